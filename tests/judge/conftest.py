"""Fixtures for capseal.judge tests: the vendored vectors, a software signer, and a
temp store holding one sealed act capsule (the thing every judgment judges)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capseal import Producer
from capseal.errors import JudgmentRefusedError
from capseal.judge import JudgmentStore, Target
from capseal.keys import UnsafeEphemeralSigner

DATA = Path(__file__).resolve().parent.parent / "vectors" / "judge-data"
JUDGE = DATA / "vectors" / "judge"
RESULT = DATA / "vectors" / "evidence-result"
JUDGMENT = DATA / "vectors" / "judgment"
NOW = "2026-10-01T12:00:00Z"

REQUEST = {"order": "A-1009", "refund": "612.00", "currency": "EUR", "approval_ref": "SUP-EX-77"}


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def judgment_vectors() -> tuple[Any, dict[str, Any], dict[str, str]]:
    """A fresh copy (a module may change it) of the judgment-capsule vectors,
    with the AI-judge case and the raw files by role (prompt, axes, policy)."""
    vectors = load(JUDGMENT / "vectors.json")
    ai = next(c for c in vectors["cases"] if c["id"] == "pos-ai-judge")
    raw = {role: vectors["raw_files"][name]
           for role, name in (("prompt", "judge-prompt.md"), ("axes", "axes.json"), ("policy", "policy.md"))}
    return vectors, ai, raw


@pytest.fixture(scope="session")
def signer() -> UnsafeEphemeralSigner:
    return UnsafeEphemeralSigner()


class World:
    """A temp ledger with a sealed act, a store over it, and common artifacts."""

    def __init__(self, producer: Producer, store: JudgmentStore) -> None:
        self.producer = producer
        self.store = store
        planned = producer.planned("refund-A-1009", effect_type="send_payment", request=REQUEST)
        self.act = producer.confirmed(planned, response={"status": "issued"}, effect_attestation="gate_executed")
        self.act_t = Target.of_capsule(self.act)
        self.request_t = store.put_json(REQUEST, type="refund-request")
        self.rubric_t = store.put_json({"rubric_id": "r", "criteria": [{"id": "C1"}]}, type="rubric")
        self.prompt = "Grade the act against the criterion.\n"
        self.prompt_t = store.put_text(self.prompt, type="judge-prompt")

    def assert_seal_refused(self, body: Any, rule: str, **seal_args: Any) -> None:
        """``store.seal(body, **seal_args)`` is refused naming ``rule``, and the
        ledger holds what it held before."""
        count = self.producer.ledger.count()
        with pytest.raises(JudgmentRefusedError) as caught:
            self.store.seal(body, **seal_args)
        assert caught.value.rule == rule
        assert self.producer.ledger.count() == count


@pytest.fixture()
def world(tmp_path: Path, signer: UnsafeEphemeralSigner) -> Iterator[World]:
    with Producer("example-org", "refund-agent@1.0", signer, tmp_path / "judged.db") as producer:
        yield World(producer, JudgmentStore(producer.ledger, signer))
