"""``pkcs11:`` keys: a signer for keys held in a PKCS#11 token (HSM, smart card,
SoftHSM2), and the provisioning functions ``capseal keys`` and ``capseal token``
call.

    signer = open_signer("pkcs11:token=agents;object=seal-key"
                         "?module-path=/usr/lib/softhsm/libsofthsm2.so", pin=pin)

* Ed25519 keys sign with ``CKM_EDDSA`` (→ ``EdDSA``: the AAC profile envelope);
  P-256/P-384 with ``CKM_ECDSA`` over a digest computed here (→ ``ES256`` /
  ``ES384``, raw r‖s as COSE wants); RSA with RSA-PSS, SHA-256, MGF1-SHA-256,
  salt 32 (→ ``PS256``).
* All signers of one token share one logged-in session and every PKCS#11
  call runs under one process-wide lock (``_pkcs11_session``); a session that
  dies is reopened, logged in again and the call retried once.
* ``external_device = True``: the producer verifies every signature the token
  returns before it is used.
* The PIN comes from ``pin=``, the URI's ``pin-value`` or ``pin-source`` (a
  file), or ``secrets_handler``; it never appears in a message, ``repr``, the
  signer's ``uri`` or an exception chain.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from capseal.errors import DeviceError, KeyURIError, SignerUnavailableError, UnsupportedAlgorithmError

from ._base import PendingSignature, SignatureResult, Signer, alg_for_public_key, kid_for
from ._pin import Secret, as_secret
from ._pkcs11_calls import run
from ._pkcs11_fast import FastSign
from ._pkcs11_helper import ANSWER_TIMEOUT, SigningProcess
from ._pkcs11_keys import (
    SignMechanism,
    enabled_extra_usages,
    find_private_keys,
    find_public_key,
    generate_keypair,
    key_attributes,
    load_keypair,
    mechanism_for,
    new_key_shortfalls,
    objects_with,
    public_key_of,
)
from ._pkcs11_session import P11_LOCK, TokenSession, open_token, release_token
from ._pkcs11_uri import PKCS11URI, parse_pkcs11_uri, read_pin_source
from ._registry import SecretsHandler, check_options
from .custody import SOFTWARE_TOKEN_MANUFACTURERS, custody_statement

__all__ = [
    "PKCS11Signer",
    "PKCS11URI",
    "parse_pkcs11_uri",
    "create_key",
    "list_keys",
    "doctor_checks",
    "init_softhsm_token",
]


def pin_for(uri: PKCS11URI, pin: str | Secret | None) -> Secret | None:
    """The PIN to log in with, held as a :class:`Secret`: the ``pin``
    argument, else the URI's ``pin-value``, else the file its ``pin-source``
    names; None when none. Checked here, where its source is known (see
    ``usable_pin``), and named after it and the token."""
    token = uri.describe_token()
    pin = as_secret(pin, "pin=")
    if pin is not None:
        return pin.with_suffix(f"for {token}").usable_pin()
    if uri.pin_secret is not None:
        return uri.pin_secret.renamed(f"the URI's pin-value for {token}").usable_pin()
    if uri.pin_source is not None:
        return read_pin_source(uri.pin_source).renamed(f"pin-source {uri.pin_source} for {token}").usable_pin()
    return None


def _parse(uri: str | PKCS11URI) -> PKCS11URI:
    return uri if isinstance(uri, PKCS11URI) else parse_pkcs11_uri(uri)


class PKCS11Signer(Signer):
    """A private key on a PKCS#11 token. Open with :meth:`from_uri` (or
    ``capseal.keys.open_signer``); close when done (the last signer of a token
    closes its session and logs out)."""

    external_device = True

    def __init__(
        self,
        uri: str | PKCS11URI,
        *,
        pin: str | Secret | None = None,
        secrets_handler: SecretsHandler | None = None,
        module_allowlist: Any = None,
        signing_process: bool = False,
        timeout: float | None = ANSWER_TIMEOUT,
    ) -> None:
        pin = as_secret(pin, "pin=")
        answer_timeout = _timeout(timeout)
        uri = parsed = _parse(uri)  # the text may hold a pin-value: only the parsed URI (which hides it) stays
        self._uri = parsed.without_pin()  # first: describe_short() works even if the rest fails
        ts = open_token(parsed, pin=pin_for(parsed, pin), module_allowlist=module_allowlist, pin_prompt=secrets_handler)
        self._ts: TokenSession | None = ts
        self._release = weakref.finalize(self, release_token, ts)  # also closes on garbage collection
        try:
            # key, mechanisms and the session epoch they belong to, in one locked call
            pair, mechanisms, epoch = run(ts, lambda s: (load_keypair(s, parsed, ts.name), _mechanisms(ts), ts.epoch),
                                          ts.name)
            self._mech = check_sign_mechanism(pair.alg, mechanisms, f"{ts.name}, key {parsed.describe_key()}",
                                              "it cannot sign with this key")
        except BaseException:
            self._release()
            raise
        # how to find this exact key again after a reconnect
        self._refind = PKCS11URI(object=pair.label if pair.label else None, id=pair.key_id or None) \
            if (pair.label or pair.key_id) else PKCS11URI()
        self._where = f"{ts.name}, key {self._uri.describe_key()}"
        self._public = pair.public_key
        self._alg = pair.alg
        self._private: Any = pair.private
        self._epoch: int = epoch
        self._kid_cache = kid_for(pair.public_key)
        # C_Sign straight through the function table when the mechanism allows (see _pkcs11_fast)
        # a software token in this process: SoftHSM2's own module, not one reached through a proxy
        in_process = ts.token.manufacturer_id in SOFTWARE_TOKEN_MANUFACTURERS and \
            os.path.basename(ts.module.real).startswith("libsofthsm2")
        self._fast = FastSign.create(ts.module.real, self._mech.mechanism, self._mech.param, self._mech.size,
                                     software_token=in_process)
        self._process: SigningProcess | None = None
        self._answer_timeout = answer_timeout
        if signing_process:
            try:
                self._process = self._start_process(ts, pair)
            except BaseException:
                self._release()
                raise
            self._stop_process = weakref.finalize(self, self._process.close)
            self.queues_signatures = True  # the child's pipe is the device's queue: the pipeline need not wait on it

    def _start_process(self, ts: TokenSession, pair: Any) -> SigningProcess:
        """The child that signs for this signer (see ``_pkcs11_helper``)."""
        mech = self._mech
        if mech.param is not None or mech.size is None:
            raise UnsupportedAlgorithmError(
                f"{self._where}: a signing process needs a mechanism without parameters (EdDSA, ECDSA); "
                f"{self._alg} keys sign in this process")
        config = {"module": ts.module.real, "token_label": ts.label, "serial": ts.serial,
                  "key_label": pair.label or "", "key_id": pair.key_id.hex(), "kid": self._kid_cache,
                  "mechanism": int(mech.mechanism), "size": mech.size}
        public, alg = self._public, self._alg

        def self_test() -> tuple[bytes, Callable[[bytes], bool]]:
            from capseal.cose import signature_ok

            message = b"capseal signing-process self-test " + os.urandom(16)
            return self._payload(message), lambda signature: signature_ok(alg, public, signature, message)

        return SigningProcess(config, ts, self_test, self._where, answer_timeout=self._answer_timeout)

    @classmethod
    def from_uri(
        cls,
        uri: str | PKCS11URI,
        *,
        pin: str | Secret | None = None,
        secrets_handler: SecretsHandler | None = None,
        module_allowlist: Any = None,
        signing_process: bool = False,
        timeout: float | None = ANSWER_TIMEOUT,
        **options: Any,
    ) -> PKCS11Signer:
        """``open_signer`` entry point.

        Args:
            uri: the key's RFC 7512 ``pkcs11:`` URI.
            pin: the token's user PIN (else the URI's pin-value or pin-source, else ``secrets_handler``).
            secrets_handler: asked for the PIN when none is given otherwise.
            module_allowlist: a list of module paths or a colon-separated string; restricts which modules may
                be loaded, on top of ``CAPSEAL_PKCS11_MODULES``.
            signing_process: make the signatures in a child process of their own (``_pkcs11_helper``:
                faster under load; Ed25519 and ECDSA keys).
            timeout: seconds a signature may wait for the signing process while it runs without answering
                (the token hangs) before it fails with SignerUnavailableError; None: no limit.
            options: none other; any is refused.

        Returns:
            The signer, logged in.

        Raises:
            UnknownOptionError: an option this backend does not take (a misspelling is named, and the valid
                options listed).
            InputError: ``timeout`` is not a positive number of seconds or None.
            KeyURIError, TokenNotFoundError, KeyNotFoundError, PinIncorrectError, PinLockedError,
            SignerUnavailableError, DeviceError, UnsupportedAlgorithmError: see the module docstring.
        """
        check_options("open_signer for a pkcs11: key", options, _SIGNER_OPTIONS)
        uri = _parse(uri)  # the text may hold a pin-value: only the parsed URI (which hides it) stays
        return cls(uri, pin=pin, secrets_handler=secrets_handler, module_allowlist=module_allowlist,
                   signing_process=signing_process, timeout=timeout)

    # ------------------------------------------------------------------ Signer

    @property
    def alg(self) -> str:
        return self._alg

    @property
    def public_key(self) -> Any:
        return self._public

    @property
    def uri(self) -> str:
        return self._uri.to_string()

    @property
    def token_session(self) -> TokenSession:
        """The shared session this signer uses (diagnostics and tests)."""
        if self._ts is None:
            raise SignerUnavailableError(f"{self.describe_short()} was closed")
        return self._ts

    def describe_short(self) -> str:
        return f"PKCS11Signer({self._uri.describe_token()}, {self._uri.describe_key()})"

    def _key(self, ts: TokenSession, session: Any) -> Any:
        """The private-key handle for the current session; found again (and
        checked to be the same key) after a reconnect. Lock held."""
        if self._private is None:  # closed by another thread meanwhile
            raise SignerUnavailableError(f"{self.describe_short()} was closed")
        if self._epoch != ts.epoch:
            pair = load_keypair(session, self._refind, ts.name)
            if kid_for(pair.public_key) != self.kid:
                raise DeviceError(f"{self._where}: after reconnecting, the key found is a different key")
            self._private, self._epoch = pair.private, ts.epoch
        return self._private

    def _payload(self, data: bytes) -> bytes:
        mech = self._mech
        return mech.prehash(data).digest() if mech.prehash is not None else bytes(data)

    def sign(self, data: bytes) -> SignatureResult:
        if self._process is not None:
            return self.begin_sign(data).result()
        return self._sign_in_process(self._payload(data))

    def begin_sign(self, data: bytes) -> PendingSignature:
        """With a signing process: the request is in the child's pipe when this
        returns. Otherwise the signature is made in ``result()``."""
        process = self._process
        if process is None:
            return super().begin_sign(data)
        return process.begin(self, self._payload(data))

    def _sign_in_process(self, payload: bytes) -> SignatureResult:
        ts = self._ts
        if ts is None:
            raise SignerUnavailableError(f"{self.describe_short()} was closed")
        mech = self._mech
        mechanism, param = mech.mechanism, mech.param

        fast = self._fast

        def call(session: Any) -> bytes:
            key = self._key(ts, session)
            if fast is not None:
                signature = fast.sign(session.handle, key.handle, payload)
                if signature is not None:
                    return signature
            # python-pkcs11 makes the signature, or raises the typed error that
            # the fast path only saw as a return value
            return key.sign(payload, mechanism=mechanism, mechanism_param=param)

        return self._signature_result(run(ts, call, self._where))

    def _signature_result(self, signature: bytes) -> SignatureResult:
        size = self._mech.size
        if size is not None and len(signature) != size:
            raise DeviceError(f"{self._where}: {self._alg} signature is {len(signature)} bytes, expected {size}")
        return SignatureResult(signature, self._kid_cache, self._alg)

    def describe(self) -> dict[str, Any]:
        """Custody statement from what the token reports *now*: token and
        library identity, and the key's CKA_SENSITIVE, CKA_NEVER_EXTRACTABLE,
        CKA_LOCAL, … ``software_device`` is true for SoftHSM2, unknown (left
        out) for anything else: a token's name is not evidence of hardware."""
        ts = self._ts
        if ts is None:
            raise SignerUnavailableError(f"{self.describe_short()} was closed")
        attributes, device = run(ts, lambda s: (key_attributes(self._key(ts, s)), ts.device_info()), self._where)
        software = True if device.get("manufacturer") in SOFTWARE_TOKEN_MANUFACTURERS else None
        return custody_statement(
            backend="pkcs11",
            alg=self._alg,
            kid=self.kid,
            public_key=self._public,
            software_device=software,
            key_store="pkcs11-token",
            device=device,
            key_attributes=attributes,
            extra={"key_uri": self.uri},
        )

    def close(self) -> None:
        """Stop the signing process (it signs what it was sent first) and let
        go of the token session (the last user closes it). Idempotent."""
        if self._process is not None:
            self._stop_process()
        with P11_LOCK:
            self._ts = None
            self._private = None
        self._release()


