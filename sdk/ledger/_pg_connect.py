"""Connections to a PostgreSQL ledger, and the typed error for each way one fails.

Every failure becomes a capseal error naming the ledger by its redacted URL
(never the password, which is also scrubbed from the server's own words):
a refused login is LedgerAccessDeniedError, a server that cannot be reached
or went away LedgerUnavailableError, a lock held too long LedgerBusyError.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import LedgerAccessDeniedError, LedgerBusyError, LedgerError, LedgerUnavailableError
from ._pg_url import DatabaseURL, psycopg_module

__all__ = ["connect", "failure", "is_lost", "reason"]

_ACCESS = ("password authentication failed", "no password supplied", "authentication failed", "pg_hba.conf",
           "permission denied for database", "must be superuser")
# SQLSTATE classes and codes of a server going away: 08 connection exception, 57P01 admin shutdown,
# 57P02 crash shutdown, 57P03 cannot connect now (starting up or shutting down)
_GONE = ("57P01", "57P02", "57P03")


def reason(exc: BaseException, url: DatabaseURL) -> str:
    """The server's (or libpq's) words for ``exc``, one line, without the password."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    secret = url.password()
    if secret:
        text = text.replace(secret, "***")
    return text[:300]


def is_lost(exc: BaseException, conn: Any = None) -> bool:
    """Whether ``exc`` says the connection is gone (the server restarted, the network broke)."""
    psycopg = psycopg_module()
    if conn is not None and getattr(conn, "broken", False):
        return True
    state = getattr(exc, "sqlstate", None) or ""
    return isinstance(exc, psycopg.OperationalError) and (state.startswith("08") or state in _GONE or not state)


def failure(exc: BaseException, url: DatabaseURL, what: str, *, lock_timeout: float = 0.0) -> LedgerError:
    """The typed error for a psycopg error met while ``what`` (e.g. "append to").

    Args:
        exc: what psycopg raised.
        url: the ledger's URL (shown redacted).
        what: the operation, for the message.
        lock_timeout: the lock wait in force (named in a busy error).

    Returns:
        The capseal error to raise.
    """
    psycopg = psycopg_module()
    text = reason(exc, url)
    state = getattr(exc, "sqlstate", None) or ""
    if isinstance(exc, psycopg.errors.LockNotAvailable) or state == "55P03":
        return LedgerBusyError(f"{what} {url.name} failed: another writer kept it locked for {lock_timeout:g} s "
                               f"({text}); nothing was written")
    if state == "42501" or any(a in text for a in _ACCESS) or ("role" in text and "does not exist" in text):
        return LedgerAccessDeniedError(f"{what} {url.name}: the server refused the login or the access ({text})",
                                       hint="Check the user and password the URL gives (or PGPASSFILE), and the "
                                            "server's pg_hba.conf and grants.")
    if "database" in text and "does not exist" in text:
        return LedgerError(f"{what} {url.name}: no such database ({text})",
                           hint="Create it first (createdb, or CREATE DATABASE); capseal makes its tables in it.")
    if is_lost(exc):
        return LedgerUnavailableError(f"{what} {url.name}: the database server cannot be reached ({text}); "
                                      "nothing was written", hint="Check that the server is running and that the "
                                      "URL's host, port (or socket directory) are right; capseal reconnects on the "
                                      "next call.")
    return LedgerError(f"{what} {url.name} failed: {text}")


def connect(url: DatabaseURL, *, readonly: bool, synchronous: str, lock_timeout: float) -> Any:
    """An autocommit connection to the ledger's database with capseal's session settings.

    Args:
        url: the ledger's URL.
        readonly: every transaction read-only.
        synchronous: ``FULL`` or ``EXTRA`` (a commit returns once it is on disk), ``NORMAL``
            (asynchronous commit: the server may lose the last commits in a crash).
        lock_timeout: seconds to wait for a lock (and for the connection).

    Returns:
        A psycopg connection.

    Raises:
        MissingExtraError: psycopg is not installed.
        LedgerAccessDeniedError, LedgerUnavailableError, LedgerError: see :func:`failure`.
    """
    psycopg = psycopg_module()
    wait = max(2, math.ceil(min(lock_timeout, 60.0)))  # libpq's connect_timeout: whole seconds, at least 2
    try:
        conn = psycopg.connect(url.conninfo(), autocommit=True, connect_timeout=wait, application_name="capseal")
    except psycopg.Error as exc:
        raise failure(exc, url, "opening") from None
    except ValueError as exc:  # a URL libpq cannot parse
        raise LedgerError(f"{url.name} is not a PostgreSQL URL libpq can read ({reason(exc, url)})") from None
    try:
        # no parallel plans or index builds: the key functions catch errors, and a subtransaction
        # cannot start in a parallel operation (ledgers made before they were labelled unsafe)
        conn.execute(f"SET synchronous_commit = {'off' if synchronous == 'NORMAL' else 'on'}; "
                     "SET max_parallel_workers_per_gather = 0; SET max_parallel_maintenance_workers = 0; "
                     f"SET lock_timeout = '{max(1, int(lock_timeout * 1000))}ms'" +
                     ("; SET default_transaction_read_only = on" if readonly else ""))
    except psycopg.Error as exc:
        conn.close()
        raise failure(exc, url, "opening") from None
    return conn
