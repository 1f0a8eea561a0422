"""Provisioning keys on a PKCS#11 token (``capseal keys create``, ``list``
and ``delete``): a sign-only key pair generated on the token and checked
after generation, the keys a token holds, and the removal of exactly the
one the operator was shown.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from capseal.errors import DeviceError, KeyNotFoundError, KeyURIError
from capseal.keys import SecretsHandler, alg_for_public_key, check_options, kid_for
from capseal.keys.provision import held_interrupts, note_left
from capseal.keys.secret import Secret, as_secret

from ._calls import run
from ._objects import (
    enabled_extra_usages,
    find_private_keys,
    find_public_key,
    generate_keypair,
    key_attributes,
    new_key_shortfalls,
    objects_with,
    public_key_of,
)
from ._session import TokenSession, open_token, release_token
from ._signer import PKCS11Signer, check_sign_mechanism, parse, pin_for, token_mechanisms
from ._uri import PKCS11URI

__all__ = ["create_key", "list_keys", "delete_key", "check_new_key"]


# ---------------------------------------------------------------------- provisioning


def create_key(
    uri: str | PKCS11URI,
    alg: str,
    *,
    pin: str | Secret | None = None,
    secrets_handler: SecretsHandler | None = None,
    module_allowlist: Any = None,
    rsa_bits: int = 3072,
    **options: Any,
) -> PKCS11Signer:
    """Generate a key pair on the token and open it (``capseal keys create``).

    The private key is a token object, private, sensitive, not extractable
    and sign-only; the attributes are read back and the key is destroyed and
    the call refused if the token did not honour them. ``object`` (CKA_LABEL)
    is required; ``id`` (CKA_ID) is taken from the URI or made random. A key
    that already uses the label or id is never overwritten. A create that
    does not finish (a Ctrl-C meanwhile) destroys what it made.

    Args:
        uri: the new key's ``pkcs11:`` URI (``object=`` required).
        alg: EdDSA, ES256, ES384 or PS256.
        pin: the token's user PIN (else the URI's, else ``secrets_handler``).
        secrets_handler: asked for the PIN when none is given otherwise.
        module_allowlist: as for :meth:`PKCS11Signer.from_uri`.
        rsa_bits: the size of a PS256 key (2048 or more).
        options: none other; any is refused.

    Returns:
        The new key, opened.

    Raises:
        UnknownOptionError: an option not taken here (valid: pin, secrets_handler, module_allowlist, rsa_bits).
        KeyURIError: no object=, an empty id=, type= other than private, or a label or id in use.
        UnsupportedAlgorithmError: the token cannot sign with (or make) such a key; nothing was created.
        DeviceError: the token did not make the key as asked (it was destroyed).
        TokenNotFoundError, PinIncorrectError, PinLockedError, SignerUnavailableError: as for opening a signer.
    """
    check_options("keys create for a pkcs11: key", options, ("pin", "secrets_handler", "module_allowlist", "rsa_bits"))
    pin = as_secret(pin, "pin=")
    uri = parsed = parse(uri)
    if parsed.type not in (None, "private"):
        raise KeyURIError("capseal keys create makes a private key: drop type= or use type=private")
    if not parsed.object:
        raise KeyURIError("name the new key: add object=<label> to the pkcs11 URI")
    key_id = parsed.id if parsed.id is not None else os.urandom(8)
    if not key_id:
        raise KeyURIError("pkcs11 URI: id= is empty; leave it out to get a random id")
    secret = pin_for(parsed, pin)
    ts = open_token(parsed, pin=secret, module_allowlist=module_allowlist, pin_prompt=secrets_handler)
    where = f"{ts.name}, new key object={parsed.object!r} id={key_id.hex()}"
    made = False  # objects with this label and id may exist from here on, and are ours (none did before)
    try:
        def make(session: Any) -> None:
            nonlocal made
            clash = objects_with(session, label=parsed.object, key_id=key_id)
            if clash:
                raise KeyURIError(f"{where}: an object with that label or id already exists; capseal never overwrites keys")
            # the token must sign with the new key before it makes one: a key pair it can generate
            # but not use (RSA without PSS is common on smart cards) was left on the token
            check_sign_mechanism(alg, token_mechanisms(ts), where, "nothing was created")
            rw = ts.token.open(rw=True)  # PIN-less: shares the login of the session above
            try:
                made = True
                generate_keypair(rw, alg, parsed.object or "", key_id, rsa_bits=rsa_bits)
                check_new_key(rw, parsed.object or "", key_id, where)
            finally:
                rw.close()

        run(ts, make, where)
        # opened while the session is held, with the PIN the token took: ``secret``
        # is None when it came from ``secrets_handler``, which is not asked twice
        signer = PKCS11Signer(parsed.with_id(key_id), pin=ts.pin_for_child(), module_allowlist=module_allowlist)
    except BaseException as exc:  # a Ctrl-C (or a failure) before the caller has the key: it goes again
        if made:
            _undo_new_key(ts, parsed.object or "", key_id, where, exc, parsed.with_id(key_id).to_string())
        raise
    finally:
        release_token(ts)
    return signer


def _undo_new_key(ts: TokenSession, label: str, key_id: bytes, where: str, exc: BaseException, uri: str) -> None:
    """Destroy the objects a ``create_key`` that did not finish made (every
    object with its label or id: none existed before it), with Ctrl-C held
    off; when that fails, ``exc`` is marked as leaving ``uri`` behind."""
    def destroy(session: Any) -> None:
        rw = ts.token.open(rw=True)
        try:
            seen: set[int] = set()
            for obj in objects_with(rw, label=label, key_id=key_id):
                if obj.handle not in seen:
                    seen.add(obj.handle)
                    obj.destroy()
        finally:
            rw.close()

    with held_interrupts():
        try:
            run(ts, destroy, where)
        except Exception:  # noqa: BLE001 - the error on its way out is the one to report, with this key named
            note_left(exc, uri)


def check_new_key(rw: Any, label: str, key_id: bytes, where: str) -> None:
    """Read a just-generated key pair's attributes back; the token may have
    ignored the template. Lock held.

    Args:
        rw: a read-write session.
        label: the new key's CKA_LABEL.
        key_id: its CKA_ID.
        where: names the token and key.

    Raises:
        DeviceError: after destroying the pair, unless the private key reports
            what the template asked (a private token object, sensitive, not and
            never extractable, signing; an attribute it does not report fails,
            named as not reported) and neither half can do more than sign /
            verify (no CKA_DECRYPT, CKA_UNWRAP, CKA_DERIVE, CKA_ENCRYPT, CKA_WRAP).
    """
    new = find_private_keys(rw, PKCS11URI(object=label, id=key_id))
    private = new[0] if len(new) == 1 else None
    problem = None
    if private is None:
        problem = f"{len(new)} private keys with that label and id after generation"
    else:
        short = new_key_shortfalls(private)
        extra = enabled_extra_usages(private, find_public_key(rw, private))
        if short:
            problem = f"the token did not make the private key as asked ({', '.join(short)})"
        elif extra:
            problem = f"the token made a signing key that can also use {', '.join(extra)}"
    if problem is not None:
        destroyed: set[int] = set()
        for obj in objects_with(rw, label=label, key_id=key_id):  # found by label and by id: once each
            if obj.handle not in destroyed:
                destroyed.add(obj.handle)
                obj.destroy()
        raise DeviceError(f"{where}: {problem}; destroyed it",
                          hint="the token ignored (or does not report) capseal's sign-only template; "
                               "check its key-generation policy")


def list_keys(
    uri: str | PKCS11URI,
    *,
    pin: str | Secret | None = None,
    secrets_handler: SecretsHandler | None = None,
    module_allowlist: Any = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Private keys on the token (filtered by the URI's object/id) (``capseal keys list``).

    Args:
        uri: the token's (or a key's) ``pkcs11:`` URI.
        pin: the token's user PIN (else the URI's, else ``secrets_handler``).
        secrets_handler: asked for the PIN when none is given otherwise.
        module_allowlist: as for :meth:`PKCS11Signer.from_uri`.
        options: none other; any is refused.

    Returns:
        One entry per key: ``uri``, ``label``, ``id``, ``alg``, ``kid`` (or
        ``error``) and its custody ``attributes``.

    Raises:
        UnknownOptionError: an option not taken here (valid: pin, secrets_handler, module_allowlist).
        TokenNotFoundError, PinIncorrectError, PinLockedError, SignerUnavailableError: as for opening a signer.
    """
    check_options("keys list for a pkcs11: token", options, ("pin", "secrets_handler", "module_allowlist"))
    pin = as_secret(pin, "pin=")
    uri = parsed = parse(uri)
    ts = open_token(parsed, pin=pin_for(parsed, pin), module_allowlist=module_allowlist, pin_prompt=secrets_handler)
    try:
        def collect(session: Any) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            base = PKCS11URI(token=ts.label, serial=ts.serial, module_path=parsed.module_path,
                             module_name=parsed.module_name, pin_source=parsed.pin_source)
            for private in find_private_keys(session, PKCS11URI(object=parsed.object, id=parsed.id, type=parsed.type)):
                attrs = key_attributes(private)
                label, key_id = attrs.get("CKA_LABEL"), attrs.get("CKA_ID")
                entry: dict[str, Any] = {
                    "uri": replace(base, object=label, id=bytes.fromhex(key_id) if key_id else None).to_string(),
                    "label": label,
                    "id": key_id,
                }
                try:
                    public_obj = find_public_key(session, private)
                    public_key = public_key_of(public_obj if public_obj is not None else private, ts.name)
                    entry["alg"] = alg_for_public_key(public_key)
                    entry["kid"] = kid_for(public_key)
                except Exception as exc:  # list what can be listed; say why the rest cannot
                    entry["error"] = type(exc).__name__
                entry["attributes"] = {k: v for k, v in attrs.items() if k not in ("CKA_LABEL", "CKA_ID")}
                out.append(entry)
            return out

        return run(ts, collect, ts.name)
    finally:
        release_token(ts)


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
    uri = parsed = parse(uri)
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
