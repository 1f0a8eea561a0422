"""Many threads sealing through shared producers: the stress the hardware and
ledger tests apply (8 threads x 1,000 records by default)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from capseal import Producer


def seal_from_threads(producers: Sequence[Producer], *, threads: int = 8, per_thread: int = 1000,
                      submit: bool = False) -> list[BaseException]:
    """Thread ``t`` seals ``per_thread`` decide capsules through
    ``producers[t % len(producers)]`` — one ``seal()`` at a time, or with
    ``submit`` all handed to ``submit()`` (a token's or TPM's signing
    pipeline) and then waited for; returns every exception raised (none is
    expected)."""
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        producer = producers[t % len(producers)]
        try:
            pendings = []
            for i in range(per_thread):
                spec = {"action_id": f"t{t}-{i}", "action_type": "decide",
                        "disposition": {"decision": "accept", "approver": "policy",
                                        "human_disposed": False, "verdict_class": "executed"}}
                if submit:
                    pendings.append(producer.submit(spec))
                else:
                    producer.seal(spec)
            for pending in pendings:
                pending.result(timeout=120)  # a lost record fails the test instead of hanging it
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return errors
