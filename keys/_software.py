"""Software keys: PKCS#8 PEM files and an in-memory key for tests.

Both are labelled software in their custody statement. ``UnsafeEphemeralSigner``
carries the ``Unsafe`` prefix (as in sigstore-python) because its key dies with
the process: records it signs can be verified, but nobody can sign as it again.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from capseal.errors import (
    KeyNotFoundError,
    KeyURIError,
    PinIncorrectError,
    SecretFileExposedError,
    UnsupportedAlgorithmError,
)

from ._base import SignatureResult, Signer, alg_for_public_key
from ._registry import check_options
from .custody import custody_statement
from .secret import (
    MAX_KEY_FILE,
    FileTooLargeError,
    Secret,
    as_secret,
    cli_caller,
    exposure,
    pin_advice,
    read_secret_file,
)

__all__ = ["SoftwareSigner", "FileSigner", "UnsafeEphemeralSigner", "generate_private_key", "write_pkcs8"]

_ALGS = ("EdDSA", "ES256", "ES384", "PS256")
_PRIVATE_KEY_TYPES = (ed25519.Ed25519PrivateKey, ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)


def generate_private_key(alg: str) -> Any:
    """A fresh software private key.

    Args:
        alg: a COSE algorithm name (EdDSA, ES256, ES384, PS256) or its CLI
            spelling (ed25519, p256, p384, rsa-pss).

    Returns:
        A ``cryptography`` private key (RSA: 3072 bits).

    Raises:
        UnsupportedAlgorithmError: an unknown algorithm.
    """
    if alg in ("EdDSA", "ed25519"):
        return ed25519.Ed25519PrivateKey.generate()
    if alg in ("ES256", "p256"):
        return ec.generate_private_key(ec.SECP256R1())
    if alg in ("ES384", "p384"):
        return ec.generate_private_key(ec.SECP384R1())
    if alg in ("PS256", "rsa-pss"):
        return rsa.generate_private_key(public_exponent=65537, key_size=3072)
    raise UnsupportedAlgorithmError(f"unknown algorithm {alg!r}; use one of {_ALGS}")


def _passphrase(pin: object, source: str) -> Secret | None:
    """``pin`` (a str or a Secret) as a PEM passphrase; None for no
    passphrase. Anything but a str that encodes as UTF-8 is
    PinIncorrectError naming its source and chaining nothing: ``bytes`` has
    no ``encode`` and a UnicodeEncodeError's args hold the whole passphrase."""
    secret = as_secret(pin, source)
    del pin
    if secret is None or secret.empty:
        return None
    problem = secret.text_problem()  # a PIN's text rule; control characters stay allowed in a PEM passphrase
    if problem is not None:
        raise PinIncorrectError(f"the passphrase from {secret.source} {problem}")
    return secret


def write_pkcs8(key: Any, path: str | os.PathLike[str], passphrase: bytes | Secret | None = None) -> Path:
    """Write ``key`` as PKCS#8 PEM with mode 0600 (created exclusively).

    Args:
        key: a ``cryptography`` private key.
        path: the new file (never overwritten).
        passphrase: encrypts the PEM when given (bytes, or a secret held by capseal).

    Returns:
        The path written.

    Raises:
        FileExistsError: something is at ``path`` already. OSError: it cannot be written.
    """
    secret = as_secret(passphrase, "passphrase=")
    del passphrase
    enc: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(secret.encoded()) if secret is not None and not secret.empty
        else serialization.NoEncryption()
    )
    # the PEM is the private key itself: held as a secret, never as bytes in a frame
    pem = Secret(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc), "a new key")
    target = Path(path)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem.encoded())
    except BaseException:
        # created above (O_EXCL), so ours: a truncated PEM left there would
        # block creating the key again and load as 'not a PEM private key'
        target.unlink(missing_ok=True)
        raise
    return target


