"""A flow finished by another producer: after a restart, or from a second worker
process, a lifecycle call on a parent this producer did not seal writes exactly
what the producer that sealed it would have (its action ids, its request
digest), or says what it cannot know."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import agent_action_capsule as ref
import pytest

import capseal
from capseal import Ledger, Producer, verify_ledger
from capseal.errors import InputError
from capseal.keys import UnsafeEphemeralSigner

ORDER = {"sku": "A-1", "qty": 2}
REPLY = {"order": "O-1"}


def _producer(path: Path, developer: str = "agent@1") -> Producer:
    return Producer("acme", developer, UnsafeEphemeralSigner(), path)


def _capsule(path: Path, capsule_id: str) -> dict[str, Any]:
    with Ledger(path, readonly=True) as ledger:
        record = ledger.get(capsule_id)
        assert record is not None
        return record.capsule


def test_a_restart_keeps_the_whole_action_id_and_asks_for_the_request(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with _producer(path) as first:
        call_2 = first.planned("run-1/call-2", effect_type="write_order", request=ORDER).capsule_id
        call_3 = first.planned("run-1/call-3", effect_type="write_order", request=ORDER).capsule_id
    with _producer(path) as restarted:
        # a planned capsule never carries its request's digest: it cannot be guessed
        with pytest.raises(InputError, match="request digest .* cannot be recovered") as refused:
            restarted.confirmed(call_2, response=REPLY)
        assert "request=" in refused.value.hint
        done_2 = restarted.confirmed(call_2, response=REPLY, request=ORDER)
        done_3 = restarted.confirmed(call_3, response=REPLY, request=ORDER)  # was DuplicateRecordError
        count = restarted.ledger.count()
    assert done_2.capsule["action_id"] == "run-1/call-2/confirmed"  # was run-1/confirmed
    assert done_3.capsule["action_id"] == "run-1/call-3/confirmed"
    assert done_2.capsule["effect"]["request_digest"] == capseal.json_digest(ORDER)
    assert done_2.capsule["effect"]["type"] == "write_order"
    assert done_2.capsule["chain"] == {"parent_capsule_id": call_2, "relation": "confirms"}
    assert count == 6  # two epoch boundaries, two planned, two confirmed: the refusal wrote nothing
    assert verify_ledger(path).ok


def test_request_none_seals_without_a_request_digest_when_there_was_none(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with _producer(path) as first:
        planned = first.planned("job-7/step-1").capsule_id
    with _producer(path) as second:
        dispatched = second.dispatched(planned, request=None)
    assert dispatched.capsule["action_id"] == "job-7/step-1/dispatched"
    assert "request_digest" not in dispatched.capsule["effect"]


def _flow(producer: Producer, planned: Any, later: Producer) -> list[dict[str, Any]]:
    """planned → dispatched (an action id of the caller's) → confirmed, and a
    refusal and a resolution of another plan: each later step through ``later``."""
    dispatched = later.dispatched(planned, request=ORDER, action_id="custom-send-7")
    confirmed = later.confirmed(dispatched.capsule_id, response=REPLY)
    other = producer.planned("run-9/call-1", effect_type="send_payment")
    denied = later.refused(other.capsule_id, verdict_class="denied")
    resolved = later.resolved(denied.capsule_id, decision="accept", approver="policy")
    return [r.capsule for r in (dispatched, confirmed, denied, resolved)]


@pytest.mark.parametrize("split", [False, True], ids=["one-producer", "restarted"])
def test_rebuilt_flows_name_and_digest_exactly_as_the_sealing_producer(tmp_path: Path, split: bool) -> None:
    path = tmp_path / "l.db"
    with _producer(path) as first:
        planned = first.planned("run-1/call-2", effect_type="write_order", request=ORDER,
                                irreversibility_class="one_way_recoverable", external_ref="PO-7")
        if split:
            with _producer(path, "agent@1-worker") as later:
                capsules = _flow(first, planned.capsule_id, later)
        else:
            capsules = _flow(first, planned, first)
    assert [c["action_id"] for c in capsules] == [
        "custom-send-7", "run-1/call-2/confirmed", "run-9/call-1/denied", "run-9/call-1/resolved"]
    confirmed = capsules[1]["effect"]
    assert confirmed["request_digest"] == capseal.json_digest(ORDER)  # carried by the dispatched capsule
    assert (confirmed["type"], confirmed["irreversibility_class"], confirmed["external_ref"]) == (
        "write_order", "one_way_recoverable", "PO-7")


_WORKER = textwrap.dedent("""
    import json, sys
    from capseal import Producer
    from capseal.keys import UnsafeEphemeralSigner
    path, planned, order = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    with Producer("acme", "agent@1-worker-2", UnsafeEphemeralSigner(), path) as worker:
        dispatched = worker.dispatched(planned, request=order)
        confirmed = worker.confirmed(dispatched, response={"order": "O-1"})
    print(json.dumps([dispatched.capsule_id, confirmed.capsule_id]))
""")


def test_a_second_worker_process_finishes_the_flow_while_the_first_runs(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with _producer(path) as first:
        planned = first.planned("run-1/call-2", effect_type="write_order", request=ORDER)
        first.flush()
        out = subprocess.run([sys.executable, "-c", _WORKER, str(path), planned.capsule_id, json.dumps(ORDER)],
                             capture_output=True, text=True, timeout=60, check=True)
        dispatched_id, confirmed_id = json.loads(out.stdout)
        first.planned("run-1/call-3", effect_type="write_order")  # the first worker goes on
    dispatched, confirmed = _capsule(path, dispatched_id), _capsule(path, confirmed_id)
    assert (dispatched["action_id"], confirmed["action_id"]) == ("run-1/call-2/dispatched", "run-1/call-2/confirmed")
    assert confirmed["effect"]["request_digest"] == capseal.json_digest(ORDER)
    report = verify_ledger(path)
    assert report.ok, [f.code for r in report.records for f in r.findings]
    for capsule in (dispatched, confirmed):
        assert ref.verify(capsule).ok
