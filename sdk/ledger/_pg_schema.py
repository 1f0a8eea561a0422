"""A PostgreSQL ledger's tables, and the check that a database holds one.

A ledger is the set of capseal's tables in the connection's current schema
(``public`` unless the URL's ``search_path`` says otherwise). A schema that
holds other tables and no capseal ledger is refused with NotALedgerError
before anything is written to it; one of another ledger format with
LedgerFormatError. An empty schema gets the tables, the append-only
triggers, the body-read indexes, the format row and both chains' head rows in
ONE transaction, under an advisory lock: creators racing each other make
one ledger, and a reader sees all of it or nothing.

The same lookups as the file engine's read a capsule's action id, stream and
epoch boundaries from its hashed body (``capseal_member``: NULL for a body
that is not JSON, so a damaged body fails its own row, never every lookup).
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import LedgerError, LedgerFormatError, NotALedgerError
from ._format import GENESIS, LEDGER_FORMAT

__all__ = ["ACTION_ID", "STREAM", "BOUNDARY", "TABLES", "OBJECTS", "PRESENT_SQL", "prepare", "create", "claim_empty", "usable_schema"]


def _member(*path: str) -> str:
    return "capseal_member(body, " + ", ".join(f"'{p}'" for p in path) + ")"


#: SQL for a capsule row's values read from its body (as the file engine's :mod:`._columns`)
ACTION_ID = _member("capsule", "action_id")
STREAM = f"({_member('capsule', 'operator')} || chr(31) || {_member('capsule', 'developer')})"
BOUNDARY = f"record_type = 'capsule' AND {_member('capsule', 'disposition', 'verdict_class')} = 'epoch_boundary'"

TABLES = ("meta", "heads", "records", "evidence", "evidence_members")
_APPEND_ONLY = ("records", "evidence", "evidence_members")

_FUNCTIONS = r"""
CREATE FUNCTION capseal_member(body bytea, VARIADIC path text[]) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    RETURN convert_from(body, 'UTF8')::json #>> path;
EXCEPTION WHEN others THEN
    RETURN NULL;  -- not JSON (a damaged body): this row only, never every lookup
