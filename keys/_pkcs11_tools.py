"""Operator tools for PKCS#11: ``capseal token init`` (a SoftHSM2 token for
development) and the PKCS#11 part of ``capseal doctor``.

``init_softhsm_token`` does not run ``softhsm2-util``: that tool takes PINs
only as command-line arguments (visible to every user in ``/proc``) or from a
terminal. Instead a child Python process (its own ``SOFTHSM2_CONF``, so this
process's already-initialised SoftHSM2 is untouched) reads the PINs from its
stdin, calls ``C_InitToken`` through ctypes (python-pkcs11 has no
``C_InitToken``) and ``C_InitPIN`` through python-pkcs11.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from capseal.errors import CapsealError, InputError, SignerError, SignerUnavailableError

from ._base import SignerSelfTest
from ._pin import Secret, as_secret, usable_pin
from ._pkcs11_keys import attribute_shortfalls
from ._pkcs11_session import P11_LOCK, _find_tokens, _list_tokens, load_module, open_token, release_token
from ._pkcs11_uri import KNOWN_MODULES, PKCS11URI, check_module_allowed, parse_pkcs11_uri, pct_encode, resolve_module
from .custody import SOFTWARE_TOKEN_MANUFACTURERS
from .doctor import Check

__all__ = ["init_softhsm_token", "doctor_checks", "softhsm_module"]

_SOFTHSM_PATHS = (
    "/usr/lib/softhsm/libsofthsm2.so",
    "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/local/lib/softhsm/libsofthsm2.so",
)

_CHILD = r"""
import ctypes, json, sys
req = json.loads(sys.stdin.readline())
out = {}
created = False
try:
    import pkcs11
    from pkcs11.constants import TokenFlag
    lib = pkcs11.lib(req["module"])
    slots = lib.get_slots(token_present=True)
    tokens = [s.get_token() for s in slots]
    if any(t.label == req["label"] and t.flags & TokenFlag.TOKEN_INITIALIZED for t in tokens):
        raise SystemExit(json.dumps({"error": "exists"}))
    free = [t for t in tokens if not t.flags & TokenFlag.TOKEN_INITIALIZED]
    if not free:
        raise SystemExit(json.dumps({"error": "no free slot"}))
    so = req["so_pin"].encode("utf-8")
    label = req["label"].encode("utf-8").ljust(32, b" ")
    dll = ctypes.CDLL(req["module"])
    dll.C_InitToken.argtypes = [ctypes.c_ulong, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    dll.C_InitToken.restype = ctypes.c_ulong
    rv = dll.C_InitToken(free[0].slot.slot_id, so, len(so), label)
    if rv:
        raise SystemExit(json.dumps({"error": "C_InitToken returned 0x%x" % rv}))
    created = True
    lib.reinitialize()  # SoftHSM2 gives the new token a new slot id
    token = lib.get_token(token_label=req["label"])
    session = token.open(rw=True, so_pin=req["so_pin"])
    try:
        session.init_pin(req["pin"])
    finally:
        session.close()
    out = {"serial": token.serial.decode("ascii", "replace").strip()}
except SystemExit:
    raise
except Exception as exc:
    out = {"error": type(exc).__name__, "created": created}
print(json.dumps(out))
"""


def softhsm_module() -> str:
    """Path of the installed SoftHSM2 module."""
    for path in _SOFTHSM_PATHS:
        if os.path.exists(path):
            return path
    raise SignerUnavailableError("libsofthsm2.so not found", hint="apt-get install softhsm2")


def _pin_file(path: Path) -> Secret:
    """A random PIN written to ``path`` (mode 0600, never overwritten)."""
    value = Secret("".join(secrets.choice("0123456789") for _ in range(12)), f"the PIN generated into {path}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value.reveal() + "\n")
    return value


def _check_init_request(base: Path, label: str, pin: Secret | None, so_pin: Secret | None) -> str:
    """Everything ``init_softhsm_token`` can check before it writes a byte:
    the label, the PINs given, the module (and the allow-list, as for any
    module capseal loads: the child process loads it too), and that no PIN
    file it would generate is already there (one is never overwritten: it may
    be the only copy of a PIN). Returns the module path."""
    if not label or len(label.encode("utf-8")) > 32:
        raise InputError("a token label is 1 to 32 bytes")
    for name, value in (("user PIN", pin), ("SO PIN", so_pin)):
        if value is None:
            continue
        value = usable_pin(value, f"the {name} given for token {label!r}")
        if not 4 <= value.size() <= 255:
            raise InputError(f"SoftHSM2 needs a {name} of 4 to 255 characters")
    module = softhsm_module()
    check_module_allowed(module)
    for name, value in (("user-pin", pin), ("so-pin", so_pin)):
        if value is None and os.path.lexists(base / name):
            raise InputError(
                f"{base / name} already exists; capseal never overwrites a PIN file",
                hint="use another --dir, or give the PIN (--pin-env/--pin-file, --so-pin-env) instead of generating it")
    return module


def init_softhsm_token(
    dir: Path, label: str, *, pin: str | Secret | None = None, so_pin: str | Secret | None = None
) -> dict[str, Any]:
    """Create a SoftHSM2 token in ``dir`` (its own ``softhsm2.conf`` and token
    store) for development. SoftHSM2 keeps keys in files: custody statements
    of its keys say ``software_device: true``.

    A PIN not given is generated into ``dir/user-pin`` / ``dir/so-pin`` (mode
    0600) and the result names the file, never the PIN. Returns
    ``softhsm2_conf``, ``module_path``, ``label``, ``serial`` and a ``uri``.
    Everything that can be checked is checked before anything is written; PIN
    files generated by a run that created no token are removed again.
    """
    pin, so_pin = as_secret(pin, "pin="), as_secret(so_pin, "so_pin=")
    base = Path(dir).resolve()
    module = _check_init_request(base, label, pin, so_pin)
    tokens = base / "tokens"
    conf = base / "softhsm2.conf"
    failure: str | None = None
    try:
        tokens.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not conf.exists():
            conf.write_text(
                f"directories.tokendir = {tokens}\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n"
            )
    except OSError as exc:  # --dir is a file, or under one, or not writable: the caller's to fix
        failure = exc.strerror or type(exc).__name__
    if failure is not None:  # raised outside the handler: a typed error, no chained OSError
        raise InputError(f"cannot make the token directory {base}: {failure}",
                         hint="give --dir a directory this user can create or write")
    result: dict[str, Any] = {"softhsm2_conf": str(conf), "module_path": module, "label": label}
    generated: list[Path] = []
    if pin is None:
        pin = _pin_file(base / "user-pin")
        generated.append(base / "user-pin")
        result["pin_source"] = str(base / "user-pin")
    if so_pin is None:
        so_pin = _pin_file(base / "so-pin")
        generated.append(base / "so-pin")
        result["so_pin_file"] = str(base / "so-pin")
    answer = _run_init_child(module, label, pin, so_pin, conf)
    if "error" in answer:
        if not answer.get("created"):  # no token holds these PINs: leave nothing behind
            for path in generated:
                path.unlink(missing_ok=True)
        if answer["error"] == "exists":
            raise InputError(f"a token labelled {label!r} already exists in {tokens}")
        raise SignerError(f"could not initialise SoftHSM2 token {label!r} in {tokens}: {answer['error']}")
    result["serial"] = answer.get("serial")
    query = f"module-path={pct_encode(module, query=True)}"
    if "pin_source" in result:
        query += f"&pin-source={pct_encode(result['pin_source'], query=True)}"
    result["uri"] = f"pkcs11:token={pct_encode(label)}?{query}"
    result["env"] = f"SOFTHSM2_CONF={shlex.quote(str(conf))}"  # pasted after `export`: a space must not split it
    return result


def _run_init_child(module: str, label: str, pin: Secret, so_pin: Secret, conf: Path) -> dict[str, Any]:
    """The child that initialises the token (see the module docstring): the
    PINs go down its stdin, never on a command line (and are never text in
    this frame)."""
    request = Secret(json.dumps({"module": module, "label": label, "pin": pin.reveal(), "so_pin": so_pin.reveal()}),
                     "token init's request")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=request.reveal() + "\n",
        capture_output=True,
        text=True,
        env={**os.environ, "SOFTHSM2_CONF": str(conf)},
        timeout=60,
        check=False,
    )
    del request
    return _last_json(proc.stdout) or _last_json(proc.stderr) or {"error": f"exit status {proc.returncode}"}


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


# ---------------------------------------------------------------------- doctor


def doctor_checks(uri: str | None, pin: str | Secret | None = None, *, pin_problem: Exception | None = None,
                  **_: Any) -> list[Check]:
    """What ``capseal doctor pkcs11:…`` checks, in order, stopping at the first
    failure (later checks need the earlier ones): the URI parses, the module
    loads (and is allowed), the token is present, the PIN works, the key is
    there and can sign. Each failure carries its fix. Never prints the PIN."""
    from ._pkcs11 import PKCS11Signer, pin_for

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
            found = _find_tokens(module, parsed)
            seen = sorted({t.label for t in _list_tokens(module) if t.label})
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
        from ._pkcs11 import list_keys

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
