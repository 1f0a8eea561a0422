"""capseal.keys — signing keys in software, PKCS#11 tokens and TPM 2.0 chips.

>>> from capseal.keys import open_signer
>>> signer = open_signer("file:/etc/capseal/seal-key.pem")      # doctest: +SKIP
>>> signer = open_signer("pkcs11:token=agents;object=seal-key"
...                      "?module-path=/usr/lib/softhsm/libsofthsm2.so", pin=pin)  # doctest: +SKIP

Backends are chosen by URI scheme from :data:`SIGNER_FOR_URI_SCHEME`; optional
ones load lazily.
"""

from ._base import PendingSignature, SignatureResult, Signer, SignerSelfTest, alg_for_public_key, kid_for
from ._registry import SIGNER_FOR_URI_SCHEME, SecretsHandler, open_signer, redact_uri, register_scheme
from ._software import FileSigner, SoftwareSigner, UnsafeEphemeralSigner, generate_private_key, write_pkcs8
from .certify import verify_certify
from .custody import CUSTODY_SCHEMA, custody_statement

__all__ = [
    "Signer",
    "SignatureResult",
    "PendingSignature",
    "SignerSelfTest",
    "SoftwareSigner",
    "FileSigner",
    "UnsafeEphemeralSigner",
    "SIGNER_FOR_URI_SCHEME",
    "SecretsHandler",
    "open_signer",
    "register_scheme",
    "redact_uri",
    "kid_for",
    "alg_for_public_key",
    "generate_private_key",
    "write_pkcs8",
    "custody_statement",
    "CUSTODY_SCHEMA",
    "verify_certify",
]
