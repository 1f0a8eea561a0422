"""The id tables a ledger walk keeps (``IdIndex``): every id found again
with its first seq and its flags, past the size it was made for."""

from __future__ import annotations

from capseal.ledger import IdIndex


def test_ids_keep_their_first_seq_and_flags_past_the_size_expected() -> None:
    index = IdIndex(100)
    ids = [f"{i:064x}" for i in range(5000)]  # fifty times what it was sized for: it grows
    for seq, rid in enumerate(ids, 1):
        assert index.add(rid, seq, flags=seq % 3) is None
    assert len(index) == 5000
    for seq, rid in enumerate(ids, 1):
        assert index.get(rid) == (seq, seq % 3)
        assert index.add(rid, seq + 10_000, flags=4) == seq  # the first seq stays; flags are OR-ed in
        assert index.has(rid, 4) and index.seq(rid) == seq
    assert index.get("0" * 63 + "x") is None and not index.has("nope", 1)


def test_a_table_is_sized_for_the_ids_expected_not_the_next_power_of_two() -> None:
    index = IdIndex(1_000_000)
    slots = len(index._keys)  # the table's own arrays: 8 bytes a slot each
    assert 1_000_000 < slots * 0.7 + 1 and slots < 1_500_000
