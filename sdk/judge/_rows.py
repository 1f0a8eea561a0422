"""Reading one judge row of the ledger: its JSON, its digest, what it cites.

The store (:mod:`capseal.judge.store`, which exports these names) writes the
rows; the verifier reads them back through the same functions.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from capseal.canonical import canonical_bytes, capsule_id, is_hex64, json_digest, raw_digest
from capseal.ledger import StoredEntry
from capseal.record import RECEIVED_CAPSULE, strict_json

from .vocab import ARTIFACT_RECORD_TYPE

__all__ = ["artifact_content", "body_of_entry", "cited_digests", "declared_external", "digest_of_entry"]


def cited_digests(body: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The digests a body cites and references.

    *Cited*: every judge citation ``{type, digest_alg, digest, judge_purpose}``,
    every ``x-evidence-links`` target and every Evidence Result ``evidence[]`` /
    ``close_ref`` / ``peer_close_ref`` digest — these must resolve in the store.
    *Referenced*: other digest refs (a pin's prompt/axes/weights, a Close's
    head, proofs) — preimages a store may or may not publish.

    Args:
        body: a record body.

    Returns:
        ``(cited, referenced)``, each a list of ``(JSONPath, digest)``.
    """
    cited: list[tuple[str, str]] = []
    referenced: list[tuple[str, str]] = []

    def walk(node: Any, path: str, parent_key: str) -> None:
        if isinstance(node, dict):
            digest = node.get("digest")
            if isinstance(digest, str) and node.get("digest_alg") == "SHA-256":
                if "judge_purpose" in node or parent_key in ("evidence", "close_ref", "peer_close_ref"):
                    cited.append((path, digest))
                else:
                    referenced.append((path, digest))
            target = node.get("target")
            if parent_key == "x-evidence-links" and isinstance(target, str):
                cited.append((f"{path}.target", target))
            for k, v in node.items():
                walk(v, f"{path}.{k}" if k.isidentifier() else f'{path}["{k}"]', k)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]", parent_key)

    walk(body, "$", "")
    return cited, referenced


def body_of_entry(entry: StoredEntry) -> dict[str, Any]:
    """The stored JSON of a judge row (``capseal-judgment/1`` or
    ``capseal-artifact/1``).

    Read one way only (``strict_json``): a member held twice reads as one
    record to a parser keeping the last (Python's) and as another to one
    keeping the first, so it is refused, as are NaN/Infinity and nesting too
    deep to read; the store writes none of them.

    Args:
        entry: the ledger row.

    Returns:
        The row's JSON object.

    Raises:
        MalformedJSONError: not strict JSON (a ValueError).
        ValueError: not a JSON object.
    """
    value = strict_json(entry.body, "the stored judge row")
    if not isinstance(value, dict):
        raise ValueError("stored judge row is not a JSON object")
    return value


def declared_external(stored: Mapping[str, Any]) -> tuple[str, ...]:
    """The digests a stored judgment row was sealed citing or linking to in
    another store (its ``external`` member; none when absent).

    Args:
        stored: the row's JSON (``capseal-judgment/1``).

    Returns:
        The digests, sorted.

    Raises:
        ValueError: ``external`` is not a non-empty, sorted list of distinct
            64-hex digests (the only form the store writes).
    """
    if "external" not in stored:
        return ()
    value = stored["external"]
    if (not isinstance(value, list) or not value or not all(isinstance(d, str) and is_hex64(d) for d in value)
            or value != sorted(set(value))):
        raise ValueError("the row's external member is not a sorted list of distinct 64-hex digests")
    return tuple(value)


def artifact_content(stored: Mapping[str, Any]) -> tuple[str, Any, bytes]:
    """What an artifact row holds.

    Args:
        stored: the row's stored body (:func:`body_of_entry`).

    Returns:
        ``(kind, content, digested bytes)``: ``json`` and the value with its
        JCS bytes, ``text`` and the string with its UTF-8, or ``bytes`` twice.

    Raises:
        ValueError: an unknown encoding, or content that does not decode.
        CanonicalizationError: a JSON artifact with no JCS form.
    """
    encoding = stored.get("encoding")
    content = stored.get("content")
    if encoding == "json":
        return "json", content, canonical_bytes(content)
    if encoding == "utf-8" and isinstance(content, str):
        return "text", content, content.encode("utf-8")
    if encoding == "base64" and isinstance(content, str):
        data = base64.b64decode(content, validate=True)
        return "bytes", data, data
    raise ValueError(f"artifact encoding {encoding!r} is not json, utf-8 or base64")


def digest_of_entry(entry: StoredEntry) -> str:
    """Recompute a stored row's digest from its bytes.

    Args:
        entry: the ledger row.

    Returns:
        The capsule id, the record digest, or the artifact's content digest.

    Raises:
        ValueError: a malformed row (no capsule, not strict JSON, an unknown
            artifact encoding).
        CanonicalizationError: content with no JCS form.
    """
    if entry.record_type in ("capsule", RECEIVED_CAPSULE):
        capsule = entry.record().get("capsule")
        if not isinstance(capsule, dict):
            raise ValueError("capsule row has no capsule")
        return capsule_id(capsule)
    stored = body_of_entry(entry)
    if entry.record_type == ARTIFACT_RECORD_TYPE:
        return raw_digest(artifact_content(stored)[2])
    return json_digest(stored.get("record"))
