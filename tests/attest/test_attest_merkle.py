"""RFC 9162 §2.1 Merkle trees over capsule ids (no TPM needed)."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from capseal import merkle


def test_hashing_is_rfc9162_domain_separated() -> None:
    assert merkle.build([]).root == hashlib.sha256(b"").digest()
    # MTH of one empty leaf: SHA-256(0x00) — the RFC 6962/9162 test vector
    assert merkle.leaf_hash(b"").hex() == "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
    a, b = bytes(32), b"\x01" * 32
    assert merkle.leaf_hash(a) == hashlib.sha256(b"\x00" + a).digest()
    assert merkle.node_hash(a, b) == hashlib.sha256(b"\x01" + a + b).digest()
    assert merkle.build([a, b]).root == merkle.node_hash(merkle.leaf_hash(a), merkle.leaf_hash(b))
    # the second-preimage guard: an interior node is never a leaf hash of its children
    assert merkle.build([a + b]).root != merkle.build([a, b]).root


def test_fast_tree_equals_the_rfc_definitions_for_every_small_size() -> None:
    for n in list(range(1, 70)) + [127, 128, 129, 1000]:
        leaves = [hashlib.sha256(f"{n}-{i}".encode()).digest() for i in range(n)]
        tree = merkle.build(leaves)
        assert tree.root == merkle.root_recursive(leaves)
        for m in range(n) if n < 200 else (0, 1, n // 2, n - 2, n - 1):
            assert list(tree.proofs[m]) == merkle.path_recursive(m, leaves)
            assert merkle.verify_inclusion(leaves[m], m, n, tree.proofs[m], tree.root)


@given(st.lists(st.binary(min_size=32, max_size=32), min_size=2, max_size=40, unique=True), st.data())
def test_a_proof_proves_only_its_own_leaf(leaves: list[bytes], data: st.DataObject) -> None:
    tree = merkle.build(leaves)
    n = len(leaves)
    m = data.draw(st.integers(0, n - 1))
    other = data.draw(st.integers(0, n - 1).filter(lambda j: j != m))
    proof = tree.proofs[m]
    assert merkle.verify_inclusion(leaves[m], m, n, proof, tree.root)
    assert not merkle.verify_inclusion(leaves[other], m, n, proof, tree.root)  # another leaf
    assert not merkle.verify_inclusion(leaves[m], other, n, proof, tree.root)  # another index
    # (tree_size is not committed to by the root alone — RFC 9162 §2.1.3.2 proves
    # inclusion of the leaf under the root, which is what a slot claims)
    if proof:
        bad = list(proof)
        bad[0] = bytes(32)
        assert not merkle.verify_inclusion(leaves[m], m, n, bad, tree.root)
        assert not merkle.verify_inclusion(leaves[m], m, n, proof[:-1], tree.root)
        assert not merkle.verify_inclusion(leaves[m], m, n, [*proof, bytes(32)], tree.root)


def test_nonsense_indices_are_refused_not_raised() -> None:
    leaves = [bytes([i]) * 32 for i in range(5)]
    tree = merkle.build(leaves)
    for index, size in ((-1, 5), (5, 5), (0, 0), (True, 5), ("0", 5)):
        assert not merkle.verify_inclusion(leaves[0], index, size, tree.proofs[0], tree.root)  # type: ignore[arg-type]
