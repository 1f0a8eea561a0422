"""capseal.keys.provision — operator provisioning: create, show, list and
delete keys by URI, whatever the backend.

Each backend exposes ``create_key(uri, alg, *, pin, secrets_handler, **opts)
-> Signer``, ``list_keys(uri, *, pin, secrets_handler, **opts) -> list[dict]``
and ``delete_key(uri, *, kid, pin, secrets_handler, **opts) -> dict``; this
module dispatches on the URI scheme like ``open_signer`` does, reaching the
backends by name, so optional backends stay lazy. Keys created on tokens and
TPMs are non-extractable and sensitive; ``show_key`` reports what the device
says about them (custody).

A ``create_key`` that does not finish (a Ctrl-C, a failure between the device
making the key and the caller receiving it) removes the key again; when that
fails, the exception on its way out names the key left behind
(:func:`note_left`, read by :func:`left_behind`). :func:`held_interrupts`
keeps a Ctrl-C from stopping that undoing half-way. The backends use the
three for their own undoing.
"""

from __future__ import annotations

from typing import Any

from capseal.errors import KeyURIError, SignatureFailedError

from ._base import Signer, SignerSelfTest
from ._leftover import held_interrupts, left_behind, note_left
from ._registry import SecretsHandler, load_target, open_signer
from .secret import Secret, as_secret

__all__ = ["ALG_ALIASES", "create_key", "delete_key", "show_key", "list_keys", "normalize_alg",
           "held_interrupts", "note_left", "left_behind"]

#: CLI spellings → COSE algorithm names.
ALG_ALIASES = {"ed25519": "EdDSA", "eddsa": "EdDSA", "p256": "ES256", "es256": "ES256",
               "p384": "ES384", "es384": "ES384", "rsa-pss": "PS256", "ps256": "PS256"}

# by name: the optional backends load on first use (a missing extra is named then)
_PROVISIONERS = {
    "file": "capseal.keys._software:create_file_key",
    "pkcs11": "capseal.keys.pkcs11:create_key",
    "tpm2": "capseal.keys.tpm:create_key",
}
_DELETERS = {
    "file": "capseal.keys._software:delete_file_key",
    "pkcs11": "capseal.keys.pkcs11:delete_key",
    "tpm2": "capseal.keys.tpm:delete_key",
}
_LISTERS = {
    "file": "capseal.keys._software:list_file_keys",
    "pkcs11": "capseal.keys.pkcs11:list_keys",
    "tpm2": "capseal.keys.tpm:list_keys",
}


def normalize_alg(alg: str) -> str:
    """The COSE name of an algorithm.

    Args:
        alg: a CLI spelling (ed25519, p256, p384, rsa-pss) or a COSE name.

    Returns:
        EdDSA, ES256, ES384 or PS256.

    Raises:
        KeyURIError: not a str, or an unknown algorithm.
    """
    if not isinstance(alg, str):  # was an AttributeError from .lower()
        raise KeyURIError(f"alg is a {type(alg).__name__}, not an algorithm name; use ed25519, p256, p384 or rsa-pss")
    name = ALG_ALIASES.get(alg.lower(), alg)
    if name not in ("EdDSA", "ES256", "ES384", "PS256"):
        raise KeyURIError(f"unknown algorithm {alg!r}; use ed25519, p256, p384 or rsa-pss")
    return name


def _backend(table: dict[str, str], uri: str) -> Any:
    if not isinstance(uri, str):  # bytes was a TypeError from split()
        raise KeyURIError(f"uri is a {type(uri).__name__}, not a key URI string")
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    target = table.get(scheme)
    if target is None:
        raise KeyURIError(f"cannot provision keys for scheme {scheme!r}; known: {sorted(table)}")
    return load_target(scheme, target)


def create_key(uri: str, alg: str, *, pin: str | Secret | None = None, secrets_handler: SecretsHandler | None = None,
               **opts: Any) -> Signer:
    """Create a new key at ``uri`` (refusing to overwrite one) and open it,
    checked to sign with the private key its public key belongs to.

    Args:
        uri: where the key goes (``file:``, ``pkcs11:``, ``tpm2:``).
        alg: ed25519, p256, p384, rsa-pss (or the COSE names).
        pin: the token's PIN, the TPM key's new auth value, or the PEM's passphrase.
        secrets_handler: asked for the PIN when none is given.
        opts: backend options (each backend refuses those it does not take).

    Returns:
        The new key, opened (close it when done).

    Raises:
        KeyURIError, UnknownOptionError, SignatureFailedError, SignerError: see the backends.
    """
    pin = as_secret(pin, "pin=")
    signer: Signer = _backend(_PROVISIONERS, uri)(uri, normalize_alg(alg), pin=pin, secrets_handler=secrets_handler,
                                                  **opts)
    try:
        SignerSelfTest.run(signer)
    except SignatureFailedError as exc:
        where = signer.uri
        signer.close()
        raise SignatureFailedError(f"{exc}; the key just created ({where}) is kept: inspect it, and remove it "
                                   "before creating a key under that name again", hint=exc.hint) from None
    except BaseException as exc:  # a Ctrl-C (or a failure) before the caller has the key: it goes again
        where, kid = signer.uri, signer.kid
        signer.close()
        _undo(where, kid, pin, opts, exc)
        raise
    return signer


