"""``capseal keys create``, ``keys list`` and ``keys delete`` for ``tpm2:``
keys: a new key generated inside the TPM (persisted at a handle, or written
as a ``TSS2 PRIVATE KEY`` file), the persistent objects a TPM holds, and the
removal of exactly the one the operator was shown.
"""

from __future__ import annotations

import os
from typing import Any

from tpm2_pytss.constants import ESYS_TR, TPM2_CAP, TPM2_HC
from tpm2_pytss.types import TPM2B_PUBLIC, TPM2B_SENSITIVE_CREATE

from capseal.errors import KeyNotFoundError, KeyURIError
from capseal.keys import SecretsHandler, check_options
from capseal.keys.provision import held_interrupts, note_left
from capseal.keys.secret import Secret, as_secret

from ._device import TPMDevice, get_device
from ._objects import (
    CREATE_AUTH_BYTES,
    HandleInUseError,
    auth_value,
    check_alg_supported,
    cose_alg,
    keyfile_public,
    read_keyfile,
    signing_template,
    srk_template,
    write_keyfile,
)
from ._persistent import create_under_srk, evict, key_summary, occupant, persist, read_persistent
from ._signer import TPMSigner
from ._uri import TPM_RH_OWNER, TPMKeyFile, TPMKeyURI, format_handle, is_persistent_handle, parse_tpm_uri

__all__ = ["create_key", "delete_key", "list_keys"]


