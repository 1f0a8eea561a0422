"""TPM 2.0 signer against a real swtpm: capsules sealed with P-256 and RSA-PSS
keys in the TPM pass our verifier, the reference verifier, pycose and
scitt-cose; the custody statement says what the TPM reported (a software TPM)
and carries a TPM2_Certify by the AK that verifies; key files interoperate
with tpm2-pytss's TSSPrivKey; 8 threads seal 8,000 records through one swtpm."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import pytest
from agent_action_capsule import verify as reference_verify
from tpm2_pytss.constants import TPM2_CAP, TPM2_HC

from capseal import Ledger, Producer, verify_ledger
from capseal.envelope import signature_ok
from capseal.errors import KeyNotFoundError, KeyURIError, PinIncorrectError, UnsupportedAlgorithmError
from capseal.keys import open_signer
from capseal.keys.tpm import (
    TPMKeyFile,
    TPMSigner,
    create_key,
    get_device,
    list_keys,
    parse_tpm_uri,
    provision,
    verify_certify,
)
from capseal.keys.tpm._info import classify_software

from ...cose_checks import assert_envelope_verifies_independently
from ...stress import seal_from_threads
from ...tpm_keys import key_file_under_srk

P256, AK, RSA = 0x81000A01, 0x81000A02, 0x81000A03  # a range of our own on the shared session swtpm


@pytest.fixture(scope="module")
def tpm(swtpm: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Provision a P-256 key and an AK (as `capseal tpm provision` does), an
    RSA-PSS key at a handle and a P-256 key file, once for the module."""
    info = provision(swtpm.tcti, signing_handle=P256, ak_handle=AK, alg="p256", force=True)
    rsa_uri = f"tpm2:handle=0x{RSA:08x}?tcti={swtpm.tcti}"
    for entry in list_keys(f"tpm2:?tcti={swtpm.tcti}"):
        if entry["handle"] == f"0x{RSA:08x}":  # left by an earlier run in this session
            break
    else:
        create_key(rsa_uri, "PS256").close()
    keyfile = tmp_path_factory.mktemp("tpmkeys") / "seal.tss"
    create_key(f"tpm2:keyfile={keyfile}?tcti={swtpm.tcti}", "ES256").close()
    return {
        "provision": info,
        "ES256": f"tpm2:handle=0x{P256:08x}?tcti={swtpm.tcti}&ak-handle=0x{AK:08x}",
        "PS256": rsa_uri,
        "keyfile": f"tpm2:keyfile={keyfile}?tcti={swtpm.tcti}",
        "keyfile_path": keyfile,
        "tcti": swtpm.tcti,
    }


def _seal_two(signer: Any, ledger: Path) -> tuple[Any, Any, Any]:
    with Producer("acme", "buyer-agent@1.4", signer, ledger) as producer:
        planned = producer.planned("po-7", effect_type="write_order", request={"sku": "A1", "qty": 2})
        confirmed = producer.confirmed(planned, response={"order": "O-1"}, effect_attestation="gate_executed")
        return producer.epoch_record, planned, confirmed


