"""PKCS#11 modules loaded in this process: one per real path, initialised
again when other code finalised it, or when this process was forked.

Why the care: other code in the process may finalise a module
(``C_Finalize``: another library that loaded it too, done with it). Every
call then answers ``CKR_CRYPTOKI_NOT_INITIALIZED``; PKCS#11 says the
application must then call ``C_Initialize`` again and log in again, which
:meth:`Module.recover_if_finalized` and the token sessions' reconnect do,
once per call. A process forked from this one (``os.fork()`` without exec:
multiprocessing's ``fork``, a pre-forking server) is, for PKCS#11, another
application: it must call ``C_Initialize`` itself *before anything else*
(PKCS#11 v2.40 §5.5.1), which :meth:`Module.ensure_initialized` does on the
module's first use there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pkcs11

from capseal.errors import SignerForkedError, SignerUnavailableError

from ._direct import c_initialize
from ._lock import P11_LOCK, check_alive, log, p11x
from ._uri import check_module_allowed

__all__ = ["Module", "load_module", "loaded_modules", "module_hint", "version_text"]

#: what ``C_Initialize`` answers a module that is initialised already (PKCS#11 v2.40 §5.4)
_CKR_CRYPTOKI_ALREADY_INITIALIZED = 0x191


def version_text(pair: tuple[int, int]) -> str:
    """A CK_VERSION as text: a string, never a float (custody statements are hashed JSON).

    Args:
        pair: ``(major, minor)``.

    Returns:
        ``"2.6"`` for ``(2, 6)``.
    """
    return f"{pair[0]}.{pair[1]}"


@dataclass
class Module:
    """A loaded PKCS#11 module. ``generation`` grows each time the module is
    re-initialised; session handles from an older generation are dead."""

    path: str
    real: str
    lib: Any
    generation: int = 0
    #: loaded before this process was forked from its parent, and not yet
    #: initialised here (see ensure_initialized)
    inherited: bool = False

    def info(self) -> dict[str, str]:
        """What the library reports about itself.

        Returns:
            ``library_manufacturer``, ``library_description``, ``library_version``, ``cryptoki_version``.
        """
        lib = self.lib
        return {
            "library_manufacturer": lib.manufacturer_id,
            "library_description": lib.library_description,
            "library_version": version_text(lib.library_version),
            "cryptoki_version": version_text(lib.cryptoki_version),
        }

    def reinitialize(self) -> None:
        """``C_Finalize`` + ``C_Initialize``: SoftHSM2 (and some other modules)
        see tokens created, and recover from storage that vanished, only then.
        Every session of this module in the process dies; the generation bump
        tells each TokenSession to reconnect instead of using a dead handle.

        Raises:
            SignerUnavailableError: the module cannot be initialised.
        """
        self.generation += 1
        log.info("re-initialising PKCS#11 module %s", self.path)
        failure = None
        try:
            if self.lib.initialized:
                self.lib.finalize()
        except p11x.PKCS11Error:
            pass  # finalised underneath already (other code called C_Finalize): initialising is all that is left
        try:
            self.lib.initialize()
        except p11x.PKCS11Error as exc:
            failure = type(exc).__name__
        if failure is not None:  # raised outside the handler: no exception context at all
            raise SignerUnavailableError(f"PKCS#11 module {self.path} cannot be initialised ({failure})",
                                         hint=module_hint(self.path))

    def recover_if_finalized(self, exc: BaseException | None = None) -> bool:
        """Whether the module had been finalised underneath this process's
        sessions (``C_Finalize`` by other code that loaded it too), in which
        case it is initialised again here and every session of it is marked
        dead (``generation``), so each TokenSession reconnects and logs in
        again on its next call, as PKCS#11 requires.

        Asked with ``C_Initialize`` itself, through the module's function
        table: a module in use answers ``CKR_CRYPTOKI_ALREADY_INITIALIZED``
        and nothing changes; a finalised one answers ``CKR_OK`` and is
        initialised by that very call. Without a trusted table, python-pkcs11's
        own message for ``CKR_CRYPTOKI_NOT_INITIALIZED`` (``exc``) decides,
        and the module is re-initialised through python-pkcs11. Lock held.

        Args:
            exc: the python-pkcs11 error that made the caller ask.

        Returns:
            True when the module was finalised and is initialised again.
        """
        if self.inherited:  # a fork's first use: ensure_initialized's job
            return False
        rv = c_initialize(self.real)
        if rv is None:
            if exc is None or "not initialized" not in str(exc):
                return False
            self.reinitialize()
        elif rv != 0:
            return False
        else:
            self.generation += 1
        log.warning("PKCS#11 module %s was finalised by other code in this process; initialised it again "
                    "(its sessions log in again)", self.path)
        return True

    def ensure_initialized(self) -> None:
        """Initialise the module first if this process was forked since it was
        loaded, or if an earlier re-initialisation failed. Lock held.

        Raises:
            SignerForkedError: the module cannot be initialised in this forked process.
            SignerUnavailableError: it cannot be initialised.
        """
        if self.inherited:
            self._initialize_in_fork()
        elif not self.lib.initialized:  # an earlier re-initialisation failed
            self.reinitialize()

    def _initialize_in_fork(self) -> None:
        """First use in a process forked from one that had loaded the module:
        ``C_Initialize`` comes first (PKCS#11 v2.40 §5.5.1). A module that
        notices the fork starts afresh and answers ``CKR_OK`` (OpenSC, for
        one, thereby lets go of the parent's reader connections without
        closing them). One that answers ``CKR_CRYPTOKI_ALREADY_INITIALIZED``
        still holds the parent's state (SoftHSM2): ``C_Finalize`` +
        ``C_Initialize`` give this process its own. The parent's sessions,
        whose handles this process shares, are never closed from here
        (``generation`` moved on at the fork)."""
        rv = c_initialize(self.real)
        self.inherited = False
        if rv == 0:
            log.info("PKCS#11 module %s initialised in this forked process", self.path)
            return
        if rv is not None and rv != _CKR_CRYPTOKI_ALREADY_INITIALIZED:
            self.inherited = True  # tried again on the next use
            raise SignerForkedError(
                f"PKCS#11 module {self.path} cannot be initialised in this forked process (C_Initialize answered 0x{rv:x})",
                hint="open signers in a process started with spawn or forkserver")
        self.reinitialize()


_MODULES: dict[str, Module] = {}


def module_hint(path: str) -> str:
    """What to check when a module cannot be loaded or initialised.

    Args:
        path: the module's path.

    Returns:
        The hint (SoftHSM2: its configuration file and token directory).
    """
    if "softhsm" in path.lower():
        conf = os.environ.get("SOFTHSM2_CONF", "/etc/softhsm/softhsm2.conf")
        return f"SoftHSM2 reads {conf} (SOFTHSM2_CONF): check that it exists and that its tokendir is there"
    return "check the module's own configuration and that the device is connected"


def load_module(path: str, allowlist: object = None) -> Module:
    """Load (once per real path) the module at ``path``, after the allow-list check.

    Args:
        path: the module's path.
        allowlist: the caller's allow-list (see ``module_allowlist``).

    Returns:
        The loaded module.

    Raises:
        SignerUnavailableError: not on an allow-list in force, no such readable
            file, it cannot be loaded or initialised, or PKCS#11 is refused here.
        SignerForkedError: this process was forked in the middle of a call.
    """
    real = check_module_allowed(path, allowlist)  # before anything is loaded
    with P11_LOCK:
        check_alive()
        module = _MODULES.get(real)
        if module is not None:
            module.ensure_initialized()
            return module
        if not os.path.exists(path):
            raise SignerUnavailableError(f"PKCS#11 module {path} does not exist",
                                         hint="install the token's PKCS#11 module and fix module-path")
        if not os.path.isfile(real) or not os.access(real, os.R_OK):
            raise SignerUnavailableError(f"PKCS#11 module {path} is not a readable file")
        # pkcs11.lib caches by the string it is given; two spellings of one
        # file would C_Initialize it twice. Reuse any object for the same file.
        lib = None
        for so, existing in list(getattr(pkcs11, "_loaded", {}).items()):
            if os.path.realpath(so) == real:
                lib = existing
        detail = None
        try:
            lib = lib if lib is not None else pkcs11.lib(real)
            if not lib.initialized:
                lib.initialize()
        except p11x.PKCS11Error as exc:
            detail = str(exc).replace(real, path) if str(exc) else type(exc).__name__
        if detail is not None:
            raise SignerUnavailableError(f"cannot load PKCS#11 module {path}: {detail}", hint=module_hint(path))
        # and let python-pkcs11 hand this object to anyone asking by the
        # spelling we were given, instead of initialising the module twice
        getattr(pkcs11, "_loaded", {}).setdefault(path, lib)
        module = Module(path=path, real=real, lib=lib)
        _MODULES[real] = module
        return module



def loaded_modules() -> list[Module]:
    """Every module loaded in this process (for the fork hooks; lock held).

    Returns:
        The modules, in the order they were loaded.
    """
    return list(_MODULES.values())
