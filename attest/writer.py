"""Writing a quoted batch's slots into the ledger — in this process, or in a
helper process so the sealing process's GIL is left to sealing.

Why a helper process at all: per record, a batch slot costs the writer some
50–60 µs of Python and SQLite work (Merkle tree, the check of every inclusion
proof, the slot bytes, the ledger's row hash, the row itself). In the sealing
process that work competes for the GIL with the thread that seals, which is
what limits sealing throughput. In a helper process it runs on another core;
the sealing process only sends capsule ids and the quote (a few bytes per
record). The TPM is still driven from the sealing process (one
:class:`TPMDevice` owner per TPM: a second process on a TPM without a
resource manager would flush the other's objects).

Either way the same :func:`write_batch` runs, and it verifies before it
writes: the quote (signature, magic, type, root as qualifyingData, PCR
digest, AK) and every inclusion proof. A batch is written whole or not at all.

Protocol (helper ← parent on stdin): frames of a 4-byte big-endian length and
UTF-8 JSON, ``{"op": "batch", "k": n, "root": hex, "ids": [hex…], "shared":
{…}}`` or ``{"op": "stop"}``; the first frame is ``{"op": "hello", "ledger":
path, "pin": {ak_public, ak_name, ak_qualified_name}}``. Helper → parent on
stdout: one JSON line per batch, ``{"k": n, "ok": true, "n": rows}`` or
``{"k": n, "ok": false, "error": "…"}``.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from capseal.errors import EvidenceError

from . import merkle
from .evidence import BatchBodies, evidence_for_batch
from .trust import PinnedAK, TrustPolicy
from .verify import verify_evidence

__all__ = ["write_batch", "ProcessWriter", "pin_policy"]


def pin_policy(pin: Mapping[str, str]) -> TrustPolicy:
    """A policy trusting exactly the quoter's AK (from its identity fields)."""
    return TrustPolicy((PinnedAK.from_pem(pin["ak_public"], name=pin["ak_name"], qualified_name=pin["ak_qualified_name"]),))


def write_batch(ledger: Any, policy: TrustPolicy, ids: Sequence[str], shared: Mapping[str, Any], root: bytes,
                tree: merkle.Tree | None = None) -> int:
    """Verify, then append the slots of one quoted batch (``ids`` in leaf
    order) in one ledger transaction. Raises EvidenceError (nothing written)
    when anything does not verify."""
    leaves = [bytes.fromhex(cid) for cid in ids]
    if not leaves or any(len(leaf) != 32 for leaf in leaves):
        raise EvidenceError("a batch is one or more 32-byte capsule ids")
    if tree is None:
        tree = merkle.build(leaves)
    if tree.root != root:
        raise EvidenceError("the batch's Merkle root is not the quoted one; nothing written")
    n = len(ids)
    first = evidence_for_batch(shared, root, 0, n, tree.proofs[0])
    result = verify_evidence(ids[0], policy, evidence=first)
    if not result.ok:
        raise EvidenceError(f"batch quote did not verify ({result.status}); nothing written")
    if not merkle.verify_all(leaves, tree.proofs, root):
        raise EvidenceError(f"an inclusion proof of the batch of {n} does not verify; nothing written")
    bodies = BatchBodies(shared, root, n)  # the shared members serialized once per batch
    return int(ledger.add_evidence_many([(cid, bodies.body(i, tree.proofs[i])) for i, cid in enumerate(ids)]))


# ---------------------------------------------------------------------------- the helper process


def _send(out: IO[bytes], message: Mapping[str, Any]) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    out.write(struct.pack(">I", len(data)) + data)
    out.flush()


def _recv(inp: IO[bytes]) -> Any:
    head = inp.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">I", head)
    data = inp.read(size)
    if len(data) < size:
        return None
    return json.loads(data)


