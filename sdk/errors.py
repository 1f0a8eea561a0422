"""One small hierarchy of typed errors for everything capseal refuses.

Why one hierarchy: callers (agent frameworks, CLIs, CI) need to tell "your input is
wrong" from "the key device is unreachable" from "the ledger is damaged" without
parsing messages, and every refusal must leave the ledger exactly as it was.

Rules every error here follows:

* the message names *what* is wrong and *where* (a JSON path, a key URI without
  its PIN, a TCTI, a ledger path);
* no secret (PIN, private key bytes, pin-value query) ever reaches ``str()``,
  ``repr()`` or ``diagnostics()``;
* verifiers never raise these: they return findings instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "CapsealError",
    "InputError",
    "MalformedJSONError",
    "CanonicalizationError",
    "FloatInDigestError",
    "UnsafeIntegerError",
    "NonJSONValueError",
    "CapsuleValidationError",
    "AssuranceError",
    "AssuranceOverclaimError",
    "AssuranceMismatchError",
    "SealAbortedError",
    "CoseFormatError",
    "SignerError",
    "KeyURIError",
    "MissingExtraError",
    "UnknownOptionError",
    "SignerUnavailableError",
    "TokenNotFoundError",
    "KeyNotFoundError",
    "SecretFileExposedError",
    "PinIncorrectError",
    "PinLockedError",
    "DeviceError",
    "TPMObjectMemoryError",
    "UnsupportedAlgorithmError",
    "SignatureFailedError",
    "LedgerError",
    "LedgerClosedError",
    "DuplicateRecordError",
    "LedgerCorruptError",
    "LedgerBusyError",
    "NotALedgerError",
    "LedgerFormatError",
    "LedgerUnavailableError",
    "LedgerAccessDeniedError",
    "ForkedProcessError",
    "LedgerForkedError",
    "SignerForkedError",
    "EvidenceError",
    "EvidenceForkedError",
    "JudgmentError",
    "JudgmentRefusedError",
    "RefereeError",
    "RefereeInputError",
    "CaseFileError",
    "PairRefusedError",
    "RefereeUnreachableError",
    "ToolCallBlockedError",
    "ToolCallPairingError",
    "shown",
]


def shown(value: Any, limit: int = 60) -> str:
    """A short description of a caller's value for an error message.

    Args:
        value: anything a caller passed.
        limit: the most characters of a string's or scalar's repr shown.

    Returns:
        The value's repr, cut to ``limit`` characters, for strings and
        small scalars; the type and size for containers and huge integers.
        Never raises: ``repr`` of an integer of more than 4,300 digits, of a
        deeply nested list or of a list that contains itself does.
    """
    t = type(value)
    if value is None or t is bool:
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 200:
            return f"<an integer of {value.bit_length()} bits>"
        text = int.__repr__(value)
    elif isinstance(value, float):
        text = float.__repr__(value)
    elif isinstance(value, str):
        text = str.__repr__(value)
    elif isinstance(value, (bytes, bytearray)):
        return f"<{t.__name__} of length {len(value)}>"
    elif isinstance(value, (dict, list, tuple, set, frozenset)):
        return f"<a {t.__name__} of {len(value)} items>"
    else:
        return f"<a {t.__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


class CapsealError(Exception):
    """Base of every error capseal raises on purpose.

    ``diagnostics()`` returns a longer human explanation (what to do next), in the
    style of sigstore-python's errors; ``str()`` stays one line.
    """

    hint: str = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint

    def diagnostics(self) -> str:
        """The message and, when there is one, the hint on the next line.

        Returns:
            The text a command line prints for this error.
        """
        text = str(self)
        return f"{text}\n{self.hint}" if self.hint else text


# --------------------------------------------------------------------------- input


class InputError(CapsealError, ValueError):
    """The caller's input cannot become an honest capsule; nothing was written."""


class MalformedJSONError(InputError):
    """Bytes that were supposed to be JSON are not (or have duplicate keys)."""


class CanonicalizationError(InputError):
    """A value cannot be put into RFC 8785 canonical form under the -05 rules.

    ``path`` is a JSONPath-like location (``$.effect.request_digest``).
    """

    def __init__(self, message: str, *, path: str, hint: str | None = None) -> None:
        super().__init__(f"{message} at {path}", hint=hint)
        self.path = path


class FloatInDigestError(CanonicalizationError):
    """-05 §2: JSON floating-point values are forbidden in digest-bearing material."""

    hint = "Write amounts and quantities as exact decimal strings, e.g. \"12.50\"."


class UnsafeIntegerError(CanonicalizationError):
    """-05 §2: integers beyond ±(2^53−1) must be decimal strings."""

    hint = "Represent integers outside ±9007199254740991 as decimal strings."


class NonJSONValueError(CanonicalizationError):
    """A value that is not JSON (bytes, Decimal, a non-string key, a lone surrogate)."""


