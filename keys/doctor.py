"""capseal.keys.doctor — ``capseal doctor``: is this machine ready to sign,
and if not, what to do.

Each check (:class:`Check`) says what it looked at and, when it fails, the
fix. The backends add deeper checks (token present, PIN works, TPM answers)
through their ``doctor_checks(uri_or_tcti, pin)``, reached by name as the
scheme registry reaches them, so a backend's missing extra never stops the
system-level checks here, which need no optional package.
"""

from __future__ import annotations

import grp
import importlib.util
import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._registry import SIGNER_FOR_URI_SCHEME, load_target, open_signer, redact_uri
from .secret import as_secret

__all__ = ["Check", "run_doctor"]


@dataclass(frozen=True)
class Check:
    """One thing doctor looked at: ``ok``, what it found (``detail``) and, when
    it failed, the ``fix``. ``checked`` is False for a check doctor did not
    make (it would have cost something, e.g. a TPM dictionary-attack try):
    the detail says why, and it does not count as a failure."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    checked: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The check as JSON (``capseal doctor --json``).

        Returns:
            ``name``, ``ok``, ``detail``, ``fix`` and ``checked``.
        """
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "fix": self.fix, "checked": self.checked}


def _python_package(module: str, extra: str, apt: str) -> Check:
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # an import hook that refuses it, a broken install
        found = False
    if found:
        return Check(f"python package {module}", True, "importable")
    return Check(f"python package {module}", False, "not installed", f"pip install '{extra}' (system packages: {apt})")


def _module_path(uri: str) -> str | None:
    """The URI's module file as the signer finds it: module-path, else the file
    module-name= names in the module directories (RFC 7512 parser, no
    python-pkcs11 needed): "module-path=" may also occur inside an object label
    or a pin-value, and splitting the text there would check a file the URI
    does not name, or print part of the PIN. None when the URI does not parse:
    the backend's "pkcs11 URI" check says why."""
    from capseal.errors import CapsealError

    parse_pkcs11_uri = load_target("pkcs11", "capseal.keys.pkcs11:parse_pkcs11_uri")  # pure Python: no extra needed
    resolve_module = load_target("pkcs11", "capseal.keys.pkcs11:resolve_module")
    try:
        parsed = parse_pkcs11_uri(uri)
    except CapsealError:
        return None
    if parsed.module_path is None and parsed.module_name is not None:
        # module-name= is looked up as the signer looks it up; this check was skipped for it
        # (and with it the SoftHSM2 config check). Not found: the "module loads" check says so
        try:
            resolved: str = resolve_module(parsed)
        except CapsealError:
            return None
        return resolved
    module_path: str | None = parsed.module_path
    return module_path


def _pkcs11_system(uri: str | None) -> list[Check]:
    checks = [_python_package("pkcs11", "capseal[pkcs11]", "a PKCS#11 module, e.g. softhsm2")]
    path = _module_path(uri) if uri else None
    if path is not None:
        p = Path(path)
        if not p.exists():
            checks.append(Check("PKCS#11 module", False, f"{path} does not exist",
                                "install the token's PKCS#11 module (SoftHSM2: apt-get install softhsm2) and fix module-path"))
        elif not os.access(p, os.R_OK):
            checks.append(Check("PKCS#11 module", False, f"{path} is not readable by this user", f"chmod o+r {path} or run as a user who can read it"))
        else:
            checks.append(Check("PKCS#11 module", True, f"{path} is readable"))
        if "softhsm" in path:
            conf = os.environ.get("SOFTHSM2_CONF", "/etc/softhsm/softhsm2.conf")
            ok = Path(conf).is_file()
            checks.append(Check("SoftHSM2 config", ok, f"{conf} {'exists' if ok else 'is missing'}",
                                "" if ok else "set SOFTHSM2_CONF to your softhsm2.conf (capseal token init writes one)"))
    return checks