#: What ``open_signer`` takes for a pkcs11: key.
_SIGNER_OPTIONS = ("pin", "secrets_handler", "module_allowlist", "signing_process", "timeout")


def _timeout(value: object) -> float | None:
    """``timeout=``: None (no limit) or a positive number of seconds (0 would
    give up on every signature at once; a str failed deep in ``threading``)."""
    import math
    import threading

    from capseal.errors import InputError

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= threading.TIMEOUT_MAX:
        raise InputError(f"timeout is a positive number of seconds or None (no limit), not {value!r:.40}")
    return float(value)


def check_sign_mechanism(alg: str, mechanisms: set[Any] | None, where: str, outcome: str) -> SignMechanism:
    """``mechanism_for(alg, mechanisms)``, its refusal naming the token and key
    (``where``) and what it means (``outcome``). Why: the bare "the token has
    no CKM_EDDSA mechanism" named neither, and the doctor's fix for an error
    without a hint is "create it", wrong for a key that is there."""
    try:
        return mechanism_for(alg, mechanisms)
    except UnsupportedAlgorithmError as exc:
        problem = str(exc)
    raise UnsupportedAlgorithmError(
        f"{where}: {problem} for {alg}; {outcome}",
        hint="list the token's mechanisms (pkcs11-tool --module MODULE -M) and use a key of an algorithm it signs "
             "with (capseal keys create … --alg p256 needs only CKM_ECDSA)")


