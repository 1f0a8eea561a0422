"""``capseal keys delete pkcs11:…``: destroy one private key and its
public-key object on a token, exactly the one the operator was shown."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from capseal.errors import KeyNotFoundError, KeyURIError

from ._base import kid_for
from ._pin import Secret, as_secret
from ._pkcs11 import _parse, pin_for
from ._pkcs11_calls import run
from ._pkcs11_keys import find_private_keys, find_public_key, key_attributes, public_key_of
from ._pkcs11_session import open_token, release_token
from ._pkcs11_uri import PKCS11URI
from ._registry import SecretsHandler, check_options

__all__ = ["delete_key"]


def delete_key(
    uri: str | PKCS11URI,
    *,
    kid: str | None = None,
    pin: str | Secret | None = None,
    secrets_handler: SecretsHandler | None = None,
    module_allowlist: Any = None,
    **options: Any,
) -> dict[str, Any]:
    """Destroy the one private key ``uri`` names and its public-key object
    (``capseal keys delete``).

    Args:
        uri: a ``pkcs11:`` URI naming the key with ``object=`` and/or ``id=``.
        kid: when given, the key found must have this kid (what the operator was shown).
        pin: the token's user PIN (else the URI's, else ``secrets_handler``).
        secrets_handler: asked for the PIN when none is given otherwise.
        module_allowlist: as for ``PKCS11Signer.from_uri``.
        options: none other; any is refused.

    Returns:
        ``uri``, ``kid`` and ``deleted`` (the objects destroyed).

    Raises:
        KeyURIError: the URI names no key (no object=/id=), several keys, or another key than ``kid``.
        KeyNotFoundError: no private key matches.
        UnknownOptionError, TokenNotFoundError, PinIncorrectError, DeviceError: as for opening a signer.
    """
    check_options("keys delete for a pkcs11: key", options, ("kid", "pin", "secrets_handler", "module_allowlist"))
    pin = as_secret(pin, "pin=")
    uri = parsed = _parse(uri)
    if parsed.object is None and parsed.id is None:
        raise KeyURIError("name the key to delete: add object=<label> or id= to the pkcs11 URI")
    ts = open_token(parsed, pin=pin_for(parsed, pin), module_allowlist=module_allowlist, pin_prompt=secrets_handler)
    try:
        def destroy(_session: Any) -> dict[str, Any]:
            rw = ts.token.open(rw=True)  # PIN-less: shares the login of the session above
            try:
                found = find_private_keys(rw, PKCS11URI(object=parsed.object, id=parsed.id, type=parsed.type))
                if not found:
                    raise KeyNotFoundError(f"{ts.name}: no private key {parsed.describe_key()}")
                if len(found) > 1:
                    raise KeyURIError(f"{ts.name}: {len(found)} private keys match {parsed.describe_key()}; add id= "
                                      "to name one")
                private = found[0]
                public_obj = find_public_key(rw, private)
                public_key = public_key_of(public_obj if public_obj is not None else private, ts.name)
                found_kid = kid_for(public_key)
                if kid is not None and found_kid != kid:
                    raise KeyURIError(f"{ts.name}: {parsed.describe_key()} is another key than the one shown "
                                      f"(kid {kid[:16]}…); not deleted")
                attrs = key_attributes(private)
                key_id = attrs.get("CKA_ID")
                deleted = ["private key"]
                private.destroy()
                if public_obj is not None:
                    public_obj.destroy()
                    deleted.append("public key")
                shown = replace(parsed.without_pin(), object=attrs.get("CKA_LABEL"),
                                id=bytes.fromhex(key_id) if key_id else None)
                return {"uri": shown.to_string(), "kid": found_kid, "deleted": deleted}
            finally:
                rw.close()

        return run(ts, destroy, ts.name)
    finally:
        release_token(ts)