def _undo(uri: str, kid: str, pin: Secret | None, opts: dict[str, Any], exc: BaseException) -> None:
    """Delete the key a ``create_key`` that did not finish made, with Ctrl-C
    held off; when that fails, ``exc`` is marked as leaving it behind (the CLI
    names it)."""
    with held_interrupts():
        try:
            delete_key(uri, kid=kid, pin=pin, **{k: v for k, v in opts.items() if k in ("module_allowlist", "tcti")})
        except BaseException:  # noqa: BLE001 - the error on its way out is the one to report, with this key named
            note_left(exc, uri)


def delete_key(uri: str, *, kid: str | None = None, pin: str | Secret | None = None,
               secrets_handler: SecretsHandler | None = None, **opts: Any) -> dict[str, Any]:
    """Delete the one key at ``uri``: a key file, a token's private key with
    its public-key object, or a TPM key (evicted from its handle, or its key
    file removed). Nothing else is touched.

    Args:
        uri: the key (``file:``, ``pkcs11:`` with object=/id=, ``tpm2:``).
        kid: when given, the key found must have this kid (the key the
            operator was shown and confirmed), or nothing is deleted.
        pin: the token's PIN (or a key file's passphrase, with ``kid``).
        secrets_handler: asked for the PIN when none is given.
        opts: backend options (each backend refuses those it does not take).

    Returns:
        ``uri``, ``kid`` (when known) and ``deleted`` (what was removed).

    Raises:
        KeyNotFoundError: no key there.
        KeyURIError: the URI names several keys, or another key than ``kid``, or an object that is no key.
        UnknownOptionError, SignerError: see the backends.
    """
    pin = as_secret(pin, "pin=")
    return dict(_backend(_DELETERS, uri)(uri, kid=kid, pin=pin, secrets_handler=secrets_handler, **opts))


def list_keys(uri: str, *, pin: str | Secret | None = None, secrets_handler: SecretsHandler | None = None,
              **opts: Any) -> list[dict[str, Any]]:
    """Keys visible at ``uri`` (a token, a TPM, a directory).

    Args:
        uri: ``file:/dir``, ``pkcs11:token=…``, ``tpm2:?tcti=…`` (or one key's URI).
        pin: the token's PIN, or the passphrase of encrypted PEMs.
        secrets_handler: asked for the PIN when none is given.
        opts: backend options (each backend refuses those it does not take).

    Returns:
        One dict per key (uri, alg, kid and what the device says of it).

    Raises:
        KeyURIError, UnknownOptionError, SignerError: see the backends.
    """
    pin = as_secret(pin, "pin=")
    return list(_backend(_LISTERS, uri)(uri, pin=pin, secrets_handler=secrets_handler, **opts))


def show_key(uri: str, *, pin: str | Secret | None = None, secrets_handler: SecretsHandler | None = None,
             **opts: Any) -> dict[str, Any]:
    """Public key, kid and custody statement of the key at ``uri``. The key
    signs once and its public key must verify that signature first: a device
    can pair a private key with another key's public-key object, and a
    verifier handed that PEM would reject everything the key seals.

    Args:
        uri: the key's URI.
        pin: its PIN, passphrase or auth value.
        secrets_handler: asked for the PIN when none is given.
        opts: backend options (see ``open_signer``).

    Returns:
        ``uri``, ``alg``, ``kid``, ``public_key_pem`` and ``custody``.

    Raises:
        SignatureFailedError: the key's public key does not verify its signature.
        KeyURIError, UnknownOptionError, SignerError: see the backends.
    """
    pin = as_secret(pin, "pin=")
    with open_signer(uri, pin=pin, secrets_handler=secrets_handler, **opts) as signer:
        SignerSelfTest.run(signer)
        return {
            "uri": signer.uri,
            "alg": signer.alg,
            "kid": signer.kid,
            "public_key_pem": signer.public_key_pem(),
            "custody": signer.describe(),
        }