def _mechanisms(ts: TokenSession) -> set[Any] | None:
    try:
        return set(ts.token.slot.get_mechanisms())
    except Exception:  # a module that cannot list mechanisms: try the call itself
        return None


# ---------------------------------------------------------------------- provisioning


def create_key(
    uri: str | PKCS11URI,
    alg: str,
    *,
    pin: str | Secret | None = None,
    secrets_handler: SecretsHandler | None = None,
    module_allowlist: Any = None,
    rsa_bits: int = 3072,
    **options: Any,
) -> PKCS11Signer:
    """Generate a key pair on the token and open it (``capseal keys create``).

    The private key is a token object, private, sensitive, not extractable
    and sign-only; the attributes are read back and the key is destroyed and
    the call refused if the token did not honour them. ``object`` (CKA_LABEL)
    is required; ``id`` (CKA_ID) is taken from the URI or made random. A key
    that already uses the label or id is never overwritten.

    Raises:
        UnknownOptionError: an option not taken here (valid: pin, secrets_handler, module_allowlist, rsa_bits).
    """
    check_options("keys create for a pkcs11: key", options, ("pin", "secrets_handler", "module_allowlist", "rsa_bits"))
    pin = as_secret(pin, "pin=")
    uri = parsed = _parse(uri)
    if parsed.type not in (None, "private"):
        raise KeyURIError("capseal keys create makes a private key: drop type= or use type=private")
    if not parsed.object:
        raise KeyURIError("name the new key: add object=<label> to the pkcs11 URI")
    key_id = parsed.id if parsed.id is not None else os.urandom(8)
    if not key_id:
        raise KeyURIError("pkcs11 URI: id= is empty; leave it out to get a random id")
    secret = pin_for(parsed, pin)
    ts = open_token(parsed, pin=secret, module_allowlist=module_allowlist, pin_prompt=secrets_handler)
    where = f"{ts.name}, new key object={parsed.object!r} id={key_id.hex()}"
    made = False  # objects with this label and id may exist from here on, and are ours (none did before)
    try:
        def make(session: Any) -> None:
            nonlocal made
            clash = objects_with(session, label=parsed.object, key_id=key_id)
            if clash:
                raise KeyURIError(f"{where}: an object with that label or id already exists; capseal never overwrites keys")
            # the token must sign with the new key before it makes one: a key pair it can generate
            # but not use (RSA without PSS is common on smart cards) was left on the token
            check_sign_mechanism(alg, _mechanisms(ts), where, "nothing was created")
            rw = ts.token.open(rw=True)  # PIN-less: shares the login of the session above
            try:
                made = True
                generate_keypair(rw, alg, parsed.object or "", key_id, rsa_bits=rsa_bits)
                check_new_key(rw, parsed.object or "", key_id, where)
            finally:
                rw.close()

        run(ts, make, where)
        # opened while the session is held, with the PIN the token took: ``secret``
        # is None when it came from ``secrets_handler``, which is not asked twice
        signer = PKCS11Signer(parsed.with_id(key_id), pin=ts.pin_for_child(), module_allowlist=module_allowlist)
    except BaseException as exc:  # a Ctrl-C (or a failure) before the caller has the key: it goes again
        if made:
            _undo_new_key(ts, parsed.object or "", key_id, where, exc, parsed.with_id(key_id).to_string())
        raise
    finally:
        release_token(ts)
    return signer


