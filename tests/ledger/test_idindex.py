"""The id tables a ledger walk keeps (``IdIndex``): every id found again
with its first seq and its flags, past the size it was made for, in memory
or in a file, taking no more memory as it fills."""

from __future__ import annotations

import os

import pytest

from capseal.ledger import IdIndex


def _resident_kb() -> int:
    """This process's resident memory (its own and of mapped files), in kB."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.parametrize("memory_ids", [1 << 18, 0, 1000], ids=["memory", "file", "memory-then-file"])
def test_ids_keep_their_first_seq_and_flags_past_the_size_expected(memory_ids: int) -> None:
    index = IdIndex(100, memory_ids=memory_ids)
    ids = [f"{i:064x}" for i in range(5000)]  # fifty times what it was sized for: it grows
    for seq, rid in enumerate(ids, 1):
        assert index.add(rid, seq, flags=seq % 3) is None
    assert len(index) == 5000
    assert index.on_file is (memory_ids < 5000)
    for seq, rid in enumerate(ids, 1):
        assert index.get(rid) == (seq, seq % 3)
        assert index.add(rid, seq + 10_000, flags=4) == seq  # the first seq stays; flags are OR-ed in
        assert index.has(rid, 4) and index.seq(rid) == seq
    assert index.get("0" * 63 + "x") is None and not index.has("nope", 1)
    assert index.add("\ud800 lone surrogate", 7) is None and index.seq("\ud800 lone surrogate") == 7
    index.close()
    assert len(index) == 0 and not index.on_file and index.get(ids[0]) is None


def test_a_table_is_sized_for_the_ids_expected_not_the_next_power_of_two() -> None:
    for memory_ids in (2_000_000, 0):
        index = IdIndex(1_000_000, memory_ids=memory_ids)
        assert index.on_file is (memory_ids == 0)
        assert 1_000_000 < index.slots * 0.7 + 1 and index.slots < 1_500_000
        index.close()


@pytest.mark.parametrize("on_file", [True, False], ids=["file", "memory"])
def test_a_file_table_takes_no_memory_as_it_fills(on_file: bool) -> None:
    n = 600_000
    before = _resident_kb()
    index = IdIndex(n, memory_ids=0 if on_file else n)
    table_kb = 16 * index.slots // 1024
    assert index.on_file is on_file and table_kb > 12_000
    for i in range(n):
        index.add(f"{i:064x}", i + 1, flags=1)
    for i in range(0, n, 97):
        assert index.get(f"{i:064x}") == (i + 1, 1)
    grown = _resident_kb() - before
    index.close()
    if on_file:  # the slots are in the file: what grows is what Python holds now and then
        assert grown < table_kb // 6, (grown, table_kb)
    else:  # the same table in memory shows what the bound above tells apart
        assert grown > table_kb // 2, (grown, table_kb)


def test_a_forked_process_reads_the_file_table_its_parent_filled() -> None:
    index = IdIndex(10_000, memory_ids=0)
    for i in range(10_000):
        index.add(f"id-{i}", i + 1, flags=2 if i % 2 else 1)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: every id found, with its flags, and nothing else
        ok = all(index.get(f"id-{i}") == (i + 1, 2 if i % 2 else 1) for i in range(10_000))
        os.write(w, b"1" if ok and index.get("id-x") is None else b"0")
        os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1"
    finally:
        os.close(r)
        os.waitpid(pid, 0)
        index.close()
