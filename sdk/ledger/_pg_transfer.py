"""Importing an export into a PostgreSQL ledger: the tables and every row in ONE transaction.

The target schema must be empty. The creators' lock is taken, the ledger's
tables are made and every line is checked and added in the same
transaction, so an import that fails (a broken chain, a malformed line, a
server that goes away, a kill) leaves the schema as empty as it was, and
nobody ever sees a half-imported ledger.
"""

from __future__ import annotations

from typing import IO

from ..errors import LedgerCorruptError
from . import _pg_schema
from ._pg_connect import failure
from ._pg_url import DatabaseURL, psycopg_module
from ._pg_write import PGTransaction, WriteConnection
from ._transfer import load_rows
from .storage import DuplicateRow

__all__ = ["import_into"]


def import_into(url: DatabaseURL, src: IO[bytes], *, lock_timeout: float) -> None:
    """Build a ledger in the empty schema ``url`` names from the export ``src``.

    Args:
        url: the database URL (its current schema must be empty).
        src: the export.
        lock_timeout: seconds to wait for a lock or the server.

    Raises:
        LedgerError: the schema holds a ledger already (NotALedgerError: other tables).
        MalformedJSONError, LedgerCorruptError: a line or a chain is broken (nothing kept).
        LedgerUnavailableError, LedgerAccessDeniedError: the server could not be used.
    """
    psycopg = psycopg_module()
    link = WriteConnection(url, synchronous="FULL", lock_timeout=lock_timeout)
    conn = link.get()
    try:
        conn.execute("BEGIN")
        cur = conn.cursor()
        _pg_schema.usable_schema(cur, url.name)
        _pg_schema.claim_empty(cur, url.name)
        _pg_schema.create(cur)
        tx = PGTransaction(link, "import into", outer=True)
        try:
            load_rows(tx, src)
            tx.finish()
        except DuplicateRow as exc:  # met when a buffer of rows was sent, not on its own line
            raise LedgerCorruptError(f"the export holds a key twice ({exc.detail}); nothing was imported") from None
        conn.execute("COMMIT")
    except psycopg.Error as exc:
        raise failure(exc, url, "import into") from None
    except BaseException:
        if not conn.broken:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:  # the original error goes on up; closing the connection ends the transaction
                pass
        raise
    finally:
        link.drop()