class SoftwareSigner(Signer):
    """A private key held by ``cryptography`` in this process.

    >>> signer = SoftwareSigner(ed25519.Ed25519PrivateKey.generate())   # doctest: +SKIP
    """

    def __init__(self, private_key: Any, *, uri: str = "memory:", key_store: str = "memory",
                 extra: dict[str, Any] | None = None) -> None:
        """Sign with ``private_key``.

        Args:
            private_key: a ``cryptography`` Ed25519, EC (P-256, P-384) or RSA (2048 bits or more) private key.
            uri: how the key is named in messages and custody statements (default ``memory:``: a key
                held only by this process, which no URI opens again).
            key_store: the custody statement's ``key_store`` (default ``memory``).
            extra: more custody statement members.

        Raises:
            UnsupportedAlgorithmError: ``private_key`` is not such a key.
        """
        if not isinstance(private_key, _PRIVATE_KEY_TYPES):
            # named: it was an AttributeError from private_key.public_key(), or a PEM taken for a key
            raise UnsupportedAlgorithmError(
                f"private_key is a {type(private_key).__name__}, not a cryptography private key (Ed25519, EC P-256/"
                "P-384 or RSA); load a PEM with cryptography's serialization.load_pem_private_key, or open it "
                "with open_signer('file:/path/key.pem')")
        self._key: Any = private_key
        self._public = private_key.public_key()
        self._alg = alg_for_public_key(self._public)
        self._uri = uri
        self._key_store = key_store
        self._extra = extra or {}
        self._lock = threading.Lock()  # cryptography keys are thread-safe; this guards close()

    @property
    def alg(self) -> str:
        """The COSE algorithm of the key."""
        return self._alg

    @property
    def public_key(self) -> Any:
        """The key's ``cryptography`` public key."""
        return self._public

    @property
    def uri(self) -> str:
        """How the key is named (``memory:``, ``file:…``, ``unsafe-ephemeral:``)."""
        return self._uri

    def sign(self, data: bytes) -> SignatureResult:
        """Sign ``data`` with the key in this process (see :meth:`Signer.sign`).

        Args:
            data: the message.

        Returns:
            The signature (ECDSA as raw r‖s; PS256 with salt 32).

        Raises:
            SignerUnavailableError: the signer was closed.
        """
        key = self._key
        if key is None:
            from capseal.errors import SignerUnavailableError

            raise SignerUnavailableError(f"{self.describe_short()} was closed")
        alg = self._alg
        if alg == "EdDSA":
            sig = key.sign(data)
        elif alg in ("ES256", "ES384"):
            size = 32 if alg == "ES256" else 48
            der = key.sign(data, ec.ECDSA(hashes.SHA256() if alg == "ES256" else hashes.SHA384()))
            r, s = decode_dss_signature(der)
            sig = r.to_bytes(size, "big") + s.to_bytes(size, "big")
        else:
            sig = key.sign(data, padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32), hashes.SHA256())
        return SignatureResult(sig, self.kid, alg)

    def describe(self) -> dict[str, Any]:
        """The custody statement: backend ``software``, ``software_device`` true.

        Returns:
            The statement.
        """
        return custody_statement(
            backend="software",
            alg=self._alg,
            kid=self.kid,
            public_key=self._public,
            software_device=True,
            key_store=self._key_store,
            extra=self._extra,
        )

    def close(self) -> None:
        """Drop the private key: later signatures raise SignerUnavailableError. Idempotent."""
        with self._lock:
            self._key = None