def _tpm_system(tcti: str) -> list[Check]:
    checks = [_python_package("tpm2_pytss", "capseal[tpm]", "libtss2-dev pkg-config gcc (build), libtss2-esys")]
    libs = [p for p in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/usr/local/lib")
            if list(Path(p).glob("libtss2-esys.so*"))]
    checks.append(Check("libtss2-esys", bool(libs), f"found in {libs[0]}" if libs else "not found",
                        "" if libs else "apt-get install libtss2-esys-3.0.2-0 (or libtss2-dev)"))
    if tcti.startswith("device:"):
        dev = tcti.split(":", 1)[1] or "/dev/tpmrm0"
        p = Path(dev)
        if not p.exists():
            checks.append(Check("TPM device", False, f"{dev} does not exist",
                                "enable the TPM in firmware; the kernel's resource manager is /dev/tpmrm0 (tpm_tis/tpm_crb)"))
        else:
            readable = os.access(p, os.R_OK | os.W_OK)
            checks.append(Check("TPM device", readable, f"{dev} {'is' if readable else 'is not'} readable and writable",
                                "" if readable else "add this user to the 'tss' group: usermod -aG tss $USER (then log in again)"))
        checks.append(_tss_group_check())
    return checks


def _tss_group_check() -> Check:
    """Whether this process can use a device of group ``tss``, saying why.

    Why not just "user X is in group tss": root is not a member and needs
    none, and a user added with ``usermod -aG`` is a member while the running
    session (which got its groups at login) still lacks the group, and
    cannot open the device."""
    try:
        tss = grp.getgrnam("tss")
    except KeyError:
        return Check("tss group", False, "no 'tss' group on this system",
                     "apt-get install tpm-udev (creates the tss group and udev rules)")
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid with no passwd entry (containers): name it by number
        user = f"uid {os.getuid()}"
    if tss.gr_gid in os.getgroups() or os.getegid() == tss.gr_gid:
        return Check("tss group", True, f"this process (user {user}) has group tss")
    if os.geteuid() == 0:
        return Check("tss group", True, f"user {user} is not in group tss, but runs as root, "
                                        "which the device's group permissions do not limit")
    if user in tss.gr_mem:
        return Check("tss group", False, f"user {user} is in group tss, but this session is not: "
                                         "it started before the user was added",
                     "log in again (or run `newgrp tss`) so the session gets the group")
    return Check("tss group", False, f"user {user} is not in group tss", f"usermod -aG tss {user} (then log in again)")


def run_doctor(uri: str | None = None, *, pin: Any = None, tcti: str | None = None,
               pin_problem: Exception | None = None) -> list[Check]:
    """Run every check relevant to ``uri`` (or the default TPM when none).

    Args:
        uri: a key URI (``pkcs11:``, ``tpm2:``, ``file:``), or None for the
            PKCS#11 system checks and the default TPM.
        pin: the PIN, passphrase or auth value to try (never printed).
        tcti: the TPM, overriding the URI's (they must agree).
        pin_problem: why the PIN could not be read (a PIN file others can read,
            an unset ``--pin-env``): it is reported as a failed check, and the
            checks that need no PIN still run.

    Returns:
        The checks, in order. Never raises: whatever goes wrong is a failed check.
    """
    pin = as_secret(pin, "pin=")
    checks: list[Check] = []
    scheme = uri.split(":", 1)[0].lower() if uri else None
    if scheme == "pkcs11":
        checks += _pkcs11_system(uri)
        checks += _backend_checks("pkcs11", uri, pin, pin_problem=pin_problem)
        return checks
    if pin_problem is not None:
        checks.append(_pin_problem_check(pin_problem))
    if scheme == "tpm2":
        tcti, refusal = _tpm_tcti(uri, tcti)
        if refusal is not None:
            return checks + [refusal]
        checks += _tpm_system(tcti)
        checks += _backend_checks("tpm2", redact_uri(uri or ""), pin, tcti=tcti)
    elif scheme == "file":
        try:
            with open_signer(uri or "", pin=pin) as signer:
                checks.append(Check("key file", True, f"{signer.alg} key {signer.kid[:16]}… opens"))
        except Exception as exc:  # the error's own hint first: a key file others can read is fixed by chmod 600
            checks.append(Check("key file", False, str(exc), getattr(exc, "hint", "") or "check the path and passphrase"))
    elif scheme is not None:
        checks.append(_unknown_scheme(uri or "", scheme))
    else:
        checks += _pkcs11_system(None)
        tcti, refusal = _tpm_tcti(None, tcti)
        if refusal is not None:
            return checks + [refusal]
        checks += _tpm_system(tcti)
        checks += _backend_checks("tpm2", None, pin, tcti=tcti)
    return checks


