"""Reading the small files a key or PIN lives in, with a bound on their size.

Why: ``Path.read_bytes()`` reads until the end, so a key or PIN "file" that
never ends (``file:/dev/zero``, ``pin-source=/dev/urandom``) took memory until
the process died. Pipes and process substitutions (``--pin-file <(pass …)``)
still work: only the size is bounded, not the kind of file.

A private key file or a PIN file is also checked for who else can use it
(:func:`exposure`), from the same open file that was read."""

from __future__ import annotations

import os
import stat

__all__ = ["MAX_KEY_FILE", "MAX_PIN_FILE", "FileTooLargeError", "exposure", "read_capped"]

#: far above any PEM private key or TSS2 key file (RSA 8192 with openssl's Bag Attributes is ~10 KB)
MAX_KEY_FILE = 1 << 20
#: far above any PIN or passphrase
MAX_PIN_FILE = 64 << 10


class FileTooLargeError(ValueError):
    """The file holds more than the caller's limit (the caller names the file)."""


def read_capped(path: str | os.PathLike[str], limit: int) -> tuple[bytes, os.stat_result]:
    """The bytes of the file at ``path`` and its status (taken from the open
    file, so both describe the same file, whatever is renamed meanwhile);
    FileTooLargeError when it holds more than ``limit`` bytes, OSError when
    it cannot be read."""
    with open(path, "rb") as fh:
        status = os.fstat(fh.fileno())
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(f"more than {limit} bytes")
    return data, status


def exposure(status: os.stat_result) -> str | None:
    """Why a file holding a secret (a private key, a PIN) is open to other
    users (completing "key file X …"), or None when it is not.

    The rule is OpenSSH's for private keys, one step stricter: a file that
    every user of the host may read or write is refused whoever owns it, one
    its group may change is refused, and one its group may read is refused
    when it is this user's own (``root:capseal 0640``, a secret kept readable
    for a service's group by another owner, stays usable). Why refuse and not
    warn: whoever can read the key can sign records as this producer, and no
    custody statement can say which records they were; whoever can read a
    token's PIN can do the same wherever they reach the token (a network HSM,
    a connector on localhost). Only regular files are checked: a pipe
    (``file:/dev/stdin``, a process substitution) is private to the two
    processes at its ends."""
    if not stat.S_ISREG(status.st_mode):
        return None
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o006:
        verb = {0o004: "read", 0o002: "changed"}.get(mode & 0o006, "read and changed")
        return f"can be {verb} by every user of this host (mode {mode:04o})"
    if mode & 0o020:
        return f"can be changed by its group (mode {mode:04o})"
    if mode & 0o040 and status.st_uid == os.getuid():
        return f"is owned by this user and readable by its group (mode {mode:04o})"
    return None