class FileSigner(SoftwareSigner):
    """``file:/path/key.pem``: a PKCS#8 PEM private key (Ed25519, P-256, P-384,
    RSA ≥ 2048 for PS256). An encrypted PEM takes its passphrase as ``pin``."""

    def __init__(self, path: str | os.PathLike[str], *, pin: str | Secret | None = None, pin_source: str = "pin=") -> None:
        password = _passphrase(pin, pin_source)  # before the file is read: a bad one is refused whatever the file
        del pin
        p = Path(path)
        try:
            data, status = read_secret_file(p, MAX_KEY_FILE, f"key file {p}")  # the private key: never plain bytes here
        except FileNotFoundError:
            raise KeyNotFoundError(f"no key file at {p}") from None
        except OSError as exc:
            raise KeyNotFoundError(f"cannot read key file {p}: {exc.strerror}") from None
        except FileTooLargeError as exc:  # /dev/zero read until memory ran out
            raise KeyNotFoundError(f"key file {p} holds {exc}: no PEM private key is that large") from None
        try:
            key = serialization.load_pem_private_key(data.encoded(),
                                                     password=None if password is None else password.encoded())
        except TypeError:
            if password is None:
                raise PinIncorrectError(f"key file {p} is encrypted; {pin_advice('its passphrase')}") from None
            raise PinIncorrectError(f"key file {p} is not encrypted; give no passphrase for it"
                                    + (" (unset CAPSEAL_PIN, leave out --pin-file)" if cli_caller() else "")) from None
        except ValueError:
            if password is not None:
                raise PinIncorrectError(f"the passphrase for key file {p} is incorrect (or the file is not PKCS#8 PEM)") from None
            raise KeyNotFoundError(f"{p} is not a PEM private key") from None
        except Exception as exc:  # unsupported key types raise various errors
            raise UnsupportedAlgorithmError(f"{p}: {type(exc).__name__}") from None
        exposed = exposure(status)
        if exposed is not None:  # checked once the file is known to hold a private key; the key is dropped
            del key
            raise SecretFileExposedError(f"key file {p} {exposed}: whoever can read it can sign as this key; "
                                         "refused, as OpenSSH refuses such a key", hint=f"chmod 600 {p}")
        try:
            alg_for_public_key(key.public_key())
        except UnsupportedAlgorithmError as exc:  # name the file, as the errors above do
            raise UnsupportedAlgorithmError(f"key file {p}: {exc}") from None
        super().__init__(
            key,
            uri=file_uri(p.absolute()),  # reopens this file from any working directory
            key_store="file",
            extra={"file_mode": f"{stat.S_IMODE(status.st_mode):04o}", "encrypted": password is not None},
        )

    @classmethod
    def from_uri(cls, uri: str, *, pin: str | Secret | None = None, secrets_handler: Any = None,
                 **options: Any) -> FileSigner:
        """``open_signer`` entry point for ``file:/path.pem``.

        Args:
            uri: the key file's ``file:`` URI (an absolute path).
            pin: the passphrase of an encrypted PEM.
            secrets_handler: asked for the passphrase when the PEM is encrypted and no ``pin`` is given.
            options: none are taken; any is refused.

        Returns:
            The signer.

        Raises:
            UnknownOptionError: for an option a file key does not take.
            KeyURIError, KeyNotFoundError, PinIncorrectError, SecretFileExposedError,
            UnsupportedAlgorithmError: see :class:`FileSigner`.
        """
        check_options("open_signer for a file: key", options, _FILE_OPTIONS)
        pin = as_secret(pin, "pin=")
        path = cls.path_of(uri)
        if pin is None and secrets_handler is not None and _is_encrypted(path):
            return cls(path, pin=as_secret(secrets_handler(f"passphrase for {path}"), "secrets_handler"))
        return cls(path, pin=pin)

    @staticmethod
    def path_of(uri: str) -> str:
        """The path a ``file:`` key URI names.

        Args:
            uri: ``file:/absolute/path.pem`` (RFC 8089); a name's bytes that are not
                UTF-8 are read back as written by :func:`file_uri`.

        Returns:
            The absolute path.

        Raises:
            KeyURIError: not a ``file:`` URI, a query or fragment, a host other than
                localhost, no path, a relative path, or a NUL byte (the URI is never echoed).
        """
        parts = urlsplit(uri)
        if parts.scheme != "file":
            raise KeyURIError(f"not a file: key URI: {parts.scheme}:…")
        if parts.query or parts.fragment:  # never echoed: a stray ?pin=… would be quoted
            raise KeyURIError(f"file: key URIs take no {'query' if parts.query else 'fragment'}; write a '?' or "
                              "'#' in the file's name as %3F or %23")
        if parts.netloc not in ("", "localhost"):
            raise KeyURIError("file: key URIs must name a local path")
        # bytes that are not UTF-8 come back as the file name's own bytes (as file_uri
        # wrote them), not as U+FFFD, which would name another file
        path = unquote(parts.path, errors="surrogateescape")
        if not path:
            raise KeyURIError("file: key URI has no path")
        if not path.startswith("/"):
            # RFC 8089 §2: a file URI's path is absolute. A relative one named
            # whatever file the working directory held when the key was opened
            raise KeyURIError("file: key URIs name an absolute path (RFC 8089); write file:/full/path/to/key.pem, "
                              "not a path relative to the working directory")
        if "\x00" in path:  # the OS call would raise a bare ValueError ('embedded null byte')
            raise KeyURIError("file: key URI path holds a NUL byte (%00), which no file path can")
        return path


