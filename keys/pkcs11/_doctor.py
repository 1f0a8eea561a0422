"""The PKCS#11 part of ``capseal doctor``: the URI parses, the module loads
(and is allowed), the token is present, the PIN works, the key is there and
can sign, and the token shows it as protected.
"""

from __future__ import annotations

from typing import Any

from capseal.errors import CapsealError
from capseal.keys import SignerSelfTest
from capseal.keys.custody import SOFTWARE_TOKEN_MANUFACTURERS
from capseal.keys.doctor import Check
from capseal.keys.secret import Secret, as_secret

from ._lock import P11_LOCK
from ._module import load_module
from ._objects import attribute_shortfalls
from ._provision import list_keys
from ._session import find_tokens, list_tokens, open_token, release_token
from ._signer import PKCS11Signer, pin_for
from ._uri import KNOWN_MODULES, PKCS11URI, parse_pkcs11_uri, resolve_module

__all__ = ["doctor_checks"]


def doctor_checks(uri: str | None, pin: str | Secret | None = None, *, pin_problem: Exception | None = None,
                  **_: Any) -> list[Check]:
    """What ``capseal doctor pkcs11:…`` checks, in order, stopping at the first
    failure (later checks need the earlier ones): the URI parses, the module
    loads (and is allowed), the token is present, the PIN works, the key is
    there and can sign, and the token shows it as protected. Each failure
    carries its fix. Never prints the PIN, never raises.

    Args:
        uri: the key's (or token's) URI; None: no checks.
        pin: the PIN to try.
        pin_problem: why the CLI could not read the PIN it was told to use
            (reported as the "PIN works" check).
        _: other options the doctor passes to every backend.

    Returns:
        The checks.
    """
    pin = as_secret(pin, "pin=")
    if not uri:
        return []
    checks: list[Check] = []
    try:
        parsed = parse_pkcs11_uri(uri)
    except CapsealError as exc:
        return [Check("pkcs11 URI", False, str(exc), "write the URI as RFC 7512 says: pkcs11:token=…;object=…?module-path=…")]
    checks.append(Check("pkcs11 URI", True, parsed.to_string()))

    try:
        module = load_module(resolve_module(parsed))
    except CapsealError as exc:
        return checks + [Check("PKCS#11 module loads", False, str(exc), exc.hint or
                               f"install the module (SoftHSM2: apt-get install softhsm2 → {KNOWN_MODULES['SoftHSM2']})")]
    info = module.info()
    checks.append(Check("PKCS#11 module loads", True,
                        f"{module.path}: {info['library_description']} {info['library_version']} ({info['library_manufacturer']})"))

    try:
        with P11_LOCK:
            found = find_tokens(module, parsed)
            seen = sorted({t.label for t in list_tokens(module) if t.label})
            token_facts = [(t.label, t.serial, t.manufacturer_id, t.model) for t in found]
    except CapsealError as exc:
        return checks + [Check("token present", False, str(exc), exc.hint)]
    if len(token_facts) != 1:
        detail = f"{len(token_facts)} tokens match {parsed.describe_token()}; present: {', '.join(map(repr, seen)) or 'none'}"
        fix = ("add serial= to the URI" if token_facts else
               "check token= in the URI, plug the token in, or for development run `capseal token init`")
        return checks + [Check("token present", False, detail, fix)]
    label, serial, manufacturer, model = token_facts[0]
    serial_text = serial.decode("ascii", "replace").strip() if isinstance(serial, bytes) else str(serial)
    software = " — a software token" if manufacturer in SOFTWARE_TOKEN_MANUFACTURERS else ""
    checks.append(Check("token present", True, f"{label!r} serial {serial_text}, {manufacturer} {model}{software}"))

    if pin_problem is not None:  # the CLI could not read the PIN it was told to use
        return checks + [Check("PIN works", False, str(pin_problem), getattr(pin_problem, "hint", "") or
                               "fix where the PIN comes from: CAPSEAL_PIN, --pin-env VAR or --pin-file FILE")]
    try:
        secret = pin_for(parsed, pin)
    except CapsealError as exc:
        return checks + [Check("PIN works", False, str(exc), exc.hint or "fix pin-source= (a file holding the PIN)")]
    if secret is None:
        return checks + [Check("PIN works", False, "no PIN given",
                               "set CAPSEAL_PIN (or --pin-file FILE), or add pin-source=file:/path to the URI")]
    try:
        ts = open_token(parsed, pin=secret)
    except CapsealError as exc:
        return checks + [Check("PIN works", False, str(exc), exc.hint or "check the PIN; do not retry blindly (tokens lock)")]
    release_token(ts)
    checks.append(Check("PIN works", True, f"logged in to token {label!r}"))

    if parsed.object is None and parsed.id is None:
        keys = list_keys(uri, pin=secret)
        names = ", ".join(repr(k.get("label")) for k in keys) or "none"
        checks.append(Check("key found", bool(keys), f"no object= in the URI; private keys on the token: {names}",
                            "" if keys else "create one: capseal keys create 'pkcs11:…;object=NAME?…' --alg ed25519"))
        return checks
    try:
        with PKCS11Signer(parsed, pin=secret) as signer:
            custody = signer.describe()
            SignerSelfTest.run(signer)  # signs, and the public key must verify it: a mismatched pair fails here
    except CapsealError as exc:
        fix = exc.hint or f"create it: capseal keys create '{PKCS11URI(token=label, object=parsed.object, module_path=parsed.module_path).to_string()}' --alg ed25519"
        return checks + [Check("key found", False, str(exc), fix)]
    attrs = custody.get("key_attributes", {})
    facts = [name for name, flag in (("sensitive", "CKA_SENSITIVE"), ("never extractable", "CKA_NEVER_EXTRACTABLE"),
                                     ("generated on the token", "CKA_LOCAL")) if attrs.get(flag)]
    # an attribute the token did not report is said to be so, never taken as false
    short = attribute_shortfalls(attrs, (("CKA_SENSITIVE", True), ("CKA_NEVER_EXTRACTABLE", True)))
    checks.append(Check("key found", True, f"{custody['alg']} key {custody['kid'][:16]}… signs and its public key verifies; {', '.join(facts) or 'no protection attribute reported true'}"))
    reported_false = any(not s.endswith("not reported by the token") for s in short)
    checks.append(Check("key protected", not short,
                        f"the token does not show the private key as protected: {', '.join(short)}" if short else
                        "CKA_SENSITIVE and CKA_NEVER_EXTRACTABLE are true",
                        "" if not short else
                        "create a new key with `capseal keys create` (sensitive, never extractable) and retire this one"
                        if reported_false else "check the key's protection with the token vendor's own tools"))
    return checks
