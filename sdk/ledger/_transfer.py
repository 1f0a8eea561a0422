"""Export to JSON Lines and import back, byte for byte.

An export is every record row (header, chain hashes and body), then every
evidence row, one JSON object a line; ``export_jsonl`` of an imported ledger
equals the file it was imported from. An import checks every line, every
hash and every batch before it keeps anything, and builds the new ledger
under a hidden name beside its target, hard-linked into place only once it
is whole: nobody sees a half-imported ledger, and a failure or a kill leaves
no ledger at the target (what a killed import left is swept by the next).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import IO, Any, TypeVar

from ..errors import LedgerCorruptError, LedgerError, MalformedJSONError
from ..record import storage_json
from . import _columns
from ._evidence import Batch, EvidenceEntry
from ._format import GENESIS, StoredEntry, batch_header, evidence_header, row_hash
from .storage import DuplicateRow, Storage, Transaction

__all__ = ["export_lines", "import_file", "load", "load_rows"]

_IMPORT_PREFIX = ".capseal-import-"
_IMPORT_GRACE = 10.0  # s: a temp file younger than this may belong to an import that has not locked it yet

L = TypeVar("L")


def export_lines(records: Iterable[StoredEntry], evidence: Iterable[EvidenceEntry], out: IO[bytes]) -> int:
    """Write every row as one JSON line (records, then evidence).

    Returns:
        How many lines were written.

    Raises:
        LedgerCorruptError: an evidence row is damaged (an import would refuse it).
    """
    n = 0
    for stored in records:
        header = {**stored.header(), "action_id": stored.action_id, "stream": stored.stream, "tag": stored.tag,
                  "prev_hash": stored.prev_hash, "row_hash": stored.row_hash}
        out.write(b'{"header":' + storage_json(header) + b',"kind":"record","record":' + stored.body + b"}\n")
        n += 1
    for ev in evidence:
        ev.refuse_damaged()  # an export is checked on import: a damaged row would only stop it there
        ev_header = storage_json({**ev.header(), "prev_hash": ev.prev_hash, "row_hash": ev.row_hash})
        if ev.record_id is None:
            out.write(b'{"batch":' + ev.body + b',"header":' + ev_header + b',"kind":"evidence-batch"}\n')
        else:
            out.write(b'{"evidence":' + ev.body + b',"header":' + ev_header + b',"kind":"evidence"}\n')
        n += 1
    return n


def import_file(open_ledger: Callable[[Path], L], close: Callable[[L], None], storage_of: Callable[[L], Storage],
                src: IO[bytes], target: Path) -> None:
    """Build a new ledger file at ``target`` from the export ``src``.

    Args:
        open_ledger: opens a ledger at a path (a new file).
        close: closes it.
        storage_of: its engine.
        src: the export.
        target: where the ledger goes; nothing may be there.

    Raises:
        LedgerError: ``target`` exists, or cannot be made.
        MalformedJSONError, LedgerCorruptError: see :func:`load`.
    """
    if os.path.lexists(target):  # lexists: a dangling symlink is not a free name either
        raise LedgerError(f"{target} already exists; import builds a new ledger")
    # built under a private name, then linked into place (link() never
    # replaces a file): only files this call made are ever deleted
    _sweep_abandoned_imports(target.parent)
    tmp = target.with_name(f"{_IMPORT_PREFIX}{os.getpid()}-{os.urandom(4).hex()}")  # short: any target name fits
    try:  # held until the temp files are gone: the sign that this import is alive
        alive = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise LedgerError(f"cannot import into {target}: {exc.strerror} (building it aside in {target.parent}); "
                          "nothing was imported") from None
    ledger: L | None = None
    try:
        fcntl.flock(alive, fcntl.LOCK_EX)
        ledger = open_ledger(tmp)
        storage = storage_of(ledger)
        with storage.write_lock:  # every engine call under one of its locks (a fork waits on them)
            load(storage, src)
        close(ledger)  # the last connection: checkpoints, the -wal is gone
        try:
            os.link(tmp, target)
        except FileExistsError:
            raise LedgerError(f"{target} was created by another process during the import; "
                              "import builds a new ledger") from None
        except OSError as exc:
            raise LedgerError(f"cannot put the imported ledger at {target}: {exc.strerror} (capseal builds an "
                              "import aside and hard-links it into place; this filesystem or directory refused "
                              "the link); nothing was imported") from None
    except BaseException:
        if ledger is not None:
            close(ledger)
        raise
    finally:
        for suffix in ("", "-wal", "-shm"):
            with suppress(OSError):  # never hides the error that got here
                Path(str(tmp) + suffix).unlink()
        os.close(alive)


def load(storage: Storage, src: IO[bytes]) -> None:
    """Add every line of an export to an empty store, in one transaction,
    checking each hash; nothing is kept unless every line is sound.

    Args:
        storage: the new store's engine (the caller holds its write lock).
        src: the export, one JSON object a line.

    Raises:
        MalformedJSONError: a line that is not JSON, or lacks a member.
        LedgerCorruptError: a hash chain broken, a batch that does not hash
            to its root, a record stored twice, evidence naming an unknown record.
    """
    with storage.write("import into") as tx:
        load_rows(tx, src)


def load_rows(tx: Transaction, src: IO[bytes]) -> None:
    """Add every line of an export through ``tx``, checking each hash (see :func:`load`).

    Args:
        tx: a write transaction on an empty store.
        src: the export, one JSON object a line.

    Raises:
        MalformedJSONError, LedgerCorruptError: as :func:`load`.
    """
    chains = _Chains()
    for lineno, item in _lines(src):
        try:
            if item["kind"] == "record":
                _load_record(tx, chains, lineno, item)
            else:
                _load_evidence(tx, chains, lineno, item)
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedJSONError(f"line {lineno}: missing or malformed field {exc}") from None
        except DuplicateRow as exc:
            raise LedgerCorruptError(f"line {lineno}: {exc.detail}") from None


class _Chains:
    """The last row hash of each chain read so far."""

    def __init__(self) -> None:
        self.records = GENESIS
        self.evidence = GENESIS


def _lines(src: IO[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
    for lineno, line in enumerate(src, 1):
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise MalformedJSONError(f"line {lineno}: not JSON ({exc})") from None
        if not isinstance(item, dict) or item.get("kind") not in ("record", "evidence", "evidence-batch"):
            raise MalformedJSONError(f"line {lineno}: not a capseal ledger line")
        if not isinstance(item.get("header"), dict):
            raise MalformedJSONError(f"line {lineno}: header missing")
        yield lineno, item


def _load_record(tx: Transaction, chains: _Chains, lineno: int, item: dict[str, Any]) -> None:
    h = item["header"]
    body = storage_json(item["record"])
    header = {k: h[k] for k in ("seq", "record_id", "record_type", "epistemic_type", "links", "nonce")}
    if h["prev_hash"] != chains.records or row_hash(chains.records, header, body) != h["row_hash"]:
        raise LedgerCorruptError(f"line {lineno}: hash chain broken at seq {h['seq']}")
    columns = (h.get("action_id"), h.get("stream"), h.get("tag"))
    if columns != _columns.row_columns(h["record_type"], item["record"]):
        raise LedgerCorruptError(f"line {lineno}: seq {h['seq']}: its action_id, stream and tag "
                                 "are not the ones its body gives")
    links = h["links"]
    if not isinstance(links, list) or not all(isinstance(link, dict) for link in links):
        raise ValueError("'links' (not an array of objects)")
    tx.add_records([StoredEntry(
        seq=h["seq"], record_id=h["record_id"], record_type=h["record_type"], epistemic_type=h["epistemic_type"],
        links=tuple(links), nonce=h["nonce"], body=body, prev_hash=h["prev_hash"], row_hash=h["row_hash"],
        action_id=h.get("action_id"), stream=h.get("stream"), tag=h.get("tag"))])
    chains.records = h["row_hash"]


def _load_evidence(tx: Transaction, chains: _Chains, lineno: int, item: dict[str, Any]) -> None:
    h = item["header"]
    batch = item["kind"] == "evidence-batch"
    body = storage_json(item["batch" if batch else "evidence"])
    header = batch_header(h["eid"]) if batch else evidence_header(h["record_seq"], h["record_id"], h["eid"])
    if h["prev_hash"] != chains.evidence or row_hash(chains.evidence, header, body) != h["row_hash"]:
        raise LedgerCorruptError(f"line {lineno}: evidence hash chain broken at {h['eid']}")
    if batch:
        parsed = Batch.parse(body)
        try:
            Batch.check(parsed.leaves, parsed.root, parsed.shared)
        except ValueError as exc:
            raise LedgerCorruptError(f"line {lineno}: evidence {h['eid']}: {exc}") from None
        named = [(rid, i) for i, rid in enumerate(parsed.leaves)]
    else:
        named = [(h["record_id"], -1)]
    seqs = tx.record_seqs([rid for rid, _ in named])
    if len(seqs) != len(named) or (not batch and seqs[h["record_id"]] != h["record_seq"]):
        raise LedgerCorruptError(f"line {lineno}: evidence {h['eid']} names a record the ledger lacks")
    row = EvidenceEntry(h["eid"], None if batch else h["record_seq"], None if batch else h["record_id"], body,
                        h["prev_hash"], h["row_hash"])
    tx.add_evidence([row], sorted((seqs[rid], h["eid"], i) for rid, i in named))
    chains.evidence = h["row_hash"]


def _sweep_abandoned_imports(directory: Path) -> None:
    """Delete what killed imports left in ``directory``: an import builds
    under a hidden ``.capseal-import-*`` name, deleted when it ends; a kill
    (SIGKILL, power loss) skips that. An import holds an exclusive ``flock``
    on its file while alive, so a file nobody locks is abandoned (and files
    younger than a few seconds are left alone: their import may not have
    taken its lock yet). Best effort: nothing here raises."""
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(_IMPORT_PREFIX)]
    except OSError:
        return
    now = time.time()
    for entry in entries:
        with suppress(OSError):
            if now - entry.stat(follow_symlinks=False).st_mtime < _IMPORT_GRACE:
                continue
            if entry.name.endswith(("-wal", "-shm")):
                if not os.path.lexists(entry.path[:-4]):  # its import deletes the main file first
                    os.unlink(entry.path)
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while its import is alive
                if os.fstat(fd).st_ino != os.stat(entry.path, follow_symlinks=False).st_ino:
                    continue
                for suffix in ("-wal", "-shm", ""):
                    with suppress(FileNotFoundError):
                        os.unlink(entry.path + suffix)
            finally:
                os.close(fd)
