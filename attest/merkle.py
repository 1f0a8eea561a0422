"""RFC 9162 Merkle trees: moved to :mod:`capseal.merkle` (the ledger rebuilds
inclusion proofs of stored batches); this name stays for existing imports."""

from capseal.merkle import *  # noqa: F403
from capseal.merkle import __all__ as __all__  # noqa: F401
