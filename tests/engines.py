"""The two ledger engines, seen the same way by the tests that run over both
(the ``engine`` fixture): where a new ledger goes, and SQL run behind
capseal's back (what someone holding the file, or the database's superuser,
can do)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENGINES = ("sqlite", "postgres")


@dataclass
class Engine:
    """One engine for a test: ``sqlite`` (files in ``tmp``) or ``postgres``
    (schemas on the session's server)."""

    name: str
    tmp: Path
    server: Any = None  # tests.conftest.PostgresServer for postgres

    @property
    def postgres(self) -> bool:
        return self.name == "postgres"

    def new(self, name: str = "l") -> str:
        """Where a new, empty ledger goes: a file path, or the URL of an empty schema."""
        return self.server.new_url() if self.postgres else str(self.tmp / f"{name}.db")

    def execute(self, target: str, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """Run ``sql`` (``?`` placeholders) on the ledger's store directly, committed; its rows."""
        if not self.postgres:
            with sqlite3.connect(target) as db:
                return db.execute(sql, args).fetchall()
        import psycopg

        with psycopg.connect(target, autocommit=True) as conn:
            cur = conn.execute(sql.replace("?", "%s"), args or None)
            return cur.fetchall() if cur.description is not None else []

    def allow_edits(self, target: str, table: str = "records") -> None:
        """Take away the trigger that refuses UPDATE on ``table`` (a superuser, or the file's holder, can)."""
        if self.postgres:
            self.execute(target, f"ALTER TABLE {table} DISABLE TRIGGER {table}_no_update")
        else:
            self.execute(target, f"DROP TRIGGER {table}_no_update")

    @property
    def refusal(self) -> tuple[type[BaseException], ...]:
        """What the store raises for an UPDATE or DELETE its triggers refuse."""
        if not self.postgres:
            return (sqlite3.IntegrityError,)
        import psycopg

        return (psycopg.errors.RestrictViolation,)

    def holds_ledger(self, target: str) -> bool:
        """Whether anything of a ledger is at ``target`` (a file; tables in the schema)."""
        if not self.postgres:
            return Path(target).exists()
        return bool(self.execute(target, "SELECT 1 FROM pg_tables WHERE schemaname = current_schema()"))