@pytest.mark.direct_path
@pytest.mark.parametrize("alg", ["ES256", "PS256"])
def test_sealed_capsules_verify_everywhere(alg: str, tpm: dict[str, Any], tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    with open_signer(tpm[alg]) as signer:
        assert isinstance(signer, TPMSigner) and signer.external_device and signer.alg == alg
        pem = signer.public_key_pem()
        epoch, planned, confirmed = _seal_two(signer, ledger)

    report = verify_ledger(ledger)
    assert report.ok, [f.to_dict() for f in report.findings] + [r.to_dict() for r in report.records if not r.ok]
    assert report.counts()["records"] == 3 and report.counts()["signature:authored"] == 3
    for record in (epoch, planned, confirmed):
        result = reference_verify(record.capsule)
        assert result.ok, result.findings

    envelope = confirmed.to_json()["envelopes"][0]
    assert (envelope["profile"], envelope["alg"]) == ("cose-sign1", alg)
    assert "signature" not in confirmed.capsule and "key_id" not in confirmed.capsule
    cose = bytes.fromhex(envelope["cose"])
    cid_raw = bytes.fromhex(confirmed.capsule_id)
    assert_envelope_verifies_independently(cose, pem, cid_raw, alg)


def test_raw_signatures_are_cose_form(tpm: dict[str, Any]) -> None:
    for key, alg, size in ((tpm["ES256"], "ES256", 64), (tpm["PS256"], "PS256", 256), (tpm["keyfile"], "ES256", 64)):
        with open_signer(key) as signer:
            for i in range(40):  # r or s with a leading zero byte shows up about once in 128
                msg = b"message %d" % i
                result = signer.sign(msg)
                assert (result.alg, result.kid, len(result.signature)) == (alg, signer.kid, size)
                assert signature_ok(alg, signer.public_key, result.signature, msg)
            assert not signature_ok(alg, signer.public_key, result.signature, b"other message")


def test_custody_is_observed_and_says_software(tpm: dict[str, Any], tmp_path: Path) -> None:
    with open_signer(tpm["ES256"]) as signer:
        assert isinstance(signer, TPMSigner)
        epoch, _, _ = _seal_two(signer, tmp_path / "l.db")
        kid, name = signer.kid, signer.tpm_name.hex()
        public_key = signer.public_key
    custody = epoch.capsule["model_attestation"]["compute_attestation"]["x-capseal-key-custody"]
    assert (custody["backend"], custody["alg"], custody["kid"]) == ("tpm2", "ES256", kid)
    assert custody["software_device"] is True
    assert "SW TPM" in custody["software_device_reason"]
    assert custody["device"]["manufacturer"] == "IBM"  # what libtpms reports
    assert " ".join(custody["device"]["vendor"].split()) == "SW TPM"
    assert custody["device"]["spec"].startswith("2.0 rev ")
    attrs = custody["key_attributes"]
    assert attrs["fixedTPM"] and attrs["fixedParent"] and attrs["sensitiveDataOrigin"] and attrs["sign"]
    assert not attrs["restricted"] and not attrs["decrypt"]
    assert custody["tpm_key"] == {"name": name, "type": "ecc", "tcti": tpm["tcti"], "handle": f"0x{P256:08x}"}

    certify = custody["tpm_certify"]
    assert certify["key_name"] == name and certify["ak_handle"] == f"0x{AK:08x}"
    assert certify["ak_name"] == tpm["provision"]["attestation_key"]["name"]
    assert verify_certify(certify, public_key=public_key, trusted_ak_names=[certify["ak_name"]]) == []

    def no_floats(value: Any) -> None:
        assert not isinstance(value, float)
        for child in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
            no_floats(child)

    no_floats(custody)


def test_certify_tampering_is_found(tpm: dict[str, Any]) -> None:
    with open_signer(tpm["ES256"]) as signer, open_signer(tpm["PS256"]) as other:
        certify = signer.describe()["tpm_certify"]
        public_key, other_key = signer.public_key, other.public_key
    assert verify_certify(certify, public_key=public_key) == []

    def altered(field: str, fn: Any) -> dict[str, Any]:
        out = copy.deepcopy(certify)
        out[field] = fn(out[field])
        return out

    def flip_b64(b64: str, index: int = -1) -> str:
        raw = bytearray(base64.b64decode(b64))
        raw[index] ^= 1
        return base64.b64encode(bytes(raw)).decode()

    cases = {
        "attest": altered("attest", flip_b64),
        "signature": altered("signature", lambda s: flip_b64(s, -3)),
        "qualifying_data": altered("qualifying_data", lambda q: "00" * 32),
        "key_name": altered("key_name", lambda n: n[:-2] + ("00" if n[-2:] != "00" else "01")),
    }
    for what, record in cases.items():
        assert verify_certify(record, public_key=public_key), what
    assert any("not this signer's public key" in p for p in verify_certify(certify, public_key=other_key))
    assert any("not a trusted" in p for p in verify_certify(certify, trusted_ak_names=["000b" + "00" * 32]))
    assert verify_certify({"kind": "tpm2-certify"}) != []  # malformed: a finding, never an exception


def test_key_file_interoperates_with_tsskey(tpm: dict[str, Any], tmp_path: Path) -> None:
    """Our TSS2 PRIVATE KEY loads with tpm2-pytss's TSSPrivKey (the format of
    tpm2-tss-engine / tpm2-openssl), and a TSSPrivKey file opens as a signer."""
    from tpm2_pytss.tsskey import TSSPrivKey

    ours = TSSPrivKey.from_pem(Path(tpm["keyfile_path"]).read_bytes())
    assert ours.parent == 0x40000001 and ours.empty_auth is True
    with open_signer(tpm["keyfile"]) as signer:
        assert isinstance(signer, TPMSigner)
        expected_name = signer.tpm_name

        def load_with_tsskey(ectx: Any) -> bytes:
            handle = ours.load(ectx)
            try:
                return bytes(ectx.read_public(handle)[1])
            finally:
                ectx.flush_context(handle)

        assert signer.device.call(load_with_tsskey) == expected_name  # same SRK, same key

    def make_with_tsskey(ectx: Any) -> bytes:
        return TSSPrivKey.create_ecc(ectx).to_pem()

    theirs = tmp_path / "theirs.tss"
    theirs.write_bytes(get_device(tpm["tcti"]).call(make_with_tsskey))
    kf = TPMKeyFile.from_pem(theirs.read_bytes())
    assert kf.empty_auth and kf.parent == 0x40000001
    assert TPMKeyFile.from_der(kf.to_der()) == kf
    with open_signer(f"tpm2:keyfile={theirs}?tcti={tpm['tcti']}") as signer:
        result = signer.sign(b"from a tsskey file")
        assert signer.alg == "ES256" and signature_ok("ES256", signer.public_key, result.signature, b"from a tsskey file")
        custody = signer.describe()
        assert custody["key_store"] == "tpm2-keyfile" and custody["tpm_key"]["parent"] == "0x40000001"


def test_key_file_with_auth_value(swtpm: Any, tmp_path: Path) -> None:
    """A key file created with an auth value needs it; the value never shows."""
    secret = "pw-" + "7" * 12
    path = tmp_path / "authed.tss"
    uri = f"tpm2:keyfile={path}?tcti={swtpm.tcti}"
    with create_key(uri, "p256", pin=secret) as created:
        assert created.sign(b"x").alg == "ES256"
        assert secret not in repr(created) and secret not in created.uri
        assert secret not in repr(created.describe())
    assert TPMKeyFile.from_pem(path.read_bytes()).empty_auth is False
    with pytest.raises(PinIncorrectError) as exc_info:
        open_signer(uri)
    assert secret not in str(exc_info.value)
    prompts: list[str] = []
    def handler(prompt: str) -> str:
        prompts.append(prompt)
        return secret

    with open_signer(uri, secrets_handler=handler) as signer:
        assert signer.sign(b"y").alg == "ES256"
    assert prompts == [f"auth value for TPM key file {path} on {swtpm.tcti}"]
    with pytest.raises(KeyURIError, match="never accepted in a URI"):
        open_signer(uri + "&pin-value=" + secret)


def test_unknown_handle_and_wrong_kinds_of_key(tpm: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(KeyNotFoundError) as exc_info:
        open_signer(f"tpm2:handle=0x81000a7f?tcti={tpm['tcti']}")
    assert "0x81000a7f" in str(exc_info.value) and tpm["tcti"] in str(exc_info.value)
    with pytest.raises(UnsupportedAlgorithmError, match="restricted signing key"):
        open_signer(f"tpm2:handle=0x{AK:08x}?tcti={tpm['tcti']}")  # the AK signs only TPM-made data
    with pytest.raises(KeyNotFoundError, match="no attestation key"):
        open_signer(f"tpm2:handle=0x{P256:08x}?tcti={tpm['tcti']}&ak-handle=0x81000a7e").describe()
    with pytest.raises(KeyNotFoundError, match="no TPM key file"):
        open_signer(f"tpm2:keyfile={tmp_path / 'missing.tss'}?tcti={tpm['tcti']}")
    with pytest.raises(UnsupportedAlgorithmError, match="TPM_ALG_EDDSA"):
        create_key(f"tpm2:handle=0x81000a7d?tcti={tpm['tcti']}", "ed25519")


def test_uri_grammar() -> None:
    ref = parse_tpm_uri("tpm2:handle=0x81000101?tcti=swtpm:host=127.0.0.1,port=2321&ak-handle=0x81000102")
    assert (ref.handle, ref.ak_handle, ref.tcti) == (0x81000101, 0x81000102, "swtpm:host=127.0.0.1,port=2321")
    assert parse_tpm_uri(ref.to_uri()) == ref
    assert parse_tpm_uri("tpm2:handle=2164261121").tcti == "device:/dev/tpmrm0"
    kf = parse_tpm_uri("tpm2:keyfile=/etc/capseal/a%3Fb.tss?tcti=device:/dev/tpmrm0")
    assert kf.keyfile == "/etc/capseal/a?b.tss" and parse_tpm_uri(kf.to_uri()) == kf
    for bad in ("tpm2:handle=0x81000101;keyfile=/k", "tpm2:handel=0x81000101", "tpm2:handle=0x80000001",
                "tpm2:handle=0x81000101?tcti=x&tcti=y", "tpm2:handle=0x81000101?colour=red",
                "tpm2:handle=zz", "pkcs11:token=a"):
        with pytest.raises(KeyURIError):
            parse_tpm_uri(bad)


def test_software_classification() -> None:
    assert classify_software("IBM", "SW   TPM", "device:/dev/tpmrm0")[0] is True
    assert classify_software("IFX", "SLB9670", "swtpm:host=127.0.0.1,port=1")[0] is True  # a simulator protocol
    assert classify_software("IFX", "SLB9670", "device:/dev/tpmrm0")[0] is False
    assert classify_software("MSFT", "", "device:/dev/tpmrm0")[0] is None
    assert classify_software("ACME", "", "device:/dev/tpmrm0")[0] is None


def test_list_keys_shows_roles(tpm: dict[str, Any]) -> None:
    entries = {e["handle"]: e for e in list_keys(f"tpm2:?tcti={tpm['tcti']}")}
    assert entries[f"0x{P256:08x}"]["role"] == "signing-key" and entries[f"0x{P256:08x}"]["type"] == "ecc-p256"
    assert entries[f"0x{AK:08x}"]["role"] == "attestation-key"
    assert entries[f"0x{RSA:08x}"]["type"] == "rsa-2048"
    assert entries[f"0x{P256:08x}"]["kid"] == tpm["provision"]["signing_key"]["kid"]
    (only,) = list_keys(tpm["keyfile"])
    assert only["role"] == "signing-key" and only["parent"] == "0x40000001"


@pytest.mark.parametrize("how", ["seal", "submit"])
def test_eight_threads_seal_8000_records_through_one_swtpm(tpm: dict[str, Any], tmp_path: Path, how: str) -> None:
    """8 threads × 1,000 records, two producers (the persistent P-256 key and
    the key file, so two signers queue on one TPM worker) into one ledger, by
    ``seal()`` and by ``submit()`` (signatures queued on the worker): no
    crash, no TPM error, 8,000 records, every one verifies."""
    path = tmp_path / "threads.db"
    device = get_device(tpm["tcti"])
    generation = device.generation
    with Ledger(path) as ledger:
        a = open_signer(tpm["ES256"])
        assert isinstance(a, TPMSigner)
        b = open_signer(tpm["keyfile"])
        assert isinstance(b, TPMSigner)
        assert a.device is b.device is device
        producers = [Producer("acme", "agent-a@1", a, ledger), Producer("acme", "agent-b@1", b, ledger)]

        errors = seal_from_threads(producers, submit=how == "submit")
        for p in producers:
            p.close()
        a.close()
        b.close()
        assert errors == []
        assert device.generation == generation  # the connection was never lost
        assert ledger.count() == 8000 + 2  # plus each producer's epoch boundary
    report = verify_ledger(path)
    assert report.ok
    assert report.counts()["records"] == 8002 and report.counts()["ok"] == 8002


def test_more_key_files_than_object_slots(swtpm: Any, tmp_path: Path) -> None:
    """swtpm has three transient slots; four loaded key files take turns: the
    device gives up its cached copies when the TPM is full and reloads them."""
    signers = [create_key(f"tpm2:keyfile={tmp_path / f'k{i}.tss'}?tcti={swtpm.tcti}", "p256") for i in range(4)]
    try:
        for _round in range(3):
            for signer in signers:
                result = signer.sign(b"turn")
                assert signature_ok("ES256", signer.public_key, result.signature, b"turn")
        assert "tpm_key" in signers[0].describe()
    finally:
        for signer in signers:
            signer.close()


def test_verify_ledger_rechecks_the_custody_certify(tpm: dict[str, Any], tmp_path: Path) -> None:
    """A producer that records a forged TPM2_Certify in its custody statement is
    caught by verify_ledger, not only at recording time."""
    with open_signer(tpm["ES256"]) as signer:
        _seal_two(signer, tmp_path / "honest.db")
        honest = verify_ledger(tmp_path / "honest.db")
        assert honest.ok and not [f for r in honest.records for f in r.findings if f.code.startswith("custody_")]
        real = signer.describe()
        forged = copy.deepcopy(real)
        forged["tpm_certify"]["qualifying_data"] = "00" * 32
        signer.describe = lambda: forged  # type: ignore[method-assign]  # a lying producer, on a real TPM key
        _seal_two(signer, tmp_path / "forged.db")
        public_key = signer.public_key
    report = verify_ledger(tmp_path / "forged.db", trusted_keys=[public_key])  # pinned: the findings are the certify's alone
    assert not report.ok
    bad = [r for r in report.records if not r.ok]
    assert len(bad) == 1 and {f.code for f in bad[0].findings} == {"custody_certify_invalid"}


def test_forget_cached_key_after_another_process_reused_the_handle(fresh_swtpm: Any, tmp_path: Path) -> None:
    """Another client flushes a key-file signer's loaded key and loads a
    different signing key that lands on the same transient handle: the
    cached handle now signs with that key on the queued path (which the
    producer checks itself). sign() checks its result and reloads the file
    with the name check, so what it returns is this key's, and so is every
    signature after it. The other client's object is let go of, not flushed
    (the producer's path, forget_cached_key() after its own check fails, is
    the next test)."""
    from tpm2_pytss import ESAPI

    tcti = fresh_swtpm.tcti
    path = tmp_path / "k.tss"
    create_key(f"tpm2:keyfile={path}?tcti={tcti}", "p256").close()
    signer = open_signer(f"tpm2:keyfile={path}?tcti={tcti}")
    other = ESAPI(tcti)
    try:
        assert _verifies(signer, b"before")
        theirs = _take_over_the_loaded_handle(other)
        their_name = bytes(other.read_public(theirs)[1])
        unchecked = signer.begin_sign(b"reused handle").result()  # the queued path the producer checks itself
        assert not signature_ok(unchecked.alg, signer.public_key, unchecked.signature, b"reused handle")
        assert _verifies(signer, b"after")  # sign() checks, reloads the key with its name check, signs again
        assert bytes(other.read_public(theirs)[1]) == their_name  # still loaded: it was not ours to flush
        unchecked = signer.begin_sign(b"queued again").result()  # the cache now holds this key again
        assert signature_ok(unchecked.alg, signer.public_key, unchecked.signature, b"queued again")
    finally:
        other.close()
        signer.close()
        get_device(tcti).close()


def test_a_producer_recovers_when_another_process_reused_the_key_handle(fresh_swtpm: Any, tmp_path: Path) -> None:
    """The same reuse under a running producer: the seal that got the other
    key's signature is refused (SignatureFailedError, nothing written), and
    the next seal signs with this key again, with no restart."""
    from tpm2_pytss import ESAPI

    from capseal import Producer, verify_ledger
    from capseal.errors import SignatureFailedError

    tcti = fresh_swtpm.tcti
    path = tmp_path / "k.tss"
    create_key(f"tpm2:keyfile={path}?tcti={tcti}", "p256").close()
    signer = open_signer(f"tpm2:keyfile={path}?tcti={tcti}")
    other = ESAPI(tcti)
    ledger = tmp_path / "l.db"
    try:
        with Producer("acme", "agent@1", signer, ledger) as producer:
            producer.seal({"action_id": "before", "action_type": "fyi"})
            _take_over_the_loaded_handle(other)
            count = producer.ledger.count()
            with pytest.raises(SignatureFailedError, match="does not verify"):
                producer.seal({"action_id": "reused", "action_type": "fyi"})
            assert producer.ledger.count() == count
            producer.seal({"action_id": "after", "action_type": "fyi"})
        assert verify_ledger(ledger).ok
    finally:
        other.close()
        signer.close()
        get_device(tcti).close()


def _take_over_the_loaded_handle(other: Any) -> Any:
    """As another client of a TPM without a resource manager: flush the one
    transient object loaded (a key-file signer's key) and load a different
    signing key at that same handle; returns it (an ESYS_TR of ``other``)."""
    from tpm2_pytss.constants import ESYS_TR, TPMA_OBJECT
    from tpm2_pytss.types import TPM2B_PUBLIC, TPM2B_SENSITIVE_CREATE

    _more, data = other.get_capability(TPM2_CAP.HANDLES, TPM2_HC.TRANSIENT_FIRST, 64)
    (loaded,) = [int(h) for h in data.data.handles]
    other.flush_context(other.tr_from_tpmpublic(loaded))
    attrs = (TPMA_OBJECT.SIGN_ENCRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT | TPMA_OBJECT.NODA
             | TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH)
    template = TPM2B_PUBLIC.parse("ecc256:ecdsa-sha256:null", objectAttributes=attrs)
    fillers = []
    while True:  # swtpm hands out the lowest free handle: fill those below ours first
        theirs = other.create_primary(TPM2B_SENSITIVE_CREATE(), template, ESYS_TR.OWNER)[0]
        if other.tr_get_tpm_handle(theirs) == loaded:
            break
        fillers.append(theirs)
        assert len(fillers) < 3
    for filler in fillers:
        other.flush_context(filler)
    return theirs


def _verifies(signer: Any, data: bytes) -> bool:
    result = signer.sign(data)
    return bool(signature_ok(result.alg, signer.public_key, result.signature, data))


def test_an_auth_value_that_cannot_be_one_is_refused_without_showing_it(tpm: dict[str, Any], tmp_path: Path) -> None:
    """Before: pin=1234 or b"…" was an AttributeError, a pin with a lone
    surrogate a UnicodeEncodeError holding the whole pin in its args, and one
    longer than a TPM auth value an IndexError wrapped in DeviceError."""
    secret = "SECRET-auth-Vq3"
    uri = f"tpm2:handle=0x{P256:08x}?tcti={tpm['tcti']}"
    for pin, problem in ((1234, "is a int"), (secret.encode(), "is a bytes"), ("\ud800" + secret, "UTF-8"),
                         ("x" * 60 + secret, "at most 64 bytes")):
        with pytest.raises(PinIncorrectError, match=problem) as exc_info:
            open_signer(uri, pin=pin)  # type: ignore[arg-type]
        assert secret not in repr(exc_info.value.args) and exc_info.value.__context__ is None
    with pytest.raises(PinIncorrectError, match="at most 32 bytes") as exc_info:
        create_key(f"tpm2:keyfile={tmp_path / 'long.tss'}?tcti={tpm['tcti']}", "p256", pin="y" * 20 + secret)
    assert secret not in str(exc_info.value) and not (tmp_path / "long.tss").exists()
    with open_signer(uri, pin="") as signer:  # empty: no auth value, as before
        assert signer.sign(b"x").alg == "ES256"


def test_a_duplicable_key_file_is_described_as_such_with_an_ak(tpm: dict[str, Any], tmp_path: Path) -> None:
    """A key file whose key is not fixedTPM|fixedParent (made in this TPM, but
    duplicable): custody says so from the TPM's public area, and no
    TPM2_Certify is claimed for it. Before: describe() raised
    SignatureFailedError "returned a TPM2_Certify that does not verify",
    blaming the TPM for the key's attributes (and no epoch could be sealed)."""
    from tpm2_pytss.constants import TPMA_OBJECT

    attrs = TPMA_OBJECT.SIGN_ENCRYPT | TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH | TPMA_OBJECT.NODA
    path = key_file_under_srk(tpm["tcti"], "ecc256:ecdsa-sha256:null", attrs, tmp_path / "duplicable.tss")
    with open_signer(f"tpm2:keyfile={path}?tcti={tpm['tcti']}&ak-handle=0x{AK:08x}") as signer:
        custody = signer.describe()
        with Producer("acme", "buyer-agent@1.4", signer, tmp_path / "l.db"):
            pass
    assert custody["key_attributes"]["fixedTPM"] is False and custody["key_attributes"]["fixedParent"] is False
    assert custody["software_device"] is True
    assert "tpm_certify" not in custody and "not fixedTPM|fixedParent" in custody["tpm_certify_omitted"]
    assert verify_ledger(tmp_path / "l.db").ok


def test_a_closed_key_file_signer_loads_nothing_again(tpm: dict[str, Any]) -> None:
    """Before: describe() after close() loaded the key file again and the
    object stayed loaded for the life of the process (swtpm has three slots);
    a signature queued just after close() did the same."""
    from capseal.errors import SignerUnavailableError
    from capseal.keys.tpm._handles import transient_handles

    device = get_device(tpm["tcti"])
    loaded = lambda: set(device.call(transient_handles))  # noqa: E731
    before = loaded()
    signer = open_signer(tpm["keyfile"])
    assert isinstance(signer, TPMSigner)
    digest = b"\x00" * 32
    signer.close()
    with pytest.raises(SignerUnavailableError, match="closed"):
        signer.describe()
    # the signer's own job, queued behind its release: no public call can queue it after close()
    late = device.submit(lambda ectx: signer._sign_on_worker(ectx, digest), what="a signature queued as close() ran")
    with pytest.raises(SignerUnavailableError, match="closed"):
        device.wait(late)
    assert loaded() == before
