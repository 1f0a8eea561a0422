"""A judge model pinned by what it is and how it was asked (family §6, ``Basis``).

Why a pin: a model verdict is only attributable if the record says which model
(``model_id``), which prompt (``prompt_digest`` — computed here from the prompt's
bytes, never typed in), which axes, which weights and which sampling settings.
Sampling values are integers, strings or booleans: a float can change in
serialization alone, so it is refused; :func:`decimal_string` and :func:`micros`
turn one into a form that cannot drift.

The pin's own digest is never stored in a record (family §9); a calibration
summary cites the pin by the digest of its JSON, computed by ``Target``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import Field

from capseal.canonical import MAX_SAFE_INTEGER
from capseal.errors import JudgmentRefusedError

from .citation import DigestRef, JudgePart, NonEmpty, Target, utf8_of

__all__ = ["JudgePin", "decimal_string", "micros", "check_sampling", "bytes_of"]

SamplingValue = Annotated[int, Field(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)] | str | bool


def decimal_string(value: float | int | str | Decimal) -> str:
    """The exact decimal a number was written as, never in exponent form.

    A float gives the shortest repr that round-trips (``0.7`` → ``"0.7"``), so
    what a person typed is what is stored.

    Args:
        value: a float, an int, a decimal string or a ``Decimal``.

    Returns:
        The decimal string (``"0"`` for zero and minus zero).

    Raises:
        JudgmentRefusedError: ``sampling_float`` for NaN or an infinity;
            ``sampling_value_type`` for a bool or text that is no decimal.
    """
    if isinstance(value, bool):
        raise JudgmentRefusedError("a boolean is not a number", rule="sampling_value_type")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise JudgmentRefusedError(f"{value!r} has no decimal form", rule="sampling_float")
        dec = Decimal(repr(value))
    else:
        try:
            dec = Decimal(str(value))
        except InvalidOperation:
            raise JudgmentRefusedError(f"{value!r} is not a decimal number", rule="sampling_value_type") from None
        if not dec.is_finite():
            raise JudgmentRefusedError(f"{value!r} has no decimal form", rule="sampling_float")
    text = format(dec, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def micros(value: float | int | str | Decimal) -> int:
    """``value`` × 10⁶ as an exact integer (``0.7`` → ``700000``).

    Args:
        value: what :func:`decimal_string` takes.

    Returns:
        The integer.

    Raises:
        JudgmentRefusedError: ``sampling_float`` for a value with more than six
            decimals (never rounded) and as :func:`decimal_string`;
            ``unsafe_integer`` beyond ±(2^53−1).
    """
    scaled = Decimal(decimal_string(value)) * 1_000_000
    if scaled != scaled.to_integral_value():
        raise JudgmentRefusedError(f"{value!r} has more than six decimals; store it with decimal_string()", rule="sampling_float")
    out = int(scaled)
    if abs(out) > MAX_SAFE_INTEGER:
        raise JudgmentRefusedError(f"{value!r} in micros is outside the safe integer range", rule="unsafe_integer")
    return out


def check_sampling(sampling: Mapping[str, Any], path: str = "$.sampling") -> dict[str, Any]:
    """Sampling settings as int / str / bool only.

    Args:
        sampling: name → value.
        path: where they are (for the refusal).

    Returns:
        A new dict of the settings.

    Raises:
        JudgmentRefusedError: ``sampling_float`` for a float (the message
            gives its :func:`decimal_string` and :func:`micros` forms);
            ``sampling_value_type`` for a name that is not a non-empty str or
            a value of another type; ``unsafe_integer`` beyond ±(2^53−1).
    """
    if not isinstance(sampling, Mapping):
        raise JudgmentRefusedError("sampling is an object of name → int | str | bool", rule="sampling_value_type", path=path)
    out: dict[str, Any] = {}
    for key, value in sampling.items():
        where = f"{path}.{key}"
        if not isinstance(key, str) or not key:
            raise JudgmentRefusedError("sampling names are non-empty strings", rule="sampling_value_type", path=path)
        if isinstance(value, float):
            raise JudgmentRefusedError(
                f"{key}={value!r} is a float; write decimal_string({value!r}) = {decimal_string(value)!r}"
                + (f" or micros({value!r}) = {micros(value)} under '{key}_micros'" if _fits_micros(value) else ""),
                rule="sampling_float",
                path=where,
            )
        if type(value) not in (int, str, bool):
            raise JudgmentRefusedError(f"{key} is {type(value).__name__}; sampling values are int, str or bool", rule="sampling_value_type", path=where)
        if type(value) is int and abs(value) > MAX_SAFE_INTEGER:
            raise JudgmentRefusedError(f"{key}={value} is outside the safe integer range", rule="unsafe_integer", path=where)
        out[key] = value
    return out


def _fits_micros(value: float) -> bool:
    try:
        micros(value)
    except JudgmentRefusedError:
        return False
    return True


class JudgePin(JudgePart):
    """The ``Basis`` block: ``judge_pin`` in evaluation-report/v1, ``basis`` in
    adjudication/v1. Build it with :meth:`pin` so every digest comes from bytes."""

    model_id: NonEmpty
    prompt_digest: DigestRef
    sampling: dict[str, SamplingValue]
    axes_digest: DigestRef = None  # type: ignore[assignment]
    weights_digest: DigestRef = None  # type: ignore[assignment]

    @classmethod
    def pin(
        cls,
        *,
        model_id: str,
        prompt: bytes | str | Target,
        sampling: Mapping[str, Any],
        axes: bytes | str | Target | None = None,
        weights: bytes | Target | None = None,
    ) -> JudgePin:
        """Pin a judge.

        Args:
            model_id: the judge's model (non-blank).
            prompt: the published prompt's bytes (text is taken as its UTF-8
                bytes) or a Target computed from them.
            sampling: the sampling settings (:func:`check_sampling`).
            axes: the axes file, likewise, or None.
            weights: the weights file's bytes or Target, or None.

        Returns:
            The pin, every digest computed from bytes.

        Raises:
            JudgmentRefusedError: ``judge_unpinned`` for a blank model id or a
                file given as anything but its bytes, text or Target; as
                :func:`check_sampling`.
        """
        if not isinstance(model_id, str) or not model_id.strip():
            raise JudgmentRefusedError("a judge is pinned by a non-empty model_id", rule="judge_unpinned", path="$.model_id")
        fields: dict[str, Any] = {
            "model_id": model_id,
            "prompt_digest": _ref(prompt, "prompt"),
            "sampling": check_sampling(sampling),
        }
        if axes is not None:
            fields["axes_digest"] = _ref(axes, "axes")
        if weights is not None:
            fields["weights_digest"] = _ref(weights, "weights")
        return cls(**fields)

    def target(self) -> Target:
        """The pin as a citable JSON value (a calibration summary cites it).

        Returns:
            The Target of the pin's JSON.
        """
        return Target.of_json(self.to_json(), type="judge-pin")


def bytes_of(value: Any, what: str, *, path: str = "$") -> bytes:
    """The bytes a published file's digest covers.

    Args:
        value: ``bytes``/``bytearray``/``memoryview`` (taken as they are) or
            text (its UTF-8 bytes).
        what: what the file is (for the refusal).
        path: where it is (for the refusal).

    Returns:
        The bytes.

    Raises:
        JudgmentRefusedError: ``citation_content_type`` for anything else
            (``bytes(5)`` would silently be five zero bytes) or text with a
            lone surrogate.
    """
    if isinstance(value, str):
        return utf8_of(value, f"the {what}")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise JudgmentRefusedError(f"the {what} is given as its bytes or its text (str), not {type(value).__name__}",
                               rule="citation_content_type", path=path)


def _ref(value: bytes | str | Target, what: str) -> DigestRef:
    if isinstance(value, Target):
        return DigestRef.of(value)
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return DigestRef.of_bytes(bytes_of(value, what))
    raise JudgmentRefusedError(f"the {what} is given as its bytes (or a Target), never as a typed-in digest", rule="judge_unpinned", path=f"$.{what}_digest")