class CapsuleValidationError(InputError):
    """The capsule (or a block of it) breaks a -05 rule the typed model enforces.

    ``errors`` lists ``(path, message)`` pairs, one per broken rule.
    """

    def __init__(self, errors: list[tuple[str, str]], *, hint: str | None = None) -> None:
        self.errors = errors
        listed = "; ".join(f"{p}: {m}" for p, m in errors[:5])
        more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
        super().__init__(f"capsule refused: {listed}{more}", hint=hint)


class AssuranceError(InputError):
    """The caller supplied an assurance value that the evidence does not give."""

    def __init__(self, message: str, *, field: str, claimed: Any, derived: Any) -> None:
        super().__init__(message)
        self.field = field
        self.claimed = claimed
        self.derived = derived


class AssuranceOverclaimError(AssuranceError):
    """-05 §5.4: a producer MUST NOT record an assurance mode it did not achieve."""

    hint = "Leave `assurance` out: capseal derives every mode from the record's own evidence."


class AssuranceMismatchError(AssuranceError):
    """A supplied assurance value differs from the derived one (without being higher)."""

    hint = "Leave `assurance` out: capseal derives every mode from the record's own evidence."


class SealAbortedError(CapsealError):
    """capseal's own verifier found an error in a capsule about to be sealed.

    ``findings`` holds the verifier's error findings. Nothing was signed or written.
    """

    def __init__(self, message: str, findings: list[Any]) -> None:
        super().__init__(message)
        self.findings = findings


class CoseFormatError(CapsealError, ValueError):
    """Bytes (or header values) that are not a COSE_Sign1 capseal reads or writes.

    ``refusals`` holds every ``(rule, detail)`` the check found, in the order
    it makes them (``capseal.cose.Refusal`` names the rules); ``rule`` and
    ``str()`` are the first one's.
    """

    def __init__(self, refusals: Sequence[tuple[str, str]]) -> None:
        if not refusals:
            raise ValueError("a CoseFormatError names at least one refusal")
        self.refusals: tuple[tuple[str, str], ...] = tuple((str(rule), str(detail)) for rule, detail in refusals)
        super().__init__(self.refusals[0][1])

    @property
    def rule(self) -> str:
        """The first refusal's rule."""
        return self.refusals[0][0]


# --------------------------------------------------------------------------- keys


class SignerError(CapsealError):
    """A key could not be opened or could not sign. Nothing was written."""


class KeyURIError(SignerError, ValueError):
    """A key URI is malformed or names an unknown scheme (the PIN is never echoed)."""


class MissingExtraError(SignerError, ImportError):
    """An optional backend's Python package or system library is missing."""


class UnknownOptionError(SignerError, TypeError):
    """An option given to ``open_signer`` (or a provisioning call) that the
    key's backend does not take: the message names it and lists the valid
    ones. Why refused: a misspelled option (``modul_allowlist=``) would
    otherwise be dropped without a word, and with it what it asked for."""


class SignerUnavailableError(SignerError):
    """The module, token or TPM cannot be reached right now."""


class TokenNotFoundError(SignerError):
    """No PKCS#11 token with the requested label/serial is present."""


class KeyNotFoundError(SignerError):
    """The token or TPM has no key matching the URI."""


class SecretFileExposedError(SignerError):
    """A file holding a private key or a PIN that other users of the host can
    read or change (OpenSSH refuses such a key file); nothing in it was used."""


class PinIncorrectError(SignerError):
    """The token refused the PIN. The PIN itself is never included."""


class PinLockedError(SignerError):
    """The token's PIN is locked after too many wrong attempts."""


class DeviceError(SignerError):
    """The token or TPM returned an error during an operation."""


class TPMObjectMemoryError(DeviceError):
    """The TPM has no free transient object slots (TPM_RC_OBJECT_MEMORY)."""


class UnsupportedAlgorithmError(SignerError):
    """The key's algorithm cannot make the requested signature or envelope."""


class SignatureFailedError(SignerError):
    """A signature was produced but does not verify against the key's public key."""


# --------------------------------------------------------------------------- ledger


class LedgerError(CapsealError):
    """The ledger refused or could not complete an operation."""


class LedgerClosedError(LedgerError):
    """The ledger (or producer) was used after close()."""


class DuplicateRecordError(LedgerError):
    """A record with this capsule id / action id is already in the ledger."""


class LedgerCorruptError(LedgerError):
    """The ledger file is not a capseal ledger or its hash chain is broken."""


class LedgerBusyError(LedgerError):
    """Another connection kept the ledger file locked past the lock timeout
    (the file may be fine: a lock is not damage). Nothing was written."""


class NotALedgerError(LedgerCorruptError):
    """The file is not a capseal ledger: another application's SQLite
    database, or not SQLite at all (or its header is damaged). Nothing was
    written to it."""


