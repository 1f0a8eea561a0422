"""A :class:`~capseal.ledger.Ledger` across ``os.fork()`` without exec.

SQLite forbids using a connection in a process forked from the one that
opened it, and a ledger's committer thread does not exist in the fork. So a
forked process refuses every call on a ledger it inherited
(``LedgerForkedError``, raised by the ledger's parts on the :class:`ForkGuard`
flag set here), and opens its own. Three things make that safe; without
any one of them records are lost or a process hangs:

* **No SQLite call is in flight at the fork.** Before a fork, every open
  ledger's write and read locks are taken (waiting, within the fork's one
  deadline, :data:`capseal.process.FORK_WAIT` s, for a running transaction
  to end; a ledger's own commit callbacks, which run after its COMMIT, do
  not wait on themselves) and held across it. A ledger holds its write lock
  while it opens its connections too. A connection copied mid-transaction
  would, once let go of in the fork, roll back into the WAL index the parent
  shares; a fork taken mid-commit would also copy SQLite's write lock, and
  the fork's own ledger on that file would find it held by nobody, and wait.
* **The inherited connections are never closed the ordinary way.** Closing
  runs SQLite's last-connection checkpoint, whose stale view of the WAL
  (this copy's) checkpoints nothing and then deletes the ``-wal`` file by
  name, with the records another process had committed in it.
* **...but they are let go of before the fork opens that file itself.**
  SQLite keeps one record per file per process of the OS locks it holds;
  the inherited connections' record claims locks this process does not
  hold (POSIX locks are not inherited), so a new connection on the same file
  would take none, and the parent, seeing no other user, would checkpoint
  and delete the ``-wal`` the fork was still appending to. Closing them with
  checkpoint-on-close switched off (``SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE``)
  drops that record without touching the files.

Files are matched by the real path each ledger resolved when it opened (as
SQLite did; the current directory may have changed since). Until a fork
opens a ledger on the same file, the inherited connections are
kept alive (through interpreter shutdown too, which would otherwise close
them): no SQLite call on them at all. When the option cannot be set, opening
that file in the fork is refused; when the fork could not be made quiet (a
transaction outlived the wait), opening any ledger in the fork is refused,
with the reason: the thread that was inside SQLite may have held SQLite's
process-wide mutexes, copied held into the fork.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import threading
import time
import weakref
from typing import Any, Protocol

from .. import process
from ..errors import LedgerForkedError

log = logging.getLogger("capseal")

__all__ = ["ForkGuard", "register", "forget", "before_opening"]


class ForkGuard:
    """A ledger's flag "inherited through fork", shared by its parts: each
    refuses every call once it is set (one attribute test on the hot path).

    Args:
        path: the ledger's path (named in the refusal).
    """

    __slots__ = ("forked", "_path", "_pid")

    def __init__(self, path: object) -> None:
        self.forked = False
        self._path = path
        self._pid = os.getpid()  # the process that opened it

    def error(self, what: str) -> LedgerForkedError:
        """The refusal of ``what`` in a forked copy (callers test ``forked`` first)."""
        return LedgerForkedError(
            f"{what}: the ledger {self._path} was opened by process {self._pid}, and this is process "
            f"{os.getpid()}, forked from it: its SQLite connections and threads belong to process {self._pid}. "
            "Open a new Ledger (or Producer) in this process; nothing was written")


class Forkable(Protocol):
    """What this module uses of a ledger (the package's Ledger)."""

    @property
    def path(self) -> Any: ...

    @property
    def closed(self) -> bool: ...

    @property
    def forked(self) -> bool: ...

    def unfinished(self) -> int: ...

    def close(self) -> None: ...

    def _fork_parts(self) -> tuple[Any, Any, ForkGuard]:
        """Its engine (``write_lock``, ``read_lock``, ``connections()``,
        ``location``), its group commit (``committing``, ``in_callbacks``:
        thread ids) and its fork flag."""
        ...


_SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE = getattr(sqlite3, "SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE", 1006)  # sqlite3.h
_OPEN: weakref.WeakSet[Forkable] = weakref.WeakSet()
# held by a fork from before it looks at _OPEN until after it: a ledger is
# registered (then connects) either before, and the fork waits for it, or after
_REGISTRY = threading.Lock()
_fork = threading.local()  # the locks this thread's fork took (its own: forks on other threads wait)
# in a forked process: inherited connections not yet let go of, by the real
# path of their file, and why opening that file here is refused (None: it is not)
_INHERITED: dict[str, tuple[list[sqlite3.Connection], str | None]] = {}
# in a process forked while a ledger was in use: why no ledger may be opened here
_not_quiet: str | None = None


def register(ledger: Forkable) -> None:
    """Called by a Ledger holding its own (new) write lock, before it connects.

    Args:
        ledger: the ledger (held weakly).
    """
    with _REGISTRY:
        _OPEN.add(ledger)
    process.close_at_exit("ledgers", ledger, _close_at_exit)


def _close_at_exit(ledger: Forkable, deadline: float) -> None:
    """At exit: what a ledger used directly (``Ledger.submit``) or shared by
    producers still has queued is written, with a warning (the program should
    have closed it)."""
    if ledger.closed or ledger.forked:
        return
    unwritten = ledger.unfinished()
    if unwritten:
        log.warning("capseal: %d submitted record(s) for %s were not yet durable at exit; closing the "
                            "ledger writes them (call close() or flush() before the program ends)",
                            unwritten, ledger.path.name)
    ledger.close()


def forget(ledger: Forkable) -> None:
    """Called without the ledger's write lock (a fork holding the registry may wait on it).

    Args:
        ledger: a ledger closed with no snapshot open, or one that failed to open.
    """
    with _REGISTRY:
        _OPEN.discard(ledger)


def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


def before_opening(path: str) -> None:
    """Called before a Ledger opens the file at the real path ``path``: in a
    forked process, let go of the connections to it inherited from the
    parent, or refuse. After a fork taken while a ledger was in use, every
    file is refused: SQLite's process-wide mutexes (its file table, its
    allocator) may have been copied held by the thread that was using it."""
    if _not_quiet is not None:
        raise LedgerForkedError(
            f"the ledger {path} cannot be opened in this process ({os.getpid()}): {_not_quiet}. Open ledgers in a "
            "process started with 'spawn' or 'forkserver', or fork while no ledger is in use; nothing was written")
    entry = _INHERITED.get(path)
    if entry is None:
        return
    connections, refused = entry
    if refused is None and all(_no_checkpoint_on_close(c, path) for c in connections):
        for connection in connections:
            connection.close()  # checkpoint-on-close is off: no WAL work, no file deleted
        del _INHERITED[path]
        return
    reason = refused or ("this Python cannot switch off SQLite's checkpoint-on-close for the connections "
                         "inherited from the parent")
    _INHERITED[path] = (connections, reason)
    raise LedgerForkedError(
        f"the ledger {path} cannot be opened in this process ({os.getpid()}), forked from one that had it open: "
        f"{reason}. Open it in a process started with 'spawn' or 'forkserver'; nothing was written")


def _no_checkpoint_on_close(connection: sqlite3.Connection, path: str) -> bool:
    """Switch off checkpoint-on-close for ``connection``, and confirm it is
    off; False if that cannot be done."""
    setconfig = getattr(connection, "setconfig", None)  # Python 3.12+
    getconfig = getattr(connection, "getconfig", None)
    if setconfig is not None and getconfig is not None:
        try:
            setconfig(_SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, True)
            return bool(getconfig(_SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE))
        except sqlite3.Error:  # a closed connection
            return False
    # Python 3.10/3.11: through the C API, on the connection's sqlite3* (the
    # first field after the object header of CPython's pysqlite_Connection).
    # Used only once the handle is confirmed: SQLite names this very file for it.
    if sys.implementation.name != "cpython" or sys.version_info[:2] not in ((3, 10), (3, 11)):
        return False
    import ctypes

    try:
        import _sqlite3

        lib = ctypes.CDLL(_sqlite3.__file__)  # resolves to the libsqlite3 the module uses
        filename, db_config = lib.sqlite3_db_filename, lib.sqlite3_db_config
    except (ImportError, OSError, AttributeError):
        return False
    filename.restype, filename.argtypes = ctypes.c_char_p, (ctypes.c_void_p, ctypes.c_char_p)
    db_config.restype = ctypes.c_int
    db_config.argtypes = (ctypes.c_void_p, ctypes.c_int)  # then variadic: (int onoff, int *result)
    handle = ctypes.c_void_p.from_address(id(connection) + object.__basicsize__).value
    if not handle or not _same_file(filename(handle, b"main"), path):
        return False
    result = ctypes.c_int(-1)
    if db_config(handle, _SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, ctypes.c_int(1), ctypes.byref(result)) != 0:
        return False
    return result.value == 1


def _same_file(name: bytes | None, path: str) -> bool:
    return name is not None and bool(name) and _real(os.fsdecode(name)) == path


def _keep_alive(connection: sqlite3.Connection) -> None:
    """One reference that is never dropped: freeing the object (at interpreter
    shutdown too) would close it the ordinary way."""
    import ctypes

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(connection))


