"""``pkcs11:`` keys: the signer for keys held in a PKCS#11 token (HSM, smart
card, SoftHSM2).

    signer = open_signer("pkcs11:token=agents;object=seal-key"
                         "?module-path=/usr/lib/softhsm/libsofthsm2.so", pin=pin)

* Ed25519 keys sign with ``CKM_EDDSA`` (→ ``EdDSA``: the AAC profile envelope);
  P-256/P-384 with ``CKM_ECDSA`` over a digest computed here (→ ``ES256`` /
  ``ES384``, raw r‖s as COSE wants); RSA with RSA-PSS, SHA-256, MGF1-SHA-256,
  salt 32 (→ ``PS256``).
* All signers of one token share one logged-in session and every PKCS#11
  call runs under one process-wide lock (``_lock``); a session that
  dies is reopened, logged in again and the call retried once.
* ``external_device = True``: the producer verifies every signature the token
  returns before it is used.
* The PIN comes from ``pin=``, the URI's ``pin-value`` or ``pin-source`` (a
  file), or ``secrets_handler``; it never appears in a message, ``repr``, the
  signer's ``uri`` or an exception chain.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from capseal import process
from capseal.errors import DeviceError, SignerUnavailableError, UnsupportedAlgorithmError
from capseal.keys import PendingSignature, SecretsHandler, SignatureResult, Signer, check_options, kid_for
from capseal.keys.custody import SOFTWARE_TOKEN_MANUFACTURERS, custody_statement
from capseal.keys.secret import Secret, as_secret

from ._calls import run
from ._direct import FastSign
from ._lock import P11_LOCK
from ._objects import SignMechanism, key_attributes, load_keypair, mechanism_for
from ._session import TokenSession, open_token, release_token
from ._signing_process import ANSWER_TIMEOUT, SigningProcess
from ._uri import PKCS11URI, parse_pkcs11_uri, read_pin_source

__all__ = ["PKCS11Signer", "pin_for", "parse", "check_sign_mechanism", "token_mechanisms"]


def pin_for(uri: PKCS11URI, pin: str | Secret | None) -> Secret | None:
    """The PIN to log in with: the ``pin`` argument, else the URI's
    ``pin-value``, else the file its ``pin-source`` names. Checked here,
    where its source is known (see :meth:`~capseal.keys.secret.Secret.usable_pin`),
    and named after it and the token.

    Args:
        uri: the parsed URI.
        pin: the caller's PIN, if any.

    Returns:
        The PIN as a Secret; None when there is none.

    Raises:
        PinIncorrectError: the PIN cannot be right (empty, not text, a control character).
        KeyURIError, SecretFileExposedError: the pin-source cannot be read, or others can read it.
    """
    token = uri.describe_token()
    pin = as_secret(pin, "pin=")
    if pin is not None:
        return pin.with_suffix(f"for {token}").usable_pin()
    if uri.pin_secret is not None:
        return uri.pin_secret.renamed(f"the URI's pin-value for {token}").usable_pin()
    if uri.pin_source is not None:
        return read_pin_source(uri.pin_source).renamed(f"pin-source {uri.pin_source} for {token}").usable_pin()
    return None


def parse(uri: str | PKCS11URI) -> PKCS11URI:
    """A URI, parsed if it is text.

    Args:
        uri: the URI text or a PKCS11URI.

    Returns:
        The PKCS11URI.

    Raises:
        KeyURIError: see :func:`parse_pkcs11_uri`.
    """
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
        uri = parsed = parse(uri)  # the text may hold a pin-value: only the parsed URI (which hides it) stays
        self._uri = parsed.without_pin()  # first: describe_short() works even if the rest fails
        ts = open_token(parsed, pin=pin_for(parsed, pin), module_allowlist=module_allowlist, pin_prompt=secrets_handler)
        self._ts: TokenSession | None = ts
        # also closes on garbage collection; at exit, after the producers have signed what is queued
        self._release = process.finalize("devices", self, release_token, ts)
        try:
            # key, mechanisms and the session epoch they belong to, in one locked call
            pair, mechanisms, epoch = run(ts, lambda s: (load_keypair(s, parsed, ts.name), token_mechanisms(ts), ts.epoch),
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
        # C_Sign straight through the function table when the mechanism (and CAPSEAL_NO_DIRECT)
        # allows, see _direct; a software token in this process: SoftHSM2's own module, not one
        # reached through a proxy
        in_process = ts.token.manufacturer_id in SOFTWARE_TOKEN_MANUFACTURERS and \
            os.path.basename(ts.module.real).startswith("libsofthsm2")
        self._fast = FastSign.create(ts.module.real, self._mech.mechanism, self._mech.param, self._mech.size,
                                     software_token=in_process)
        self._process: SigningProcess | None = None
        self._signed_here = 0  # signatures made in this process (the signing process's child makes the others)
        self._answer_timeout = answer_timeout
        if signing_process:
            try:
                self._process = self._start_process(ts, pair)
            except BaseException:
                self._release()
                raise
            self._stop_process = process.finalize("devices", self, self._process.close)
            self.queues_signatures = True  # the child's pipe is the device's queue: the pipeline need not wait on it

    def _start_process(self, ts: TokenSession, pair: Any) -> SigningProcess:
        """The child that signs for this signer (see ``_signing_process``)."""
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

        return SigningProcess(config, ts, self_test, self._where, sign_here=self._sign_in_process,
                              finish=self._signature_result, answer_timeout=self._answer_timeout)

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
            signing_process: make the signatures in a child process of their own (``_signing_process``:
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
        uri = parse(uri)  # the text may hold a pin-value: only the parsed URI (which hides it) stays
        return cls(uri, pin=pin, secrets_handler=secrets_handler, module_allowlist=module_allowlist,
                   signing_process=signing_process, timeout=timeout)

    # ------------------------------------------------------------------ Signer

    @property
    def alg(self) -> str:
        """The COSE algorithm of the key (from its public key on the token)."""
        return self._alg

    @property
    def public_key(self) -> Any:
        """The public key, read from the token's public-key object."""
        return self._public

    @property
    def uri(self) -> str:
        """The key's URI, without any PIN."""
        return self._uri.to_string()

    @property
    def token_session(self) -> TokenSession:
        """The shared session this signer uses (diagnostics and tests).

        Raises:
            SignerUnavailableError: the signer was closed.
        """
        if self._ts is None:
            raise SignerUnavailableError(f"{self.describe_short()} was closed")
        return self._ts

    @property
    def direct_path(self) -> FastSign | None:
        """The direct ``C_Sign`` this signer takes (diagnostics, benches and
        tests); None when it signs with python-pkcs11's ``key.sign`` only (a
        mechanism with parameters, no trusted function table, or ``CAPSEAL_NO_DIRECT``)."""
        return self._fast

    @property
    def signatures_in_process(self) -> int:
        """How many signatures this process has asked the token for itself
        (diagnostics and tests: with a signing process, its child makes the others)."""
        return self._signed_here

    @property
    def signing_process(self) -> SigningProcess | None:
        """The child process that makes this signer's signatures
        (``signing_process=True``), or None."""
        return self._process

    def key_object(self, session: Any) -> Any:
        """The python-pkcs11 private-key object of this signer on ``session``
        (found again, and checked to be the same key, after a reconnect); for
        diagnostics and tests. Call with ``P11_LOCK`` held.

        Args:
            session: the token session's current python-pkcs11 session.

        Returns:
            The private key object.

        Raises:
            SignerUnavailableError: the signer was closed.
            DeviceError: after a reconnect, the key found is another key.
        """
        ts = self._ts
        if ts is None:
            raise SignerUnavailableError(f"{self.describe_short()} was closed")
        return self._key(ts, session)

    def describe_short(self) -> str:
        """How the signer is named in messages.

        Returns:
            ``PKCS11Signer(token 'x', object='k')``.
        """
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
        """Sign ``data`` on the token (see :meth:`Signer.sign`): a signing process's
        child makes it when there is one, else this process, with one reconnect
        if the session died.

        Args:
            data: the message (hashed here for ECDSA; EdDSA signs the message).

        Returns:
            The signature (ECDSA as raw r‖s).

        Raises:
            SignerUnavailableError: the signer was closed, or the token went away and
                did not come back.
            PinIncorrectError, PinLockedError: the login was refused on a reconnect.
            DeviceError: the token refused, or answered with a signature of the wrong size.
        """
        if self._process is not None:
            return self.begin_sign(data).result()
        return self._sign_in_process(self._payload(data))

    def begin_sign(self, data: bytes) -> PendingSignature:
        """Start signing ``data``. With a signing process the request is in the
        child's pipe when this returns; otherwise the signature is made in ``result()``.

        Args:
            data: the message.

        Returns:
            The pending signature.
        """
        process = self._process
        if process is None:
            return super().begin_sign(data)
        return process.begin(self._payload(data))

    def _sign_in_process(self, payload: bytes) -> SignatureResult:
        ts = self._ts
        if ts is None:
            raise SignerUnavailableError(f"{self.describe_short()} was closed")
        mech = self._mech
        mechanism, param = mech.mechanism, mech.param

        fast = self._fast

        def call(session: Any) -> bytes:
            key = self._key(ts, session)
            self._signed_here += 1  # under P11_LOCK
            if fast is not None:
                signature = fast.sign(session.handle, key.handle, payload)
                if signature is not None:
                    return signature
            # python-pkcs11 makes the signature, or raises the typed error that
            # the fast path only saw as a return value
            signed: bytes = key.sign(payload, mechanism=mechanism, mechanism_param=param)
            return signed

        return self._signature_result(run(ts, call, self._where))

    def _signature_result(self, signature: bytes) -> SignatureResult:
        size = self._mech.size
        if size is not None and len(signature) != size:
            raise DeviceError(f"{self._where}: {self._alg} signature is {len(signature)} bytes, expected {size}")
        return SignatureResult(signature, self._kid_cache, self._alg)

    def describe(self) -> dict[str, Any]:
        """The custody statement from what the token reports *now*: token and
        library identity, and the key's CKA_SENSITIVE, CKA_NEVER_EXTRACTABLE,
        CKA_LOCAL, … ``software_device`` is true for SoftHSM2, unknown (left
        out) for anything else: a token's name is not evidence of hardware.

        Returns:
            The statement.

        Raises:
            SignerUnavailableError: the signer was closed, or the token went away.
            DeviceError: the token refused to answer.
        """
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
    """The mechanism to sign ``alg`` with, its refusal naming the token and key
    and what it means (the doctor's fix for an error without a hint is
    "create it", wrong for a key that is there).

    Args:
        alg: the COSE algorithm.
        mechanisms: the token's mechanisms (None: unknown).
        where: names the token and key.
        outcome: what the refusal means, e.g. "nothing was created".

    Returns:
        The mechanism.

    Raises:
        UnsupportedAlgorithmError: the token has no mechanism for ``alg``.
    """
    try:
        return mechanism_for(alg, mechanisms)
    except UnsupportedAlgorithmError as exc:
        problem = str(exc)
    raise UnsupportedAlgorithmError(
        f"{where}: {problem} for {alg}; {outcome}",
        hint="list the token's mechanisms (pkcs11-tool --module MODULE -M) and use a key of an algorithm it signs "
             "with (capseal keys create … --alg p256 needs only CKM_ECDSA)")


def token_mechanisms(ts: TokenSession) -> set[Any] | None:
    """The mechanisms a token lists. Lock held.

    Args:
        ts: the token session.

    Returns:
        The mechanisms; None when the module cannot list them (the call itself is tried then).
    """
    try:
        return set(ts.token.slot.get_mechanisms())
    except Exception:  # a module that cannot list mechanisms: try the call itself
        return None
