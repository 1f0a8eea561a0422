"""``capseal token init``: a SoftHSM2 token for development.

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

import pkcs11  # noqa: F401  (the child that initialises the token uses it: a missing extra is named here, first)

from capseal.errors import InputError, SignerError, SignerUnavailableError
from capseal.keys.secret import Secret, as_secret, usable_pin

from ._uri import check_module_allowed, pct_encode

__all__ = ["init_softhsm_token", "softhsm_module"]

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
    """The installed SoftHSM2 module.

    Returns:
        Its path.

    Raises:
        SignerUnavailableError: SoftHSM2 is not installed.
    """
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
    of its keys say ``software_device: true``. A PIN not given is generated
    into ``dir/user-pin`` / ``dir/so-pin`` (mode 0600) and the result names
    the file, never the PIN. Everything that can be checked is checked before
    anything is written; PIN files generated by a run that created no token
    are removed again.

    Args:
        dir: the token's directory (created).
        label: the token's label (1 to 32 bytes).
        pin: the user PIN (4 to 255 characters); None: generated.
        so_pin: the SO PIN; None: generated.

    Returns:
        ``softhsm2_conf``, ``module_path``, ``label``, ``serial``, ``uri``,
        ``env`` and, for generated PINs, ``pin_source`` / ``so_pin_file``.

    Raises:
        InputError: a bad label or PIN, a PIN file already there (never
            overwritten), a directory that cannot be made, or a token with that label.
        SignerUnavailableError: SoftHSM2 is not installed, or not on the module allow-list.
        SignerError: the token could not be initialised.
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
