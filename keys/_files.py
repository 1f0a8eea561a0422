"""Reading the small files a key or PIN lives in, with a bound on their size.

Why: ``Path.read_bytes()`` reads until the end, so a key or PIN "file" that
never ends (``file:/dev/zero``, ``pin-source=/dev/urandom``) took memory until
the process died. Pipes and process substitutions (``--pin-file <(pass …)``)
still work: only the size is bounded, not the kind of file."""

from __future__ import annotations

import os
import stat

__all__ = ["MAX_KEY_FILE", "MAX_PIN_FILE", "FileTooLargeError", "read_capped"]

#: far above any PEM private key or TSS2 key file (RSA 8192 with openssl's Bag Attributes is ~10 KB)
MAX_KEY_FILE = 1 << 20
#: far above any PIN or passphrase
MAX_PIN_FILE = 64 << 10


class FileTooLargeError(ValueError):
    """The file holds more than the caller's limit (the caller names the file)."""


def read_capped(path: str | os.PathLike[str], limit: int) -> tuple[bytes, int]:
    """The bytes of the file at ``path`` and its permission bits (read from
    the open file, so both describe the same file); FileTooLargeError when it
    holds more than ``limit`` bytes, OSError when it cannot be read."""
    with open(path, "rb") as fh:
        mode = stat.S_IMODE(os.fstat(fh.fileno()).st_mode)
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(f"more than {limit} bytes")
    return data, mode
