"""A capsule's action id is its key in the ledger exactly as the capsule gives
it: two ids that differ anywhere (after a NUL too) are two keys, and the same
id twice is refused, on both engines."""

from __future__ import annotations

import pytest

from capseal import Ledger, Producer
from capseal.errors import DuplicateRecordError
from capseal.keys import UnsafeEphemeralSigner
from capseal.ledger import LedgerEntry
from tests.engines import Engine


def test_action_ids_that_differ_after_a_nul_are_two_keys(engine: Engine) -> None:
    """SQLite's json_extract stops at U+0000: "x\\0a" and "x\\0b" were one
    key of the body index, so the second capsule was refused as a duplicate."""
    target = engine.new()
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), target) as p:
        first = p.seal({"action_id": "x\x00a", "action_type": "fyi"})
        second = p.seal({"action_id": "x\x00b", "action_type": "fyi"})
        assert first.capsule["action_id"] == "x\x00a" and second.capsule["action_id"] == "x\x00b"
        before = p.ledger.count()
        with pytest.raises(DuplicateRecordError):
            p.seal({"action_id": "x\x00a", "action_type": "fyi"})
        assert p.ledger.count() == before
        assert p.ledger.has_action_id("x\x00a") and p.ledger.has_action_id("x\x00b")
        assert not p.ledger.has_action_id("x\x00c") and not p.ledger.has_action_id("x")
    with Ledger(target, readonly=True) as ledger:
        assert ledger.check_chain() == []


@pytest.mark.parametrize("tricky", ["x\x01", "x\x01\x01", "x\x01\x02", "x\\u0000", "x\\\x00", "\x00", "\x01"])
def test_ids_near_the_escapes_are_keys_of_their_own(engine: Engine, tricky: str) -> None:
    """Ids made of what the key's encoding uses (U+0001, backslashes, an
    escaped NUL spelt out) neither collide with each other nor with the NUL ids."""
    target = engine.new()
    others = ["x\x00", "x\x01", "x\x01\x01", "x\x01\x02", "x\\u0000", "x\\\x00", "\x00", "\x01", "x"]
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), target) as p:
        for action_id in others:
            p.seal({"action_id": action_id, "action_type": "fyi"})
        with pytest.raises(DuplicateRecordError):
            p.seal({"action_id": tricky, "action_type": "fyi"})
        assert p.ledger.has_action_id(tricky)


def test_a_record_of_another_type_keeps_its_nul_action_id(engine: Engine) -> None:
    """A record keyed by its action_id column: ids with a NUL are distinct keys there too."""
    with Ledger(engine.new()) as ledger:
        ledger.append(LedgerEntry(f"{1:064x}", "note", "producer_claim", b'{"n":1}', action_id="n\x00a"))
        ledger.append(LedgerEntry(f"{2:064x}", "note", "producer_claim", b'{"n":2}', action_id="n\x00b"))
        with pytest.raises(DuplicateRecordError, match="action_id"):
            ledger.append(LedgerEntry(f"{3:064x}", "note", "producer_claim", b'{"n":3}', action_id="n\x00a"))
        assert ledger.has_action_id("n\x00a") and not ledger.has_action_id("n\x00c")
        assert ledger.count() == 2


def test_a_duplicate_in_a_large_group_refuses_it_alone(engine: Engine) -> None:
    """A group's rows go in together (past the rows a transaction holds before
    it sends them, too); a key the ledger holds sends the group again, unit by
    unit, and only the duplicate is refused. The next group goes in whole."""
    def note(n: int, action: str) -> LedgerEntry:
        return LedgerEntry(f"{n:064x}", "note", "producer_claim", b'{"action_id":"%s","n":%d}' % (action.encode(), n),
                           action_id=action)

    with Ledger(engine.new()) as ledger:
        ledger.append(note(0, "taken"))
        appends = [ledger.submit(note(n, f"a-{n}"), wake=False) for n in range(1, 1500)]
        refused = ledger.submit(note(1500, "taken"), wake=False)
        appends += [ledger.submit(note(n, f"a-{n}"), wake=False) for n in range(1501, 1600)]
        ledger.flush()
        assert refused.error is not None and "taken" in str(refused.error)
        assert [p.result().seq for p in appends] == list(range(2, 1600))
        later = [ledger.submit(note(n, f"b-{n}"), wake=False) for n in range(1600, 1700)]
        ledger.flush()
        assert [p.result().seq for p in later] == list(range(1600, 1700))
        assert ledger.count() == 1699 and ledger.check_chain() == []
