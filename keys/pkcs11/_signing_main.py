"""The signing process's side (see ``_signing_process``): run as the module
``capseal.keys.pkcs11._signing_main`` (through ``runpy``, with the working
directory off the import path), it logs in to one token, finds one key, and
signs what arrives on stdin until stdin closes.

Why a process of its own: in the producer's process every signature waits
for the GIL after ``C_Sign`` returns, behind threads busy with capseal's
Python work, and the token idles meanwhile. Here nothing else runs: requests
queue in the pipe, and the token goes from one signature to the next.

Protocol (all integers big-endian):

* start: the parent writes one frame, ``u32 length`` + JSON (module path,
  token label and serial, key label and id, expected kid, mechanism,
  signature size, PIN); this process answers one frame of JSON:
  ``{"ok": true}``, or ``{"ok": false, "error": <type>, "message": <text>}``
  where the text is one of capseal's own typed messages, which never contain
  a PIN (anything else is reported by its type name only);
* then each request is ``u32 length`` + the bytes to sign, and each answer
  ``u8 status`` + ``u32 sequence`` + ``u32 length`` + the signature: status 0
  and the signature, or status 1 and no bytes when the module refused (the
  parent makes that signature itself, which raises the typed error and
  reconnects as its own path does). The sequence counts requests from 0 (the
  parent's self-test), so an answer out of step is seen, never paired with
  the wrong request.

The protocol runs on a duplicate of fd 1 taken before anything else; fd 1
itself then points at /dev/null, so a module or library that prints cannot
break the framing. Nothing is written to stderr (the parent sends it to
/dev/null): no traceback can carry the PIN anywhere.
"""

from __future__ import annotations

import json
import os
import select
import struct
import sys
import time
from typing import Any

__all__ = ["HEADER", "ANSWER", "MAX_REQUEST", "frame", "main"]

#: a frame's length prefix
HEADER = struct.Struct(">I")
#: an answer's head: status, sequence, length
ANSWER = struct.Struct(">BII")
MAX_REQUEST = 1 << 20  # far above any Sig_structure or digest the parent sends


def _read_exactly(fd: int, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def frame(data: bytes) -> bytes:
    """One request frame.

    Args:
        data: the bytes to sign.

    Returns:
        ``u32 length`` + ``data``.
    """
    return HEADER.pack(len(data)) + data


def _open(config: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(session, key, sign) for the key the parent named, where ``sign(session
    handle, key handle, data)`` answers the signature or None when the module
    refused; raises capseal's typed errors."""
    from capseal.errors import DeviceError, KeyNotFoundError, TokenNotFoundError
    from capseal.keys import kid_for
    from capseal.keys.direct import direct_calls_allowed
    from capseal.keys.secret import Secret

    from ._direct import FastSign
    from ._lock import P11_LOCK
    from ._login import open_logged_in
    from ._module import load_module
    from ._objects import load_keypair
    from ._session import find_tokens
    from ._uri import PKCS11URI

    name = f"token {config['token_label']!r} (serial {config['serial']})"
    module = load_module(config["module"])  # the allow-list in the environment applies here too
    with P11_LOCK:
        tokens = find_tokens(module, PKCS11URI(token=config["token_label"], serial=config["serial"]))
    if not tokens:
        raise TokenNotFoundError(f"{name} is not present")
    pin = None if config.get("pin") is None else Secret(config.pop("pin"), "the parent process")
    config.pop("pin", None)
    session, _ = open_logged_in(tokens[0], pin, name, module.real)
    key_id = bytes.fromhex(config["key_id"]) if config["key_id"] else None
    pair = load_keypair(session, PKCS11URI(object=config["key_label"] or None, id=key_id), name)
    if kid_for(pair.public_key) != config["kid"]:
        raise KeyNotFoundError(f"{name}: the key found is not the signer's key")
    if not direct_calls_allowed():  # CAPSEAL_NO_DIRECT: python-pkcs11's plain path
        return session, pair.private, _plain_sign(pair.private, config["mechanism"])
    fast = FastSign.create(config["module"], config["mechanism"], None, config["size"],
                           software_token=True)  # one thread here: a kept GIL holds nobody up
    if fast is None:
        raise DeviceError(f"{name}: the module's function table cannot be called directly")
    return session, pair.private, fast.sign


def _plain_sign(key: Any, mechanism: int) -> Any:
    """python-pkcs11's ``key.sign``, answering None when the module refuses
    (the parent then makes that signature itself, which raises the typed
    error): the child's path under ``CAPSEAL_NO_DIRECT``."""
    from pkcs11 import Mechanism
    from pkcs11.exceptions import PKCS11Error

    kind = Mechanism(mechanism)

    def sign(_session_handle: int, _key_handle: int, data: bytes) -> bytes | None:
        try:
            return bytes(key.sign(data, mechanism=kind))
        except PKCS11Error:
            return None

    return sign


_FLUSH_AFTER = 0.02  # s: answers gathered this long are written even mid-burst


def _serve(rfd: int, wfd: int, session_handle: int, key_handle: int, sign: Any) -> None:
    """Sign every whole request read, and write their answers together: once
    per burst, and every ``_FLUSH_AFTER`` seconds within a long one. Why: one
    write per burst wakes the parent's reader once, but a long burst on a slow
    token (a smart card) would leave the parent hearing nothing for long
    enough to take the child for hung.

    Ends at end of file on stdin, and also when the parent is gone though
    stdin stays open (a process the parent forked without exec may hold its
    write end): checked each second while no request comes."""
    buffer, parent, sequence = b"", os.getppid(), 0
    while True:
        if not select.select([rfd], [], [], 1.0)[0]:
            if os.getppid() != parent:
                return
            continue
        chunk = os.read(rfd, 1 << 16)
        if not chunk:
            return
        buffer += chunk
        answers, at, since = [], 0, time.monotonic()
        while len(buffer) - at >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer, at)
            if size > MAX_REQUEST:
                return  # not our parent's protocol: stop (the parent sees end of file)
            start = at + HEADER.size
            if len(buffer) - start < size:
                break
            data, at = buffer[start: start + size], start + size
            signature = sign(session_handle, key_handle, data)
            answers.append(ANSWER.pack(1, sequence, 0) if signature is None
                           else ANSWER.pack(0, sequence, len(signature)) + signature)
            sequence = (sequence + 1) & 0xFFFFFFFF
            if time.monotonic() - since > _FLUSH_AFTER:
                _write_all(wfd, b"".join(answers))
                answers, since = [], time.monotonic()
        buffer = buffer[at:]
        if answers:
            _write_all(wfd, b"".join(answers))


def main() -> int:
    """The child's whole life: read the start frame, open the key, answer, sign until stdin closes.

    Returns:
        The exit status: 0, or 1 when the key could not be opened.
    """
    rfd, wfd = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())  # anything printed from here on goes nowhere
    os.close(null)
    header = _read_exactly(rfd, 4)
    if header is None:
        return 0
    raw = _read_exactly(rfd, HEADER.unpack(header)[0])
    if raw is None:
        return 0
    try:
        config = json.loads(raw)
        del raw
        session, key, sign = _open(config)
    except Exception as exc:
        from capseal.errors import SignerError

        message = str(exc) if isinstance(exc, SignerError) else ""
        _write_all(wfd, frame(json.dumps({"ok": False, "error": type(exc).__name__, "message": message}).encode()))
        return 1
    _write_all(wfd, frame(b'{"ok": true}'))
    try:
        _serve(rfd, wfd, session.handle, key.handle, sign)
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
    finally:
        try:
            session.close()
        except Exception:  # the token may be gone: the process ends anyway
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
