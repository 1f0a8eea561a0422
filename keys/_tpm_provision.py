"""Operator provisioning for TPM keys: ``capseal tpm provision``, ``keys create``,
``keys list`` and the ``doctor`` checks.

Templates (why each attribute):

* signing key: ``sign | fixedTPM | fixedParent | sensitiveDataOrigin |
  userWithAuth`` — generated inside the TPM and never duplicable. Keys with an
  empty auth value also get ``noDA``: there is no secret to guess, and a
  DA-protected key on swtpm turns three unclean restarts into a 1000 s lockout.
  A key created with an auth value (``--pin-env``) stays DA-protected.
* attestation key (AK): ``ecc256:ecdsa-sha256:null`` with ``restricted |
  sign | fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth | noDA``.
  Restricted keys sign only TPM-generated structures (quotes, certify), so a
  signature by the AK is the TPM's own word. ``:null`` because a restricted
  signing key must have no symmetric algorithm (``TPM_RC_SYMMETRIC`` otherwise).
* parent: the TCG ECC P-256 SRK, created transiently from its template under
  the owner hierarchy (deterministic, so it need not be persisted).

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

from tpm2_pytss import TSS2_Exception
from tpm2_pytss.constants import (
    ESYS_TR,
    TPM2_ALG,
    TPM2_CAP,
    TPM2_ECC,
    TPM2_HC,
    TPM2_PT_HR,
    TPMA_OBJECT,
)
from tpm2_pytss.types import TPM2B_PUBLIC, TPM2B_SENSITIVE_CREATE

from capseal.errors import (
    CapsealError,
    DeviceError,
    InputError,
    KeyNotFoundError,
    KeyURIError,
    SignerError,
    UnsupportedAlgorithmError,
)

from ._pin import Secret, as_secret
from ._registry import SecretsHandler, check_options
from ._tpm import (
    CREATE_AUTH_BYTES,
    TPMSigner,
    _read_keyfile,
    _write_keyfile,
    auth_value,
    eddsa_refusal,
    key_attributes,
    keyfile_public,
    srk_template,
)
from ._tpm_device import TPMDevice, TPMInfo, get_device, is_listed
from ._tpm_doctor import doctor_checks  # re-exported: the doctor's TPM checks live there
from ._tpm_uri import (
    DEFAULT_TCTI,
    TPM_RH_OWNER,
    TPMKeyFile,
    TPMKeyURI,
    check_tcti,
    format_handle,
    handle_argument,
    is_persistent_handle,
    parse_tpm_uri,
)

__all__ = ["HandleInUseError", "ProvisionIncompleteError", "create_key", "delete_key", "list_keys", "provision",
           "doctor_checks", "signing_template", "AK_TEMPLATE"]

AK_TEMPLATE = "ecc256:ecdsa-sha256:null"
_BASE_SIGN = (TPMA_OBJECT.SIGN_ENCRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
              | TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH)
_AK_ATTRS = _BASE_SIGN | TPMA_OBJECT.RESTRICTED | TPMA_OBJECT.NODA
_TEMPLATES = {"ES256": "ecc256:ecdsa-sha256:null", "ES384": "ecc384:ecdsa-sha384:null",
              "PS256": "rsa2048:rsapss-sha256:null"}
_CLI_ALGS = {"p256": "ES256", "p384": "ES384", "rsa-pss": "PS256", "ed25519": "EdDSA"}
_RC_HANDLE = 0x08B
SRK_TEMPLATE_TEXT = "TCG ECC P-256 SRK (ecc256:aes128cfb, restricted|decrypt|noDA), transient"


class HandleInUseError(SignerError):
    """A persistent handle (or key file) already holds a key and --force was not given,
    or holds an object capseal can neither read nor evict."""


class ProvisionIncompleteError(DeviceError):
    """``provision`` failed after it had begun to evict or persist: the TPM was
    changed. The message names what each handle holds now (as read back) and
    the TCTI; the hint is the command that finishes the job."""


def signing_template(alg: str, *, with_auth: bool) -> TPM2B_PUBLIC:
    """Template of an unrestricted signing key for a COSE algorithm."""
    template = _TEMPLATES.get(alg)
    if template is None:
        raise UnsupportedAlgorithmError(f"capseal cannot create a TPM key for {alg!r}; use p256, p384 or rsa-pss")
    attrs = _BASE_SIGN if with_auth else _BASE_SIGN | TPMA_OBJECT.NODA
    return TPM2B_PUBLIC.parse(template, objectAttributes=attrs)


def _cose_alg(alg: object) -> str:
    """The COSE name for a CLI (``p256``) or COSE (``ES256``) algorithm name.
    Why checked: a non-str was an AttributeError from ``.lower()``."""
    if not isinstance(alg, str):
        raise KeyURIError(f"alg is a {type(alg).__name__}, not an algorithm name; use p256, p384 or rsa-pss")
    return _CLI_ALGS.get(alg.lower(), alg)


def _check_alg_supported(info: TPMInfo, alg: str) -> None:
    if alg == "EdDSA":
        raise eddsa_refusal(info)
    needs = {"ES256": (TPM2_ALG.ECC, TPM2_ALG.ECDSA, TPM2_ALG.SHA256), "ES384": (TPM2_ALG.ECC, TPM2_ALG.ECDSA, TPM2_ALG.SHA384),
             "PS256": (TPM2_ALG.RSA, TPM2_ALG.RSAPSS, TPM2_ALG.SHA256)}.get(alg)
    if needs is None:
        raise UnsupportedAlgorithmError(f"capseal cannot create a TPM key for {alg!r}")
    missing = [str(a) for a in needs if not info.supports(int(a))]
    if missing:
        raise UnsupportedAlgorithmError(f"TPM {info.tcti} does not list {', '.join(missing)} in TPM_CAP_ALGS; "
                                        f"it cannot make {alg} keys")


def _read_persistent(ectx: Any, handle: int) -> TPM2B_PUBLIC | None:
    """The public area at a persistent handle, or None when the handle is empty
    (the TPM lists nothing there: asked first, see ``is_listed``)."""
    if not _is_listed(ectx, handle):
        return None
    try:
        tr = ectx.tr_from_tpmpublic(handle)
    except TSS2_Exception as exc:
        if int(exc.error) == _RC_HANDLE:
            return None
        raise
    try:
        public, _name, _ = ectx.read_public(tr)
        return public
    finally:
        ectx.tr_close(tr)


def _is_listed(ectx: Any, handle: int) -> bool:
    """Whether TPM_CAP_HANDLES lists ``handle``: it lists persistent objects
    that ReadPublic answers with TPM_RC_HANDLE (those of a disabled
    hierarchy), at which TPM2_EvictControl refuses to persist."""
    return is_listed(ectx, handle)


def _occupant(ectx: Any, handle: int, tcti: str) -> TPM2B_PUBLIC | None:
    """:func:`_read_persistent`, refusing a handle that is taken by an object
    that cannot be read. Why: it used to read as empty, so provisioning
    persisted the signing key and then failed at the AK's handle
    (TPM_RC_NV_DEFINED), leaving half a job done."""
    public = _read_persistent(ectx, handle)
    if public is None and _is_listed(ectx, handle):
        raise HandleInUseError(
            f"TPM {tcti} lists an object at {format_handle(handle)} that cannot be read (TPM_RC_HANDLE; its "
            "hierarchy, endorsement or platform, is probably disabled): the TPM will not persist a key there and "
            "capseal cannot evict it; nothing was changed",
            hint="use another handle, or enable that hierarchy and evict the object "
                 f"(tpm2_evictcontrol -C o -c {format_handle(handle)})")
    return public


def _persistent_room(ectx: Any) -> int | None:
    """TPM_PT_HR_PERSISTENT_AVAIL: how many more objects the TPM can persist
    (None when it does not say)."""
    _more, data = ectx.get_capability(TPM2_CAP.TPM_PROPERTIES, int(TPM2_PT_HR.PERSISTENT_AVAIL), 1)
    for prop in data.data.tpmProperties:
        if int(prop.property) == int(TPM2_PT_HR.PERSISTENT_AVAIL):
            return int(prop.value)
    return None


def _flush_all(ectx: Any, objects: list[Any]) -> None:
    """Flush transient objects on every path; a flush that fails (the
    connection broke) must not hide the error that got us here."""
    for tr in objects:
        try:
            ectx.flush_context(tr)
        except TSS2_Exception:
            pass


def _create_under_srk(ectx: Any, srk: Any, template: TPM2B_PUBLIC, auth: Secret | None = None) -> tuple[Any, Any]:
    sensitive = TPM2B_SENSITIVE_CREATE()
    if auth is not None:
        sensitive.sensitive.userAuth = auth.encoded()
    private, public, _, _, _ = ectx.create(srk, sensitive, template)
    return private, public


def _persist(ectx: Any, srk: Any, private: Any, public: Any, handle: int) -> None:
    key = ectx.load(srk, private, public)
    try:
        _close_tr(ectx, ectx.evict_control(ESYS_TR.OWNER, key, handle))  # the new persistent object's ESYS_TR
    finally:
        ectx.flush_context(key)


def _evict(ectx: Any, handle: int) -> None:
    """Evict the persistent object at ``handle``, and let go of its ESYS_TR:
    ESYS keeps the evicted object's entry otherwise, and a key persisted at
    the handle later is then looked up under that stale name (evicting it
    failed with ESYS's catch-all 0x70001)."""
    tr = ectx.tr_from_tpmpublic(handle)
    ectx.evict_control(ESYS_TR.OWNER, tr, handle)
    _close_tr(ectx, tr)


def _close_tr(ectx: Any, tr: Any) -> None:
    if tr is None or int(tr) == int(ESYS_TR.NONE):
        return
    try:
        ectx.tr_close(tr)
    except TSS2_Exception:
        pass


def _key_summary(public: TPM2B_PUBLIC, handle: int | None = None) -> dict[str, Any]:
    from cryptography.hazmat.primitives import serialization

    from ._base import kid_for

    out: dict[str, Any] = {}
    if handle is not None:
        out["handle"] = format_handle(handle)
    out["name"] = bytes(public.get_name()).hex()
    area = public.publicArea
    kind = int(area.type)
    try:
        key = serialization.load_der_public_key(public.to_der())
        out["public_key_pem"] = public.to_pem().decode("ascii")
        out["kid"] = kid_for(key)
    except Exception:  # keyedhash/symcipher objects have no SPKI
        key = None
    if kind == int(TPM2_ALG.ECC):
        curve = int(area.parameters.eccDetail.curveID)
        out["type"] = {int(TPM2_ECC.NIST_P256): "ecc-p256", int(TPM2_ECC.NIST_P384): "ecc-p384"}.get(curve, f"ecc-0x{curve:04x}")
    elif kind == int(TPM2_ALG.RSA):
        out["type"] = f"rsa-{int(area.parameters.rsaDetail.keyBits)}"
    else:
        out["type"] = str(area.type)
    attrs = area.objectAttributes
    if attrs & TPMA_OBJECT.RESTRICTED and attrs & TPMA_OBJECT.SIGN_ENCRYPT:
        out["role"] = "attestation-key"
    elif attrs & TPMA_OBJECT.RESTRICTED and attrs & TPMA_OBJECT.DECRYPT:
        out["role"] = "storage-key"
    elif attrs & TPMA_OBJECT.SIGN_ENCRYPT:
        out["role"] = "signing-key"
    else:
        out["role"] = "other"
    out["attributes"] = key_attributes(public)
    return out


# ---------------------------------------------------------------------------- capseal tpm provision


def provision(tcti: str | None, *, signing_handle: int = 0x81000101, ak_handle: int = 0x81000102,
              alg: str = "p256", force: bool = False) -> dict[str, Any]:
    """Create the SRK (transient), a persistent signing key and a persistent
    restricted P-256 attestation key; return handles, URIs, public keys and
    names, plus the signing key's custody statement with a verified
    TPM2_Certify by the AK. Refuses occupied handles unless ``force``."""
    tcti = DEFAULT_TCTI if tcti is None else check_tcti(tcti, "--tcti")
    cose_alg = _cose_alg(alg)
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
    _check_alg_supported(info, cose_alg)

    handles = (signing_handle, ak_handle)
    #: names before (old) and after (new), and whether a change was begun: for the
    #: report of a failure part-way (filled in by the job as it goes)
    old_names: dict[int, str] = {}
    new_names: dict[int, str] = {}
    changing: list[str] = []

    def job(ectx: Any) -> dict[str, Any]:
        device.make_room()
        existing = {h: _occupant(ectx, h, tcti) for h in handles}
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
            key_priv, key_pub = _create_under_srk(ectx, srk, signing_template(cose_alg, with_auth=False))
            ak_priv, ak_pub = _create_under_srk(ectx, srk, TPM2B_PUBLIC.parse(AK_TEMPLATE, objectAttributes=_AK_ATTRS))
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
                _evict(ectx, h)
            for tr, h in ((key, signing_handle), (ak, ak_handle)):
                changing.append(f"persisting at {format_handle(h)}")
                _close_tr(ectx, ectx.evict_control(ESYS_TR.OWNER, tr, h))
        finally:
            _flush_all(ectx, loaded)
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
        signing = {**_key_summary(signer.public_area, signing_handle), "uri": signer.uri, "alg": signer.alg}
    finally:
        signer.close()
    ak_public = device.call(lambda e: _read_persistent(e, ak_handle), what="reading the attestation key")
    assert ak_public is not None
    ak = {**_key_summary(ak_public, ak_handle), "template": AK_TEMPLATE,
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
        now = device.call(lambda e: {h: _read_persistent(e, h) for h in handles},
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
    cli_alg = next((k for k, v in _CLI_ALGS.items() if v == alg or k == alg.lower()), alg)
    rerun = (f"capseal tpm provision --tcti '{tcti}' --handle {format_handle(handles[0])} "
             f"--ak-handle {format_handle(handles[1])} --alg {cli_alg}" + (" --force" if occupied else ""))
    return ProvisionIncompleteError(
        f"provisioning on TPM {tcti} failed while {step}, after it had changed the TPM: {exc}. Now {report}",
        hint=f"when the TPM works again, finish the job with: {rerun}")


# ---------------------------------------------------------------------------- capseal keys create / list


def create_key(uri: str, alg: str, *, pin: str | Secret | None = None, secrets_handler: SecretsHandler | None = None,
               **opts: Any) -> TPMSigner:
    """``capseal keys create tpm2:…``: a new key generated inside the TPM.

    ``tpm2:handle=0x81…`` persists it at that (empty) handle;
    ``tpm2:keyfile=/path`` writes a TSS2 PRIVATE KEY (mode 0600, never
    overwriting) whose parent is the SRK. ``pin`` becomes the key's auth value
    (and the key stays DA-protected)."""
    pin = as_secret(pin, "pin=")
    tcti = opts.pop("tcti", None)
    check_options("keys create for a tpm2: key", opts, ("pin", "secrets_handler", "tcti"))
    ref = parse_tpm_uri(uri, tcti=tcti)
    if not ref.names_key:
        raise KeyURIError("keys create needs tpm2:handle=0x81…?tcti=… or tpm2:keyfile=/path?tcti=…")
    cose_alg = _cose_alg(alg)
    device = get_device(ref.tcti)
    _check_alg_supported(device.info(), cose_alg)
    auth = auth_value(pin, ref.describe_key(), CREATE_AUTH_BYTES)  # before anything is created
    template = signing_template(cose_alg, with_auth=auth is not None)
    if ref.keyfile is not None:
        import os

        if os.path.exists(ref.keyfile):
            raise HandleInUseError(f"{ref.keyfile} already exists; capseal never overwrites a key file")
        folder = os.path.dirname(os.path.abspath(ref.keyfile))
        if not os.access(folder, os.W_OK | os.X_OK):
            raise KeyURIError(f"cannot write key file {ref.keyfile}: {folder} is missing or not writable")

    def job(ectx: Any) -> Any:
        device.make_room()
        if ref.handle is not None:
            current = _occupant(ectx, ref.handle, ref.tcti)
            if current is not None:
                raise HandleInUseError(f"TPM {ref.tcti} already has a key at {format_handle(ref.handle)} "
                                       f"(name {bytes(current.get_name()).hex()[:16]}…)")
        srk, *_ = ectx.create_primary(TPM2B_SENSITIVE_CREATE(), srk_template(), ESYS_TR.OWNER)
        try:
            private, public = _create_under_srk(ectx, srk, template, auth)
            if ref.handle is not None:
                _persist(ectx, srk, private, public, ref.handle)
            return private.marshal(), public.marshal()
        finally:
            ectx.flush_context(srk)

    what = f"creating {ref.describe_key()}"
    fut = device.submit(job, what=what, retry=False)
    try:
        private_blob, public_blob = device.wait(fut, None)
    except KeyboardInterrupt as exc:  # the worker goes on making the key: wait for it, and undo it
        _undo_create(device, ref, exc, fut)
        raise
    written = False
    try:
        if ref.keyfile is not None:
            try:
                _write_keyfile(ref.keyfile, TPMKeyFile(public=public_blob, private=private_blob, parent=TPM_RH_OWNER,
                                                       empty_auth=auth is None))
                written = True
            except FileExistsError:
                raise HandleInUseError(f"{ref.keyfile} already exists; capseal never overwrites a key file") from None
            except OSError as exc:
                raise KeyURIError(f"cannot write key file {ref.keyfile}: {exc.strerror}") from None
        return TPMSigner(ref, auth=auth, device=device)
    except BaseException as exc:  # a Ctrl-C (or a failure) before the caller has the key: it goes again
        if ref.handle is not None or written:
            _undo_create(device, ref, exc)
        raise


def _undo_create(device: TPMDevice, ref: TPMKeyURI, exc: BaseException, job: Any = None) -> None:
    """Remove the key a ``create_key`` that did not finish made: evict it from
    its handle (once ``job``, the TPM command making it, is done: a Ctrl-C
    does not stop the TPM's worker) or delete its key file, with Ctrl-C held
    off meanwhile. When that fails, ``exc`` is marked as leaving it behind."""
    import os

    from ._leftover import held_interrupts, note_left

    with held_interrupts():
        try:
            if job is not None:
                try:
                    job.result(timeout=60)
                except Exception:  # noqa: BLE001 - the job failed: it made nothing to undo
                    return
            if ref.keyfile is not None:
                if job is None:  # the key file was written by this call (the TPM holds nothing of it)
                    os.unlink(ref.keyfile)
                return
            handle = ref.handle
            assert handle is not None
            device.call(lambda ectx: _evict(ectx, handle), what=f"removing the unfinished {ref.describe_key()}",
                        retry=False, timeout=30)
        except BaseException:  # noqa: BLE001 - the error on its way out is the one to report, with this key named
            note_left(exc, ref.to_uri())


def delete_key(uri: str, *, kid: str | None = None, pin: str | Secret | None = None,
               secrets_handler: SecretsHandler | None = None, **opts: Any) -> dict[str, Any]:
    """``capseal keys delete tpm2:…``: evict the key at a persistent handle
    (TPM2_EvictControl), or delete a key file (the TPM holds nothing of it).

    Args:
        uri: ``tpm2:handle=0x81…`` or ``tpm2:keyfile=/path``.
        kid: when given, the key found must have this kid (what the operator was shown).
        pin: not needed (evicting uses the owner hierarchy's empty auth).
        secrets_handler: not asked.
        opts: ``tcti``; any other is refused.

    Returns:
        ``uri``, ``kid`` (when the key has one) and ``deleted``.

    Raises:
        KeyURIError: the URI names no key, the object is not a signing or attestation key
            (a storage key, say: left alone), or is another key than ``kid``.
        KeyNotFoundError: nothing at the handle, or no key file.
        UnknownOptionError, SignerUnavailableError, DeviceError: as for other TPM commands.
    """

    tcti = opts.pop("tcti", None)
    check_options("keys delete for a tpm2: key", opts, ("kid", "pin", "secrets_handler", "tcti"))
    ref = parse_tpm_uri(uri, tcti=tcti)
    if not ref.names_key:
        raise KeyURIError("keys delete needs tpm2:handle=0x81…?tcti=… or tpm2:keyfile=/path?tcti=…")

    def check(public: TPM2B_PUBLIC) -> str | None:
        summary = _key_summary(public, ref.handle)
        if summary["role"] not in ("signing-key", "attestation-key"):
            raise KeyURIError(f"{ref.describe_key()} is a {summary['role']}, not a signing or attestation key; "
                              "capseal deletes only those, and left it alone")
        found = summary.get("kid")
        if kid is not None and found != kid:
            raise KeyURIError(f"{ref.describe_key()} is another key than the one shown (kid {kid[:16]}…); not deleted")
        return found if isinstance(found, str) else None

    if ref.keyfile is not None:
        import os

        kf = _read_keyfile(ref.keyfile)  # KeyNotFoundError when there is none; a file that is no key is refused
        found = check(keyfile_public(kf, ref.describe_key()))
        os.unlink(ref.keyfile)
        return {"uri": ref.to_uri(), "kid": found, "deleted": [f"key file {ref.keyfile}"]}
    handle = ref.handle
    assert handle is not None
    device = get_device(ref.tcti)

    def job(ectx: Any) -> str | None:
        public = _read_persistent(ectx, handle)
        if public is None:
            raise KeyNotFoundError(f"no key at persistent handle {format_handle(handle)} on TPM {ref.tcti}")
        found = check(public)
        _evict(ectx, handle)
        return found

    found = device.call(job, what=f"deleting {ref.describe_key()}", retry=False)
    return {"uri": ref.to_uri(), "kid": found, "deleted": [f"persistent object {format_handle(handle)}"]}


def list_keys(uri: str, *, pin: str | Secret | None = None, secrets_handler: SecretsHandler | None = None,
              **opts: Any) -> list[dict[str, Any]]:
    """``capseal keys list tpm2:?tcti=…``: every persistent object on the TPM
    (role, type, kid, name, attributes); for a handle or keyfile URI, that key
    (none when no object is at the handle, as a PKCS#11 URI's filter lists none)."""
    tcti = opts.pop("tcti", None)
    check_options("keys list for a tpm2: TPM", opts, ("pin", "secrets_handler", "tcti"))
    ref = parse_tpm_uri(uri, tcti=tcti)
    device = get_device(ref.tcti)
    if ref.keyfile is not None:
        kf = _read_keyfile(ref.keyfile)
        public = keyfile_public(kf, ref.describe_key())
        return [{**_key_summary(public), "uri": ref.to_uri(), "parent": format_handle(kf.parent),
                 "empty_auth": kf.empty_auth}]

    def job(ectx: Any) -> list[dict[str, Any]]:
        handles: list[int] = []
        more, start = True, int(TPM2_HC.PERSISTENT_FIRST)
        while more:
            more, data = ectx.get_capability(TPM2_CAP.HANDLES, start, 64)
            batch = [int(h) for h in data.data.handles]
            handles += [h for h in batch if is_persistent_handle(h) and ref.handle in (None, h)]
            if not batch:
                break
            start = batch[-1] + 1
        out = []
        for h in handles:
            public = _read_persistent(ectx, h)
            if public is None:
                continue
            entry = _key_summary(public, h)
            entry["uri"] = TPMKeyURI(tcti=ref.tcti, handle=h).to_uri()
            out.append(entry)
        return out

    return device.call(job, what="listing persistent keys")

