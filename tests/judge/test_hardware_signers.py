"""Judgment records sealed with a key in a real SoftHSM2 token (PKCS#11) and in a
real swtpm (TPM 2.0), then verified — the same code path as a software key."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from capseal import Producer
from capseal.audit import verify_ledger
from capseal.judge import HumanRating, JudgmentStore, Target, link, verify_judgment
from capseal.keys import open_signer
from capseal.keys.provision import create_key

NOW = "2026-10-01T12:00:00Z"


def _judge_with(signer: Any, ledger: Path) -> None:
    with Producer("example-org", "agent@1", signer, ledger) as producer:
        act = producer.seal({"action_id": "a1", "action_type": "fyi"})
        store = JudgmentStore(producer.ledger, signer)
        packet = store.put_json({"case": "a1", "model_verdict_shown": False}, type="rated-case")
        sealed = store.seal(HumanRating.of(record_id="hr-1", rated_at=NOW, rater_ref="principal:r-1", case=packet, label="met"),
                            links=[link("cites", Target.of_capsule(act))])
        result = verify_judgment(sealed, store, trusted_keys=[signer.public_key])
        assert result.ok and result.signature == "authored" and result.signer_kid == signer.kid, result.to_dict()
        assert sealed.envelopes[0].alg == signer.alg
    report = verify_ledger(ledger)
    assert report.ok, report.to_dict()


@pytest.mark.parametrize("alg", ["ed25519", "p256"])
def test_judgment_sealed_with_a_pkcs11_key(alg: str, softhsm: Any, tmp_path: Path) -> None:
    uri = softhsm.uri(f"judge-{alg}-{os.urandom(3).hex()}")
    create_key(uri, alg, pin=softhsm.pin).close()
    with open_signer(uri, pin=softhsm.pin) as signer:
        _judge_with(signer, tmp_path / "l.db")


def test_judgment_sealed_with_a_tpm_key(swtpm: Any, tmp_path: Path) -> None:
    uri = f"tpm2:keyfile={tmp_path / 'judge.tss'}?tcti={swtpm.tcti}"
    create_key(uri, "ES256").close()
    with open_signer(uri) as signer:
        assert signer.external_device
        _judge_with(signer, tmp_path / "l.db")
