"""``tpm2:`` signing keys: persistent handles and ``TSS2 PRIVATE KEY`` files.

The key never leaves the TPM: capseal hashes the message in Python and the TPM
signs the digest (TPM2_Sign with a null hashcheck ticket, which unrestricted
signing keys accept). All TPM work runs on the device's worker thread
(:mod:`._tpm_device`), so any number of producer threads can share one key.

Algorithms: ECC P-256 → ES256 and P-384 → ES384 (ECDSA; R and S left-padded
to the curve size, the raw r‖s COSE form), RSA ≥ 2048 → PS256 (RSASSA-PSS,
salt = hash length = 32, which TPMs use and COSE requires). EdDSA needs a TPM
that lists TPM_ALG_EDDSA (0x0060) *and* TPM2_SignSequenceComplete (TPM 2.0
rev 1.83), which neither swtpm 0.7 nor libtss2 3.2 has: such requests are
refused with UnsupportedAlgorithmError saying which part is missing.

Provisioning (``create_key``, ``list_keys``, ``provision``) and the doctor
checks live in :mod:`._tpm_provision` and are re-exported here, where the
registries look for them.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from tpm2_pytss import TSS2_Exception
from tpm2_pytss.constants import ESYS_TR, TPM2_ALG, TPM2_ECC, TPM2_RH, TPM2_ST, TPMA_OBJECT
from tpm2_pytss.types import (
    TPM2B_DIGEST,
    TPM2B_PRIVATE,
    TPM2B_PUBLIC,
    TPM2B_SENSITIVE_CREATE,
    TPMT_SIG_SCHEME,
    TPMT_TK_HASHCHECK,
)

from capseal.errors import (
    InputError,
    KeyNotFoundError,
    KeyURIError,
    PinIncorrectError,
    SignatureFailedError,
    SignerUnavailableError,
    UnsupportedAlgorithmError,
)

from ._base import PendingSignature, SignatureResult, Signer
from ._files import MAX_KEY_FILE, FileTooLargeError, read_capped
from ._pin import Secret, as_secret, pin_advice
from ._registry import SecretsHandler, check_options
from ._tpm_device import TPMDevice, TPMInfo, auth_value_hint, get_device, persistent_tr
from ._tpm_uri import (
    TPM_RH_OWNER,
    TPMKeyFile,
    TPMKeyURI,
    format_handle,
    handle_argument,
    parse_handle,
    parse_tpm_uri,
)
from .custody import custody_statement

__all__ = [
    "TPMSigner",
    "TPM_ALG_EDDSA",
    "SRK_TEMPLATE",
    "srk_template",
    "key_attributes",
    "auth_value",
    "eddsa_refusal",
    "create_key",
    "list_keys",
    "delete_key",
    "provision",
    "doctor_checks",
    "create_key_hint",
]

#: TPM_ALG_EDDSA (TPM 2.0 rev 1.83); tpm2-pytss 3.0 has no constant for it.
TPM_ALG_EDDSA = 0x0060
TPM_ECC_ED25519 = 0x0040
SRK_TEMPLATE = "ecc256:aes128cfb"
_SRK_ATTRS = (TPMA_OBJECT.RESTRICTED | TPMA_OBJECT.DECRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
              | TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH | TPMA_OBJECT.NODA)
_RC_HANDLE = 0x08B
_RC_REFERENCE_H0 = 0x910
_RC_AUTH_FAIL = 0x08E
_RC_BAD_AUTH = 0x0A2
_RC_INTEGRITY = 0x09F
_DEFAULT_TIMEOUT = 60.0

_ATTRIBUTE_NAMES = (
    ("fixedTPM", TPMA_OBJECT.FIXEDTPM),
    ("stClear", TPMA_OBJECT.STCLEAR),
    ("fixedParent", TPMA_OBJECT.FIXEDPARENT),
    ("sensitiveDataOrigin", TPMA_OBJECT.SENSITIVEDATAORIGIN),
    ("userWithAuth", TPMA_OBJECT.USERWITHAUTH),
    ("adminWithPolicy", TPMA_OBJECT.ADMINWITHPOLICY),
    ("noDA", TPMA_OBJECT.NODA),
    ("encryptedDuplication", TPMA_OBJECT.ENCRYPTEDDUPLICATION),
    ("restricted", TPMA_OBJECT.RESTRICTED),
    ("decrypt", TPMA_OBJECT.DECRYPT),
    ("sign", TPMA_OBJECT.SIGN_ENCRYPT),
)


def srk_template() -> TPM2B_PUBLIC:
    """The TCG storage root key template (ECC P-256, AES-128-CFB, empty unique):
    the parent ``0x40000001`` means in a TSS2 PRIVATE KEY, as tpm2-tss-engine,
    tpm2-openssl and ``tpm2_pytss.tsskey`` create it. Primaries are
    deterministic per seed and template, so any process gets the same SRK."""
    return TPM2B_PUBLIC.parse(SRK_TEMPLATE, objectAttributes=_SRK_ATTRS)


def key_attributes(public: TPM2B_PUBLIC) -> dict[str, bool]:
    """TPMA_OBJECT bits of a public area, by their TPM specification names."""
    attrs = public.publicArea.objectAttributes
    return {name: bool(attrs & bit) for name, bit in _ATTRIBUTE_NAMES}


def create_key_hint(tcti: str, handle: int) -> str:
    """The command that creates a signing key at an empty persistent handle.

    Why not ``capseal tpm provision --handle``: on a TPM that is already
    provisioned that refuses, and its ``--force`` replaces the pinned
    attestation key too. ``keys create`` touches only the one handle."""
    return f"capseal keys create '{TPMKeyURI(tcti=tcti, handle=handle).to_uri()}' --alg p256"


#: Longest auth value ESAPI takes (TPM2B_AUTH holds a SHA-512 digest); a key
#: accepts at most its name algorithm's digest size (32 bytes for SHA-256,
#: which capseal's templates use), so creating checks against that instead.
MAX_AUTH_BYTES = 64
CREATE_AUTH_BYTES = 32


def auth_value(pin: object, where: str, limit: int = MAX_AUTH_BYTES) -> Secret | None:
    """The auth value ``pin`` (a str or a Secret) checked for the TPM and held
    as a :class:`Secret` (its UTF-8 bytes go to the TPM); None for no pin or "".

    Why checked here: ``pin.encode()`` was an AttributeError for a non-str, a
    UnicodeEncodeError whose args hold the whole pin for text that is not
    UTF-8, and an overlong value an IndexError from tpm2-pytss. Each is now
    PinIncorrectError naming ``where``, with no part of the value.

    Raises:
        PinIncorrectError: the value is not usable text, or longer than ``limit`` bytes.
    """
    secret = as_secret(pin, "pin=")
    del pin
    if secret is None or secret.empty:
        return None
    secret = secret.with_suffix(f"for {where}").usable_pin()
    if secret.byte_length() > limit:
        raise PinIncorrectError(f"the auth value for {where} is {secret.byte_length()} bytes; a TPM key's auth value "
                                f"is at most {limit} bytes")
    return secret


def eddsa_refusal(info: TPMInfo) -> UnsupportedAlgorithmError:
    """Why this TPM cannot make capseal an Ed25519 key (always an error today)."""
    who = f"TPM {info.tcti} ({info.manufacturer} {info.vendor.strip()})"
    if not info.supports(TPM_ALG_EDDSA):
        return UnsupportedAlgorithmError(
            f"{who} does not list TPM_ALG_EDDSA (0x0060) in TPM_CAP_ALGS, so it cannot hold an Ed25519 key; "
            "use p256 (ES256) or rsa-pss (PS256)")
    return UnsupportedAlgorithmError(
        f"{who} lists TPM_ALG_EDDSA, but pure EdDSA needs TPM2_SignSequenceComplete (TPM 2.0 rev 1.83), which "
        "libtss2 3.2 / tpm2-pytss 3.0 do not provide; use p256 (ES256)")


class _KeyShape:
    """How to sign with a given public area: COSE alg, hash, TPM scheme, sizes."""

    __slots__ = ("alg", "hash_name", "scheme", "size", "public_key", "is_rsa")

    def __init__(self, public: TPM2B_PUBLIC, info: TPMInfo, where: str) -> None:
        area = public.publicArea
        attrs = area.objectAttributes
        if not attrs & TPMA_OBJECT.SIGN_ENCRYPT:
            raise UnsupportedAlgorithmError(f"{where} is not a signing key (attributes {attrs})")
        if attrs & TPMA_OBJECT.RESTRICTED:
            raise UnsupportedAlgorithmError(
                f"{where} is a restricted signing key (an attestation key): it signs only TPM-generated data, "
                "not capsules; use the unrestricted signing key")
        self.is_rsa = int(area.type) == int(TPM2_ALG.RSA)
        if int(area.type) == int(TPM2_ALG.ECC):
            curve = int(area.parameters.eccDetail.curveID)
            if curve == int(TPM2_ECC.NIST_P256):
                self.alg, self.hash_name, hash_alg, self.size = "ES256", "sha256", TPM2_ALG.SHA256, 32
            elif curve == int(TPM2_ECC.NIST_P384):
                self.alg, self.hash_name, hash_alg, self.size = "ES384", "sha384", TPM2_ALG.SHA384, 48
            elif curve == TPM_ECC_ED25519:
                raise eddsa_refusal(info)
            else:
                raise UnsupportedAlgorithmError(f"{where} is on ECC curve 0x{curve:04x}; capseal signs with P-256 or P-384")
            fixed = area.parameters.eccDetail.scheme
            if int(fixed.scheme) not in (int(TPM2_ALG.NULL), int(TPM2_ALG.ECDSA)) or (
                int(fixed.scheme) == int(TPM2_ALG.ECDSA) and int(fixed.details.anySig.hashAlg) != int(hash_alg)
            ):
                raise UnsupportedAlgorithmError(f"{where} has signing scheme {fixed.scheme}; {self.alg} needs ECDSA "
                                                f"with {self.hash_name.upper()} (or no fixed scheme)")
            self.scheme = TPMT_SIG_SCHEME(scheme=TPM2_ALG.ECDSA)
        elif self.is_rsa:
            bits = int(area.parameters.rsaDetail.keyBits)
            if bits < 2048:
                raise UnsupportedAlgorithmError(f"{where} is RSA-{bits}; PS256 needs at least 2048 bits")
            fixed = area.parameters.rsaDetail.scheme
            if int(fixed.scheme) not in (int(TPM2_ALG.NULL), int(TPM2_ALG.RSAPSS)) or (
                int(fixed.scheme) == int(TPM2_ALG.RSAPSS) and int(fixed.details.anySig.hashAlg) != int(TPM2_ALG.SHA256)
            ):
                raise UnsupportedAlgorithmError(f"{where} has RSA scheme {fixed.scheme}; PS256 needs RSASSA-PSS with "
                                                "SHA-256 (or no fixed scheme)")
            self.alg, self.hash_name, hash_alg, self.size = "PS256", "sha256", TPM2_ALG.SHA256, bits // 8
            self.scheme = TPMT_SIG_SCHEME(scheme=TPM2_ALG.RSAPSS)
        else:
            raise UnsupportedAlgorithmError(f"{where} is a TPM object of type {area.type}, not an ECC or RSA key")
        self.scheme.details.any.hashAlg = hash_alg
        self.public_key = serialization.load_der_public_key(public.to_der())


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
            self._keyfile = _read_keyfile(ref.keyfile)
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
            self._shape = _KeyShape(public, info, ref.describe_key())
        except BaseException:
            self.close()  # flush a loaded key file we cannot use
            raise
        self._digest = getattr(hashlib, self._shape.hash_name)
        self._ticket = TPMT_TK_HASHCHECK(tag=TPM2_ST.HASHCHECK, hierarchy=TPM2_RH.NULL)
        self._fast = _FastSign.create(self._shape, self._ticket)

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
            kf = _read_keyfile(ref.keyfile)
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
                if int(exc.error) in (_RC_HANDLE, _RC_REFERENCE_H0):
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
            parent = _persistent_tr(ectx, kf.parent, self._ref.tcti, f"parent key for {where}")
            transient_parent = False
        try:
            return ectx.load(parent, private, public)
        except TSS2_Exception as exc:
            if int(exc.error) == _RC_INTEGRITY:
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
        return self._shape.alg

    @property
    def public_key(self) -> Any:
        return self._shape.public_key

    @property
    def uri(self) -> str:
        return self._ref.to_uri()

    @property
    def device(self) -> TPMDevice:
        return self._device

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
        once more; SignatureFailedError if it still does not verify. The
        producer queues with :meth:`begin_sign` and checks every signature
        itself (about 0.1 ms for P-256), so it pays the check once."""
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
        ``result()`` waits for it (``sign`` is just that). The timeout bounds
        the TPM's time per command, never the wait in the queue (see
        :meth:`TPMDevice.wait`)."""
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
                if self._fast is not None and getattr(ectx, "_ctx", None) is not None:
                    return self._fast.sign(ectx._ctx, tr, digest)
                sig = ectx.sign(tr, TPM2B_DIGEST(digest), shape.scheme, self._ticket)
            except TSS2_Exception as exc:
                err = int(exc.error)
                if self._keyfile is not None and attempt == 0 and err in (_RC_HANDLE, _RC_REFERENCE_H0):
                    # our loaded copy was flushed behind our back (another process on a TPM
                    # without a resource manager): load it again, once
                    self._device.forget((self._token, "key"))
                    continue
                if err in (_RC_AUTH_FAIL, _RC_BAD_AUTH):
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
        """Custody statement from what the TPM reports now: device properties,
        the key's public area (attributes, name) and, with an AK, a verified
        TPM2_Certify of the key by the AK."""
        if self._closed:
            raise SignerUnavailableError(f"{self.describe_short()} was closed")
        return self._device.call(self._describe_on_worker, what=f"describing {self._ref.describe_key()}",
                                 timeout=self._timeout)

    def _describe_on_worker(self, ectx: Any) -> dict[str, Any]:
        from ._tpm_certify import take_certify

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
                                      lambda e: _persistent_tr(e, ak_handle, ref.tcti, "attestation key"))
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


class _FastSign:
    """TPM2_Sign straight through cffi, for the hot path.

    Why: tpm2-pytss's ``ESAPI.sign`` wrapper and its attribute machinery cost
    ~160 µs of Python per call on top of ~100 µs for ESYS itself; at swtpm's
    ~1,000 signatures/s that Python time competes with the producer's own
    work for the GIL. This calls ``Esys_Sign`` with preallocated structures
    and reads R and S from the C structure. It relies on tpm2-pytss 3.0's
    ``ESAPI._ctx`` and ``_libtpm2_pytss`` (the extra pins that version);
    without them :meth:`create` returns None and ``ectx.sign`` is used.
    Used only on the device's worker thread, so the buffers are never shared.
    """

    __slots__ = ("_ffi", "_lib", "_digest", "_out", "_scheme", "_ticket", "_rsa", "_size", "_scheme_obj",
                 "_ticket_obj")

    @classmethod
    def create(cls, shape: _KeyShape, ticket: TPMT_TK_HASHCHECK) -> _FastSign | None:
        try:
            from tpm2_pytss._libtpm2_pytss import ffi, lib

            if not hasattr(lib, "Esys_Sign") or not hasattr(lib, "Esys_Free"):
                return None
            return cls(ffi, lib, shape, ticket)
        except Exception:
            return None

    def __init__(self, ffi: Any, lib: Any, shape: _KeyShape, ticket: TPMT_TK_HASHCHECK) -> None:
        self._ffi, self._lib = ffi, lib
        self._digest = ffi.new("TPM2B_DIGEST *")
        self._out = ffi.new("TPMT_SIGNATURE **")
        self._scheme_obj, self._ticket_obj = shape.scheme, ticket  # keep the owners of the cdata alive
        self._scheme, self._ticket = shape.scheme._cdata, ticket._cdata
        self._rsa, self._size = shape.is_rsa, shape.size

    def sign(self, ctx: Any, key_tr: Any, digest: bytes) -> bytes:
        ffi, lib, d = self._ffi, self._lib, self._digest
        d.size = len(digest)
        ffi.memmove(d.buffer, digest, len(digest))
        rc = lib.Esys_Sign(ctx, int(key_tr), int(ESYS_TR.PASSWORD), int(ESYS_TR.NONE), int(ESYS_TR.NONE), d,
                           self._scheme, self._ticket, self._out)
        if rc:
            raise TSS2_Exception(rc)
        sig = self._out[0]
        try:
            if self._rsa:
                body = sig.signature.rsapss.sig
                return bytes(ffi.buffer(body.buffer, body.size)).rjust(self._size, b"\x00")
            ecdsa = sig.signature.ecdsa
            r = bytes(ffi.buffer(ecdsa.signatureR.buffer, ecdsa.signatureR.size))
            s = bytes(ffi.buffer(ecdsa.signatureS.buffer, ecdsa.signatureS.size))
        finally:
            lib.Esys_Free(sig)
        if len(r) > self._size or len(s) > self._size:
            raise SignatureFailedError("the TPM returned an oversized ECDSA component")
        return r.rjust(self._size, b"\x00") + s.rjust(self._size, b"\x00")


def _persistent_tr(ectx: Any, handle: int, tcti: str, what: str) -> Any:
    try:
        return persistent_tr(ectx, handle, tcti, what)
    except TSS2_Exception as exc:
        if int(exc.error) in (_RC_HANDLE, _RC_REFERENCE_H0):
            raise KeyNotFoundError(f"no {what} at persistent handle {format_handle(handle)} on TPM {tcti}") from None
        raise


def keyfile_public(kf: TPMKeyFile, where: str) -> TPM2B_PUBLIC:
    """The key file's public area, refused with KeyURIError unless it is one
    whole TPM2B_PUBLIC whose name can be computed.

    Why the name: tpm2-pytss unmarshals ``00 00`` or a made-up type without
    complaint, and only hashing it (``get_name``) raises — a ValueError or a
    raw TSS2_Exception that ``keys list`` let escape as an internal error."""
    try:
        public, used = TPM2B_PUBLIC.unmarshal(kf.public)
        if used == len(kf.public):
            public.get_name()
    except (TSS2_Exception, ValueError):
        raise KeyURIError(f"{where}: pubkey is not a TPM2B_PUBLIC capseal can read") from None
    if used != len(kf.public):
        raise KeyURIError(f"{where}: pubkey is not a TPM2B_PUBLIC (trailing bytes after it)")
    return public


def _read_keyfile(path: str) -> TPMKeyFile:
    p = Path(path)
    try:
        data, _ = read_capped(p, MAX_KEY_FILE)
    except FileNotFoundError:
        raise KeyNotFoundError(f"no TPM key file at {p}") from None
    except OSError as exc:
        raise KeyNotFoundError(f"cannot read TPM key file {p}: {exc.strerror}") from None
    except FileTooLargeError as exc:
        raise KeyNotFoundError(f"TPM key file {p} holds {exc}: no TSS2 PRIVATE KEY is that large") from None
    except ValueError as exc:  # a path no file can have (an embedded NUL byte)
        raise KeyURIError(f"TPM key file path {path!r} is not a usable path: {exc}") from None
    return TPMKeyFile.from_pem(data, where=str(p))


def _write_keyfile(path: str, kf: TPMKeyFile) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(kf.to_pem())


# Provisioning lives in ._tpm_provision (imported lazily: it imports this module).


def create_key(uri: str, alg: str, **kw: Any) -> TPMSigner:
    """See :func:`capseal.keys._tpm_provision.create_key`."""
    from ._tpm_provision import create_key as impl

    return impl(uri, alg, **kw)


def delete_key(uri: str, **kw: Any) -> dict[str, Any]:
    """See :func:`capseal.keys._tpm_provision.delete_key`."""
    from ._tpm_provision import delete_key as impl

    return impl(uri, **kw)


def list_keys(uri: str, **kw: Any) -> list[dict[str, Any]]:
    """See :func:`capseal.keys._tpm_provision.list_keys`."""
    from ._tpm_provision import list_keys as impl

    return impl(uri, **kw)


def provision(tcti: str | None, **kw: Any) -> dict[str, Any]:
    """See :func:`capseal.keys._tpm_provision.provision`."""
    from ._tpm_provision import provision as impl

    return impl(tcti, **kw)


def doctor_checks(uri: str | None, **kw: Any) -> list[Any]:
    """See :func:`capseal.keys._tpm_doctor.doctor_checks`."""
    from ._tpm_doctor import doctor_checks as impl

    return impl(uri, **kw)
