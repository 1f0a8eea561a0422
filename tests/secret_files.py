"""Writing a secret file (a private key, a PIN) as an operator keeps one:
mode 0600. capseal refuses one that other users can read or change
(``capseal.keys.secret.exposure``), and a test file written with the default
umask (0644) would be refused for that, not for what the test checks."""

from __future__ import annotations

from pathlib import Path


def write_secret(path: Path, data: bytes | str) -> Path:
    """``data`` into ``path``, then mode 0600 (before anything reads it)."""
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(0o600)
    return path
