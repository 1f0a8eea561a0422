"""Where :class:`capseal.process.ForkCopies` was, until the backends import it from there."""

from .process import ForkCopies

__all__ = ["ForkCopies"]
