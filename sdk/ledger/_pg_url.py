"""A PostgreSQL ledger's address: the URL a caller gives, shown without its password.

``postgresql://user:password@host:port/database?host=/socket/dir&options=-csearch_path%3Dschema``
names a ledger: the tables in the connection's current schema (``public``
unless ``search_path`` says otherwise). The URL is handed to libpq as given;
everywhere capseal shows it (messages, reprs, reports, logs) the password is
replaced by ``***``, in the user part and in a ``password=`` parameter alike.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from ..errors import MissingExtraError

__all__ = ["SCHEMES", "DatabaseURL", "is_database_url", "as_url", "redact_url", "psycopg_module"]

SCHEMES = ("postgresql://", "postgres://")


def is_database_url(value: object) -> bool:
    """Whether ``value`` names a PostgreSQL ledger rather than a file.

    Args:
        value: a ledger argument (a path, a URL, anything).

    Returns:
        True for a :class:`DatabaseURL`, and for text starting ``postgresql://`` or ``postgres://``.
    """
    return isinstance(value, DatabaseURL) or (isinstance(value, str) and value.lower().startswith(SCHEMES))


def as_url(value: object) -> DatabaseURL | None:
    """``value`` as a :class:`DatabaseURL`, or None when it names a file.

    Args:
        value: a ledger argument (a path, a URL, a DatabaseURL).

    Returns:
        The URL, or None.
    """
    if isinstance(value, DatabaseURL):
        return value
    return DatabaseURL(value) if isinstance(value, str) and is_database_url(value) else None


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (user part and query).

    Args:
        url: a ``postgresql://`` URL.

    Returns:
        The URL as capseal shows it; never the password.
    """
    scheme, sep, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}{':***' if ':' in userinfo else ''}@{hosts}"
    path, qmark, query = tail.partition("?")
    if qmark:
        parts = []
        for item in query.split("&"):
            key = urllib.parse.unquote(item.partition("=")[0]).strip().lower()
            parts.append(f"{item.partition('=')[0]}=***" if key == "password" else item)
        query = "&".join(parts)
    return f"{scheme}{sep}{netloc}{slash}{path}{qmark}{query}"


class DatabaseURL:
    """A ledger's database URL: the text for libpq, and the redacted text for
    everything shown (``str``, ``repr``, ``name``). Stands where a file
    ledger has its path (``Ledger.path``).

    Args:
        url: the URL as the caller gave it.
    """

    __slots__ = ("_url", "name")

    def __init__(self, url: str) -> None:
        self._url = url
        self.name = redact_url(url)  #: the URL without its password, for messages

    def conninfo(self) -> str:
        """The URL as given (with its password): only for libpq."""
        return self._url

    def password(self) -> str | None:
        """The password the URL carries (to scrub it from a server's message), or None."""
        try:
            from psycopg.conninfo import conninfo_to_dict

            value = conninfo_to_dict(self._url).get("password")
        except Exception:  # noqa: BLE001 - a URL libpq cannot parse carries no password we can name
            return None
        return str(value) if value else None

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"DatabaseURL({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DatabaseURL) and other._url == self._url

    def __hash__(self) -> int:
        return hash(self._url)


def psycopg_module() -> Any:
    """The ``psycopg`` package.

    Returns:
        The module.

    Raises:
        MissingExtraError: psycopg (3) is not installed.
    """
    try:
        import psycopg
    except ImportError as exc:
        raise MissingExtraError(
            f"a PostgreSQL ledger needs psycopg 3, which is not installed ({exc})",
            hint="Install capseal's postgres extra: pip install 'capseal[postgres]' (and libpq5, the PostgreSQL "
                 "client library).") from None
    return psycopg
