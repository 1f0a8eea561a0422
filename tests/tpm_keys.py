"""Key files made the way other tools make them (tpm2_create under the SRK),
for tests of what capseal says about keys it did not provision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpm2_pytss.constants import ESYS_TR
from tpm2_pytss.types import TPM2B_PUBLIC, TPM2B_SENSITIVE_CREATE

from capseal.keys.tpm import TPMKeyFile, get_device, srk_template


def key_file_under_srk(tcti: str, template: str, attrs: Any, path: Path) -> Path:
    """A TSS2 PRIVATE KEY file at ``path`` for a new key of ``template``
    (tpm2-pytss's text form, e.g. ``ecc256:ecdsa-sha256:null``) with object
    attributes ``attrs``, made under the owner SRK on the TPM at ``tcti``."""
    device = get_device(tcti)

    def make(ectx: Any) -> tuple[bytes, bytes]:
        device.make_room()
        srk, *_ = ectx.create_primary(TPM2B_SENSITIVE_CREATE(), srk_template(), ESYS_TR.OWNER)
        try:
            parsed = TPM2B_PUBLIC.parse(template, objectAttributes=attrs)
            private, public, *_ = ectx.create(srk, TPM2B_SENSITIVE_CREATE(), parsed)
            return bytes(private.marshal()), bytes(public.marshal())
        finally:
            ectx.flush_context(srk)

    private, public = device.call(make)
    path.write_bytes(TPMKeyFile(public=public, private=private).to_pem())
    return path
