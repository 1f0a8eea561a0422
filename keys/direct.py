"""capseal.keys.direct — the one switch that turns the backends' fast paths off.

With the environment variable ``CAPSEAL_NO_DIRECT`` set to ``1`` (any value
but empty or ``0``), every backend signs only through its library's plain
path: python-pkcs11's ``key.sign`` and tpm2-pytss's ``ESAPI.sign``. Records,
signatures, custody statements and errors are the same either way; only the
time a signature takes changes. The switch is read when a signer is opened
(and when a signing process starts), so a signer keeps the path it opened with.

What the switch turns off:

* PKCS#11, in this process: ``C_SignInit`` + ``C_Sign`` called straight
  through the module's function table (``capseal.keys.pkcs11._direct``),
  with its choice of keeping or releasing the GIL per call; the signer then
  signs with ``key.sign``.
* PKCS#11 signing process (``signing_process=True``): the child's direct
  ``C_SignInit`` + ``C_Sign`` (it signs with ``key.sign`` instead), and the
  parent's requests written with libc's ``write`` while holding the GIL
  (``os.write`` instead).
* TPM 2.0: ``Esys_Sign`` called through tpm2-pytss's cffi library with
  preallocated structures (``capseal.keys.tpm._direct``); the signer then
  calls ``ESAPI.sign``.

What stays, because python-pkcs11 has no call that does the job correctly:
``C_Initialize`` straight through the function table in a forked process
(python-pkcs11 will not make it on a module it believes initialised), and
``C_Login`` / ``C_Logout`` on a session python-pkcs11 opened (its own login
leaves the session open when the token refuses the PIN). None of them is on
the signing path.

    $ CAPSEAL_NO_DIRECT=1 python -m pytest -m "softhsm or swtpm"

>>> from capseal.keys.direct import direct_calls_allowed
>>> direct_calls_allowed()     # with CAPSEAL_NO_DIRECT=1 in the environment  # doctest: +SKIP
False
"""

from __future__ import annotations

import os

__all__ = ["NO_DIRECT_ENV", "direct_calls_allowed"]

#: The environment variable of the switch.
NO_DIRECT_ENV = "CAPSEAL_NO_DIRECT"


def direct_calls_allowed() -> bool:
    """Whether the backends may take their fast paths (see the module docstring).

    capseal's core reads the same variable by the same rule, for the sealer's,
    the envelope's and the verifier's fast paths (a test keeps the two in step).

    Returns:
        False when ``CAPSEAL_NO_DIRECT`` is set to anything but ``""`` or ``"0"``.
    """
    return os.environ.get(NO_DIRECT_ENV, "").strip() in ("", "0")
