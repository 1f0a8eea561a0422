"""The ``Signer`` seam every backend implements (software, PKCS#11, TPM 2.0).

Shaped after securesystemslib's signer: a small ABC, one subpackage (or
private module) per backend, and a scheme registry (``_registry.py``). A signer signs bytes and
returns the signature *together with* the key id and algorithm it used, so a key
that is rotated between two calls can never be paired with the wrong kid.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from capseal.errors import UnsupportedAlgorithmError

__all__ = ["Signer", "SignatureResult", "PendingSignature", "kid_for", "alg_for_public_key", "SignerSelfTest"]


@dataclass(frozen=True)
class SignatureResult:
    """A signature in COSE form (raw r‖s for ECDSA) with the key that made it."""

    signature: bytes
    kid: str
    alg: str

    def __repr__(self) -> str:
        return f"SignatureResult(alg={self.alg!r}, kid={self.kid[:16]}…, {len(self.signature)} bytes)"


class PendingSignature(ABC):
    """A signature on its way (see :meth:`Signer.begin_sign`)."""

    @abstractmethod
    def result(self) -> SignatureResult:
        """Wait for the signature.

        Returns:
            The signature, as :meth:`Signer.sign` returns it.

        Raises:
            SignerError: what :meth:`Signer.sign` would have raised.
        """

    def cancel(self) -> None:
        """The signature is no longer wanted: a device queue drops the command
        if it has not started (a started one finishes and is thrown away).
        Returns nothing, raises nothing."""

    @staticmethod
    def deferred(call: Callable[[bytes], SignatureResult], data: bytes) -> PendingSignature:
        """A pending signature that is made only when ``result()`` is called.

        Args:
            call: makes the signature (``signer.sign``, or a backend's own path).
            data: what ``call`` is given.

        Returns:
            The pending signature.
        """
        return _SignOnResult(call, data)


class _SignOnResult(PendingSignature):
    """The default: nothing happens until ``result()``, which makes the call
    (``signer.sign(data)``, or a backend's own in-process path)."""

    __slots__ = ("_call", "_data")

    def __init__(self, call: Callable[[bytes], SignatureResult], data: bytes) -> None:
        self._call, self._data = call, data

    def result(self) -> SignatureResult:
        return self._call(self._data)


def alg_for_public_key(public_key: Any) -> str:
    """The COSE algorithm a capseal signer uses for a kind of key.

    Args:
        public_key: a ``cryptography`` public key.

    Returns:
        ``EdDSA`` (Ed25519), ``ES256`` (P-256), ``ES384`` (P-384) or ``PS256`` (RSA of 2048 bits or more).

    Raises:
        UnsupportedAlgorithmError: another curve, a smaller RSA key, or another kind of key (each named).
    """
    if isinstance(public_key, ed25519.Ed25519PublicKey):
        return "EdDSA"
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        if public_key.curve.name == "secp256r1":
            return "ES256"
        if public_key.curve.name == "secp384r1":
            return "ES384"
        # named, or the refusal reads as if EC keys were not supported at all
        raise UnsupportedAlgorithmError(f"EC keys on curve {public_key.curve.name} are not supported; use P-256 or P-384")
    if isinstance(public_key, rsa.RSAPublicKey):
        if public_key.key_size >= 2048:
            return "PS256"
        raise UnsupportedAlgorithmError(f"RSA keys of {public_key.key_size} bits are not supported; PS256 needs at least 2048")
    raise UnsupportedAlgorithmError(f"keys of type {type(public_key).__name__} are not supported")


def kid_for(public_key: Any) -> str:
    """The key id of a public key, in hex.

    Args:
        public_key: a ``cryptography`` public key.

    Returns:
        For Ed25519 the raw 32-byte public key, as the AAC profile's COSE
        ``kid`` (label 4) must be; for other keys SHA-256 of the DER
        SubjectPublicKeyInfo, so the kid pins the exact public key.
    """
    if isinstance(public_key, ed25519.Ed25519PublicKey):
        return public_key.public_bytes_raw().hex()
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


class Signer(ABC):
    """A signing key. Subclasses hold a key in software, a token or a TPM.

    Contract:
      * ``sign(data)`` signs the *message* ``data`` (hashing it itself where the
        algorithm needs a digest) and returns a :class:`SignatureResult`;
      * ``alg`` is a COSE algorithm name (``EdDSA``, ``ES256``, ``ES384``,
        ``PS256``); ``public_key`` is a ``cryptography`` public key; ``kid`` is
        :func:`kid_for` of it;
      * ``describe()`` returns the custody statement: only what was *observed*;
      * ``uri`` never contains a PIN;
      * raises only :class:`capseal.errors.SignerError` subclasses.
    """

    #: True when signatures come from outside this process's own crypto library
    #: (a token or TPM): the producer then verifies every signature it gets back.
    external_device: bool = False

    #: True when :meth:`begin_sign` hands the work to the device's own command
    #: queue and returns at once (the TPM backend): the producer's pipeline
    #: then queues signatures straight to the device instead of keeping a
    #: thread that waits on each one.
    queues_signatures: bool = False

    @property
    @abstractmethod
    def alg(self) -> str:
        """The COSE algorithm name: ``EdDSA``, ``ES256``, ``ES384`` or ``PS256``."""

    @property
    @abstractmethod
    def public_key(self) -> Any:
        """The ``cryptography`` public key of the key that signs."""

    @property
    def kid(self) -> str:
        """The key id (:func:`kid_for` of :attr:`public_key`), computed once."""
        cached = getattr(self, "_kid_cache", None)
        if cached is None:
            cached = kid_for(self.public_key)
            self._kid_cache = cached
        return cached

    @property
    def public_key_raw(self) -> bytes:
        """The raw 32-byte Ed25519 public key (the AAC profile's kid).

        Raises:
            UnsupportedAlgorithmError: the key is not an Ed25519 key.
        """
        cached = getattr(self, "_raw_cache", None)
        if cached is None:
            key = self.public_key
            if not isinstance(key, ed25519.Ed25519PublicKey):
                raise UnsupportedAlgorithmError(f"{self.alg} keys have no raw Ed25519 form")
            cached = self._raw_cache = key.public_bytes_raw()
        return cached

    def public_key_pem(self) -> str:
        """The public key as PEM.

        Returns:
            The SubjectPublicKeyInfo PEM text (what ``capseal verify --trust`` pins).
        """
        pem: bytes = self.public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        return pem.decode("ascii")

    @property
    @abstractmethod
    def uri(self) -> str:
        """The key's URI with any PIN removed."""

    @abstractmethod
    def sign(self, data: bytes) -> SignatureResult:
        """Sign the message ``data`` (the signer hashes it where the algorithm needs a digest).

        Args:
            data: the message, e.g. a COSE Sig_structure.

        Returns:
            The signature in COSE form with the kid and alg of the key that made it.

        Raises:
            SignerError: a subclass naming the key and what went wrong (never a PIN).
        """

    def begin_sign(self, data: bytes) -> PendingSignature:
        """Start signing ``data``. By default the signature is made inside
        ``result()``; a backend whose device queues commands
        (``queues_signatures``) overrides this so that several signatures can be
        in the queue at once and the device never waits for the caller between
        two of them.

        Args:
            data: the message, as for :meth:`sign`.

        Returns:
            The pending signature: its ``result()`` gives what :meth:`sign` would
            return or raise.

        Raises:
            SignerError: the signer cannot take the request at all (closed).
        """
        return PendingSignature.deferred(self.sign, data)

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """The custody statement (see :mod:`capseal.keys.custody`): only what was observed.

        Returns:
            The statement, a dict of JSON values (no float, no secret).

        Raises:
            SignerError: the device cannot be asked (closed, gone).
        """

    def describe_short(self) -> str:
        """How the signer is named in messages.

        Returns:
            ``ClassName(uri)``, never with a PIN.
        """
        return f"{type(self).__name__}({self.uri})"

    def forget_cached_key(self) -> None:
        """Called after a signature of this signer did not verify under its
        public key: a backend that caches a loaded key (a TPM key file's
        handle, which another process may have reused for another key) loads
        it again, with its checks, for the next signature. Nothing to forget
        by default; returns nothing.
        """

    def close(self) -> None:
        """Release sessions or handles. Idempotent; raises nothing."""

    def __enter__(self) -> Signer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        """Safe at any stage: a signer whose ``__init__`` failed half-way is
        still printed (tracebacks with captured locals, debuggers, logs), as
        ``<Name (not open)>`` instead of raising from inside the repr."""
        try:
            alg, kid, uri = self.alg, self.kid, self.uri
        except Exception:
            return f"<{type(self).__name__} (not open)>"
        return f"{type(self).__name__}(alg={alg!r}, kid={kid[:16]}…, uri={uri!r})"


class SignerSelfTest:
    """Pairwise consistency check run once when a signer is put to use: sign a
    fixed message and verify it with the public key. Catches a key/public-key
    mismatch (wrong token object, wrong file) before any record depends on it."""

    MESSAGE = b"capseal signer self-test v1"

    @staticmethod
    def run(signer: Signer) -> None:
        """Sign :data:`MESSAGE` and verify the signature with the signer's public key.

        Args:
            signer: the signer, open.

        Raises:
            SignatureFailedError: the public key rejects the signature (the
                device paired the private key with another key's public key).
            SignerError: the signature could not be made.
        """
        from capseal.cose import signature_ok
        from capseal.errors import SignatureFailedError

        result = signer.sign(SignerSelfTest.MESSAGE)
        if not signature_ok(result.alg, signer.public_key, result.signature, SignerSelfTest.MESSAGE):
            raise SignatureFailedError(
                f"{signer.describe_short()} produced a signature its own public key rejects",
                hint="the private key and the public key the device reports for it are not one key pair "
                     "(e.g. a public-key object with the same CKA_ID or label that belongs to another key); "
                     "do not hand out or use this public key",
            )