def _undo_new_key(ts: TokenSession, label: str, key_id: bytes, where: str, exc: BaseException, uri: str) -> None:
    """Destroy the objects a ``create_key`` that did not finish made (every
    object with its label or id: none existed before it), with Ctrl-C held
    off; when that fails, ``exc`` is marked as leaving ``uri`` behind."""
    from ._leftover import held_interrupts, note_left

    def destroy(session: Any) -> None:
        rw = ts.token.open(rw=True)
        try:
            seen: set[int] = set()
            for obj in objects_with(rw, label=label, key_id=key_id):
                if obj.handle not in seen:
                    seen.add(obj.handle)
                    obj.destroy()
        finally:
            rw.close()

    with held_interrupts():
        try:
            run(ts, destroy, where)
        except Exception:  # noqa: BLE001 - the error on its way out is the one to report, with this key named
            note_left(exc, uri)


def check_new_key(rw: Any, label: str, key_id: bytes, where: str) -> None:
    """Read a just-generated key pair's attributes back; the token may have
    ignored the template. Destroys the pair and raises DeviceError unless the
    private key reports what the template asked (a private token object,
    sensitive, not and never extractable, signing: ``NEW_KEY_REQUIRED``; an
    attribute it does not report fails, named as not reported) and neither
    half can do more than sign / verify (no CKA_DECRYPT, CKA_UNWRAP,
    CKA_DERIVE, CKA_ENCRYPT, CKA_WRAP). Lock held."""
    new = find_private_keys(rw, PKCS11URI(object=label, id=key_id))
    private = new[0] if len(new) == 1 else None
    problem = None
    if private is None:
        problem = f"{len(new)} private keys with that label and id after generation"
    else:
        short = new_key_shortfalls(private)
        extra = enabled_extra_usages(private, find_public_key(rw, private))
        if short:
            problem = f"the token did not make the private key as asked ({', '.join(short)})"
        elif extra:
            problem = f"the token made a signing key that can also use {', '.join(extra)}"
    if problem is not None:
        destroyed: set[int] = set()
        for obj in objects_with(rw, label=label, key_id=key_id):  # found by label and by id: once each
            if obj.handle not in destroyed:
                destroyed.add(obj.handle)
                obj.destroy()
        raise DeviceError(f"{where}: {problem}; destroyed it",
                          hint="the token ignored (or does not report) capseal's sign-only template; "
                               "check its key-generation policy")


