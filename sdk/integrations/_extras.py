"""An adapter's framework, imported on first use of the adapter."""

from __future__ import annotations

import importlib
from types import ModuleType

from capseal.errors import MissingExtraError

__all__ = ["require"]


def require(module: str, extra: str, adapter: str) -> ModuleType:
    """Import ``module`` for ``adapter``.

    Args:
        module: the framework's module (``langchain_core``).
        extra: capseal's extra that installs it (``langchain``).
        adapter: the adapter module asking (for the message).

    Returns:
        The module.

    Raises:
        MissingExtraError: it is not installed, naming the extra.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(f"{adapter} needs capseal[{extra}] ({module} cannot be imported: {exc})",
                                hint=f"pip install 'capseal[{extra}]'") from None
