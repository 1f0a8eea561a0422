"""``capseal tpm provision``: the SRK (transient), a persistent signing key
and a persistent restricted attestation key, as close to atomic as a TPM
allows.

Nothing is overwritten unless the operator says ``--force``.

``provision`` is as close to atomic as a TPM allows (it has no transactions):
everything that can be checked is checked before the first change — the
handles are free or readable (a listed object that cannot be read, e.g. of a
disabled hierarchy, would make persisting fail), there is NV room for the new
persistent objects, and both new keys are created *and loaded* (SRK + two
keys: three transient slots, swtpm's whole supply). Only then are the old
objects evicted and the new ones persisted, which cannot be undone: a failure
from there on (the TPM going away, say) is a ProvisionIncompleteError that
reads back and names what each handle holds now, with the command that
finishes the job.
"""

from __future__ import annotations

from typing import Any

from tpm2_pytss.constants import ESYS_TR, TPM2_CAP, TPM2_PT_HR
from tpm2_pytss.types import TPM2B_SENSITIVE_CREATE

from capseal.errors import CapsealError, DeviceError, InputError, KeyURIError

from ._device import TPMDevice, get_device
from ._objects import (
    AK_TEMPLATE,
    CLI_ALGS,
    SRK_TEMPLATE_TEXT,
    HandleInUseError,
    ak_template,
    check_alg_supported,
    cose_alg,
    signing_template,
    srk_template,
)
from ._persistent import close_tr, create_under_srk, evict, flush_all, key_summary, occupant, read_persistent
from ._signer import TPMSigner
from ._uri import DEFAULT_TCTI, TPMKeyURI, check_tcti, format_handle, handle_argument, is_persistent_handle

__all__ = ["ProvisionIncompleteError", "provision"]


class ProvisionIncompleteError(DeviceError):
    """``provision`` failed after it had begun to evict or persist: the TPM was
    changed. The message names what each handle holds now (as read back) and
    the TCTI; the hint is the command that finishes the job."""



def _persistent_room(ectx: Any) -> int | None:
    """TPM_PT_HR_PERSISTENT_AVAIL: how many more objects the TPM can persist
    (None when it does not say)."""
    _more, data = ectx.get_capability(TPM2_CAP.TPM_PROPERTIES, int(TPM2_PT_HR.PERSISTENT_AVAIL), 1)
    for prop in data.data.tpmProperties:
        if int(prop.property) == int(TPM2_PT_HR.PERSISTENT_AVAIL):
            return int(prop.value)
    return None