def _before_fork() -> None:
    """Take the registry, then every open ledger's write and read locks (in
    that order, as ``Ledger.close`` does), all held across the fork: no
    transaction runs at the fork, and no ledger registers (and connects)
    during it.

    A fork from a commit's callbacks (an observer, a listener), which run on
    the committing thread after its COMMIT, holding the write lock, does not
    wait on its own lock: SQLite is between statements there. A fork from
    that thread *inside* the transaction (a signal handler, a finaliser) does
    not wait either, and counts as not quiet. A Ctrl-C meanwhile is held back
    until the after-fork hooks are done (:mod:`capseal.process`)."""
    _fork.registry = False
    _fork.held = held = []
    _fork.between = between = []  # ledgers whose write lock this thread holds, between statements
    deadline = process.fork_deadline()
    _fork.registry = _REGISTRY.acquire(timeout=max(0.0, deadline - time.monotonic()))
    me = threading.get_ident()
    for ledger in list(_OPEN):
        storage, commits, _ = ledger._fork_parts()
        write, read = storage.write_lock, storage.read_lock
        if commits.in_callbacks == me:
            between.append(ledger)
        elif commits.committing != me and write.acquire(timeout=max(0.0, deadline - time.monotonic())):
            held.append(write)
        if read.acquire(timeout=max(0.0, deadline - time.monotonic())):
            held.append(read)


