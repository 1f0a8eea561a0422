"""capseal.keys.secret — PINs, passphrases and TPM auth values: the one type
that holds them, the one check every PIN passes before it reaches a device,
and the bounded reading of the small files keys and PINs live in.

>>> from capseal.keys.secret import Secret
>>> pin = Secret("4821", "environment variable CAPSEAL_PIN")
>>> pin
<secret from environment variable CAPSEAL_PIN: redacted>

Why a type of its own (:class:`Secret`): error reporters that capture frame
locals (Sentry's ``include_local_variables``, a post-mortem debugger,
``traceback`` with ``capture_locals``) print every local of every frame an
exception passes through. A PIN held as a ``str`` anywhere on the way — the
CLI reading a PIN file, a backend checking it, a login that fails — is then
in the report. So a PIN (a token's PIN, a PEM's passphrase, a TPM key's auth
value) is wrapped the moment it is read (a file, the environment, a prompt,
``pin=``, a URI's pin-value, a secrets handler) and only revealed inside the
expression that hands it to the device; its ``repr`` says where it came from
and nothing of it.

Why the PIN check is here: the CLI (which reads PINs from files, the
environment and a prompt) and the backends apply the same rule, and the CLI
must not import python-pkcs11 to do it. Every login with a PIN the token
refuses uses up one of its few tries (then the PIN locks), so a PIN that
cannot be right is refused before any login.

Why the files are read here: ``Path.read_bytes()`` reads until the end, so a
key or PIN "file" that never ends (``file:/dev/zero``,
``pin-source=/dev/urandom``) took memory until the process died. Pipes and
process substitutions (``--pin-file <(pass …)``) still work: only the size is
bounded, not the kind of file. A private key file or a PIN file is also
checked for who else can use it (:func:`exposure`), from the same open file
that was read.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
from typing import Any

from capseal.errors import KeyURIError, PinIncorrectError, SecretFileExposedError

__all__ = [
    "Secret",
    "as_secret",
    "usable_pin",
    "text_problem",
    "caller_is_cli",
    "cli_caller",
    "pin_advice",
    "read_secret_file",
    "read_pin_file",
    "read_capped",
    "exposure",
    "FileTooLargeError",
    "MAX_KEY_FILE",
    "MAX_PIN_FILE",
]

#: far above any PEM private key or TSS2 key file (RSA 8192 with openssl's Bag Attributes is ~10 KB)
MAX_KEY_FILE = 1 << 20
#: far above any PIN or passphrase
MAX_PIN_FILE = 64 << 10


class FileTooLargeError(ValueError):
    """The file holds more than the caller's limit (the caller names the file)."""


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_HMAC_KEY = os.urandom(32)  # secrets are compared by HMAC under a per-process key