class LedgerFormatError(LedgerCorruptError):
    """A capseal ledger of a format this capseal does not read or write."""


class LedgerUnavailableError(LedgerError):
    """The ledger's database server cannot be reached (down, restarting, an
    unknown or unreachable host, the connection lost). Records not yet
    acknowledged are not written; the ledger reconnects on its next use."""


class LedgerAccessDeniedError(LedgerError):
    """The ledger's database server refused the credentials (a wrong
    password, an unknown user). The password is never included."""


# --------------------------------------------------------------------------- fork


class ForkedProcessError(CapsealError):
    """A Producer, Ledger, TPM signer or batch evidence worker was used in a
    process forked (without exec) from the process that opened it, or a
    PKCS#11 module could not be made this process's own after such a fork.
    Nothing was signed, queued or written.

    Why a refusal: the parent's SQLite connections, TPM connection and worker
    threads do not carry across ``fork()`` (SQLite forbids using a connection
    in the child; the threads do not exist there). Raised as one of the
    subclasses below, so code that already catches LedgerError around ledger
    calls, SignerUnavailableError around a device or EvidenceError around
    evidence still catches it; catch this class to handle the fork case alone.
    """

    hint = "Open a new Ledger, Producer or signer in this process (or start workers with 'spawn' or 'forkserver')."


class LedgerForkedError(ForkedProcessError, LedgerError):
    """A Ledger, or a Producer (through its ledger), used in a forked process."""


class SignerForkedError(ForkedProcessError, SignerUnavailableError):
    """A signer whose device connection belongs to the parent process (a TPM
    signer) used in a forked process; a signer opened there works. Also a
    PKCS#11 module the fork could not make its own."""


# --------------------------------------------------------------------------- other


class EvidenceError(CapsealError):
    """A hardware quote could not be taken or did not verify; the slot stays null."""


class EvidenceForkedError(ForkedProcessError, EvidenceError):
    """A batch evidence worker (``capseal.attest.BatchEvidence``) used in a
    process forked (without exec) from the one that started it. Nothing was
    queued: its worker thread is not in this process, so an id queued there
    would never be quoted, and a flush could not honestly say anything was."""

    hint = ("Create a new BatchEvidence (capseal.attest.attach) in this process, with a Ledger or Producer "
            "and a quoter opened there (or start workers with 'spawn' or 'forkserver').")


class JudgmentError(CapsealError):
    """Base for judgment-record errors."""


class JudgmentRefusedError(JudgmentError, InputError):
    """A judgment record breaks a rule of its shape; ``rule`` names the rule."""

    def __init__(self, message: str, *, rule: str, path: str = "$") -> None:
        super().__init__(f"{rule}: {message} (at {path})")
        self.rule = rule
        self.path = path


# --------------------------------------------------------------------------- twins and a referee


class RefereeError(JudgmentError):
    """Base for the twin comparison and referee (``capseal.judge.referee``)."""


class RefereeInputError(RefereeError, InputError):
    """A value given to the referee machinery (a setting, a roster entry, a
    history row, a draw) is not one it can use; ``path`` names where.
    Nothing was recorded."""

    def __init__(self, message: str, *, path: str = "$", hint: str | None = None) -> None:
        super().__init__(f"{message} (at {path})", hint=hint)
        self.path = path


class CaseFileError(RefereeInputError):
    """A referee case file could not be read as one (not JSON, a member
    missing or of the wrong type, an unknown setting). Nothing was recorded."""


class PairRefusedError(RefereeInputError):
    """Two halves that are not a pair the rules may compare: a forged half,
    an answer that is not the body its record signs, a half whose server
    announced no key, one half alone, halves of different requests. ``rule``
    names the rule (``V1``, ``P1`` …) and ``reason`` the refusal. Nothing was
    recorded and no referee was asked."""

    def __init__(self, message: str, *, rule: str, reason: str, path: str = "$") -> None:
        super().__init__(f"{reason}: {message}", path=path)
        self.rule = rule
        self.reason = reason


class RefereeUnreachableError(RefereeError):
    """A referee's re-answer did not come (a timeout, a refused connection,
    an error status, an answer that is not a chat completion). The pair's one
    call is spent all the same."""


# --------------------------------------------------------------------------- agent-framework integrations


class ToolCallBlockedError(CapsealError):
    """Fail-closed (``capseal.integrations``): a tool call was stopped before
    it ran, because its planned capsule could not be sealed; ``__cause__`` is
    the seal's error. Nothing of the call was recorded, and the tool did not run."""


class ToolCallPairingError(CapsealError):
    """An agent framework reported a tool call's end that cannot be paired
    with one start: no start was seen for its ids, or two calls still open
    share them. Nothing was sealed for that end (never paired by a guess)."""
