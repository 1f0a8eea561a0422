"""`provision()` is as close to atomic as the TPM allows, against a swtpm of
each test's own: every new object is created *and loaded* before anything is
evicted, a handle the TPM would refuse to persist at is found before anything
changes, and a failure after the first change names what each handle holds."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from tpm2_pytss import ESAPI
from tpm2_pytss.constants import ESYS_TR
from tpm2_pytss.types import TPM2B_SENSITIVE_CREATE

from capseal.errors import TPMObjectMemoryError
from capseal.keys._tpm import provision, srk_template
from capseal.keys._tpm_device import get_device, transient_handles
from capseal.keys._tpm_provision import HandleInUseError, ProvisionIncompleteError, list_keys

from .tpm_keys import key_file_under_srk

KEY, AK = 0x81000101, 0x81000102


@pytest.fixture()
def tcti(fresh_swtpm: Any) -> Iterator[str]:
    yield fresh_swtpm.tcti
    get_device(fresh_swtpm.tcti).close()


def _names(tcti: str) -> dict[str, str]:
    return {e["handle"]: e["name"] for e in list_keys(f"tpm2:?tcti={tcti}")}


def _loaded(tcti: str) -> list[int]:
    return get_device(tcti).call(transient_handles)


def test_a_failed_load_after_create_leaves_the_old_keys_in_place(tcti: str) -> None:
    """A transient slot held by a second connection (swtpm has three): both
    new keys are loaded (SRK + two keys) before anything is evicted, so the
    TPM refuses the second one (TPM_RC_OBJECT_MEMORY) while the old keys are
    still in place, and every object capseal loaded is flushed. Before, a key
    was loaded only after the old ones were evicted, and a refusal there left
    neither the old keys nor the new ones (this replacement itself went through)."""
    first = provision(tcti, signing_handle=KEY, ak_handle=AK, alg="p256")
    before = _names(tcti)
    get_device(tcti).info()  # capseal is connected: it flushes leftovers only when it connects
    other = ESAPI(tcti)
    try:
        held = [other.create_primary(TPM2B_SENSITIVE_CREATE(), srk_template(), ESYS_TR.OWNER)[0] for _ in range(1)]
        with pytest.raises(TPMObjectMemoryError) as info:
            provision(tcti, signing_handle=KEY, ak_handle=AK, alg="p256", force=True)
        assert _names(tcti) == before  # the old keys are still there
        assert tcti in str(info.value) and "nothing on the TPM was changed" in str(info.value)
        assert sorted(_loaded(tcti)) == sorted(int(other.tr_get_tpm_handle(h)) for h in held)  # capseal flushed its own
        for h in held:
            other.flush_context(h)
    finally:
        other.close()
    again = provision(tcti, signing_handle=KEY, ak_handle=AK, alg="p256", force=True)
    assert again["replaced"] == ["0x81000101", "0x81000102"]
    assert again["signing_key"]["name"] != first["signing_key"]["name"] and _loaded(tcti) == []


def _hide_a_key_at(tcti: str, handle: int) -> None:
    """Persist an endorsement-hierarchy key at ``handle`` and disable that
    hierarchy: ReadPublic then answers TPM_RC_HANDLE (the handle looks empty)
    while TPM2_EvictControl refuses to persist there (TPM_RC_NV_DEFINED)."""
    ectx = ESAPI(tcti)
    try:
        key = ectx.create_primary(TPM2B_SENSITIVE_CREATE(), srk_template(), ESYS_TR.ENDORSEMENT)[0]
        ectx.evict_control(ESYS_TR.OWNER, key, handle)
        ectx.flush_context(key)
        ectx.hierarchy_control(ESYS_TR.ENDORSEMENT, ESYS_TR.ENDORSEMENT, False)
    finally:
        ectx.close()


def _show_hidden(tcti: str) -> None:
    ectx = ESAPI(tcti)
    try:
        ectx.hierarchy_control(ESYS_TR.PLATFORM, ESYS_TR.ENDORSEMENT, True)
    finally:
        ectx.close()


@pytest.mark.parametrize("force", [False, True])
def test_a_handle_the_tpm_will_not_persist_at_is_refused_before_anything_changes(tcti: str, force: bool) -> None:
    """Before: the hidden object's handle read as empty, the signing key was
    persisted, then persisting the AK failed (TPM_RC_NV_DEFINED): a signing
    key without its AK, and a re-run without --force refused (its handle was
    taken). Now the handle is found in use before anything is created."""
    if force:
        provision(tcti, signing_handle=KEY, ak_handle=0x81000103, alg="p256")
    before = _names(tcti)
    _hide_a_key_at(tcti, AK)
    with pytest.raises(HandleInUseError, match="0x81000102") as info:
        provision(tcti, signing_handle=KEY, ak_handle=AK, alg="p256", force=force)
    assert tcti in str(info.value) and "hierarchy" in str(info.value)
    assert _names(tcti) == before and _loaded(tcti) == []
    _show_hidden(tcti)  # the operator frees the handle ...
    ectx = ESAPI(tcti)
    try:
        ectx.evict_control(ESYS_TR.OWNER, ectx.tr_from_tpmpublic(AK), AK)
    finally:
        ectx.close()
    done = provision(tcti, signing_handle=KEY, ak_handle=AK, alg="p256", force=force)  # ... and a re-run finishes
    assert done["attestation_key"]["handle"] == "0x81000102" and done["signing_key"]["role"] == "signing-key"


# ---------------------------------------------------------------------------- the TPM going away part-way

_CC_EVICT_CONTROL = 0x120


class _CuttingProxy:
    """A loopback TCP relay in front of a real swtpm (its command and control
    ports) that cuts the connection instead of passing on the ``cut_at``-th
    TPM2_EvictControl: the TPM going away in the middle of provisioning, at a
    chosen command. Once it has cut, it relays everything."""

    def __init__(self, port: int, cut_at: int) -> None:
        self.cut_at, self.seen = cut_at, 0
        for _ in range(100):  # two adjacent free ports, as the swtpm TCTI wants (commands, control)
            first = socket.create_server(("127.0.0.1", 0))
            try:
                second = socket.create_server(("127.0.0.1", first.getsockname()[1] + 1))
                break
            except OSError:
                first.close()
        else:
            pytest.fail("no two adjacent free loopback ports")
        self.port = first.getsockname()[1]
        self._listeners = [first, second]
        for lst, target, commands in ((first, port, True), (second, port + 1, False)):
            threading.Thread(target=self._accept, args=(lst, target, commands), daemon=True).start()

    @property
    def tcti(self) -> str:
        return f"swtpm:host=127.0.0.1,port={self.port}"

    def _accept(self, lst: socket.socket, target: int, commands: bool) -> None:
        while True:
            try:
                client, _ = lst.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", target))
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(client, server, commands), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, commands: bool) -> None:
        buf = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not commands:
                    dst.sendall(data)
                    continue
                buf += data
                while len(buf) >= 10:  # whole TPM commands: tag(2) size(4) code(4) ...
                    size = struct.unpack(">I", buf[2:6])[0]
                    if len(buf) < size:
                        break
                    command, buf = buf[:size], buf[size:]
                    if struct.unpack(">I", command[6:10])[0] == _CC_EVICT_CONTROL:
                        self.seen += 1
                        if self.seen == self.cut_at:
                            raise ConnectionAbortedError
                    dst.sendall(command)
        except OSError:
            pass
        for sock in (src, dst):  # shutdown wakes the other direction's recv(); close alone does not
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        for lst in self._listeners:
            try:
                lst.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            lst.close()


def test_the_tpm_going_away_part_way_is_reported_handle_by_handle(fresh_swtpm: Any) -> None:
    """The connection is cut at the fourth TPM2_EvictControl (evict the old
    key, evict the old AK, persist the new key, *persist the new AK*): the
    error says what each handle holds now and the TCTI, capseal leaves no
    object loaded, and the command in its hint finishes the job. Before, the
    error was "TPM … is not reachable" and said nothing of the handles."""
    proxy = _CuttingProxy(fresh_swtpm.port, cut_at=4)
    tcti = proxy.tcti
    try:
        first = provision(tcti, signing_handle=KEY, ak_handle=AK, alg="p256")
        proxy.seen = 0
        with pytest.raises(ProvisionIncompleteError) as info:
            provision(tcti, signing_handle=KEY, ak_handle=AK, alg="p256", force=True)
        message = str(info.value)
        assert tcti in message and "failed while persisting at 0x81000102" in message
        assert "0x81000101 holds the new signing key" in message
        assert f"0x81000102 holds nothing (its old key, name {first['attestation_key']['name'][:16]}" in message
        rerun = (f"capseal tpm provision --tcti '{tcti}' --handle 0x81000101 --ak-handle 0x81000102 --alg p256 "
                 "--force")
        assert info.value.hint.endswith(rerun)
        new_key = _names(tcti)["0x81000101"]
        assert new_key != first["signing_key"]["name"] and "0x81000102" not in _names(tcti)
        assert _loaded(tcti) == []
        done = provision(tcti, signing_handle=KEY, ak_handle=AK, alg="p256", force=True)  # the hint, run
        assert done["replaced"] == ["0x81000101"] and sorted(_names(tcti)) == ["0x81000101", "0x81000102"]
    finally:
        get_device(tcti).close()
        proxy.close()


def test_no_room_for_both_keys_is_refused_before_anything_changes(tcti: str) -> None:
    """NV room for one more persistent object: before, the signing key was
    persisted and the AK then failed with TPM_RC_NV_SPACE (half a job, and a
    re-run without --force refused). Now TPM_PT_HR_PERSISTENT_AVAIL is read
    first and nothing is changed."""
    from tpm2_pytss.constants import TPM2_CAP, TPM2_PT_HR, TPMA_OBJECT
    from tpm2_pytss.types import TPM2B_PUBLIC

    from capseal.errors import DeviceError

    get_device(tcti).close()
    ectx = ESAPI(tcti)
    fillers: list[int] = []
    try:
        srk = ectx.create_primary(TPM2B_SENSITIVE_CREATE(), srk_template(), ESYS_TR.OWNER)[0]
        attrs = (TPMA_OBJECT.SIGN_ENCRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT | TPMA_OBJECT.NODA
                 | TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH)
        private, public, *_ = ectx.create(srk, TPM2B_SENSITIVE_CREATE(),
                                          TPM2B_PUBLIC.parse("ecc256:ecdsa-sha256:null", objectAttributes=attrs))

        def room() -> int:
            _more, data = ectx.get_capability(TPM2_CAP.TPM_PROPERTIES, int(TPM2_PT_HR.PERSISTENT_AVAIL), 1)
            return int(data.data.tpmProperties[0].value)

        while room() > 1:
            key = ectx.load(srk, private, public)
            ectx.evict_control(ESYS_TR.OWNER, key, 0x81000400 + len(fillers))
            ectx.flush_context(key)
            fillers.append(0x81000400 + len(fillers))
        ectx.flush_context(srk)
    finally:
        ectx.close()
    before = _names(tcti)
    with pytest.raises(DeviceError, match="room for 1 more persistent object") as info:
        provision(tcti, signing_handle=KEY, ak_handle=AK, alg="p256")
    assert tcti in str(info.value) and "nothing was changed" in str(info.value)
    assert _names(tcti) == before and _loaded(tcti) == []
    ectx = ESAPI(tcti)
    try:
        ectx.evict_control(ESYS_TR.OWNER, ectx.tr_from_tpmpublic(fillers[0]), fillers[0])
    finally:
        ectx.close()
    assert provision(tcti, signing_handle=KEY, ak_handle=AK, alg="p256")["replaced"] == []


# ---------------------------------------------------------------------------- wrongly typed arguments


def _bad_calls(tcti: str) -> list[Any]:
    from capseal.keys import open_signer
    from capseal.keys._tpm import create_key
    from capseal.keys.provision import create_key as create_any_key

    uri = f"tpm2:handle=0x81000e01?tcti={tcti}"
    return [
        ("alg", lambda: provision(tcti, signing_handle=0x81000e01, ak_handle=0x81000e02, alg=1)),
        ("signing_handle", lambda: provision(tcti, signing_handle="0x81000e01", ak_handle=0x81000e02)),
        ("ak_handle", lambda: provision(tcti, signing_handle=0x81000e01, ak_handle=1.5)),
        ("ak_handle", lambda: provision(tcti, signing_handle=0x81000e01, ak_handle=True)),
        ("tcti", lambda: provision(b"swtpm:", signing_handle=0x81000e01, ak_handle=0x81000e02)),  # type: ignore[arg-type]
        ("force", lambda: provision(tcti, signing_handle=0x81000e01, ak_handle=0x81000e02, force="no")),
        ("alg", lambda: create_key(uri, 1)),  # type: ignore[arg-type]
        ("alg", lambda: create_any_key(uri, 1)),  # type: ignore[arg-type]
        ("uri", lambda: create_any_key(b"tpm2:handle=0x81000e01", "p256")),  # type: ignore[arg-type]
        ("tcti", lambda: create_key("tpm2:handle=0x81000e01", "p256", tcti=b"swtpm:")),
        ("tcti", lambda: open_signer("tpm2:handle=0x81000e01", tcti=b"swtpm:")),
        ("ak_handle", lambda: open_signer(uri, ak_handle=1.5)),
        ("ak_handle", lambda: open_signer(uri, ak_handle=b"0x81000e02")),
        ("timeout", lambda: open_signer(uri, timeout="5")),
        ("timeout", lambda: open_signer(uri, timeout=0)),
        ("secrets_handler", lambda: open_signer(uri, secrets_handler=5)),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize("case", range(16))
def test_a_wrongly_typed_argument_is_a_typed_error_naming_it(swtpm: Any, case: int) -> None:
    """Before: AttributeError ('int' object has no attribute 'lower'),
    TypeError ('<=' not supported …), ValueError (Unknown format code 'x'), or
    nothing at all: force="no" replaced the keys, timeout="5" was taken and
    failed at the first signature. Now each is an InputError (KeyURIError for
    what names a key or TPM) naming the argument, before the TPM is touched."""
    from capseal.errors import InputError, KeyURIError

    calls = _bad_calls(swtpm.tcti)
    assert len(calls) == 16
    argument, call = calls[case]
    with pytest.raises((InputError, KeyURIError)) as info:
        call()
    assert argument.lower() in str(info.value).lower()
    assert "0x81000e01" not in _names(swtpm.tcti)


# ---------------------------------------------------------------------------- a key that also decrypts


def test_a_key_that_signs_and_decrypts_is_described_as_such(tcti: str, tmp_path: Any) -> None:
    """An unrestricted key with sign *and* decrypt (tpm2_create's default
    attributes) is accepted as a signing key, as before; its custody
    statement says plainly that it also decrypts (key_attributes.decrypt,
    as the TPM's ReadPublic reports it), next to the verified certify."""
    from tpm2_pytss.constants import TPMA_OBJECT

    from capseal.keys import open_signer
    from capseal.keys._tpm_certify import verify_certify

    provision(tcti, signing_handle=KEY, ak_handle=AK, alg="p256")
    attrs = (TPMA_OBJECT.SIGN_ENCRYPT | TPMA_OBJECT.DECRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
             | TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH | TPMA_OBJECT.NODA)
    # sign|decrypt needs no fixed scheme (TPM_ALG_NULL)
    path = key_file_under_srk(tcti, "ecc256:null:null", attrs, tmp_path / "sign-and-decrypt.tss")
    with open_signer(f"tpm2:keyfile={path}?tcti={tcti}&ak-handle=0x{AK:08x}") as signer:
        assert signer.alg == "ES256" and signer.sign(b"x").alg == "ES256"
        custody = signer.describe()
    attributes = custody["key_attributes"]
    assert attributes["decrypt"] is True and attributes["sign"] is True and attributes["restricted"] is False
    assert verify_certify(custody["tpm_certify"], public_key=signer.public_key) == []
    assert _loaded(tcti) == []


# ---------------------------------------------------------------------------- another TPM behind the TCTI


def test_a_tpm_replaced_behind_the_same_tcti_is_read_afresh(fresh_swtpm: Any, tmp_path: Any) -> None:
    """The device's context remembers each persistent object's name. When the
    TPM at the address is another one (a swtpm restarted on new state, or a
    TPM cleared and provisioned again), provisioning there works, and a signer
    opened on the old key is refused by its pinned name, not signed with the
    new key or failed as an ESAPI 'catch all' error."""
    from capseal.errors import KeyNotFoundError
    from capseal.keys import open_signer

    from .conftest import SwTPM

    tcti = fresh_swtpm.tcti
    provision(tcti, signing_handle=KEY, ak_handle=AK, alg="p256")
    old = open_signer(f"tpm2:handle=0x{KEY:08x}?tcti={tcti}&ak-handle=0x{AK:08x}")
    try:
        old_key = old.public_key
        old.sign(b"before")
        fresh_swtpm.stop()
        other = SwTPM(state=tmp_path / "other-tpm", port=fresh_swtpm.port, pid=0)
        other.start()
        try:
            provision(tcti, signing_handle=KEY, ak_handle=AK, alg="p256")
            with open_signer(f"tpm2:handle=0x{KEY:08x}?tcti={tcti}&ak-handle=0x{AK:08x}") as new:
                assert new.public_key != old_key
                assert new.describe()["tpm_certify"]
            with pytest.raises(KeyNotFoundError, match="no longer the key this signer opened"):
                old.sign(b"after")
        finally:
            other.stop()
    finally:
        old.close()
        get_device(tcti).close()
