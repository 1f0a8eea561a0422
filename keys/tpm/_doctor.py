"""The TPM part of ``capseal doctor``: the TPM answers, is not in lockout,
has slots free; the key (when a URI names one) opens, has an algorithm
capseal signs with, is certified by its AK, and its auth value works (or
why it was not tried). Looking changes nothing on the TPM but, at most, one
dictionary-attack try that the operator's own PIN costs (see _auth_check).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpm2_pytss.constants import TPM2_ALG, TPM2_CAP, TPM2_PT, TPM2_PT_HR, TPMA_PERMANENT

from capseal.errors import CapsealError, KeyNotFoundError, PinIncorrectError, UnsupportedAlgorithmError
from capseal.keys.doctor import Check
from capseal.keys.secret import Secret, as_secret, pin_advice

from ._device import TPMDevice
from ._errors import unreachable_fix
from ._objects import TPM_ALG_EDDSA, auth_value, create_key_hint, key_attributes
from ._signer import TPMSigner
from ._uri import DEFAULT_TCTI, TPMKeyURI, check_tcti, format_handle, parse_tpm_uri

__all__ = ["doctor_checks"]


def doctor_checks(uri: str | None, *, pin: str | Secret | None = None, tcti: str | None = None,
                  **_: Any) -> list[Check]:
    """Checks for ``capseal doctor``: the TPM answers on the TCTI, is not in
    lockout and no other process holds transient objects; the key (if a URI
    is given) exists and has an algorithm capseal signs with, and its auth
    value works (or why it was not tried); the AK (``ak-handle``) certifies
    it. Never raises. Looking must not change the TPM: the checks run on a
    private device that flushes nothing it did not load
    (``flush_others=False``), so another process's objects survive and are
    reported instead.

    Args:
        uri: the key's (or TPM's) ``tpm2:`` URI; None: the TPM alone.
        pin: the key's auth value, to try (only when a refusal cannot lock the TPM).
        tcti: the TPM, overriding the URI's.
        _: other options the doctor passes to every backend.

    Returns:
        The checks.
    """
    pin = as_secret(pin, "pin=")
    try:
        if uri:
            ref = parse_tpm_uri(uri, tcti=tcti)
        else:
            ref = TPMKeyURI(tcti=DEFAULT_TCTI if tcti is None else check_tcti(tcti, "--tcti"))
    except CapsealError as exc:
        return [Check("TPM key URI", False, str(exc), "write it as tpm2:handle=0x81000101?tcti=device:/dev/tpmrm0")]
    device = TPMDevice(ref.tcti, flush_others=False)
    try:
        return _doctor_on(device, ref, pin)
    finally:
        device.close()


def _doctor_on(device: TPMDevice, ref: TPMKeyURI, pin: Secret | None) -> list[Check]:
    checks: list[Check] = []
    try:
        info = device.info()
    except CapsealError as exc:
        return [Check("TPM answers", False, f"{ref.tcti}: {exc}", unreachable_fix(ref.tcti))]
    kind = "software TPM" if info.software else ("hardware TPM" if info.software is False else "TPM of unknown kind")
    checks.append(Check("TPM answers", True, f"{ref.tcti}: {info.manufacturer} '{info.vendor.strip()}' firmware "
                        f"{info.firmware}, {info.spec_version} ({kind}: {info.software_reason})"))
    state: _TPMState | None = None
    try:
        state = device.call(lambda ectx: _read_state(ectx, device), what="reading TPM state")
        checks += [_lockout_check(state, ref.tcti), _slots_check(state, ref.tcti)]
    except CapsealError as exc:
        checks.append(Check("TPM state", False, str(exc)))
    if not ref.names_key:
        ok = info.supports(int(TPM2_ALG.ECC)) and info.supports(int(TPM2_ALG.ECDSA))
        algs = ["ES256"] if ok else []
        if info.supports(int(TPM2_ALG.RSAPSS)):
            algs.append("PS256")
        eddsa = "lists EdDSA" if info.supports(TPM_ALG_EDDSA) else "no EdDSA (TPM_ALG_EDDSA not listed)"
        checks.append(Check("TPM algorithms", ok, f"can sign {', '.join(algs) or 'nothing capseal uses'}; {eddsa}",
                            "" if ok else "this TPM lacks ECC/ECDSA; capseal needs P-256 ECDSA or RSA-PSS"))
        return checks
    return checks + _key_checks(device, ref, pin, state)


def _key_checks(device: TPMDevice, ref: TPMKeyURI, pin: Secret | None, state: _TPMState | None = None) -> list[Check]:
    checks: list[Check] = []
    create = (create_key_hint(ref.tcti, ref.handle) if ref.handle is not None
              else f"capseal keys create '{ref.to_uri()}' --alg p256 (a new key file)")
    try:
        signer = TPMSigner(ref, auth=auth_value(pin, ref.describe_key()), device=device)
        try:
            checks.append(Check("TPM key", True, f"{ref.describe_key()}: {signer.alg} key, kid {signer.kid[:16]}…, "
                                f"TPM name {signer.tpm_name.hex()[:20]}…"))
            checks.append(Check("TPM key algorithm", True, f"{signer.alg} is supported by capseal and this TPM"))
            checks.append(_auth_check(signer, ref, pin, state))
            if ref.ak_handle is not None:
                custody = signer.describe()
                ok = "tpm_certify" in custody
                checks.append(Check("TPM attestation key", ok, f"AK {format_handle(ref.ak_handle)} certified the key "
                                    "(TPM2_Certify verified)" if ok else custody.get("tpm_certify_omitted", "no certify")))
        finally:
            signer.close()
    except KeyNotFoundError as exc:
        checks.append(Check("TPM key", False, str(exc), create if ref.handle is not None else "check the key file path"))
    except UnsupportedAlgorithmError as exc:
        checks.append(Check("TPM key algorithm", False, str(exc), f"use a P-256 key: {create}"))
    except CapsealError as exc:
        checks.append(Check("TPM key", False, str(exc), getattr(exc, "hint", "")))
    return checks


def _auth_check(signer: TPMSigner, ref: TPMKeyURI, pin: Secret | None, state: _TPMState | None) -> Check:
    """Whether the key's auth value (the PIN given, or the empty one) works,
    found by signing once and verifying the signature; or why it was not
    tried. A key without noDA counts a refused value toward the TPM's
    dictionary-attack lockout: it is tried only with a PIN given and at least
    two tries left (so a wrong one never locks the TPM), and never with the
    empty value guessed for a key at a handle, which does not say whether it
    has an auth value."""
    no_da = key_attributes(signer.public_area)["noDA"]
    declared_empty = ref.keyfile is not None and pin is None  # the key file says its auth is empty (checked at open)
    if not no_da and not declared_empty:
        if pin is None:
            return Check("TPM key auth value", True, "not checked: the key is dictionary-attack protected and no PIN "
                         "was given (trying the empty value would count toward the lockout if the key has one)",
                         pin_advice("its auth value") + " to check it", checked=False)
        if state is None or state.max_tries - state.failed_tries < 2:
            said = "the TPM's lockout counters could not be read" if state is None else (
                f"the TPM has counted {state.failed_tries} of {state.max_tries} failed authorizations")
            return Check("TPM key auth value", True, f"not checked: {said}; a refused value could lock the TPM out",
                         "wait until the TPM forgives failures (capseal doctor shows the counters), then check again",
                         checked=False)
    given = "the auth value given" if pin is not None else "the empty auth value"
    try:
        signer.sign(b"capseal doctor auth check")
    except PinIncorrectError as exc:
        counted = "" if no_da else " (this refusal counts toward the TPM's dictionary-attack lockout)"
        return Check("TPM key auth value", False, f"{ref.describe_key()} refused {given}{counted}: {exc}",
                     exc.hint or pin_advice("the key's auth value"))
    except CapsealError as exc:
        return Check("TPM key auth value", False, f"{ref.describe_key()} could not sign: {exc}", exc.hint)
    return Check("TPM key auth value", True, f"{given} works: the key signed and its public key verified the signature")


@dataclass(frozen=True)
class _TPMState:
    """What doctor reads from TPM_PT_PERMANENT, the DA counters and the handles."""

    in_lockout: bool
    lockout_auth_set: bool
    failed_tries: int
    max_tries: int
    recovery_s: int
    free_slots: int
    foreign: tuple[int, ...]  # transient objects no capseal device of this process holds


def _read_state(ectx: Any, device: TPMDevice) -> _TPMState:
    props: dict[int, int] = {}
    _more, data = ectx.get_capability(TPM2_CAP.TPM_PROPERTIES, int(TPM2_PT.VAR), 64)
    for p in data.data.tpmProperties:
        props[int(p.property)] = int(p.value)
    permanent = props.get(int(TPM2_PT.PERMANENT), 0)
    return _TPMState(
        in_lockout=bool(permanent & TPMA_PERMANENT.INLOCKOUT),
        lockout_auth_set=bool(permanent & TPMA_PERMANENT.LOCKOUTAUTHSET),
        failed_tries=props.get(int(TPM2_PT.LOCKOUT_COUNTER), 0),
        max_tries=props.get(int(TPM2_PT.MAX_AUTH_FAIL), 0),
        recovery_s=props.get(int(TPM2_PT.LOCKOUT_INTERVAL), 0),
        free_slots=props.get(int(TPM2_PT_HR.TRANSIENT_AVAIL), 0),
        foreign=tuple(device.foreign_transients()),
    )


def _lockout_check(state: _TPMState, tcti: str) -> Check:
    counts = (f"{state.failed_tries} of {state.max_tries} failed authorizations; one is forgiven every "
              f"{state.recovery_s} s")
    if not state.in_lockout:
        return Check("TPM lockout", True, f"not in dictionary-attack lockout ({counts})")
    pw = " -p LOCKOUT_PASSWORD" if state.lockout_auth_set else ""
    return Check("TPM lockout", False, f"TPM {tcti} is in dictionary-attack lockout ({counts})",
                 f"wait until the TPM forgives a failure ({state.recovery_s} s), or reset the lockout with the "
                 f"lockout authorization: TPM2TOOLS_TCTI='{tcti}' tpm2_dictionarylockout -c{pw}")


def _slots_check(state: _TPMState, tcti: str) -> Check:
    detail = f"{state.free_slots} transient object slots free (capseal needs 2 at a time)"
    if state.foreign:
        held = ", ".join(format_handle(h) for h in state.foreign)
        return Check("TPM object slots", False,
                     f"{detail}; {len(state.foreign)} transient object(s) on TPM {tcti} that capseal did not load: "
                     f"{held}",
                     "on a TPM without a resource manager capseal flushes objects it did not load when it connects, "
                     "destroying a running process's work: if the process that loaded them "
                     "is running, stop it or give each process its own view of the TPM (/dev/tpmrm0 or "
                     f"tpm2-abrmd); if it has exited, free them: TPM2TOOLS_TCTI='{tcti}' tpm2_flushcontext -t")
    if state.free_slots < 2:
        return Check("TPM object slots", False, detail, "the TPM reports too few slots for capseal (SRK + key)")
    return Check("TPM object slots", True, detail)
