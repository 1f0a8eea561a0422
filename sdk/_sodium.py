"""libsodium's Ed25519 verify, for the producer's check of each device
signature before it is written, and a verifier's first check of a profile
envelope, when the system has libsodium.

Why: with a token's signatures made in a signing process, the producer's
CPU per record bounds the sealed rate, and this check is its largest part;
libsodium's verify costs about half of OpenSSL's (``bench/keys.py`` prints
the rates with each).

Why it is safe to use for this check: libsodium (1.0.16 and later, without
``ED25519_COMPAT``) accepts a subset of what OpenSSL accepts. Both compute
the cofactorless equation, compare R byte for byte and require S < L;
libsodium also refuses small-order and non-canonical R and A. So a signature
it accepts is one OpenSSL (cryptography, the reference verifier's library)
accepts too, and the check never lets through what a verifier would refuse.

The producer's self-check uses it; a verifier uses it only to accept: a
signature libsodium refuses is checked again by cryptography, whose answer
stands, so a verifier's findings match the reference's either way. It is
loaded through ctypes (which lets go of the GIL during the call, as
cryptography does), on
first use, and only after it has agreed with cryptography on a signature
made here, the same signature over another message and an altered
signature; if the library is missing or disagrees, the check stays with
cryptography (:func:`verifier` returns None, :func:`ed25519_check` says
which). ``hardware/install-deps.sh`` installs it (Debian: libsodium23).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable

__all__ = ["Ed25519Check", "ed25519_check", "verifier"]

#: (signature, message, raw 32-byte public key) -> the signature verifies
Ed25519Check = Callable[[bytes, bytes, bytes], bool]

# Debian/Ubuntu (1.0.18: .23; 1.0.19 and later: .26), then whatever the linker knows
_NAMES = ("libsodium.so.26", "libsodium.so.23")

_lock = threading.Lock()
_loaded = False
_check: Ed25519Check | None = None


def verifier() -> Ed25519Check | None:
    """libsodium's Ed25519 check, or None (missing, or it disagreed with
    cryptography at load): loaded once per process, on first use."""
    global _loaded, _check
    if not _loaded:
        with _lock:
            if not _loaded:
                _check = _load()
                _loaded = True
    return _check


def ed25519_check() -> str:
    """Which library makes the producer's Ed25519 check in this process."""
    return "libsodium" if verifier() is not None else "cryptography"


def _library() -> ctypes.CDLL | None:
    for name in _NAMES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    found = ctypes.util.find_library("sodium")  # runs ldconfig: only when the usual names are not there
    if found is None:
        return None
    try:
        return ctypes.CDLL(found)
    except OSError:
        return None


def _load() -> Ed25519Check | None:
    lib = _library()
    if lib is None:
        return None
    try:
        if lib.sodium_init() < 0:
            return None
        verify = lib.crypto_sign_ed25519_verify_detached
    except AttributeError:  # not libsodium after all
        return None
    verify.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulonglong, ctypes.c_char_p]
    verify.restype = ctypes.c_int

    def check(signature: bytes, message: bytes, public: bytes) -> bool:
        return len(signature) == 64 and len(public) == 32 and verify(signature, message, len(message), public) == 0

    return check if _agrees(check) else None


def _agrees(check: Ed25519Check) -> bool:
    """The library takes a signature cryptography made and refuses it over
    another message, altered in R, altered in S, and with S + L (a
    non-canonical scalar, which OpenSSL refuses too), and refuses the
    neutral point's "signature" (R = neutral, S = 0) under the neutral key.
    Why the last two: a libsodium built with ``ED25519_COMPAT``, or older
    than 1.0.16, checks neither, and would accept what OpenSSL refuses (S + L)
    or what capseal's verifiers refuse (a small-order key); then cryptography
    keeps the check."""
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes_raw()
    message = b"capseal device-signature check"
    signature = key.sign(message)
    s_plus_l = (int.from_bytes(signature[32:], "little") + _L).to_bytes(32, "little")
    neutral = bytes([1]) + bytes(31)
    if check(neutral + bytes(32), message, neutral):
        return False
    refused = (
        (signature, message + b"!"),
        (bytes([signature[0] ^ 1]) + signature[1:], message),
        (signature[:40] + bytes([signature[40] ^ 1]) + signature[41:], message),
        (signature[:32] + s_plus_l, message),
    )
    return check(signature, message, public) and not any(check(sig, msg, public) for sig, msg in refused)


_L = 2**252 + 27742317777372353535851937790883648493  # the order of the Ed25519 base point