class ProcessWriter:
    """The parent's end of a helper process that writes batches.

    ``on_result(k, ok, rows, error)`` runs on a reader thread for every batch
    sent (also, with ok=False, for batches lost when the helper dies).
    """

    def __init__(self, ledger_path: str, pin: Mapping[str, str], on_result: Callable[[int, bool, int, str], None]) -> None:
        self.on_result = on_result
        self._lock = threading.Condition()
        self._inflight: set[int] = set()
        self._dead: str | None = None
        self._stderr_tail = b""
        env = dict(os.environ)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from capseal.attest.writer import _child_main; _child_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        assert self._proc.stdin is not None
        _send(self._proc.stdin, {"op": "hello", "ledger": ledger_path, "pin": dict(pin)})
        self._reader = threading.Thread(target=self._read, name="capseal-attest-writer-reader", daemon=True)
        self._reader.start()
        self._errs = threading.Thread(target=self._drain_stderr, name="capseal-attest-writer-stderr", daemon=True)
        self._errs.start()

    @property
    def alive(self) -> bool:
        return self._dead is None

    def send(self, k: int, ids: Sequence[str], root: bytes, shared: Mapping[str, Any]) -> None:
        """Hand a quoted batch over; raises EvidenceError if the helper is gone."""
        with self._lock:
            if self._dead is not None:
                raise EvidenceError(f"the evidence writer process is gone: {self._dead}")
            self._inflight.add(k)
        try:
            assert self._proc.stdin is not None
            _send(self._proc.stdin, {"op": "batch", "k": k, "root": root.hex(), "ids": list(ids), "shared": dict(shared)})
        except (OSError, ValueError) as exc:
            with self._lock:
                self._inflight.discard(k)
            self._die(f"cannot write to it: {exc}")
            raise EvidenceError(f"the evidence writer process is gone: {exc}") from None

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every batch sent so far is answered (written or failed)."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._inflight, timeout)

    def close(self, timeout: float | None = 60.0) -> None:
        """Let the helper finish what it was sent, then stop it."""
        try:
            if self._proc.stdin is not None and self._dead is None:
                _send(self._proc.stdin, {"op": "stop"})
                self._proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(5)

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                msg = json.loads(line)
                k = int(msg["k"])
            except (ValueError, KeyError, TypeError):
                continue
            with self._lock:
                self._inflight.discard(k)
            self.on_result(k, bool(msg.get("ok")), int(msg.get("n", 0)), str(msg.get("error", "")))
            with self._lock:
                self._lock.notify_all()
        rc = self._proc.wait()
        self._die(f"exited with status {rc}" + (f": {self._stderr_tail.decode(errors='replace')[-500:]}" if rc else ""))

    def _drain_stderr(self) -> None:
        assert self._proc.stderr is not None
        for chunk in iter(lambda: self._proc.stderr.read(4096), b""):  # type: ignore[union-attr]
            self._stderr_tail = (self._stderr_tail + chunk)[-4096:]

    def _die(self, why: str) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = why
            lost, self._inflight = sorted(self._inflight), set()
        for k in lost:  # their slots stay null
            self.on_result(k, False, 0, f"the evidence writer process {why}")
        with self._lock:
            self._lock.notify_all()


def _child_main() -> None:
    """Entry point of the helper process (see the module docstring)."""
    os.environ.setdefault("TSS2_LOG", "all+NONE")
    from capseal.ledger import Ledger

    inp, out = sys.stdin.buffer, sys.stdout
    hello = _recv(inp)
    if not isinstance(hello, dict) or hello.get("op") != "hello":
        sys.exit(2)
    policy = pin_policy(hello["pin"])
    with Ledger(hello["ledger"]) as ledger:
        while True:
            msg = _recv(inp)
            if msg is None or msg.get("op") == "stop":
                return
            k = msg.get("k")
            try:
                rows = write_batch(ledger, policy, msg["ids"], msg["shared"], bytes.fromhex(msg["root"]))
                reply: dict[str, Any] = {"k": k, "ok": True, "n": rows}
            except Exception as exc:  # reported, never half-written (one transaction)
                reply = {"k": k, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
            out.write(json.dumps(reply) + "\n")
            out.flush()