def file_uri(path: str | os.PathLike[str]) -> str:
    """The ``file:`` URI that :meth:`FileSigner.path_of` reads back as ``path``:
    ``%``, ``?``, ``#`` and the like are percent-encoded, or the URI capseal
    prints would name another file or be refused as having a query.

    Args:
        path: the file.

    Returns:
        The URI.
    """
    return "file:" + quote(os.fspath(path), safe="/", errors="surrogateescape")


def _is_encrypted(path: str) -> bool:
    """Whether the PEM at ``path`` needs a passphrase, so that a
    secrets_handler is asked only then. Looks past the first line: openssl
    puts text (Bag Attributes) before the PEM, and an encrypted traditional
    PEM (``openssl ec -aes256``) says so in a Proc-Type header."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_PEM_HEAD)
    except OSError:
        return False
    return b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in head or b"Proc-Type: 4,ENCRYPTED" in head


#: What ``open_signer`` takes for a file: key.
_FILE_OPTIONS = ("pin", "secrets_handler")

#: How much of a key file :func:`_is_encrypted` reads: more than any text
#: openssl writes before a PEM block, far less than a large file.
_PEM_HEAD = 64 * 1024


class UnsafeEphemeralSigner(SoftwareSigner):
    """A key generated in memory for tests and demos; it dies with the process.

    Its URI is ``unsafe-ephemeral:ALG``: asked for by a name that says what it
    is, since nobody can pin a key that did not exist before the process, and
    nobody can sign as it again."""

    def __init__(self, alg: str = "EdDSA") -> None:
        super().__init__(generate_private_key(alg), uri="unsafe-ephemeral:", key_store="memory")

    @classmethod
    def from_uri(cls, uri: str, *, pin: str | None = None, secrets_handler: Any = None,
                 **options: Any) -> UnsafeEphemeralSigner:
        """``open_signer("unsafe-ephemeral:EdDSA")`` (or ``:ES256`` …): a new key in memory.

        Args:
            uri: ``unsafe-ephemeral:ALG`` (EdDSA when no algorithm is named).
            pin: means nothing here.
            secrets_handler: means nothing here.
            options: none is taken; any is refused.

        Returns:
            The signer.

        Raises:
            UnknownOptionError: an option given.
            UnsupportedAlgorithmError: an unknown algorithm.
        """
        check_options("open_signer for an unsafe-ephemeral: key", options, _FILE_OPTIONS)
        alg = urlsplit(uri).path or "EdDSA"
        return cls(alg)


def refuse_ephemeral_uri(uri: str, **_: Any) -> Signer:
    """``ephemeral:`` is refused: a throwaway key is asked for by its unsafe name.

    Args:
        uri: the ``ephemeral:`` URI.
        _: whatever options came with it.

    Returns:
        Never.

    Raises:
        KeyURIError: always, naming ``unsafe-ephemeral:``.
    """
    alg = urlsplit(uri).path if isinstance(uri, str) else ""
    raise KeyURIError(
        "an ephemeral key dies with the process: nobody can pin it beforehand or sign as it again, so records it "
        f"signs verify only as signed by an unpinned key; ask for one by its unsafe name, unsafe-ephemeral:{alg or 'EdDSA'}, "
        "for tests and demos only",
        hint="keep a key: capseal keys create file:/path/key.pem --alg ed25519")


def create_file_key(uri: str, alg: str, *, pin: str | Secret | None = None, secrets_handler: Any = None,
                    **options: Any) -> FileSigner:
    """``capseal keys create file:/path --alg …``: a new PKCS#8 PEM (mode 0600,
    never overwriting), encrypted with ``pin`` when one is given.

    Args:
        uri: where the new key goes (``file:/absolute/path.pem``).
        alg: a COSE algorithm name (EdDSA, ES256, ES384, PS256).
        pin: the passphrase to encrypt the PEM with (none: not encrypted).
        secrets_handler: not asked (a new key's passphrase is ``pin``).
        options: none are taken; any is refused.

    Returns:
        The new key, opened.

    Raises:
        UnknownOptionError: for an option a file key does not take.
        KeyURIError: the URI is not a file: URI, or the file exists or cannot be written.
        PinIncorrectError: ``pin`` is not text.
    """
    check_options("keys create for a file: key", options, _FILE_OPTIONS)
    pin = passphrase = _passphrase(pin, "pin=")
    path = FileSigner.path_of(uri)
    try:  # typed, as the other backends' refusals are: the CLI printed these as 'internal error'
        write_pkcs8(generate_private_key(alg), path, passphrase=passphrase)
    except FileExistsError:  # O_EXCL: a file, or a symlink planted at the path, even a dangling one
        raise KeyURIError(f"{path} already exists; capseal never overwrites a key file") from None
    except OSError as exc:
        raise KeyURIError(f"cannot write key file {path}: {exc.strerror}") from None
    try:
        return FileSigner(path, pin=pin)
    except BaseException:  # a Ctrl-C (or any failure) before the caller has the key: the new file goes too
        Path(path).unlink(missing_ok=True)
        raise


def list_file_keys(uri: str, *, pin: str | Secret | None = None, secrets_handler: Any = None,
                   **options: Any) -> list[dict[str, Any]]:
    """PEM private keys in a directory (``file:/dir``), or the one file named.

    Args:
        uri: a ``file:`` URI of a directory or a key file.
        pin: the passphrase of encrypted PEMs.
        secrets_handler: not asked.
        options: none are taken; any is refused.

    Returns:
        One entry per file: ``uri``, ``alg`` and ``kid``, or ``uri`` and
        ``error`` (the type of what stopped it from opening).

    Raises:
        UnknownOptionError: for an option a file key does not take.
        KeyNotFoundError: nothing is at the path.
    """
    check_options("keys list for file: keys", options, _FILE_OPTIONS)
    pin = as_secret(pin, "pin=")
    target = Path(FileSigner.path_of(uri))
    if not target.exists():  # was a one-entry list saying KeyNotFoundError, which the CLI printed as a success
        raise KeyNotFoundError(f"no key file or directory at {target}")
    files = sorted(target.glob("*.pem")) if target.is_dir() else [target]
    out: list[dict[str, Any]] = []
    for f in files:
        try:
            signer = FileSigner(f, pin=pin)
        except Exception as exc:  # list what can be listed; say why the rest cannot
            out.append({"uri": file_uri(f), "error": type(exc).__name__})
            continue
        out.append({"uri": signer.uri, "alg": signer.alg, "kid": signer.kid})
    return out


def delete_file_key(uri: str, *, kid: str | None = None, pin: str | Secret | None = None, secrets_handler: Any = None,
                    **options: Any) -> dict[str, Any]:
    """``capseal keys delete file:/path.pem``: remove the key file.

    Args:
        uri: the key file's ``file:`` URI.
        kid: when given, the file must hold the key with this kid (what the
            operator was shown); an encrypted file is then opened with ``pin``.
        pin: the passphrase of an encrypted file, needed only with ``kid``.
        secrets_handler: not asked.
        options: none are taken; any is refused.

    Returns:
        ``uri`` and ``deleted`` (what was removed).

    Raises:
        UnknownOptionError: for an option a file key does not take.
        KeyNotFoundError: no file there.
        KeyURIError: the file is not a PEM private key (it is left alone), or holds another key than ``kid``.
    """
    check_options("keys delete for a file: key", options, _FILE_OPTIONS)
    pin = as_secret(pin, "pin=")
    path = Path(FileSigner.path_of(uri))
    if not path.is_file():
        raise KeyNotFoundError(f"no key file at {path}")
    try:
        with open(path, "rb") as fh:
            head = fh.read(_PEM_HEAD)
    except OSError as exc:
        raise KeyURIError(f"cannot read key file {path}: {exc.strerror}") from None
    if b"PRIVATE KEY-----" not in head:
        raise KeyURIError(f"{path} is not a PEM private key; capseal deletes only key files, and left it alone")
    if kid is not None and FileSigner(path, pin=pin).kid != kid:
        raise KeyURIError(f"{path} now holds another key than the one shown (kid {kid[:16]}…); not deleted")
    path.unlink()
    return {"uri": file_uri(path.absolute()), "deleted": [f"key file {path}"]}
