"""capseal.cbor, the strict reader under capseal.cose: what it reads of the
values an envelope never holds but a hostile one may."""

from __future__ import annotations

import struct

import pytest

from capseal.cbor import CBORError, decode_strict


@pytest.mark.parametrize("value", [70000.0, -1e30, 3.0e38])
def test_a_single_precision_float_beyond_half_range_is_read_not_raised(value: float) -> None:
    """A float32 too large for half precision is in its shortest form; the
    reader's shortest-form check raised OverflowError on it (an untyped error
    out of a strict reader whose refusals are CBORError)."""
    encoded = b"\xfa" + struct.pack(">f", value)
    item, tags = decode_strict(encoded)
    assert item == struct.unpack(">f", struct.pack(">f", value))[0] and type(item) is not int and tags == 0


def test_a_single_precision_float_that_fits_half_is_still_refused() -> None:
    with pytest.raises(CBORError, match="non-shortest float"):
        decode_strict(b"\xfa" + struct.pack(">f", 1.5))