def _release_after_fork() -> None:
    """Release this thread's locks from _before_fork."""
    held, _fork.held = getattr(_fork, "held", []), []
    for lock in held:
        lock.release()  # taken by this thread before the fork: ours in the child too
    if getattr(_fork, "registry", False):
        _fork.registry = False
        _REGISTRY.release()


def _after_fork_in_parent() -> None:
    _fork.between = []
    _release_after_fork()


def _after_fork_in_child() -> None:
    """Mark each inherited ledger (every call on it is refused) and keep its
    connections, untouched, for :func:`before_opening`."""
    global _not_quiet
    held = getattr(_fork, "held", [])
    between, _fork.between = getattr(_fork, "between", []), []
    taken = {id(lock) for lock in held} | {id(ledger._fork_parts()[0].write_lock) for ledger in between}
    try:
        inherited = list(_OPEN)
        _OPEN.clear()
        for ledger in inherited:
            storage, _, guard = ledger._fork_parts()
            guard.forked = True
            quiet = id(storage.write_lock) in taken and id(storage.read_lock) in taken
            connections = storage.connections()
            location = storage.location
            if quiet and ledger.closed and not connections:  # closed, no snapshot open: nothing to let go of
                continue
            for connection in connections:
                _keep_alive(connection)  # a server's connection too: closing it would end the parent's session
            files = [c for c in connections if isinstance(c, sqlite3.Connection)]
            if files or not connections:
                previous = _INHERITED.get(location, ([], None))
                _INHERITED[location] = (previous[0] + files, previous[1])
            if not quiet and _not_quiet is None:
                _not_quiet = (
                    f"this process was forked while the ledger {location} was in use in the parent (a "
                    f"transaction running, or the file being opened or closed: the fork waits up to {process.FORK_WAIT:g} s "
                    "for that to end, and this did not), so SQLite's state copied here cannot be used safely")
    finally:
        took_registry = getattr(_fork, "registry", False)
        _release_after_fork()
        if not took_registry:  # held at the fork by a thread that is not here
            global _REGISTRY
            _REGISTRY = threading.Lock()


process.on_fork("ledgers", before=_before_fork, after_in_parent=_after_fork_in_parent,
                after_in_child=_after_fork_in_child)
