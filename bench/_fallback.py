"""Bench only: the producer's Ed25519 check of device signatures made by
cryptography (OpenSSL) instead of libsodium, for one arm.

Why: capseal makes that check with libsodium when the system has it
(``capseal._sodium``) and with cryptography otherwise. ``bench/keys.py``
seals through both in the same run so the fallback's figure sits beside the
default's. Nothing here is imported by capseal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from capseal import _sodium


@contextlib.contextmanager
def cryptography_check() -> Iterator[None]:
    """For the block, capseal checks Ed25519 device signatures as it does on
    a system without libsodium (a private switch: the module's loaded state)."""
    saved = _sodium._loaded, _sodium._check
    _sodium._loaded, _sodium._check = True, None
    try:
        yield
    finally:
        _sodium._loaded, _sodium._check = saved
