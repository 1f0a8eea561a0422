"""Defects found by a review of ``capseal.judge`` (each test failed on the code
before its fix): verifiers and checkers that lost their named findings behind a
``checker_internal_error`` / ``verifier_internal_error``, and a stored row that
reads two ways but verified."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from capseal.judge import check_judgment_capsule
from capseal.judge.extension import MEMBER

from .conftest import JUDGMENT, load

V = load(JUDGMENT / "vectors.json")
AI = next(c for c in V["cases"] if c["id"] == "pos-ai-judge")
RAW = {"prompt": V["raw_files"]["judge-prompt.md"], "axes": V["raw_files"]["axes.json"], "policy": V["raw_files"]["policy.md"]}


def rules(capsule: Any, preimages: Any = None, raw_files: Any = None) -> dict[str, str]:
    return {v.rule: v.path for v in check_judgment_capsule(capsule, preimages=preimages, raw_files=raw_files)}


# --------------------------------------------------------------------------- x-judgment-v1 checker


def test_a_float_in_a_judgment_capsule_is_named_not_an_internal_error() -> None:
    """A float in the capsule is float_in_record; before, capsule_id() raised
    inside the checker and every finding became checker_internal_error."""
    capsule = copy.deepcopy(AI["capsule"])
    capsule["model_attestation"]["compute_attestation"][MEMBER]["rubric_version"] = 1.5
    found = rules(capsule, AI["preimages"]["values"], RAW)
    assert "checker_internal_error" not in found
    assert "float_in_record" in found


@pytest.mark.parametrize("name", ["rubric", "judge_parameters", "instruction_template", "agent_output"])
def test_a_float_in_a_published_preimage_is_named_and_its_digest_not_compared(name: str) -> None:
    """A preimage that cannot be canonicalized has no digest: float_in_record at
    the preimage (under preimages.<name>), never checker_internal_error."""
    pre = copy.deepcopy(AI["preimages"]["values"])
    pre[name] = {**pre[name], "weight": 0.5}
    found = rules(AI["capsule"], pre, RAW)
    assert "checker_internal_error" not in found
    assert found.get("float_in_record", "").startswith(f"preimages.{name}"), found


@pytest.mark.parametrize("capsule", [None, [], "capsule", 5])
def test_a_judgment_capsule_that_is_no_object_is_named(capsule: Any) -> None:
    assert rules(capsule) == {"record_not_object": "$"}


def test_preimages_that_are_no_mapping_are_named() -> None:
    found = rules(AI["capsule"], [AI["preimages"]["values"]], RAW)
    assert "checker_internal_error" not in found and "preimages_malformed" in found