END $$;
CREATE FUNCTION capseal_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'capseal ledger is append-only' USING ERRCODE = 'restrict_violation';
END $$;
"""

_TABLES = f"""
CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL);
-- each chain's last row, kept by the transaction that appends: the row a writer locks
-- (SELECT ... FOR UPDATE) to append, so writers on every host take turns per chain
CREATE TABLE heads (chain text PRIMARY KEY, position bigint NOT NULL, row_hash text NOT NULL);
CREATE TABLE records (
    seq bigint PRIMARY KEY,
    record_id text NOT NULL UNIQUE,
    record_type text NOT NULL,
    epistemic_type text NOT NULL,
    links text NOT NULL,
    nonce text NOT NULL,
    action_id text UNIQUE,
    stream text,
    tag text,
    body bytea NOT NULL,
    prev_hash text NOT NULL,
    row_hash text NOT NULL
);
CREATE TABLE evidence (
    eid bigint PRIMARY KEY,
    record_seq bigint REFERENCES records(seq),
    record_id text,
    body bytea NOT NULL,
    prev_hash text NOT NULL,
    row_hash text NOT NULL,
    CHECK ((record_seq IS NULL) = (record_id IS NULL))
);
CREATE TABLE evidence_members (
    record_seq bigint NOT NULL,
    eid bigint NOT NULL,
    leaf_index integer NOT NULL,
    PRIMARY KEY (record_seq, eid)
);
INSERT INTO heads VALUES ('records', 0, '{GENESIS}'), ('evidence', 0, '{GENESIS}');
"""

#: every index and trigger a write-open puts back when it is missing (name -> SQL)
OBJECTS: dict[str, str] = {
    "records_tag": "CREATE INDEX records_tag ON records(tag, stream, seq) WHERE tag IS NOT NULL",
    "records_capsule_action_id": f"CREATE UNIQUE INDEX records_capsule_action_id ON records (({ACTION_ID})) "
                                 "WHERE record_type = 'capsule'",
    "records_capsule_boundary": f"CREATE INDEX records_capsule_boundary ON records ({STREAM}, seq) WHERE {BOUNDARY}",
}
for _table in _APPEND_ONLY:
    for _event, _level in (("update", "ROW"), ("delete", "ROW"), ("truncate", "STATEMENT")):
        # dropped first: a trigger disabled behind capseal's back counts as missing
        OBJECTS[f"{_table}_no_{_event}"] = (f"DROP TRIGGER IF EXISTS {_table}_no_{_event} ON {_table}; "
                                            f"CREATE TRIGGER {_table}_no_{_event} BEFORE {_event.upper()} ON {_table} "
                                            f"FOR EACH {_level} EXECUTE FUNCTION capseal_append_only()")

_LOCK = "SELECT pg_advisory_xact_lock(hashtext('capseal-ledger:' || current_schema()))"
_RELATIONS = ("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
              "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY c.relname")
PRESENT_SQL = ("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'i' UNION ALL "
            "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND NOT t.tgisinternal "
            "AND t.tgenabled <> 'D'")


def _relations(cur: Any) -> list[str]:
    return [str(r[0]) for r in cur.execute(_RELATIONS).fetchall()]


def _format_of(cur: Any, relations: list[str]) -> str | None:
    if "meta" not in relations:
        return None
    row = cur.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
    return None if row is None else str(row[0])


def prepare(conn: Any, name: str, *, readonly: bool) -> None:
    """Check that the connection's current schema holds a ledger of this
    format, making one in an empty schema (unless ``readonly``), and put
    back a missing index or append-only trigger (a write-open only).

    Args:
        conn: an autocommit psycopg connection.
        name: the ledger's name for messages (its redacted URL).
        readonly: open for reading only (a ledger must be there).

    Raises:
        NotALedgerError: the schema holds other tables (nothing written).
        LedgerFormatError: a ledger of another format.
        LedgerError: no schema, a database that is not UTF-8, or (read-only) no ledger yet.
    """
    cur = conn.cursor()
    schema = usable_schema(cur, name)
    found = _check(cur, name, _relations(cur))
    if readonly:
        if found is None:
            raise LedgerError(f"{name} holds no ledger yet (an empty schema {schema!r})")
        return
    if found is not None and not _missing(cur):
        return
    with conn.transaction():
        cur.execute(_LOCK)  # held to the end of this transaction: creators and repairers take turns
        if _check(cur, name, _relations(cur)) is None:
            create(cur)
        for missing in _missing(cur):
            cur.execute(OBJECTS[missing])


def create(cur: Any) -> None:
    """Make a ledger in the (empty) current schema, inside the caller's transaction.

    Args:
        cur: a cursor of a connection inside a transaction.
    """
    cur.execute(_FUNCTIONS)
    cur.execute(_TABLES)
    cur.execute("INSERT INTO meta VALUES ('format', %s), ('ledger_id', %s)", (LEDGER_FORMAT, os.urandom(16).hex()))
    for missing in _missing(cur):
        cur.execute(OBJECTS[missing])


def claim_empty(cur: Any, name: str) -> None:
    """Inside a transaction: take the creators' lock and refuse a schema
    that is not empty (an import builds a new ledger).

    Args:
        cur: a cursor of a connection inside a transaction.
        name: the ledger's name for messages.

    Raises:
        LedgerError: the schema holds a ledger already.
        NotALedgerError: it holds other tables.
    """
    cur.execute(_LOCK)
    if _check(cur, name, _relations(cur)) is not None:
        raise LedgerError(f"{name} holds a ledger already; import builds a new ledger (give it an empty database "
                          "or schema)")


def usable_schema(cur: Any, name: str) -> str:
    """The connection's current schema, checked to exist in a UTF-8 database.

    Args:
        cur: a cursor.
        name: the ledger's name for messages.

    Returns:
        The schema's name.

    Raises:
        LedgerError: no such schema, or a database of another encoding.
    """
    schema, encoding = cur.execute("SELECT current_schema(), current_setting('server_encoding')").fetchone()
    if schema is None:
        raise LedgerError(f"{name}: the schema its search_path names does not exist; create it first "
                          "(CREATE SCHEMA), or leave search_path out to use public")
    if encoding not in ("UTF8", "SQL_ASCII"):
        raise LedgerError(f"{name}: the database's encoding is {encoding}; a capseal ledger needs a UTF8 database "
                          "(createdb --encoding=UTF8), so that its lookups read every capsule body")
    return str(schema)


def _check(cur: Any, name: str, relations: list[str]) -> str | None:
    """The ledger format found (None: an empty schema), or the refusal."""
    found = _format_of(cur, relations)
    if relations and found is None:
        shown = ", ".join(relations[:5]) + (f" and {len(relations) - 5} more" if len(relations) > 5 else "")
        raise NotALedgerError(
            f"{name} is not a capseal ledger: its schema holds other tables ({shown}); nothing was written to it",
            hint="Give capseal an empty database or schema (search_path in the URL's options), or a capseal ledger.")
    if found is not None and found != LEDGER_FORMAT:
        raise LedgerFormatError(f"{name} is a {found} ledger; this capseal reads {LEDGER_FORMAT} "
                                "(export it with the capseal that wrote it, then import the export)")
    if found is not None and not set(TABLES) <= set(relations):
        raise LedgerFormatError(f"{name} holds a capseal meta table but lacks "
                                f"{', '.join(sorted(set(TABLES) - set(relations)))}: not a ledger this capseal made")
    return found


def _missing(cur: Any) -> list[str]:
    """The indexes and append-only triggers that are not there (dropped behind capseal's back)."""
    present = {str(r[0]) for r in cur.execute(PRESENT_SQL).fetchall()}
    return [n for n in OBJECTS if n not in present]
