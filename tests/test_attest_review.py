# ruff: noqa: F811  (pytest fixtures imported from test_attest_support are redefined as parameters)
"""Defects found in review of capseal.attest, each pinned by a test on a real swtpm."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import capseal.attest as attest
from capseal import Producer, SealedRecord
from capseal.attest import PinnedAK, TrustPolicy, verify_evidence

from .test_attest_support import (  # noqa: F401  (fixtures)
    AttestTPM,
    producer,
    spec,
    tpm_a,
)

pytestmark = pytest.mark.swtpm  # counted in the hardware summary


@pytest.fixture()
def quoted(producer: Producer, tpm_a: AttestTPM) -> SealedRecord:
    """One sealed record quoted over its own id on TPM A."""
    record: SealedRecord = attest.quote(producer.seal(spec(1)), tpm_a.quoter(), ledger=producer.ledger)
    return record


def altered(record: SealedRecord, **members: Any) -> SealedRecord:
    ev = copy.deepcopy(record.hardware_evidence)
    assert ev is not None
    ev.update(members)
    return record.with_evidence(ev)


def test_a_required_ek_chain_is_never_passed_unchecked(quoted: SealedRecord) -> None:
    """require_ek_chain with no EK roots let any ek_certificates member pass
    (junk included): the chain was 'present', so the requirement was taken as
    met, though nothing could check it. Without roots a required chain cannot
    be valid, so it fails."""
    ev = quoted.hardware_evidence
    assert ev is not None
    strict = TrustPolicy((PinnedAK.from_pem(ev["ak_public"]),), require_ek_chain=True)
    for chain in (["bm90IGEgY2VydA=="], "junk", [7]):
        result = verify_evidence(altered(quoted, ek_certificates=chain), trust=strict)
        assert result.status == "evidence_ek_chain_invalid" and not result.ok, (chain, result.findings)
    # still: no chain at all under the same policy fails as before
    assert verify_evidence(quoted, trust=strict).status == "evidence_ek_chain_invalid"
