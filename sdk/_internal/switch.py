"""The plain-path switch as capseal's core reads it: the sealer's, the
envelope's and the verifier's fast paths go off under it.

The backends read the same variable, by the same rule, through
:mod:`capseal.keys.direct`; importing that here would load ``capseal.keys``
(and cryptography) for every ``capseal`` command, ``--help`` included.
"""

from __future__ import annotations

import os

__all__ = ["NO_DIRECT_ENV", "plain_path"]

#: The environment variable of the switch.
NO_DIRECT_ENV = "CAPSEAL_NO_DIRECT"


def plain_path() -> bool:
    """Whether only the plain paths may run.

    Returns:
        True when ``CAPSEAL_NO_DIRECT`` is set to anything but ``""`` or ``"0"``.
    """
    return os.environ.get(NO_DIRECT_ENV, "").strip() not in ("", "0")
