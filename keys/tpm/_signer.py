"""``tpm2:`` signing keys: persistent handles and ``TSS2 PRIVATE KEY`` files.

The key never leaves the TPM: capseal hashes the message in Python and the TPM
signs the digest (TPM2_Sign with a null hashcheck ticket, which unrestricted
signing keys accept). All TPM work runs on the device's worker thread
(``_device``), so any number of producer threads can share one key.

Algorithms: ECC P-256 → ES256 and P-384 → ES384 (ECDSA; R and S left-padded
to the curve size, the raw r‖s COSE form), RSA ≥ 2048 → PS256 (RSASSA-PSS,
salt = hash length = 32, which TPMs use and COSE requires). EdDSA needs a TPM
that lists TPM_ALG_EDDSA (0x0060) *and* TPM2_SignSequenceComplete (TPM 2.0
rev 1.83), which neither swtpm 0.7 nor libtss2 3.2 has: such requests are
refused with UnsupportedAlgorithmError saying which part is missing.

Provisioning lives in ``_provision`` and ``_manage``, the doctor checks in
``_doctor``; the package facade exports them.
"""


from __future__ import annotations

import hashlib
import math
import threading
from concurrent.futures import Future
from typing import Any

from tpm2_pytss import TSS2_Exception
from tpm2_pytss.constants import ESYS_TR, TPM2_RH, TPM2_ST, TPMA_OBJECT
from tpm2_pytss.types import TPM2B_DIGEST, TPM2B_PRIVATE, TPM2B_PUBLIC, TPM2B_SENSITIVE_CREATE, TPMT_TK_HASHCHECK

from capseal.errors import (
    InputError,
    KeyNotFoundError,
    KeyURIError,
    PinIncorrectError,
    SignatureFailedError,
    SignerUnavailableError,
)
from capseal.keys import PendingSignature, SecretsHandler, SignatureResult, Signer, check_options
from capseal.keys.custody import custody_statement
from capseal.keys.secret import Secret, as_secret, pin_advice

from ._certify import take_certify
from ._device import TPMDevice, get_device
from ._direct import DirectSign, esys_context
from ._errors import auth_value_hint, is_auth_failure, is_integrity_failure, names_no_object
from ._handles import persistent_tr
from ._info import TPMInfo
from ._objects import (
    KeyShape,
    auth_value,
    create_key_hint,
    key_attributes,
    keyfile_public,
    persistent_key_tr,
    read_keyfile,
    srk_template,
)
from ._uri import TPM_RH_OWNER, TPMKeyFile, TPMKeyURI, format_handle, handle_argument, parse_handle, parse_tpm_uri

__all__ = ["TPMSigner", "TPM_SIGNER_OPTIONS"]

_DEFAULT_TIMEOUT = 60.0

#: What ``open_signer`` takes for a tpm2: key.
TPM_SIGNER_OPTIONS = ("pin", "secrets_handler", "tcti", "ak_handle", "timeout")


