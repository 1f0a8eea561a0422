"""Vocabularies stay equal to the reference's registries and to the model's types."""

from __future__ import annotations

import typing

from agent_action_capsule.registries import load_registries

from capseal import model
from capseal.vocab import PENDING, REGISTRIES


def _literal_values(tp: object) -> set[str]:
    out: set[str] = set()
    for arg in typing.get_args(tp) or ():
        if typing.get_origin(arg) is typing.Literal:
            out |= set(typing.get_args(arg))
    if typing.get_origin(tp) is typing.Literal:
        out |= set(typing.get_args(tp))
    return out


def test_registries_equal_the_reference() -> None:
    theirs = load_registries()
    assert {k: set(v) for k, v in REGISTRIES.items()} == {k: set(v) for k, v in theirs.items()}


def test_model_literals_equal_the_registries() -> None:
    pairs = {
        "effect.type": model.EffectType, "irreversibility_class": model.Irreversibility,
        "effect_attestation": model.EffectAttestation, "disposition.decision": model.Decision,
        "verdict_class": model.VerdictClass, "chain.relation": model.Relation, "citation_purpose": model.CitationPurpose,
    }
    for name, tp in pairs.items():
        assert _literal_values(tp) == set(REGISTRIES[name]) | set(PENDING.get(name, ())), name
