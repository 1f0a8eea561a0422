"""Bench only: what SoftHSM2 Ed25519 sealing would reach if the producer's
check of each device signature used libsodium instead of cryptography.

Why this exists: on this 2-vCPU host the producer process's CPU per record
bounds the sealed rate (``bench/keys.py`` prints it), and the largest single
part is the Ed25519 verify the producer runs on every device signature
(design §3 principle 3): OpenSSL's, through cryptography, about 120 µs here;
libsodium's about 60 µs. libsodium is not a capseal dependency (the design
card names cryptography), so capseal does not use it; this arm measures what
taking it would buy, for whoever decides. Nothing here is imported by capseal.

The arm swaps capseal's private signature check for the length of one arm
(``swapped_verify``), Ed25519 keys only, through ctypes on the system's
libsodium; when the library is not installed the arm is left out, and the
run says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Callable, Iterator
from typing import Any


def _load() -> Callable[[bytes, bytes, bytes], bool] | None:
    name = ctypes.util.find_library("sodium")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    if lib.sodium_init() < 0:
        return None
    verify = lib.crypto_sign_ed25519_verify_detached  # ctypes lets go of the GIL during the call
    verify.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulonglong, ctypes.c_char_p]
    verify.restype = ctypes.c_int

    def ok(signature: bytes, data: bytes, public: bytes) -> bool:
        return len(signature) == 64 and len(public) == 32 and verify(signature, data, len(data), public) == 0
    return ok if _agrees(ok) else None


def _agrees(ok: Callable[[bytes, bytes, bytes], bool]) -> bool:
    """libsodium accepts a signature cryptography made and refuses it altered."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    signature = key.sign(b"capseal")
    return ok(signature, b"capseal", public) and not ok(signature, b"capseaL", public) and \
        not ok(bytes([signature[0] ^ 1]) + signature[1:], b"capseal", public)


SODIUM_VERIFY = _load()


@contextlib.contextmanager
def swapped_verify() -> Iterator[None]:
    """capseal's check of Ed25519 signatures made by libsodium for the block."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    import capseal.envelope as envelope

    assert SODIUM_VERIFY is not None
    sodium, original = SODIUM_VERIFY, envelope._signature_ok
    raw: dict[int, tuple[Any, bytes]] = {}

    def check(alg: str, key: Any, signature: bytes, tbs: bytes) -> bool:
        if alg != "EdDSA" or not isinstance(key, ed25519.Ed25519PublicKey):
            return original(alg, key, signature, tbs)
        kept = raw.get(id(key))
        if kept is None or kept[0] is not key:
            kept = raw[id(key)] = (key, key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
        return sodium(signature, tbs, kept[1])

    envelope._signature_ok = check
    try:
        yield
    finally:
        envelope._signature_ok = original
