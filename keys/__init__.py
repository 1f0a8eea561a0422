"""capseal.keys — signing keys in software, PKCS#11 tokens and TPM 2.0 chips.

>>> from capseal.keys import open_signer
>>> signer = open_signer("file:/etc/capseal/seal-key.pem")      # doctest: +SKIP
>>> signer = open_signer("pkcs11:token=agents;object=seal-key"
...                      "?module-path=/usr/lib/softhsm/libsofthsm2.so", pin=pin)  # doctest: +SKIP

Backends are chosen by URI scheme from :data:`SIGNER_FOR_URI_SCHEME`; the
optional ones (``capseal[pkcs11]``, ``capseal[tpm]``) load on first use, and a
missing extra is a :class:`~capseal.errors.MissingExtraError` naming it.

Public modules (everything else here is private):

* ``capseal.keys`` — this facade: the :class:`Signer` contract, the software
  signers, ``open_signer`` and the scheme registry;
* :mod:`capseal.keys.secret` — the one type that holds PINs, passphrases and
  TPM auth values, and the reading of PIN and key files;
* :mod:`capseal.keys.custody` — custody statements;
* :mod:`capseal.keys.certify` — checking a TPM2_Certify record;
* :mod:`capseal.keys.provision` — creating, showing, listing and deleting keys by URI;
* :mod:`capseal.keys.doctor` — ``capseal doctor``'s checks;
* :mod:`capseal.keys.direct` — the ``CAPSEAL_NO_DIRECT`` switch of the fast paths;
* :mod:`capseal.keys.pkcs11` — the PKCS#11 backend (``pkcs11:`` URIs);
* :mod:`capseal.keys.tpm` — the TPM 2.0 backend (``tpm2:`` URIs).
"""

from ._base import PendingSignature, SignatureResult, Signer, SignerSelfTest, alg_for_public_key, kid_for
from ._registry import (
    SIGNER_FOR_URI_SCHEME,
    SecretsHandler,
    check_options,
    lazy_export,
    load_target,
    open_signer,
    redact_uri,
    register_scheme,
)
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
    "check_options",
    "lazy_export",
    "load_target",
    "kid_for",
    "alg_for_public_key",
    "generate_private_key",
    "write_pkcs8",
    "custody_statement",
    "CUSTODY_SCHEMA",
    "verify_certify",
]