def _unknown_scheme(uri: str, scheme: str) -> Check:
    """What doctor says of a URI it has no checks for (not the TPM checks: an
    operator with a typo in ``pkcs11:`` must not be told about a TPM)."""
    if ":" not in uri:
        return Check("key URI", False, f"{uri[:60]!r} is not a key URI (scheme:…)",
                     "name the key as pkcs11:…, tpm2:… or file:/absolute/path.pem")
    if scheme == "ephemeral":
        return Check("key URI", True, "an ephemeral key lives in this process's memory: there is nothing to check",
                     checked=False)
    if scheme in SIGNER_FOR_URI_SCHEME:
        return Check("key URI", True, f"{scheme}: keys come from a backend registered by the application; doctor has "
                     "no checks for them", checked=False)
    return Check("key URI", False, f"unknown key URI scheme {scheme!r}; doctor checks pkcs11:, tpm2: and file: keys",
                 f"write the URI with one of the schemes capseal knows: {', '.join(sorted(SIGNER_FOR_URI_SCHEME))}")


def _pin_problem_check(problem: Exception) -> Check:
    """A failed "PIN" check for a PIN that could not be read, with its hint."""
    return Check("PIN", False, str(problem), getattr(problem, "hint", "") or
                 "fix where the PIN comes from: CAPSEAL_PIN, --pin-env VAR or --pin-file FILE (mode 0600)")


def _tpm_tcti(uri: str | None, tcti: str | None) -> tuple[str, Check | None]:
    """The one TCTI every TPM check uses: ``--tcti``, else the URI's, else the
    default; with a refusal Check when ``--tcti`` is empty or disagrees with the
    URI's (checking the system for one TPM and the key on another would report
    on neither). A malformed URI is left to the backend's "TPM key URI" check."""
    from capseal.errors import CapsealError

    # pure Python, no extra needed; by name, as the backends are reached
    check_tcti = load_target("tpm2", "capseal.keys.tpm:check_tcti")
    explicit_tcti = load_target("tpm2", "capseal.keys.tpm:explicit_tcti")
    default_tcti = load_target("tpm2", "capseal.keys.tpm:DEFAULT_TCTI")
    try:
        given = check_tcti(tcti, "--tcti") if tcti is not None else None
    except CapsealError as exc:
        return default_tcti, Check("TPM TCTI", False, str(exc), "pass --tcti device:/dev/tpmrm0 (or leave it out)")
    try:
        named = explicit_tcti(uri) if uri else None  # the URI parser's reading, not a split on "tcti="
    except CapsealError:
        named = None
    if given is not None and named is not None and given != named:
        return given, Check("TPM TCTI", False, f"--tcti {given!r} and the URI's tcti={named!r} name different TPMs",
                            "give the TCTI once: in the URI or with --tcti")
    return given or named or default_tcti, None


def _backend_checks(scheme: str, uri: str | None, pin: Any, **kw: Any) -> list[Check]:
    module = "capseal.keys.pkcs11" if scheme == "pkcs11" else "capseal.keys.tpm"
    try:
        fn = load_target(scheme, f"{module}:doctor_checks")
    except ImportError:
        # the "python package" check above already failed and says what to install: not said twice
        what = "PKCS#11" if scheme == "pkcs11" else "TPM"
        return [Check(f"{what} checks", False, "not run: they need the Python package reported missing above")]
    try:
        return list(fn(uri, pin=pin, **kw))
    except Exception as exc:  # the doctor reports, it does not crash
        return [Check(module, False, f"{type(exc).__name__}: {exc}")]