class Secret:
    """A PIN, passphrase, TPM auth value or private key's bytes, with where
    it came from (``source``, for messages).

    Never shown: ``repr``/``str`` name only the source; it is not pickled
    (``TypeError``), and ``copy``/``deepcopy`` hand back the same object.
    :meth:`reveal` and :meth:`encoded` give the value to the one expression
    that passes it on (a ``C_Login``, ``tr_set_auth``, a PEM loader).
    """

    __slots__ = ("_value", "source", "_digest")

    def __init__(self, value: object, source: str) -> None:
        """Hold ``value`` (usually a str; bytes for a file's content, or
        whatever a caller passed, which the checks then name by type).

        Args:
            value: the secret.
            source: where it came from, e.g. "PIN file /etc/capseal/token.pin".
        """
        self._value = value
        self.source = source
        self._digest: bytes | None = None
        del value  # this frame keeps no copy

    # -- never shown

    def __repr__(self) -> str:
        return f"<secret from {self.source}: redacted>"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a secret is not picklable")

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Secret:  # dataclasses.asdict deep-copies values
        return self

    # -- handing it on

    def reveal(self) -> str:
        """The value as text, for the one expression that passes it on (the
        caller uses it in place, never in a variable).

        Returns:
            The value (bytes are decoded as UTF-8).

        Raises:
            UnicodeDecodeError: bytes that are not UTF-8 (check :meth:`text_problem` first).
        """
        return self._value if isinstance(self._value, str) else self._value.decode("utf-8")  # type: ignore[attr-defined]

    def encoded(self) -> bytes:
        """The value as bytes, for a ``C_Login``, a TPM auth value or a PEM.

        Returns:
            Text encoded as UTF-8; bytes as they are.

        Raises:
            UnicodeEncodeError: text that cannot be encoded (check :meth:`text_problem` first).
        """
        return self._value.encode("utf-8") if isinstance(self._value, str) else bytes(self._value)  # type: ignore[call-overload]

    def byte_length(self) -> int:
        """The length a ``C_Login`` passes beside the PIN.

        Returns:
            The length of :meth:`encoded`.
        """
        return len(self.encoded())

    def wipe(self) -> None:
        """Overwrite a value held in a bytearray with zeros (other values are
        immutable: dropping the Secret is all that can be done). Returns nothing."""
        if isinstance(self._value, bytearray):
            self._value[:] = bytes(len(self._value))

    def renamed(self, source: str) -> Secret:
        """The same value, said to come from another source.

        Args:
            source: the new source.

        Returns:
            A new Secret.
        """
        return Secret(self._value, source)

    def with_suffix(self, where: str) -> Secret:
        """The same value, its source followed by ``where``.

        Args:
            where: appended to the source, e.g. "for token 'agents'".

        Returns:
            A new Secret.
        """
        return Secret(self._value, f"{self.source} {where}")

    # -- checks (none quotes the value)

    @property
    def empty(self) -> bool:
        """Whether the value is the empty str or bytes."""
        return self._value == "" or self._value == b""

    def text_problem(self) -> str | None:
        """What keeps the value from being secret text for a device or a PEM.

        Returns:
            Why it is not (not a str, or not encodable as UTF-8), never quoting
            it; None if it is.
        """
        if not isinstance(self._value, str):
            return f"is a {type(self._value).__name__}, not a str"
        try:
            self._value.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid UTF-8 text (it holds undecodable bytes)"
        return None

    def pin_problem(self) -> str | None:
        """What makes the value unusable as a PIN.

        Returns:
            The problem (empty, not text, a control character), never quoting
            the value; None when it is usable.
        """
        if self._value == "":
            return "is empty"
        problem = self.text_problem()
        if problem is None and _CONTROL.search(self._value) is not None:  # type: ignore[call-overload]
            return "holds a control character (a line break or tab left in a file?)"
        return problem

    def usable_pin(self) -> Secret:
        """This secret, checked to be sendable to a token: a non-empty str that
        encodes as UTF-8 and holds no control character (a line break left
        from a file, a NUL).

        Returns:
            This secret.

        Raises:
            PinIncorrectError: it is not, naming the source and no part of the
                PIN, with no exception chained to it.
        """
        problem = self.pin_problem()
        if problem is None:
            return self
        raise PinIncorrectError(f"the PIN from {self.source} {problem}; refused before it reached the token",
                                hint="check where the PIN comes from: a token locks its PIN after a few wrong tries")

    def file_text(self) -> Secret | None:
        """A file's bytes as its text.

        Returns:
            The text (strict UTF-8) without one trailing newline (``\\n`` or
            ``\\r\\n``; a PIN may itself end in other whitespace), as a Secret
            from the same source; None when the bytes are not UTF-8.
        """
        try:
            text = Secret(self.encoded().decode("utf-8"), self.source)
        except UnicodeDecodeError:
            return None
        return text._without_newline()

    def _without_newline(self) -> Secret:
        text: str = self._value  # type: ignore[assignment]  # file_text made it a str
        out = Secret(text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text, self.source)
        del text
        return out

    def size(self) -> int:
        """The value's size.

        Returns:
            How many bytes (or characters) it holds.
        """
        return len(self._value)  # type: ignore[arg-type]

    def matches(self, other: Secret | None) -> bool:
        """Whether another secret holds the same value.

        Args:
            other: the secret to compare with (None never matches).

        Returns:
            True when both values are equal (compared by HMAC under a
            per-process key, in constant time).
        """
        return other is not None and hmac.compare_digest(self._hmac(), other._hmac())

    def _hmac(self) -> bytes:
        if self._digest is None:
            self._digest = hmac.new(_HMAC_KEY, self.encoded(), hashlib.sha256).digest()
        return self._digest


#: Set by the capseal command line (:func:`caller_is_cli`): hints then name
#: its options, which is all its user can change, instead of Python's ``pin=``.
_CLI_CALLER = False


def caller_is_cli(is_cli: bool = True) -> None:
    """Make hints about PINs name the CLI's options (the ``capseal`` command
    calls this), or, with ``is_cli=False``, the API's again.

    Args:
        is_cli: whether this process's caller is the capseal command line.
    """
    global _CLI_CALLER
    _CLI_CALLER = bool(is_cli)


def cli_caller() -> bool:
    """Whether the caller is the capseal command line.

    Returns:
        True after :func:`caller_is_cli` (and until ``caller_is_cli(False)``).
    """
    return _CLI_CALLER


def pin_advice(what: str = "the PIN") -> str:
    """How this process's caller gives ``what``.

    Args:
        what: the secret named in the advice, e.g. "its passphrase".

    Returns:
        The CLI's ``CAPSEAL_PIN``, ``--pin-file`` and ``--pin-prompt`` when the
        caller is the command line, else the API's ``pin=`` and ``secrets_handler=``.
    """
    if _CLI_CALLER:
        return f"give {what} with CAPSEAL_PIN, --pin-file FILE or --pin-prompt"
    return f"pass {what} as pin= (or give a secrets_handler=)"


