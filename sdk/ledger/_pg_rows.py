"""Record rows of a PostgreSQL ledger as entries, and entries as rows.

PostgreSQL text holds no U+0000, so an action id with one is kept as its JSON
text in the ``action_id_json`` column, and ``action_id`` is NULL; every other
member is stored as :mod:`._sqlite_rows` stores it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ._format import StoredEntry
from ._sqlite_rows import RECORD_COLUMNS, record_values, stored

__all__ = ["COLUMNS", "FIRST_LAYOUT_COLUMNS", "row_values", "entry"]

#: what a read selects (:func:`entry` makes the entry); a first-layout ledger has no ``action_id_json``
COLUMNS = RECORD_COLUMNS + ", action_id_json"
FIRST_LAYOUT_COLUMNS = RECORD_COLUMNS + ", NULL::text"


def row_values(e: StoredEntry) -> tuple[Any, ...]:
    """The values of a record row, in :data:`COLUMNS` order."""
    values = record_values(e)
    if e.action_id is not None and "\x00" in e.action_id:
        return (*values[:6], None, *values[7:], json.dumps(e.action_id))
    return (*values, None)


def entry(row: Sequence[Any], *, tolerant: bool = False) -> StoredEntry:
    """A record row read with :data:`COLUMNS` (see :func:`._sqlite_rows.stored`).
    An ``action_id_json`` that is not the JSON of a string (edited) is taken
    as it is: the verifier then finds the column is not what the body gives."""
    kept = row[12]
    if kept is None:
        return stored(row[:12], tolerant=tolerant)
    try:
        action_id = json.loads(kept)
    except (ValueError, TypeError, RecursionError):
        action_id = kept
    return stored((*row[:6], action_id if isinstance(action_id, str) else kept, *row[7:12]), tolerant=tolerant)