def create_key(uri: str, alg: str, *, pin: str | Secret | None = None, secrets_handler: SecretsHandler | None = None,
               **opts: Any) -> TPMSigner:
    """``capseal keys create tpm2:…``: a new key generated inside the TPM.
    ``tpm2:handle=0x81…`` persists it at that (empty) handle;
    ``tpm2:keyfile=/path`` writes a TSS2 PRIVATE KEY (mode 0600, never
    overwriting) whose parent is the SRK. A create that does not finish (a
    Ctrl-C meanwhile) removes what it made.

    Args:
        uri: the new key's URI.
        alg: p256, p384, rsa-pss (or the COSE names).
        pin: becomes the key's auth value (the key then stays DA-protected).
        secrets_handler: not asked.
        opts: ``tcti``; any other is refused.

    Returns:
        The new key, opened.

    Raises:
        UnknownOptionError: an option not taken here.
        KeyURIError: the URI names no key, or the key file cannot be written.
        HandleInUseError: the handle or key file is taken.
        UnsupportedAlgorithmError: the TPM cannot make such a key.
        PinIncorrectError: the auth value is not usable, or too long for the key.
        SignerUnavailableError, DeviceError: as for other TPM commands.
    """
    pin = as_secret(pin, "pin=")
    tcti = opts.pop("tcti", None)
    check_options("keys create for a tpm2: key", opts, ("pin", "secrets_handler", "tcti"))
    ref = parse_tpm_uri(uri, tcti=tcti)
    if not ref.names_key:
        raise KeyURIError("keys create needs tpm2:handle=0x81…?tcti=… or tpm2:keyfile=/path?tcti=…")
    cose_name = cose_alg(alg)
    device = get_device(ref.tcti)
    check_alg_supported(device.info(), cose_name)
    auth = auth_value(pin, ref.describe_key(), CREATE_AUTH_BYTES)  # before anything is created
    template = signing_template(cose_name, with_auth=auth is not None)
    if ref.keyfile is not None:
        if os.path.exists(ref.keyfile):
            raise HandleInUseError(f"{ref.keyfile} already exists; capseal never overwrites a key file")
        folder = os.path.dirname(os.path.abspath(ref.keyfile))
        if not os.access(folder, os.W_OK | os.X_OK):
            raise KeyURIError(f"cannot write key file {ref.keyfile}: {folder} is missing or not writable")

    def job(ectx: Any) -> Any:
        device.make_room()
        if ref.handle is not None:
            current = occupant(ectx, ref.handle, ref.tcti)
            if current is not None:
                raise HandleInUseError(f"TPM {ref.tcti} already has a key at {format_handle(ref.handle)} "
                                       f"(name {bytes(current.get_name()).hex()[:16]}…)")
        srk, *_ = ectx.create_primary(TPM2B_SENSITIVE_CREATE(), srk_template(), ESYS_TR.OWNER)
        try:
            private, public = create_under_srk(ectx, srk, template, auth)
            if ref.handle is not None:
                persist(ectx, srk, private, public, ref.handle)
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
                write_keyfile(ref.keyfile, TPMKeyFile(public=public_blob, private=private_blob, parent=TPM_RH_OWNER,
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
            device.call(lambda ectx: evict(ectx, handle), what=f"removing the unfinished {ref.describe_key()}",
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
        summary = key_summary(public, ref.handle)
        if summary["role"] not in ("signing-key", "attestation-key"):
            raise KeyURIError(f"{ref.describe_key()} is a {summary['role']}, not a signing or attestation key; "
                              "capseal deletes only those, and left it alone")
        found = summary.get("kid")
        if kid is not None and found != kid:
            raise KeyURIError(f"{ref.describe_key()} is another key than the one shown (kid {kid[:16]}…); not deleted")
        return found if isinstance(found, str) else None

    if ref.keyfile is not None:
        kf = read_keyfile(ref.keyfile)  # KeyNotFoundError when there is none; a file that is no key is refused
        found = check(keyfile_public(kf, ref.describe_key()))
        os.unlink(ref.keyfile)
        return {"uri": ref.to_uri(), "kid": found, "deleted": [f"key file {ref.keyfile}"]}
    handle = ref.handle
    assert handle is not None
    device = get_device(ref.tcti)

    def job(ectx: Any) -> str | None:
        public = read_persistent(ectx, handle)
        if public is None:
            raise KeyNotFoundError(f"no key at persistent handle {format_handle(handle)} on TPM {ref.tcti}")
        found = check(public)
        evict(ectx, handle)
        return found

    found = device.call(job, what=f"deleting {ref.describe_key()}", retry=False)
    return {"uri": ref.to_uri(), "kid": found, "deleted": [f"persistent object {format_handle(handle)}"]}


def list_keys(uri: str, *, pin: str | Secret | None = None, secrets_handler: SecretsHandler | None = None,
              **opts: Any) -> list[dict[str, Any]]:
    """``capseal keys list tpm2:?tcti=…``: every persistent object on the TPM;
    for a handle or keyfile URI, that key (none when no object is at the
    handle, as a PKCS#11 URI's filter lists none).

    Args:
        uri: the TPM's (or a key's) URI.
        pin: not needed.
        secrets_handler: not asked.
        opts: ``tcti``; any other is refused.

    Returns:
        One entry per object (see ``key_summary``) with its ``uri``; a key file's
        also with ``parent`` and ``empty_auth``.

    Raises:
        UnknownOptionError: an option not taken here.
        KeyURIError, KeyNotFoundError: the URI is malformed, or the key file cannot be read.
        SignerUnavailableError, DeviceError: as for other TPM commands.
    """
    tcti = opts.pop("tcti", None)
    check_options("keys list for a tpm2: TPM", opts, ("pin", "secrets_handler", "tcti"))
    ref = parse_tpm_uri(uri, tcti=tcti)
    device = get_device(ref.tcti)
    if ref.keyfile is not None:
        kf = read_keyfile(ref.keyfile)
        public = keyfile_public(kf, ref.describe_key())
        return [{**key_summary(public), "uri": ref.to_uri(), "parent": format_handle(kf.parent),
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
            public = read_persistent(ectx, h)
            if public is None:
                continue
            entry = key_summary(public, h)
            entry["uri"] = TPMKeyURI(tcti=ref.tcti, handle=h).to_uri()
            out.append(entry)
        return out

    return device.call(job, what="listing persistent keys")
