"""What a capsule row is looked up by, read from its hashed body.

A record row's ``action_id``, ``stream`` and ``tag`` columns are outside its
row hash: anyone holding the file can change them without breaking the
chain. So the lookups the producer's refusals and its epoch chain rest on (an
action id or epoch id used before; the last epoch boundary of an operator and
developer) read a capsule's values from its body, through the indexes here;
the columns are checked against the same values by the verifier and by an
import (:func:`capsule_columns`).

Every action id, a capsule's (from its body) and another record's (its
column), is one key of one unique index (:data:`ACTION_KEY`): an id is
refused wherever it was used before, and each insert touches one index
entry for it. The key is the id as decoded, with U+0001 doubled and U+0000
written as U+0001 U+0002 (:func:`action_key`): SQLite's JSON functions end
a string at a NUL, so ids that differ only after one would otherwise be one
key. The indexes are added to an older file on its first write-open.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ACTION_ID", "ACTION_KEY", "STREAM", "BOUNDARY", "BOUNDARY_TAG", "INDEXES", "OLD_INDEXES", "action_key",
           "capsule_columns", "row_columns"]


def _from_body(path: str) -> str:
    """SQL for the member at JSON ``path`` of a row's body (NULL when the body
    is not JSON: a damaged body fails its own row, never every lookup)."""
    body = "CAST(body AS TEXT)"
    return f"(CASE WHEN json_valid({body}) THEN json_extract({body}, '{path}') END)"


def _token_key(token: str) -> str:
    """SQL for the key of the JSON value ``token`` (JSON text): decoded, with
    U+0001 doubled and U+0000 as U+0001 U+0002, as :func:`action_key` does.
    Why the escapes are rewritten before decoding: json_extract ends a string
    at U+0000. Every backslash pair goes first (as ``\\u005c``, a backslash
    too), so each backslash left starts an escape and ``\\u0000`` is found
    only where it is one. ``token`` is SQL giving JSON text."""
    return (rf"json_extract(replace(replace(replace({token}, '\\', '\u005c'), '\u0001', '\u0001\u0001'), "
            rf"'\u0000', '\u0001\u0002'), '$')")


#: SQL for a capsule row's values, and the WHERE clause of its epoch boundaries
ACTION_ID = _from_body("$.capsule.action_id")
#: SQL for a row's action-id key: a capsule's from its body, another record's from its column
_BODY_TOKEN = "CAST(body AS TEXT) -> '$.capsule.action_id'"  # the member's JSON text, as the body spells it
ACTION_KEY = (f"(CASE WHEN record_type = 'capsule' THEN (CASE WHEN json_valid(CAST(body AS TEXT)) THEN "
              f"{_token_key(_BODY_TOKEN)} END) ELSE {_token_key('json_quote(action_id)')} END)")
STREAM = f"({_from_body('$.capsule.operator')} || char(31) || {_from_body('$.capsule.developer')})"
BOUNDARY = f"record_type = 'capsule' AND {_from_body('$.capsule.disposition.verdict_class')} = 'epoch_boundary'"
BOUNDARY_TAG = "epoch_boundary"


def capsule_columns(record: Any) -> tuple[str | None, str | None, str | None]:
    """What a capsule row's lookup columns hold (as the expressions above
    read them from its body, and as capseal's producer writes them): what a
    verifier and an import check the columns against.

    Args:
        record: the row's parsed body (a sealed record).

    Returns:
        ``(action_id, stream, tag)``, each None where the body gives none.
    """
    capsule = record.get("capsule") if isinstance(record, dict) else None
    capsule = capsule if isinstance(capsule, dict) else {}
    action_id, operator, developer = (capsule.get(k) for k in ("action_id", "operator", "developer"))
    disposition = capsule.get("disposition")
    boundary = isinstance(disposition, dict) and disposition.get("verdict_class") == BOUNDARY_TAG
    return (action_id if isinstance(action_id, str) else None,
            f"{operator}\x1f{developer}" if isinstance(operator, str) and isinstance(developer, str) else None,
            BOUNDARY_TAG if boundary else None)


def row_columns(record_type: str, record: Any) -> tuple[str | None, str | None, str | None]:
    """What any row's lookup columns hold, read from its body: a capsule's as
    :func:`capsule_columns`; another record's ``action_id`` is the body's own
    top-level ``action_id`` (a writer that keys a record by one, as the
    referee's book does, puts it in the hashed body), and it has no stream or tag.

    Args:
        record_type: the row's record type.
        record: its parsed body.

    Returns:
        ``(action_id, stream, tag)``, each None where the body gives none.
    """
    if record_type == "capsule":
        return capsule_columns(record)
    action_id = record.get("action_id") if isinstance(record, dict) else None
    return (action_id if isinstance(action_id, str) else None, None, None)


def action_key(action_id: str) -> str:
    """An action id as :data:`ACTION_KEY` keys it (what a lookup compares).

    Args:
        action_id: the id.

    Returns:
        The id with U+0001 doubled and U+0000 written as U+0001 U+0002.
    """
    return action_id.replace("\x01", "\x01\x01").replace("\x00", "\x01\x02")


#: the indexes the lookups use (``has_action_id``; ``last_tagged`` for epoch boundaries)
INDEXES = f"""
CREATE UNIQUE INDEX IF NOT EXISTS records_action_id_key ON records({ACTION_KEY});
CREATE INDEX IF NOT EXISTS records_capsule_boundary ON records({STREAM}, seq) WHERE {BOUNDARY};
"""
#: the first layout's index of a capsule's action id (replaced by ``records_action_id_key``)
OLD_INDEXES = f"""
CREATE UNIQUE INDEX IF NOT EXISTS records_capsule_action_id ON records({ACTION_ID}) WHERE record_type = 'capsule';
CREATE INDEX IF NOT EXISTS records_capsule_boundary ON records({STREAM}, seq) WHERE {BOUNDARY};
"""
