"""A strict, small CBOR reader and the few encoders COSE_Sign1 needs.

Why our own: the producer-envelope profile (-05 §3.1) requires shortest-form,
definite-length CBOR, no tag but the outer 18 and no duplicate map labels. A
general decoder silently accepts all of those, so the envelope verifier reads
bytes with this one, which refuses them with a reason. Encoding is deterministic
(RFC 8949 §4.2.1 preferred serialization) for the few types we write.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["CBORError", "Tagged", "decode_strict", "enc_head", "enc_bytes", "enc_text", "enc_int", "encode", "plain_map",
           "unwrap_map"]


class CBORError(ValueError):
    """Bytes are not well-formed strict CBOR (the reason says why)."""


@dataclass(frozen=True)
class Tagged:
    tag: int
    value: Any


class _Float(float):
    """A float read from CBOR (kept distinct so -8.0 never passes as the int -8)."""


def enc_head(major: int, arg: int) -> bytes:
    """Shortest-form head for a major type and argument.

    Args:
        major: the major type, 0 to 7.
        arg: the argument (a length, a value, a tag), 0 to 2^64−1.

    Returns:
        The head's bytes.

    Raises:
        OverflowError: ``arg`` needs more than 64 bits.
    """
    mt = major << 5
    if arg < 24:
        return bytes((mt | arg,))
    if arg < 0x100:
        return bytes((mt | 24, arg))
    if arg < 0x10000:
        return bytes((mt | 25,)) + arg.to_bytes(2, "big")
    if arg < 0x100000000:
        return bytes((mt | 26,)) + arg.to_bytes(4, "big")
    return bytes((mt | 27,)) + arg.to_bytes(8, "big")


def enc_int(value: int) -> bytes:
    """An integer, shortest form (major type 0 or 1).

    Args:
        value: from −2^64 to 2^64−1.

    Returns:
        Its CBOR bytes.

    Raises:
        OverflowError: beyond that range.
    """
    return enc_head(0, value) if value >= 0 else enc_head(1, -1 - value)


def enc_bytes(value: bytes) -> bytes:
    """A byte string (major type 2).

    Args:
        value: the bytes.

    Returns:
        Its CBOR bytes.
    """
    return enc_head(2, len(value)) + value


def enc_text(value: str) -> bytes:
    """A text string (major type 3), UTF-8.

    Args:
        value: the text.

    Returns:
        Its CBOR bytes.

    Raises:
        UnicodeEncodeError: the text holds a lone surrogate.
    """
    raw = value.encode("utf-8")
    return enc_head(3, len(raw)) + raw


def encode(value: Any) -> bytes:
    """Deterministic encoding of ints, bytes, str, lists, dicts (keys in given
    order: callers pass them already sorted) and Tagged.

    Args:
        value: None, a bool, int, bytes, str, list, tuple, dict or Tagged, nested.

    Returns:
        Its CBOR bytes.

    Raises:
        CBORError: a value of another type (a float, say).
        OverflowError: an integer beyond 64 bits.
    """
    if isinstance(value, bool) or value is None:
        return b"\xf5" if value is True else b"\xf4" if value is False else b"\xf6"
    if isinstance(value, int):
        return enc_int(value)
    if isinstance(value, (bytes, bytearray)):
        return enc_bytes(bytes(value))
    if isinstance(value, str):
        return enc_text(value)
    if isinstance(value, (list, tuple)):
        return enc_head(4, len(value)) + b"".join(encode(v) for v in value)
    if isinstance(value, dict):
        return enc_head(5, len(value)) + b"".join(encode(k) + encode(v) for k, v in value.items())
    if isinstance(value, Tagged):
        return enc_head(6, value.tag) + encode(value.value)
    raise CBORError(f"cannot encode {type(value).__name__}")


def _half_to_float(h: int) -> float:
    value: float = struct.unpack(">e", h.to_bytes(2, "big"))[0]
    return value


class _Reader:
    def __init__(self, data: bytes, max_depth: int) -> None:
        self.data = data
        self.pos = 0
        self.max_depth = max_depth
        self.tags_seen = 0

    def _take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise CBORError("truncated CBOR")
        out = self.data[self.pos:end]
        self.pos = end
        return out

    def _arg(self, info: int) -> int:
        if info < 24:
            return info
        if info == 24:
            arg = self._take(1)[0]
            if arg < 24:
                raise CBORError("non-shortest integer encoding")
            return arg
        width = {25: 2, 26: 4, 27: 8}.get(info)
        if width is None:
            raise CBORError("indefinite length or reserved additional info")
        arg = int.from_bytes(self._take(width), "big")
        if arg < (1 << (4 * width)):  # would have fit in half the width
            raise CBORError("non-shortest integer encoding")
        return arg

    def item(self, depth: int = 0) -> Any:
        if depth > self.max_depth:
            raise CBORError("CBOR nested too deeply")
        initial = self._take(1)[0]
        major, info = initial >> 5, initial & 31
        if major == 7:
            return self._simple(info)
        arg = self._arg(info)
        if major == 0:
            return arg
        if major == 1:
            return -1 - arg
        if major == 2:
            return bytes(self._take(arg))
        if major == 3:
            try:
                return self._take(arg).decode("utf-8")
            except UnicodeDecodeError:
                raise CBORError("text string is not UTF-8") from None
        if major == 4:
            return [self.item(depth + 1) for _ in range(arg)]
        if major == 5:
            out: dict[Any, Any] = {}
            keys: list[tuple[type, Any]] = []
            for _ in range(arg):
                key = self.item(depth + 1)
                if isinstance(key, (list, dict)):
                    raise CBORError("map key must be a scalar")
                marker = (type(key), key)
                if marker in keys:
                    raise CBORError(f"duplicate map label {key!r}")
                keys.append(marker)
                value = self.item(depth + 1)
                out[_Key(key)] = value
            return out
        self.tags_seen += 1
        return Tagged(arg, self.item(depth + 1))

    def _simple(self, info: int) -> Any:
        if info == 20:
            return False
        if info == 21:
            return True
        if info == 22:
            return None
        if info == 25:
            value = _half_to_float(int.from_bytes(self._take(2), "big"))
            return _Float(value)
        if info == 26:
            value = struct.unpack(">f", self._take(4))[0]
            try:
                if struct.unpack(">e", struct.pack(">e", value))[0] == value:
                    raise CBORError("non-shortest float encoding")
            except OverflowError:  # beyond half precision's range: single is its shortest form
                pass
            return _Float(value)
        if info == 27:
            value = struct.unpack(">d", self._take(8))[0]
            try:
                if struct.unpack(">f", struct.pack(">f", value))[0] == value:
                    raise CBORError("non-shortest float encoding")
            except OverflowError:
                pass
            return _Float(value)
        raise CBORError(f"unsupported simple value {info}")


class _Key:
    """Map key wrapper keeping the CBOR type (True is not 1, -8.0 is not -8)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return hash((type(self.value), self.value))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and type(other.value) is type(self.value) and other.value == self.value

    def __repr__(self) -> str:
        return repr(self.value)