def list_keys(
    uri: str | PKCS11URI,
    *,
    pin: str | Secret | None = None,
    secrets_handler: SecretsHandler | None = None,
    module_allowlist: Any = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Private keys on the token (filtered by the URI's object/id), each with
    its URI, algorithm, kid and custody attributes (``capseal keys list``).

    Raises:
        UnknownOptionError: an option not taken here (valid: pin, secrets_handler, module_allowlist).
    """
    check_options("keys list for a pkcs11: token", options, ("pin", "secrets_handler", "module_allowlist"))
    pin = as_secret(pin, "pin=")
    uri = parsed = _parse(uri)
    ts = open_token(parsed, pin=pin_for(parsed, pin), module_allowlist=module_allowlist, pin_prompt=secrets_handler)
    try:
        def collect(session: Any) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            base = PKCS11URI(token=ts.label, serial=ts.serial, module_path=parsed.module_path,
                             module_name=parsed.module_name, pin_source=parsed.pin_source)
            for private in find_private_keys(session, PKCS11URI(object=parsed.object, id=parsed.id, type=parsed.type)):
                attrs = key_attributes(private)
                label, key_id = attrs.get("CKA_LABEL"), attrs.get("CKA_ID")
                entry: dict[str, Any] = {
                    "uri": replace(base, object=label, id=bytes.fromhex(key_id) if key_id else None).to_string(),
                    "label": label,
                    "id": key_id,
                }
                try:
                    public_obj = find_public_key(session, private)
                    public_key = public_key_of(public_obj if public_obj is not None else private, ts.name)
                    entry["alg"] = alg_for_public_key(public_key)
                    entry["kid"] = kid_for(public_key)
                except Exception as exc:  # list what can be listed; say why the rest cannot
                    entry["error"] = type(exc).__name__
                entry["attributes"] = {k: v for k, v in attrs.items() if k not in ("CKA_LABEL", "CKA_ID")}
                out.append(entry)
            return out

        return run(ts, collect, ts.name)
    finally:
        release_token(ts)


from ._pkcs11_tools import doctor_checks, init_softhsm_token  # noqa: E402  (they use the signer above)
