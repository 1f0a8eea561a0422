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

The layout (``meta`` key ``layout``), as the file engine's: layout 2 keys
every action id in one unique index, ``records_action_id_key`` (a capsule's
from its body, another record's from its column), as the file engine keys
it (:func:`._columns.action_key`: U+0001 doubled, U+0000 as U+0001 U+0002).
PostgreSQL text holds no U+0000, so an action id with one is kept as its
JSON text in ``action_id_json`` (``action_id`` NULL). A ledger of the first
layout (no ``layout`` row: the column's UNIQUE constraint and a body index
beside it) is brought to layout 2 by its first write-open, in the creators'
transaction; read-only, it is read as it is.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import LedgerError, LedgerFormatError, NotALedgerError
from ._format import GENESIS, LEDGER_FORMAT

__all__ = ["ACTION_ID", "ACTION_KEY", "STREAM", "BOUNDARY", "LAYOUT", "TABLES", "OBJECTS", "PRESENT_SQL", "prepare",
           "create", "claim_empty", "usable_schema", "layout_of"]


def _member(*path: str) -> str:
    return "capseal_member(body, " + ", ".join(f"'{p}'" for p in path) + ")"


#: SQL for a capsule row's values read from its body (as the file engine's :mod:`._columns`)
ACTION_ID = _member("capsule", "action_id")
#: SQL for a row's action-id key (as the file engine's :data:`._columns.ACTION_KEY`)
ACTION_KEY = ("(CASE WHEN record_type = 'capsule' THEN capseal_action_key(body) "
              "ELSE capseal_column_key(action_id, action_id_json) END)")
STREAM = f"({_member('capsule', 'operator')} || chr(31) || {_member('capsule', 'developer')})"
#: the layout this capseal writes (see the module)
LAYOUT = "2"
BOUNDARY = f"record_type = 'capsule' AND {_member('capsule', 'disposition', 'verdict_class')} = 'epoch_boundary'"

TABLES = ("meta", "heads", "records", "evidence", "evidence_members")
_APPEND_ONLY = ("records", "evidence", "evidence_members")

_FUNCTIONS = r"""
CREATE FUNCTION capseal_member(body bytea, VARIADIC path text[]) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL UNSAFE AS $$
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
# the action-id key of a JSON value's text: decoded, U+0001 doubled and U+0000 as U+0001 U+0002
# (text holds no U+0000). The backslash pairs go first (as \u005c, a backslash too), so each
# backslash left starts an escape and \u0000 is replaced only where it is one. One EXCEPTION
# block a call: each is a subtransaction.
_KEY_FUNCTIONS = r"""
CREATE OR REPLACE FUNCTION capseal_token_key(token text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL UNSAFE AS $$
BEGIN
    RETURN replace(replace(replace(token, '\\', '\u005c'), '\u0001', '\u0001\u0001'),
                   '\u0000', '\u0001\u0002')::json #>> '{}';
EXCEPTION WHEN others THEN
    RETURN NULL;  -- not JSON (an edited row): this row only
END $$;
CREATE OR REPLACE FUNCTION capseal_action_key(body bytea) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL UNSAFE AS $$
BEGIN
    -- the whole body rewritten: PostgreSQL's JSON reader stops at an escaped U+0000 on its way
    RETURN replace(replace(replace(convert_from(body, 'UTF8'), '\\', '\u005c'), '\u0001', '\u0001\u0001'),
                   '\u0000', '\u0001\u0002')::json #>> '{capsule,action_id}';
EXCEPTION WHEN others THEN
    RETURN NULL;  -- not JSON (a damaged body): this row only, never every lookup
END $$;
CREATE OR REPLACE FUNCTION capseal_column_key(action_id text, action_id_json text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE PARALLEL UNSAFE AS $$
BEGIN
    IF action_id_json IS NOT NULL THEN
        RETURN capseal_token_key(action_id_json);
    END IF;
    RETURN replace(action_id, chr(1), chr(1) || chr(1));
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
    action_id text,  -- unique through records_action_id_key (with a capsule's, read from its body)
    stream text,
    tag text,
    body bytea NOT NULL,
    prev_hash text NOT NULL,
    row_hash text NOT NULL,
    action_id_json text  -- an action id holding U+0000, as JSON text (action_id is then NULL)
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
    "records_action_id_key": f"CREATE UNIQUE INDEX records_action_id_key ON records ({ACTION_KEY})",
    "records_capsule_boundary": f"CREATE INDEX records_capsule_boundary ON records ({STREAM}, seq) WHERE {BOUNDARY}",
}
for _table in _APPEND_ONLY:
    for _event, _level in (("update", "ROW"), ("delete", "ROW"), ("truncate", "STATEMENT")):
        # dropped first: a trigger disabled behind capseal's back counts as missing
        OBJECTS[f"{_table}_no_{_event}"] = (f"DROP TRIGGER IF EXISTS {_table}_no_{_event} ON {_table}; "
                                            f"CREATE TRIGGER {_table}_no_{_event} BEFORE {_event.upper()} ON {_table} "
                                            f"FOR EACH {_level} EXECUTE FUNCTION capseal_append_only()")

# a first-layout ledger brought to layout 2 (in the creators' transaction, under their lock):
# the column's UNIQUE constraint (its index has the name the key's index takes) and the body
# index make way for the key's index; a new column is NULL in every row already there
_MIGRATE = ("ALTER TABLE records ADD COLUMN IF NOT EXISTS action_id_json text; "
            "ALTER TABLE records DROP CONSTRAINT IF EXISTS records_action_id_key; "
            "DROP INDEX IF EXISTS records_capsule_action_id")
_SET_LAYOUT = ("INSERT INTO meta VALUES ('layout', %s) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value")
_OLD_INDEX = ("SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() "
              "AND c.relname = 'records_capsule_action_id'")

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


def prepare(conn: Any, name: str, *, readonly: bool) -> str:
    """Check that the connection's current schema holds a ledger of this
    format, making one in an empty schema (unless ``readonly``), and put
    back a missing index or append-only trigger (a write-open only).

    Args:
        conn: an autocommit psycopg connection.
        name: the ledger's name for messages (its redacted URL).
        readonly: open for reading only (a ledger must be there).

    Returns:
        The ledger's layout (this capseal's, unless ``readonly``).

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
        return layout_of(cur, name)
    if found is not None and layout_of(cur, name) == LAYOUT and not _missing(cur) and not cur.execute(_OLD_INDEX).fetchone():
        return LAYOUT
    with conn.transaction():
        cur.execute(_LOCK)  # held to the end of this transaction: creators and repairers take turns
        if _check(cur, name, _relations(cur)) is None:
            create(cur)
        elif layout_of(cur, name) != LAYOUT or cur.execute(_OLD_INDEX).fetchone():
            # the first layout (or its body index, put back by an earlier capseal appending since)
            cur.execute(_KEY_FUNCTIONS)
            cur.execute(_MIGRATE)
            cur.execute(_SET_LAYOUT, (LAYOUT,))
        for missing in _missing(cur):
            cur.execute(OBJECTS[missing])
    return LAYOUT


def layout_of(cur: Any, name: str) -> str:
    """The layout of the ledger in the current schema (see the module).

    Args:
        cur: a cursor.
        name: the ledger's name for messages.

    Returns:
        The layout: "1" for a ledger without a ``layout`` row.

    Raises:
        LedgerFormatError: a layout a later capseal wrote.
    """
    row = cur.execute("SELECT value FROM meta WHERE key = 'layout'").fetchone()
    layout = "1" if row is None else str(row[0])
    if layout not in ("1", LAYOUT):
        raise LedgerFormatError(f"{name} is a {LEDGER_FORMAT} ledger of layout {layout!r}, which a later capseal "
                                f"wrote; this capseal knows layouts 1 and {LAYOUT} (export it with the capseal that "
                                "wrote it, then import the export)")
    return layout


def create(cur: Any) -> None:
    """Make a ledger in the (empty) current schema, inside the caller's transaction.

    Args:
        cur: a cursor of a connection inside a transaction.
    """
    cur.execute(_FUNCTIONS)
    cur.execute(_KEY_FUNCTIONS)
    cur.execute(_TABLES)
    cur.execute("INSERT INTO meta VALUES ('format', %s), ('ledger_id', %s), ('layout', %s)",
                (LEDGER_FORMAT, os.urandom(16).hex(), LAYOUT))
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