def plain_map(decoded: dict[Any, Any]) -> dict[Any, Any]:
    """Unwrap map keys; refuse labels that are not plain ints or text.

    Args:
        decoded: a map as :func:`decode_strict` returns it.

    Returns:
        The map with plain keys.

    Raises:
        CBORError: a label that is not an integer or text (a bool, a float, bytes).
    """
    out: dict[Any, Any] = {}
    for key, value in decoded.items():
        raw = key.value if isinstance(key, _Key) else key
        if type(raw) not in (int, str):
            raise CBORError(f"header label {raw!r} is not an integer or text")
        out[raw] = value
    return out


def unwrap_map(decoded: dict[Any, Any]) -> dict[Any, Any]:
    """Unwrap map keys whatever their type. Keys that Python holds equal
    (1, True, 1.0) collapse into one entry, the last read winning: callers
    that need the CBOR types use :func:`plain_map`.

    Args:
        decoded: a map as :func:`decode_strict` returns it.

    Returns:
        The map with plain keys.
    """
    return {key.value if isinstance(key, _Key) else key: value for key, value in decoded.items()}


def decode_strict(data: bytes, *, max_depth: int = 16) -> tuple[Any, int]:
    """Decode exactly one strict CBOR item.

    Args:
        data: the bytes, holding one item and nothing after it.
        max_depth: deepest nesting of arrays, maps and tags accepted.

    Returns:
        ``(item, tags_seen)``: maps keep their keys wrapped (see
        :func:`plain_map`), floats are a float subclass.

    Raises:
        CBORError: not well-formed strict CBOR (truncated, not shortest form,
            indefinite length, a duplicate map label, too deep, trailing bytes …).
    """
    reader = _Reader(bytes(data), max_depth)
    item = reader.item()
    if reader.pos != len(reader.data):
        raise CBORError("trailing bytes after the CBOR item")
    return item, reader.tags_seen