class TPMSigner(Signer):
    """A signing key inside a TPM 2.0, named by a ``tpm2:`` URI.

    Thread-safe: ``sign`` may be called from any number of threads; the TPM
    work is queued on the device worker. ``timeout`` (seconds, default 60)
    is how long one TPM command may take before the TPM is taken for hung and
    the signature fails with SignerUnavailableError; time spent waiting in
    the queue behind other commands does not count. The auth value (``pin``)
    is kept only in memory and never appears in ``uri``, ``repr`` or messages.
    """

    external_device = True
    queues_signatures = True

    def __init__(
        self,
        ref: TPMKeyURI,
        *,
        auth: Secret | None = None,
        device: TPMDevice | None = None,
        timeout: float | None = _DEFAULT_TIMEOUT,
    ) -> None:
        if not ref.names_key:
            raise KeyURIError("a tpm2: signing key URI names handle=0x81…… or keyfile=/path")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not math.isfinite(timeout) or timeout <= 0):
            # a str was taken here and failed as a TypeError at the first signature; 0 timed out every one
            raise InputError(f"timeout is {timeout!r}; give seconds as a positive number, or None for no limit")
        self._ref = ref
        self._auth = auth if auth is not None and not auth.empty else None
        self._timeout = timeout
        self._device = device or get_device(ref.tcti)
        self._token = object()  # this signer's entries in the device's per-connection memo
        self._closed = False
        self._released = False  # set on the worker by close()'s release job; read there only
        self._close_lock = threading.Lock()
        self._keyfile: TPMKeyFile | None = None
        if ref.keyfile is not None:
            self._keyfile = read_keyfile(ref.keyfile)
            if not self._keyfile.empty_auth and self._auth is None:
                raise PinIncorrectError(f"{ref.describe_key()} has an auth value (the key file says so) and none was "
                                        "given; nothing was sent to the TPM", hint=pin_advice("it"))
        self._pinned_name: bytes | None = None
        public, name, info = self._device.call(self._open_on_worker, what=f"opening {ref.describe_key()}",
                                               timeout=timeout)
        self._public_area = public
        self._pinned_name = name
        self._info = info
        try:
            self._shape = KeyShape(public, info, ref.describe_key())
        except BaseException:
            self.close()  # flush a loaded key file we cannot use
            raise
        self._digest = getattr(hashlib, self._shape.hash_name)
        self._ticket = TPMT_TK_HASHCHECK(tag=TPM2_ST.HASHCHECK, hierarchy=TPM2_RH.NULL)
        self._fast = DirectSign.create(self._shape, self._ticket)  # None under CAPSEAL_NO_DIRECT

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_uri(
        cls,
        uri: str,
        *,
        pin: str | Secret | None = None,
        secrets_handler: SecretsHandler | None = None,
        tcti: str | None = None,
        ak_handle: int | str | None = None,
        timeout: float | None = _DEFAULT_TIMEOUT,
        **options: Any,
    ) -> TPMSigner:
        """Open ``tpm2:handle=…`` or ``tpm2:keyfile=…`` (``open_signer``'s entry point).

        Args:
            uri: the key's ``tpm2:`` URI.
            pin: the key's auth value (when it has one).
            secrets_handler: asked only for key files that declare a non-empty auth.
            tcti: the TPM, overriding the URI's ``tcti=``.
            ak_handle: an attestation key's persistent handle, overriding the URI's ``ak-handle=``.
            timeout: seconds one TPM command may take (None: no limit).
            options: none other; any is refused.

        Returns:
            The signer.

        Raises:
            UnknownOptionError: an option this backend does not take (named, with the valid ones).
            KeyURIError, KeyNotFoundError, PinIncorrectError, SignerUnavailableError,
            UnsupportedAlgorithmError: see :class:`TPMSigner`.
        """
        check_options("open_signer for a tpm2: key", options, TPM_SIGNER_OPTIONS)
        pin = as_secret(pin, "pin=")
        if secrets_handler is not None and not callable(secrets_handler):
            raise InputError(f"secrets_handler is a {type(secrets_handler).__name__}, not a callable")
        ak = (parse_handle(ak_handle, "ak_handle") if isinstance(ak_handle, str)
              else None if ak_handle is None else handle_argument(ak_handle, "ak_handle"))
        ref = parse_tpm_uri(uri, tcti=tcti, ak_handle=ak)
        if pin is None and secrets_handler is not None and ref.keyfile is not None:
            kf = read_keyfile(ref.keyfile)
            if not kf.empty_auth:
                pin = as_secret(secrets_handler(f"auth value for {ref.describe_key()}"), "secrets_handler")
        return cls(ref, auth=auth_value(pin, ref.describe_key()), timeout=timeout)

    def _open_on_worker(self, ectx: Any) -> tuple[TPM2B_PUBLIC, bytes, TPMInfo]:
        info = self._device.info()
        tr = self._key_tr(ectx)
        public, name, _ = ectx.read_public(tr)
        return public, bytes(name), info

    # ------------------------------------------------------------------ the key handle, per connection

    def _key_tr(self, ectx: Any) -> Any:
        """The key's ESYS_TR on this connection, loaded (a key file) on first use.

        Refused once close()'s release job has run: a describe() after close,
        or a signature that slipped into the queue behind the release, would
        otherwise load the key file again into a memo entry nobody releases,
        holding one of the TPM's few object slots until the process ends."""
        if self._released:
            raise SignerUnavailableError(f"{self.describe_short()} was closed")
        return self._device.memo((self._token, "key"), self._resolve, flush=self._keyfile is not None)

    def _resolve(self, ectx: Any) -> Any:
        ref = self._ref
        if self._keyfile is not None:
            tr = self._load_keyfile(ectx, self._keyfile)
        else:
            assert ref.handle is not None
            hint = f"Create one: {create_key_hint(ref.tcti, ref.handle)}"
            try:
                tr = persistent_tr(ectx, ref.handle, ref.tcti, "key", hint)
            except TSS2_Exception as exc:  # listed, yet gone by the time it was read
                if names_no_object(exc):
                    raise KeyNotFoundError(
                        f"no key at persistent handle {format_handle(ref.handle)} on TPM {ref.tcti}", hint=hint,
                    ) from None
                raise
        if self._pinned_name is not None:
            _pub, name, _ = ectx.read_public(tr)
            if bytes(name) != self._pinned_name:
                if self._keyfile is not None:
                    ectx.flush_context(tr)
                raise KeyNotFoundError(f"{ref.describe_key()} is no longer the key this signer opened "
                                       f"(TPM name {bytes(name).hex()[:16]}…, expected {self._pinned_name.hex()[:16]}…)")
        if self._auth is not None:
            ectx.tr_set_auth(tr, self._auth.encoded())
        return tr

    def _load_keyfile(self, ectx: Any, kf: TPMKeyFile) -> Any:
        where = self._ref.describe_key()
        public = keyfile_public(kf, where)
        try:
            private, used2 = TPM2B_PRIVATE.unmarshal(kf.private)
        except TSS2_Exception:
            raise KeyURIError(f"{where}: privkey is not a TPM2B_PRIVATE") from None
        if used2 != len(kf.private):
            raise KeyURIError(f"{where}: trailing bytes after the TPM2B_PRIVATE")
        if kf.parent == TPM_RH_OWNER:
            parent, _, _, _, _ = ectx.create_primary(TPM2B_SENSITIVE_CREATE(), srk_template(), ESYS_TR.OWNER)
            transient_parent = True
        else:
            parent = persistent_key_tr(ectx, kf.parent, self._ref.tcti, f"parent key for {where}")
            transient_parent = False
        try:
            return ectx.load(parent, private, public)
        except TSS2_Exception as exc:
            if is_integrity_failure(exc):
                raise KeyNotFoundError(
                    f"{where} was not made under this TPM's parent key (TPM_RC_INTEGRITY): the file belongs to "
                    "another TPM, or the TPM was cleared since") from None
            raise
        finally:
            if transient_parent:
                ectx.flush_context(parent)
            else:
                ectx.tr_close(parent)

    # ------------------------------------------------------------------ Signer

    @property
    def alg(self) -> str:
        """The COSE algorithm of the key (from its public area)."""
        return self._shape.alg

    @property
    def public_key(self) -> Any:
        """The key's public key, from its public area."""
        return self._shape.public_key

    @property
    def uri(self) -> str:
        """The key's ``tpm2:`` URI in canonical form (never an auth value)."""
        return self._ref.to_uri()

    @property
    def device(self) -> TPMDevice:
        """The TPM device (worker thread) this signer queues on."""
        return self._device

    @property
    def direct_path(self) -> DirectSign | None:
        """The direct ``Esys_Sign`` this signer takes (diagnostics and tests);
        None when it calls ``ESAPI.sign`` (tpm2-pytss without what it needs, or
        ``CAPSEAL_NO_DIRECT``)."""
        return self._fast

    @property
    def public_area(self) -> TPM2B_PUBLIC:
        """The key's TPM2B_PUBLIC as read at open (attributes, parameters)."""
        return self._public_area

    @property
    def tpm_name(self) -> bytes:
        """The key's TPM name (nameAlg ‖ H(public area)), as read at open."""
        assert self._pinned_name is not None
        return self._pinned_name

    def sign(self, data: bytes) -> SignatureResult:
        """Sign ``data``; the signature is checked against this key's public key
        before it is returned. Why: on a TPM without a resource manager another
        process can flush this key and load another one at the cached handle
        (each capseal process flushes what it did not load when it connects),
        and TPM2_Sign would then sign with that key. On a mismatch the key is
        reloaded with its name check (:meth:`forget_cached_key`) and signed
        once more. The producer queues with :meth:`begin_sign` and checks every
        signature itself, so it pays the check once.

        Args:
            data: the message (hashed here; the TPM signs the digest).

        Returns:
            The signature (ECDSA as raw r‖s, RSA-PSS padded to the key size).

        Raises:
            SignatureFailedError: the signature still does not verify after the reload.
            PinIncorrectError: the TPM refused the key's auth value.
            KeyNotFoundError: the key is gone, or another key is where it was.
            SignerUnavailableError: the signer was closed, or the TPM is unreachable or took longer than ``timeout``.
            DeviceError: the TPM refused otherwise.
        """
        from capseal.cose import signature_ok

        for attempt in (0, 1):
            result = self.begin_sign(data).result()
            if signature_ok(result.alg, self.public_key, result.signature, data):
                return result
            if attempt == 0:
                self.forget_cached_key()
        raise SignatureFailedError(f"{self.describe_short()} returned a signature its own public key rejects, "
                                   "twice (the key at this handle or in this file is not the one capseal opened)")

    def begin_sign(self, data: bytes) -> PendingSignature:
        """Queue the signature on the device's worker and return at once;
        ``result()`` waits for it. The timeout bounds the TPM's time per command,
        never the wait in the queue (see :meth:`TPMDevice.wait`).

        Args:
            data: the message.

        Returns:
            The pending signature (not checked against the public key: the caller
            checks it, or calls :meth:`sign`).

        Raises:
            SignerUnavailableError: the signer was closed.
        """
        if self._closed:
            raise SignerUnavailableError(f"{self.describe_short()} was closed")
        digest = self._digest(data).digest()
        fut = self._device.submit(lambda ectx: self._sign_on_worker(ectx, digest),
                                  what=f"signing with {self._ref.describe_key()}")
        return _QueuedSignature(self, fut)

    def _sign_on_worker(self, ectx: Any, digest: bytes) -> bytes:
        shape = self._shape
        for attempt in (0, 1):
            tr = self._key_tr(ectx)
            try:
                fast = self._fast
                ctx = esys_context(ectx) if fast is not None else None
                if fast is not None and ctx is not None:
                    return fast.sign(ctx, tr, digest)
                sig = ectx.sign(tr, TPM2B_DIGEST(digest), shape.scheme, self._ticket)
            except TSS2_Exception as exc:
                if self._keyfile is not None and attempt == 0 and names_no_object(exc):
                    # our loaded copy was flushed behind our back (another process on a TPM
                    # without a resource manager): load it again, once
                    self._device.forget((self._token, "key"))
                    continue
                if is_auth_failure(exc):
                    raise PinIncorrectError(
                        f"{self._ref.describe_key()} refused its auth value (wrong or missing pin)",
                        hint=auth_value_hint()) from None
                raise
            if shape.is_rsa:
                out = bytes(sig.signature.rsapss.sig)
                return out.rjust(shape.size, b"\x00")
            ecdsa = sig.signature.ecdsa  # keep `sig` alive while reading its buffers
            r, s = bytes(ecdsa.signatureR), bytes(ecdsa.signatureS)
            if len(r) > shape.size or len(s) > shape.size:
                raise SignatureFailedError(f"{self._ref.describe_key()} returned an oversized ECDSA component")
            return r.rjust(shape.size, b"\x00") + s.rjust(shape.size, b"\x00")
        raise AssertionError("unreachable")  # pragma: no cover

    def forget_cached_key(self) -> None:
        """Make the next signature load the key again and check its TPM name.

        Why: signing reuses the key's cached ESYS_TR without re-reading the
        object (a second check per signature would halve the rate). If another
        process flushed a loaded key file and loaded a different key that got
        the same transient handle, or replaced the key at a persistent handle,
        TPM2_Sign would use that key. The producer's check of a signature is
        what notices; call this when it fails (SignatureFailedError) and the
        next :meth:`sign` reloads with the name check (KeyNotFoundError if the
        key really is gone). A cached copy that still is this key is flushed
        as usual; a handle that now holds another object is only let go of,
        never flushed: that object is someone else's."""
        if self._closed:
            return
        token = self._token

        def forget(ectx: Any) -> None:
            self._device.forget((token, "ak"))
            if self._keyfile is None:
                self._device.forget((token, "key"))
                return
            tr = self._device.cached((token, "key"))
            if tr is None:
                return
            try:
                ours = bytes(ectx.read_public(tr)[1]) == self._pinned_name
            except TSS2_Exception:
                ours = False  # flushed already: nothing of ours to flush
            self._device.forget((token, "key"), flush=ours)

        self._device.call(forget, what=f"forgetting the cached handle of {self._ref.describe_key()}",
                          timeout=self._timeout, retry=False)

    def describe(self) -> dict[str, Any]:
        """The custody statement from what the TPM reports now: device properties,
        the key's public area (attributes, name) and, with an AK, a verified
        TPM2_Certify of the key by the AK (or why none was taken).

        Returns:
            The statement; ``software_device`` as the TPM's own strings say.

        Raises:
            SignerUnavailableError: the signer was closed, or the TPM is unreachable.
            KeyNotFoundError: the key or the AK is gone.
            DeviceError: the TPM refused, or the TPM2_Certify did not verify.
        """
        if self._closed:
            raise SignerUnavailableError(f"{self.describe_short()} was closed")
        return self._device.call(self._describe_on_worker, what=f"describing {self._ref.describe_key()}",
                                 timeout=self._timeout)

    def _describe_on_worker(self, ectx: Any) -> dict[str, Any]:
        info = self._device.info()
        tr = self._key_tr(ectx)
        public, name, _ = ectx.read_public(tr)
        ref = self._ref
        tpm_key: dict[str, Any] = {
            "name": bytes(name).hex(),
            "type": "rsa" if self._shape.is_rsa else "ecc",
            "tcti": ref.tcti,
        }
        if ref.handle is not None:
            tpm_key["handle"] = format_handle(ref.handle)
        else:
            assert self._keyfile is not None
            tpm_key["keyfile"] = ref.keyfile
            tpm_key["parent"] = format_handle(self._keyfile.parent)
            tpm_key["empty_auth"] = self._keyfile.empty_auth
        extra: dict[str, Any] = {"tpm_key": tpm_key, "software_device_reason": info.software_reason}
        ak_handle = ref.ak_handle
        attrs = public.publicArea.objectAttributes
        fixed = TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
        if ak_handle is not None and (attrs & fixed) != fixed:
            # A certify vouches that a key cannot leave this TPM (verify_certify requires
            # fixedTPM|fixedParent); for a duplicable key it would not, so none is claimed,
            # and key_attributes say what the TPM reported. It used to be taken and then
            # refused as a TPM2_Certify "that does not verify", blaming the TPM.
            extra["tpm_certify_omitted"] = (
                f"the key is not fixedTPM|fixedParent ({attrs}): a TPM2_Certify by the AK at "
                f"{format_handle(ak_handle)} would not show that it cannot leave this TPM")
        elif ak_handle is not None:
            ak_tr = self._device.memo((self._token, "ak"),
                                      lambda e: persistent_key_tr(e, ak_handle, ref.tcti, "attestation key"))
            extra["tpm_certify"] = take_certify(ectx, tr, public, ak_tr, ak_handle, self.public_key, ref.tcti)
        device = info.to_dict()
        device.pop("software", None)
        device.pop("software_reason", None)
        return custody_statement(
            backend="tpm2",
            alg=self.alg,
            kid=self.kid,
            public_key=self.public_key,
            software_device=info.software,
            key_store="tpm2-persistent" if ref.handle is not None else "tpm2-keyfile",
            device=device,
            key_attributes=key_attributes(public),
            extra=extra,
        )

    def close(self) -> None:
        """Forget this signer's handles on the device (a loaded key file is
        flushed). The shared device connection stays open for other users."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        token = self._token

        def release(_ectx: Any) -> None:
            self._released = True
            self._device.forget((token, "key"))
            self._device.forget((token, "ak"))

        try:
            self._device.call(release, what="releasing a TPM key", timeout=10, retry=False)
        except Exception:  # closing never raises; the device flushes on its own close
            pass


class _QueuedSignature(PendingSignature):
    """A TPM2_Sign queued on the device worker (see :meth:`TPMSigner.begin_sign`)."""

    __slots__ = ("_signer", "_fut")

    def __init__(self, signer: TPMSigner, fut: Future[bytes]) -> None:
        self._signer, self._fut = signer, fut

    def result(self) -> SignatureResult:
        signer = self._signer
        raw = signer._device.wait(self._fut, signer._timeout)
        return SignatureResult(raw, signer.kid, signer._shape.alg)

    def cancel(self) -> None:
        self._fut.cancel()  # the worker skips a cancelled job (Future.cancel fails once it runs)