def as_secret(value: object, source: str) -> Secret | None:
    """``value`` held as a :class:`Secret`.

    Args:
        value: a str (or anything a caller passed), a Secret, or None.
        source: where a plain value came from.

    Returns:
        A Secret from ``source``; a Secret stays as it is, with its own source;
        None stays None.
    """
    if value is None or isinstance(value, Secret):
        return value
    return Secret(value, source)


def usable_pin(pin: object, source: str) -> Secret:
    """``pin`` as a Secret that can be sent to a token (see :meth:`Secret.usable_pin`).

    Args:
        pin: a str or a :class:`Secret`.
        source: where a plain value came from.

    Returns:
        The PIN as a Secret.

    Raises:
        PinIncorrectError: the PIN is missing or unusable, naming its source and no part of it.
    """
    secret = as_secret(pin, source)
    del pin
    if secret is None:
        raise PinIncorrectError(f"the PIN from {source} is missing")
    return secret.usable_pin()


def text_problem(value: object) -> str | None:
    """What keeps ``value`` from being secret text for a device or a PEM.

    Args:
        value: a str or a :class:`Secret`.

    Returns:
        The problem, never quoting the value; None if it is usable text.
    """
    secret = as_secret(value, "a value")
    del value
    return None if secret is None else secret.text_problem()


# ---------------------------------------------------------------------------- files


def read_capped(path: str | os.PathLike[str], limit: int) -> tuple[bytes, os.stat_result]:
    """The bytes of a (non-secret) file and its status.

    Args:
        path: the file.
        limit: the most bytes it may hold.

    Returns:
        The bytes and the status, taken from the open file, so both describe
        the same file whatever is renamed meanwhile.

    Raises:
        FileTooLargeError: it holds more than ``limit`` bytes.
        OSError: it cannot be read.
    """
    with open(path, "rb") as fh:
        status = os.fstat(fh.fileno())
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(f"more than {limit} bytes")
    return data, status


def read_secret_file(path: str | os.PathLike[str], limit: int, source: str) -> tuple[Secret, os.stat_result]:
    """The bytes of a file that holds a secret, as a Secret, and its status;
    the bytes are never in a variable of their own.

    Args:
        path: the file.
        limit: the most bytes it may hold.
        source: where the secret is said to come from.

    Returns:
        The content as a Secret from ``source``, and the open file's status.

    Raises:
        FileTooLargeError: it holds more than ``limit`` bytes.
        OSError: it cannot be read.
    """
    with open(path, "rb") as fh:
        status = os.fstat(fh.fileno())
        secret = Secret(fh.read(limit + 1), source)
    if secret.size() > limit:
        raise FileTooLargeError(f"more than {limit} bytes")
    return secret, status


def read_pin_file(path: str, what: str) -> Secret:
    """The PIN a file holds: its UTF-8 text without one trailing newline
    (``\\n`` or ``\\r\\n``; a PIN may itself end in other whitespace).
    Shared by a PKCS#11 URI's ``pin-source`` and the CLI's ``--pin-file``, so
    both read a file alike; the content is never in a variable as text or
    bytes, not even for a file that is then refused.

    Args:
        path: the file.
        what: how the file is named in messages, e.g. "PIN file /etc/capseal/pin".

    Returns:
        The PIN as a Secret from ``what``.

    Raises:
        KeyURIError: naming ``what``, never the content: it cannot be read, is too large or not UTF-8.
        SecretFileExposedError: other users can read or change it (see :func:`exposure`).
    """
    try:
        data, status = read_secret_file(path, MAX_PIN_FILE, what)
    except OSError as exc:
        raise KeyURIError(f"{what}: cannot be read: {exc.strerror}") from None
    except FileTooLargeError as exc:  # /dev/urandom read until memory ran out
        raise KeyURIError(f"{what} holds {exc}, more than any PIN or passphrase") from None
    exposed = exposure(status)
    if exposed is not None:
        raise SecretFileExposedError(f"{what} {exposed}: whoever can read it can log in to the token as this "
                                     "user; refused", hint=f"chmod 600 {path}")
    pin = data.file_text()
    if pin is None:
        raise KeyURIError(f"{what} is not UTF-8 text; refused before it reached the token")
    return pin


def exposure(status: os.stat_result) -> str | None:
    """Why a file holding a secret (a private key, a PIN) is open to other users.

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
    processes at its ends.

    Args:
        status: the file's status (from the open file that was read).

    Returns:
        The reason, completing "key file X …", or None when it is not exposed.
    """
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
