"""Shared fixtures for the capseal.attest tests: two real swtpms, each with an AK.

Why their own swtpms (not the session ``swtpm`` fixture): the TPM-backend tests
provision, lock out and restart that one; evidence tests need a TPM whose AK
stays put, and a *second* TPM to make "a quote from a different TPM".

The AK is created here with plain tpm2-pytss ESAPI (restricted ECC P-256,
template ``ecc256:ecdsa-sha256:null``, persisted), the way ``capseal tpm
provision`` does it; capseal.attest then loads it by ``tpm2:`` URI through
TPMDevice like any caller would.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from capseal import Producer
from capseal.attest import AttestationKey, TPMQuoter
from capseal.keys import UnsafeEphemeralSigner

from ..conftest import SwTPM, _start_swtpm

os.environ.setdefault("TSS2_LOG", "all+NONE")

AK_HANDLE = 0x81000142
PLAIN_HANDLE = 0x81000143


def _srk(ectx: object) -> object:
    from tpm2_pytss.constants import ESYS_TR, TPMA_OBJECT
    from tpm2_pytss.types import TPM2B_PUBLIC, TPM2B_SENSITIVE_CREATE

    attrs = (TPMA_OBJECT.RESTRICTED | TPMA_OBJECT.DECRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
             | TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH | TPMA_OBJECT.NODA)
    srk, *_ = ectx.create_primary(  # type: ignore[attr-defined]
        TPM2B_SENSITIVE_CREATE(), TPM2B_PUBLIC.parse("ecc256:aes128cfb", objectAttributes=attrs), ESYS_TR.OWNER)
    return srk


def persist_key(tcti: str, handle: int, *, restricted: bool = True, scheme: str = "ecc256:ecdsa-sha256") -> None:
    """Create a signing key under an SRK and persist it at ``handle``
    (restricted = an AK; unrestricted = a plain signing key, which is no AK).
    ``scheme``: the tpm2-tools key type and signing scheme (ECC P-256 with
    ECDSA-SHA256 unless told, e.g. ``rsa2048:rsassa-sha1``)."""
    from tpm2_pytss import ESAPI
    from tpm2_pytss.constants import ESYS_TR, TPMA_OBJECT
    from tpm2_pytss.types import TPM2B_PUBLIC, TPM2B_SENSITIVE_CREATE

    attrs = (TPMA_OBJECT.SIGN_ENCRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
             | TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH | TPMA_OBJECT.NODA)
    template = scheme
    if restricted:
        attrs |= TPMA_OBJECT.RESTRICTED
        template += ":null"
    with ESAPI(tcti) as ectx:
        srk = _srk(ectx)
        priv, pub, *_ = ectx.create(srk, TPM2B_SENSITIVE_CREATE(), TPM2B_PUBLIC.parse(template, objectAttributes=attrs))
        key = ectx.load(srk, priv, pub)
        ectx.evict_control(ESYS_TR.OWNER, key, handle)
        ectx.flush_context(key)
        ectx.flush_context(srk)


def extend_pcr(tcti: str, index: int, data: bytes) -> None:
    from tpm2_pytss import ESAPI
    from tpm2_pytss.constants import ESYS_TR, TPM2_ALG
    from tpm2_pytss.types import TPML_DIGEST_VALUES, TPMT_HA

    with ESAPI(tcti) as ectx:
        ha = TPMT_HA(hashAlg=TPM2_ALG.SHA256)
        ha.digest.sha256 = data
        ectx.pcr_extend(ESYS_TR.PCR0 + index, TPML_DIGEST_VALUES([ha]))


@dataclass
class AttestTPM:
    """A running swtpm with a persistent AK, and capseal's view of it."""

    swtpm: SwTPM
    handle: int

    @property
    def uri(self) -> str:
        return f"tpm2:handle=0x{self.handle:08x}?tcti={self.swtpm.tcti}"

    def ak(self) -> AttestationKey:
        return AttestationKey(self.uri)

    def quoter(self, **kw: object) -> TPMQuoter:
        return TPMQuoter(self.uri, **kw)  # type: ignore[arg-type]


def _attest_tpm(tmp: Path) -> Iterator[AttestTPM]:
    tpm = _start_swtpm(tmp)
    try:
        persist_key(tpm.tcti, AK_HANDLE)
        yield AttestTPM(tpm, AK_HANDLE)
    finally:
        from capseal.keys.tpm import get_device

        get_device(tpm.tcti).close()
        tpm.stop()


# module scope: each test module that imports these fixtures gets its own
# (pytest registers an imported fixture per module), torn down when it ends
@pytest.fixture(scope="module")
def tpm_a(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AttestTPM]:
    """TPM A: the one whose AK the relying party pins."""
    yield from _attest_tpm(tmp_path_factory.mktemp("attest-tpm-a"))


@pytest.fixture(scope="module")
def tpm_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AttestTPM]:
    """TPM B: a different TPM, with an AK made from the same template."""
    yield from _attest_tpm(tmp_path_factory.mktemp("attest-tpm-b"))


@pytest.fixture()
def producer(tmp_path: Path) -> Iterator[Producer]:
    with Producer("acme.example", "buyer-agent@1.4", UnsafeEphemeralSigner(), tmp_path / "ledger.db") as p:
        yield p


def spec(i: int) -> dict[str, object]:
    """A typical capsule spec (a confirmed, gate-executed effect)."""
    return {
        "action_id": f"act-{i}",
        "action_type": "decide",
        "effect": {"status": "confirmed", "type": "write_order", "request_digest": "a" * 64, "response_digest": "b" * 64,
                   "irreversibility_class": "one_way_recoverable", "effect_attestation": "gate_executed"},
        "disposition": {"decision": "accept", "approver": "policy", "human_disposed": False, "verdict_class": "executed"},
    }