def provision(tcti: str | None, *, signing_handle: int = 0x81000101, ak_handle: int = 0x81000102,
              alg: str = "p256", force: bool = False) -> dict[str, Any]:
    """Create the SRK (transient), a persistent signing key and a persistent
    restricted P-256 attestation key, checking all that can be checked first
    (see the module docstring).

    Args:
        tcti: the TPM (None: ``device:/dev/tpmrm0``).
        signing_handle: the signing key's persistent handle.
        ak_handle: the attestation key's persistent handle.
        alg: the signing key's algorithm: p256, p384 or rsa-pss.
        force: replace keys already at the handles.

    Returns:
        ``tcti``, ``device``, ``software_device``, ``srk``, ``signing_key`` and
        ``attestation_key`` (handles, URIs, public keys and names), ``replaced``,
        and the signing key's ``custody`` with a verified TPM2_Certify by the AK.

    Raises:
        KeyURIError, InputError: bad handles (not persistent, the same twice) or options.
        HandleInUseError: a handle is taken (without ``force``), or holds an object that cannot be read.
        UnsupportedAlgorithmError: the TPM cannot make such keys.
        DeviceError: no NV room for the new objects; nothing was changed.
        ProvisionIncompleteError: a failure after the TPM was changed, naming what each handle holds now.
        SignerUnavailableError: the TPM is unreachable.
    """
    tcti = DEFAULT_TCTI if tcti is None else check_tcti(tcti, "--tcti")
    cose_name = cose_alg(alg)
    handle_argument(signing_handle, "signing_handle")
    handle_argument(ak_handle, "ak_handle")
    if not isinstance(force, bool):  # force="no" is truthy: it replaced the keys
        raise InputError(f"force is a {type(force).__name__}, not True or False")
    for h, what in ((signing_handle, "signing key"), (ak_handle, "attestation key")):
        if not is_persistent_handle(h):
            raise KeyURIError(f"{what} handle {format_handle(h)} is not a persistent handle (0x81000000–0x817fffff)")
    if signing_handle == ak_handle:
        raise KeyURIError("the signing key and the attestation key need different handles")
    device = get_device(tcti)
    info = device.info()
    check_alg_supported(info, cose_name)

    handles = (signing_handle, ak_handle)
    #: names before (old) and after (new), and whether a change was begun: for the
    #: report of a failure part-way (filled in by the job as it goes)
    old_names: dict[int, str] = {}
    new_names: dict[int, str] = {}
    changing: list[str] = []

    def job(ectx: Any) -> dict[str, Any]:
        device.make_room()
        existing = {h: occupant(ectx, h, tcti) for h in handles}
        occupied = {h: p for h, p in existing.items() if p is not None}
        old_names.update({h: bytes(p.get_name()).hex() for h, p in occupied.items()})
        if occupied and not force:
            desc = ", ".join(f"{format_handle(h)} (name {bytes(p.get_name()).hex()[:16]}…)" for h, p in occupied.items())
            raise HandleInUseError(f"TPM {tcti} already has keys at {desc}; pass --force to replace them",
                                   hint="capseal keys list 'tpm2:?tcti=…' shows what is there")
        room = _persistent_room(ectx)
        need = len(handles) - len(occupied)  # evicting an old key frees its room
        if room is not None and room < need:
            raise DeviceError(f"TPM {tcti} has room for {room} more persistent object(s) "
                              f"(TPM_PT_HR_PERSISTENT_AVAIL) and provisioning needs {need}; nothing was changed",
                              hint="capseal keys list 'tpm2:?tcti=…' shows the persistent objects; evict one you "
                                   "no longer need (tpm2_evictcontrol -C o -c 0x81…)")
        loaded: list[Any] = []
        try:
            srk, srk_public, _, _, _ = ectx.create_primary(TPM2B_SENSITIVE_CREATE(), srk_template(), ESYS_TR.OWNER)
            loaded.append(srk)
            key_priv, key_pub = create_under_srk(ectx, srk, signing_template(cose_name, with_auth=False))
            ak_priv, ak_pub = create_under_srk(ectx, srk, ak_template())
            # both loaded before anything changes: a key the TPM will not load fails here, not after the evictions
            key = ectx.load(srk, key_priv, key_pub)
            loaded.append(key)
            ak = ectx.load(srk, ak_priv, ak_pub)
            loaded.append(ak)
            new_names.update({signing_handle: bytes(key_pub.get_name()).hex(), ak_handle: bytes(ak_pub.get_name()).hex()})
            # the SRK is done with; its slot is needed: the TPM loads a persistent object to evict it
            ectx.flush_context(srk)
            loaded.remove(srk)
            for h in occupied:
                changing.append(f"evicting {format_handle(h)}")
                evict(ectx, h)
            for tr, h in ((key, signing_handle), (ak, ak_handle)):
                changing.append(f"persisting at {format_handle(h)}")
                close_tr(ectx, ectx.evict_control(ESYS_TR.OWNER, tr, h))
        finally:
            flush_all(ectx, loaded)
        return {"srk": {"template": SRK_TEMPLATE_TEXT, "name": bytes(srk_public.get_name()).hex(),
                        "persistent": False},
                "replaced": [format_handle(h) for h in occupied]}

    try:
        made = device.call(job, what="provisioning keys", retry=False, timeout=None)
    except CapsealError as exc:
        if not changing:
            if "nothing was changed" in str(exc) or isinstance(exc, HandleInUseError):
                raise
            # the same error, its message extended (not rebuilt: subclasses take other arguments)
            exc.args = (f"{exc}; nothing on the TPM was changed",)
            raise
        raise _incomplete(device, tcti, alg, handles, old_names, new_names, changing[-1], exc) from None
    sign_ref = TPMKeyURI(tcti=tcti, handle=signing_handle, ak_handle=ak_handle)
    signer = TPMSigner(sign_ref, device=device)
    try:
        custody = signer.describe()  # includes the AK's TPM2_Certify of the key, verified
        signing = {**key_summary(signer.public_area, signing_handle), "uri": signer.uri, "alg": signer.alg}
    finally:
        signer.close()
    ak_public = device.call(lambda e: read_persistent(e, ak_handle), what="reading the attestation key")
    assert ak_public is not None
    ak = {**key_summary(ak_public, ak_handle), "template": AK_TEMPLATE,
          "uri": TPMKeyURI(tcti=tcti, handle=ak_handle).to_uri()}
    return {
        "tcti": tcti,
        "device": info.to_dict(),
        "software_device": info.software,
        "srk": made["srk"],
        "signing_key": signing,
        "attestation_key": ak,
        "replaced": made["replaced"],
        "custody": custody,
    }


def _incomplete(device: TPMDevice, tcti: str, alg: str, handles: tuple[int, int], old: dict[int, str],
                new: dict[int, str], step: str, exc: CapsealError) -> ProvisionIncompleteError:
    """The error for a provisioning that failed after its first change: what
    each handle holds now, read back on a fresh connection if need be."""
    what = {handles[0]: "signing key", handles[1]: "attestation key"}
    try:
        now = device.call(lambda e: {h: read_persistent(e, h) for h in handles},
                          what="reading back the provisioned handles", timeout=30)
        states = []
        for h in handles:
            public = now[h]
            name = None if public is None else bytes(public.get_name()).hex()
            if name is None:
                state = "holds nothing" + (f" (its old key, name {old[h][:16]}…, was evicted)" if h in old else "")
            elif name == new.get(h):
                state = f"holds the new {what[h]} (name {name[:16]}…)"
            elif name == old.get(h):
                state = f"still holds its old key (name {name[:16]}…)"
            else:
                state = f"holds an object this run did not make (name {name[:16]}…)"
            states.append(f"{format_handle(h)} {state}")
        occupied = any(now[h] is not None for h in handles)
        report = "; ".join(states)
    except CapsealError as again:
        occupied = True
        report = f"what the handles hold now could not be read back ({again})"
    cli_alg = next((k for k, v in CLI_ALGS.items() if v == alg or k == alg.lower()), alg)
    rerun = (f"capseal tpm provision --tcti '{tcti}' --handle {format_handle(handles[0])} "
             f"--ak-handle {format_handle(handles[1])} --alg {cli_alg}" + (" --force" if occupied else ""))
    return ProvisionIncompleteError(
        f"provisioning on TPM {tcti} failed while {step}, after it had changed the TPM: {exc}. Now {report}",
        hint=f"when the TPM works again, finish the job with: {rerun}")
