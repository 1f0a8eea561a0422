"""RFC 9162 §2.1 Merkle trees over capsule ids, for batch evidence.

In the core package (not ``capseal.attest``) because the ledger stores a
quoted batch once and rebuilds each record's inclusion proof when it is read.

Why RFC 9162 and not an ad-hoc tree: its leaf/node domain separation (0x00 /
0x01 prefixes) makes a leaf hash impossible to pass off as an interior node
(second-preimage), and any verifier that knows Certificate Transparency can
check our inclusion proofs without reading capseal's code.

Leaves are the raw 32 bytes of each capsule id (never the hex text):

    leaf  = SHA-256(0x00 || capsule_id_raw)
    node  = SHA-256(0x01 || left || right)
    MTH({}) = SHA-256("")

:func:`build` computes the root and every inclusion proof in one bottom-up
pass (a node without a sibling is carried up unchanged, which gives the same
tree as the recursive definition); :func:`root_recursive` and
:func:`path_recursive` are the RFC's definitions, kept as the reference the
fast path is tested against. :func:`verify_inclusion` is the RFC 9162
§2.1.3.2 algorithm.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import InputError

__all__ = ["leaf_hash", "node_hash", "Tree", "build", "root_and_path", "root_recursive", "path_recursive", "verify_inclusion", "root_from_proof"]

_sha256 = hashlib.sha256


def leaf_hash(leaf: bytes) -> bytes:
    """SHA-256(0x00 || leaf).

    Args:
        leaf: the raw leaf data (a capsule id's 32 bytes).

    Returns:
        The 32-byte leaf hash.
    """
    return _sha256(b"\x00" + leaf).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right).

    Args:
        left: the left child's hash.
        right: the right child's hash.

    Returns:
        The 32-byte node hash.
    """
    return _sha256(b"\x01" + left + right).digest()


@dataclass(frozen=True)
class Tree:
    """A built tree: its root and the audit path of every leaf (leaf order)."""

    root: bytes
    proofs: tuple[tuple[bytes, ...], ...]

    @property
    def size(self) -> int:
        return len(self.proofs)


def build(leaves: Sequence[bytes]) -> Tree:
    """Root and all inclusion proofs of ``leaves`` (raw leaf data, not hashes).

    O(n log n) hashing in total: at each level adjacent pairs are combined and
    every leaf under the left (right) child gets the right (left) child's hash
    appended to its path.

    Args:
        leaves: the raw leaf data, in order.

    Returns:
        The tree: its root (SHA-256 of nothing for no leaves) and every
        leaf's audit path.
    """
    n = len(leaves)
    if n == 0:
        return Tree(_sha256(b"").digest(), ())
    sha = _sha256
    level = [sha(b"\x00" + x).digest() for x in leaves]
    paths: list[list[bytes]] = [[] for _ in range(n)]
    # spans[i] = (first leaf, end leaf) covered by node i of the current level
    spans = [(i, i + 1) for i in range(n)]
    while len(level) > 1:
        nxt: list[bytes] = []
        nxt_spans: list[tuple[int, int]] = []
        for i in range(0, len(level) - 1, 2):
            left, right = level[i], level[i + 1]
            (a, b), (c, d) = spans[i], spans[i + 1]
            for leaf in range(a, b):
                paths[leaf].append(right)
            for leaf in range(c, d):
                paths[leaf].append(left)
            nxt.append(sha(b"\x01" + left + right).digest())
            nxt_spans.append((a, d))
        if len(level) % 2:
            nxt.append(level[-1])
            nxt_spans.append(spans[-1])
        level, spans = nxt, nxt_spans
    return Tree(level[0], tuple(tuple(p) for p in paths))


def root_and_path(leaves: Sequence[bytes], index: int | None = None) -> tuple[bytes, tuple[bytes, ...]]:
    """The root of ``leaves`` and (when ``index`` is given) that one leaf's
    audit path, in O(n) hashes: what a batch writer needs to quote the root and
    check the quote, without the O(n log n) of every proof (:func:`build`).

    Args:
        leaves: the raw leaf data, in order.
        index: the leaf whose audit path is wanted (None: none).

    Returns:
        ``(root, path)``; the path is empty without ``index``.

    Raises:
        InputError: ``index`` is not a leaf of ``leaves`` (a ValueError).
    """
    n = len(leaves)
    if index is not None and not 0 <= index < n:
        raise InputError(f"index={index!r} is not a leaf of the {n} leaves given")
    if n == 0:
        return _sha256(b"").digest(), ()
    sha = _sha256
    level = [sha(b"\x00" + x).digest() for x in leaves]
    path: list[bytes] = []
    pos = index
    while len(level) > 1:
        if pos is not None:
            sibling = pos ^ 1
            if sibling < len(level):  # a node without a sibling is carried up unchanged
                path.append(level[sibling])
            pos >>= 1
        odd = level[-1] if len(level) % 2 else None
        level = [sha(b"\x01" + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
        if odd is not None:
            level.append(odd)
    return level[0], tuple(path)


def _split(n: int) -> int:
    """The largest power of two strictly smaller than ``n`` (n > 1)."""
    k = 1
    while k << 1 < n:
        k <<= 1
    return k


def root_recursive(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]) exactly as RFC 9162 §2.1.1 defines it (reference).

    Args:
        leaves: the raw leaf data, in order.

    Returns:
        The 32-byte root.
    """
    n = len(leaves)
    if n == 0:
        return _sha256(b"").digest()
    if n == 1:
        return leaf_hash(leaves[0])
    k = _split(n)
    return node_hash(root_recursive(leaves[:k]), root_recursive(leaves[k:]))


def path_recursive(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PATH(m, D[n]) exactly as RFC 9162 §2.1.3.1 defines it (reference).

    Args:
        m: the leaf's index.
        leaves: the raw leaf data, in order.

    Returns:
        The leaf's audit path, nearest sibling first.

    Raises:
        InputError: ``m`` is not a leaf of ``leaves`` (a ValueError).
    """
    n = len(leaves)
    if not 0 <= m < n:
        raise InputError(f"m={m!r} is not a leaf of the {n} leaves given")
    if n == 1:
        return []
    k = _split(n)
    if m < k:
        return path_recursive(m, leaves[:k]) + [root_recursive(leaves[k:])]
    return path_recursive(m - k, leaves[k:]) + [root_recursive(leaves[:k])]


def root_from_proof(leaf_index: int, tree_size: int, leaf_digest: bytes, proof: Sequence[bytes]) -> bytes | None:
    """The root an inclusion proof leads to (RFC 9162 §2.1.3.2 steps 1–6),
    or None when the proof cannot belong to a tree of this size.

    Args:
        leaf_index: the leaf's index.
        tree_size: how many leaves the tree holds.
        leaf_digest: the leaf's hash (:func:`leaf_hash`).
        proof: the audit path.

    Returns:
        The 32-byte root, or None (also for indexes that are not plain ints).
    """
    if not (isinstance(leaf_index, int) and isinstance(tree_size, int)) or isinstance(leaf_index, bool) or isinstance(tree_size, bool):
        return None
    if not 0 <= leaf_index < tree_size:
        return None
    fn, sn = leaf_index, tree_size - 1
    r = leaf_digest
    sha = _sha256  # inlined node_hash: this loop runs for every record of every batch
    for p in proof:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            r = sha(b"\x01" + p + r).digest()
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = sha(b"\x01" + r + p).digest()
        fn >>= 1
        sn >>= 1
    if sn != 0:
        return None
    return r


def verify_inclusion(leaf: bytes, leaf_index: int, tree_size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """True when ``proof`` shows raw ``leaf`` at ``leaf_index`` of the tree of
    ``tree_size`` leaves whose root is ``root`` (RFC 9162 §2.1.3.2).

    Args:
        leaf: the raw leaf data.
        leaf_index: its index.
        tree_size: how many leaves the tree holds.
        proof: the audit path.
        root: the root the proof must lead to.

    Returns:
        Whether it does; a malformed proof is False, never an error.
    """
    computed = root_from_proof(leaf_index, tree_size, leaf_hash(leaf), proof)
    return computed is not None and computed == root
