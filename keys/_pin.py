"""PINs, passphrases and TPM auth values: the one type that holds them, and
the one check every PIN passes before it reaches a device.

Why a type of its own (:class:`Secret`): error reporters that capture frame
locals (Sentry's ``include_local_variables``, a post-mortem debugger,
``traceback`` with ``capture_locals``) print every local of every frame an
exception passes through. A PIN held as a ``str`` anywhere on the way — the
CLI reading a PIN file, a backend checking it, a login that fails — is then
in the report. So a PIN is wrapped the moment it is read (a file, the
environment, a prompt, ``pin=``, a URI's pin-value, a secrets handler) and
only revealed inside the expression that hands it to the device; its
``repr`` says where it came from and nothing of it.

Why the check is here: the CLI (which reads PINs from files, the
environment and a prompt) and the backends apply the same rule, and the CLI
must not import python-pkcs11 to do it. Every login with a PIN the token
refuses uses up one of its few tries (then the PIN locks), so a PIN that
cannot be right is refused before any login.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from typing import Any

from capseal.errors import PinIncorrectError

from ._files import FileTooLargeError

__all__ = ["Secret", "as_secret", "caller_is_cli", "cli_caller", "pin_advice", "read_secret_file", "text_problem", "usable_pin"]

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
        """The value as text (the caller uses it in place, never in a variable)."""
        return self._value if isinstance(self._value, str) else self._value.decode("utf-8")  # type: ignore[attr-defined, no-any-return]

    def encoded(self) -> bytes:
        """The value as UTF-8 bytes (for a ``C_Login``, an auth value, a PEM)."""
        return self._value.encode("utf-8") if isinstance(self._value, str) else bytes(self._value)  # type: ignore[call-overload]

    def byte_length(self) -> int:
        """Length of :meth:`encoded` (a ``C_Login`` passes it beside the PIN)."""
        return len(self.encoded())

    def wipe(self) -> None:
        """Overwrite a value held in a bytearray with zeros (other values are
        immutable: dropping the Secret is all that can be done)."""
        if isinstance(self._value, bytearray):
            self._value[:] = bytes(len(self._value))

    def renamed(self, source: str) -> Secret:
        """The same value, said to come from ``source``."""
        return Secret(self._value, source)

    def with_suffix(self, where: str) -> Secret:
        """The same value, its source followed by ``where`` ("pin= for token 'x'")."""
        return Secret(self._value, f"{self.source} {where}")

    # -- checks (none quotes the value)

    @property
    def empty(self) -> bool:
        return self._value == "" or self._value == b""

    def text_problem(self) -> str | None:
        """What keeps the value from being secret text for a device or a PEM
        (not a str, or not encodable as UTF-8), never quoting it; None if it is."""
        if not isinstance(self._value, str):
            return f"is a {type(self._value).__name__}, not a str"
        try:
            self._value.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid UTF-8 text (it holds undecodable bytes)"
        return None

    def pin_problem(self) -> str | None:
        """What makes the value unusable as a PIN (never quoting it), or None."""
        if self._value == "":
            return "is empty"
        problem = self.text_problem()
        if problem is None and _CONTROL.search(self._value) is not None:  # type: ignore[call-overload]
            return "holds a control character (a line break or tab left in a file?)"
        return problem

    def usable_pin(self) -> Secret:
        """This secret if it can be sent to a token: a non-empty str that
        encodes as UTF-8 and holds no control character (a line break left
        from a file, a NUL). Otherwise PinIncorrectError naming the source
        and no part of the PIN, with no exception chained to it."""
        problem = self.pin_problem()
        if problem is None:
            return self
        raise PinIncorrectError(f"the PIN from {self.source} {problem}; refused before it reached the token",
                                hint="check where the PIN comes from: a token locks its PIN after a few wrong tries")

    def file_text(self) -> Secret | None:
        """A file's bytes as its text (strict UTF-8) without one trailing
        newline (``\\n`` or ``\\r\\n``; a PIN may itself end in other
        whitespace); None when they are not UTF-8."""
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
        """How many bytes (or characters) the value holds."""
        return len(self._value)  # type: ignore[arg-type]

    def matches(self, other: Secret | None) -> bool:
        """Whether ``other`` holds the same value (compared by HMAC, in constant time)."""
        return other is not None and hmac.compare_digest(self._hmac(), other._hmac())

    def _hmac(self) -> bytes:
        if self._digest is None:
            self._digest = hmac.new(_HMAC_KEY, self.encoded(), hashlib.sha256).digest()
        return self._digest


#: Set by the capseal command line (:func:`caller_is_cli`): hints then name
#: its options, which is all its user can change, instead of Python's ``pin=``.
_CLI_CALLER = False


def caller_is_cli() -> None:
    """Make hints about PINs name the CLI's options (the ``capseal`` command calls this)."""
    global _CLI_CALLER
    _CLI_CALLER = True


def cli_caller() -> bool:
    """Whether the caller is the capseal command line (see :func:`caller_is_cli`)."""
    return _CLI_CALLER


def pin_advice(what: str = "the PIN") -> str:
    """How this process's caller gives ``what``: the CLI's ``--pin-file``,
    ``--pin-prompt`` and ``CAPSEAL_PIN`` when it is the command line, else the
    API's ``pin=`` and ``secrets_handler=``."""
    if _CLI_CALLER:
        return f"give {what} with CAPSEAL_PIN, --pin-file FILE or --pin-prompt"
    return f"pass {what} as pin= (or give a secrets_handler=)"


def as_secret(value: object, source: str) -> Secret | None:
    """``value`` held as a :class:`Secret` from ``source`` (a Secret stays as
    it is, with its own source); None stays None."""
    if value is None or isinstance(value, Secret):
        return value
    return Secret(value, source)


def usable_pin(pin: object, source: str) -> Secret:
    """``pin`` (a str or a :class:`Secret`) as a Secret that can be sent to a
    token; PinIncorrectError naming its source otherwise (see
    :meth:`Secret.usable_pin`). A plain value is said to come from ``source``."""
    secret = as_secret(pin, source)
    del pin
    if secret is None:
        raise PinIncorrectError(f"the PIN from {source} is missing")
    return secret.usable_pin()


def text_problem(value: object) -> str | None:
    """What keeps ``value`` (a str or a :class:`Secret`) from being secret
    text for a device or a PEM, never quoting it; None if it is."""
    secret = as_secret(value, "a value")
    del value
    return None if secret is None else secret.text_problem()


def read_secret_file(path: str | os.PathLike[str], limit: int, source: str) -> tuple[Secret, os.stat_result]:
    """The bytes of the file at ``path`` as a Secret from ``source``, and its
    status (from the open file, so both describe the same file); the bytes
    are never in a variable of their own. FileTooLargeError when it holds
    more than ``limit`` bytes, OSError when it cannot be read."""
    with open(path, "rb") as fh:
        status = os.fstat(fh.fileno())
        secret = Secret(fh.read(limit + 1), source)
    if secret.size() > limit:
        raise FileTooLargeError(f"more than {limit} bytes")
    return secret, status
