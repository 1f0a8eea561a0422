"""What a capsule row is looked up by, read from its hashed body.

A record row's ``action_id``, ``stream`` and ``tag`` columns are outside its
row hash: anyone holding the file can change them without breaking the
chain. So the lookups the producer's refusals and its epoch chain rest on (an
action id or epoch id used before; the last epoch boundary of an operator and
developer) read a capsule's values from its body, through the indexes here;
the columns are checked against the same values by the verifier and by an
import (:func:`capsule_columns`).

The indexes are added to an older file on its first write-open; an index
only, so a capseal without them reads and appends to the file as before.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ACTION_ID", "STREAM", "BOUNDARY", "BOUNDARY_TAG", "INDEXES", "capsule_columns", "row_columns"]


def _from_body(path: str) -> str:
    """SQL for the member at JSON ``path`` of a row's body (NULL when the body
    is not JSON: a damaged body fails its own row, never every lookup)."""
    body = "CAST(body AS TEXT)"
    return f"(CASE WHEN json_valid({body}) THEN json_extract({body}, '{path}') END)"


#: SQL for a capsule row's values, and the WHERE clause of its epoch boundaries
ACTION_ID = _from_body("$.capsule.action_id")
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


#: the indexes the lookups use (``has_action_id``; ``last_tagged`` for epoch boundaries)
INDEXES = f"""
CREATE UNIQUE INDEX IF NOT EXISTS records_capsule_action_id ON records({ACTION_ID}) WHERE record_type = 'capsule';
CREATE INDEX IF NOT EXISTS records_capsule_boundary ON records({STREAM}, seq) WHERE {BOUNDARY};
"""
