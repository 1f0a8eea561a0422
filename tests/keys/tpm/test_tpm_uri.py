"""tpm2: URI parsing without a TPM: an empty TCTI is refused rather than
defaulting to /dev/tpmrm0, handles have one spelling each (0x + hex, or
decimal), and the attestation key cannot be the signing key's handle."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from capseal.errors import KeyURIError
from capseal.keys.tpm import explicit_tcti, parse_handle, parse_persistent_handle, parse_tpm_uri, provision


@pytest.mark.parametrize("uri", ["tpm2:handle=0x81000101?tcti=", "tpm2:handle=0x81000101?tcti=%20",
                                 "tpm2:?tcti="])
def test_an_empty_tcti_in_a_uri_is_refused(uri: str) -> None:
    with pytest.raises(KeyURIError, match="tcti= is empty"):
        parse_tpm_uri(uri)
    with pytest.raises(KeyURIError, match="tcti= is empty"):
        explicit_tcti(uri)


def test_an_empty_tcti_argument_is_refused() -> None:
    with pytest.raises(KeyURIError, match="the TCTI given is empty"):
        parse_tpm_uri("tpm2:handle=0x81000101", tcti="")
    with pytest.raises(KeyURIError, match="--tcti is empty"):
        provision("")  # refused before any TPM is opened
    assert parse_tpm_uri("tpm2:handle=0x81000101").tcti == "device:/dev/tpmrm0"  # absent: the default
    assert explicit_tcti("tpm2:handle=0x81000101") is None


@pytest.mark.parametrize("text", ["0x8100_0101", "+0x81000101", "0o20100000401", "0b10000001000000000000000100000001",
                                  " 0x81000101", "0x81000101 ", "0x81000101\n", "١٢٣", "0x", "0x181000101", "-1",
                                  "0x8100０101", "", "4294967296", "0123", "02164261121"])
def test_handles_have_one_spelling(text: str) -> None:
    with pytest.raises(KeyURIError, match="handle"):
        parse_handle(text)
    with pytest.raises(KeyURIError):
        parse_tpm_uri(f"tpm2:handle={text}")


def test_hex_and_decimal_handles_are_accepted() -> None:
    assert parse_handle("0x81000101") == parse_handle("0X81000101") == parse_handle("2164261121") == 0x81000101
    assert parse_handle("0x8100010A") == parse_handle("0x8100010a") == 0x8100010A
    assert parse_tpm_uri("tpm2:handle=0x81000101?ak-handle=2164261122").ak_handle == 0x81000102


def test_a_leading_zero_or_hex_digits_without_0x_get_a_hint() -> None:
    """tpm2-tools read 0123 as octal; 81000101 in decimal is not a persistent
    handle and is almost always 0x81000101 with the 0x left out."""
    with pytest.raises(KeyURIError, match="without a leading zero"):
        parse_handle("0123")
    with pytest.raises(KeyURIError, match=r"did you mean 0x81000101\?"):
        parse_tpm_uri("tpm2:handle=81000101")
    with pytest.raises(KeyURIError, match=r"did you mean 0x81000102\?"):
        parse_tpm_uri("tpm2:handle=0x81000101?ak-handle=81000102")
    with pytest.raises(KeyURIError, match=r"did you mean 0x8100010a\?"):
        parse_handle("8100010a")
    with pytest.raises(KeyURIError, match=r"--handle 0x04d3f6a5 is not a persistent handle.*did you mean 0x81000101\?"):
        parse_persistent_handle("81000101", "--handle")
    with pytest.raises(KeyURIError) as exc_info:
        parse_tpm_uri("tpm2:handle=0")
    assert "did you mean" not in str(exc_info.value)


def test_the_ak_handle_must_differ_from_the_key_handle() -> None:
    with pytest.raises(KeyURIError, match="ak-handle 0x81000101 is the signing key's own handle"):
        parse_tpm_uri("tpm2:handle=0x81000101?ak-handle=0x81000101")
    with pytest.raises(KeyURIError, match="own handle"):
        parse_tpm_uri("tpm2:handle=0x81000101", ak_handle=0x81000101)


def test_a_keyfile_path_with_a_nul_byte_is_refused() -> None:
    with pytest.raises(KeyURIError, match="NUL byte"):
        parse_tpm_uri("tpm2:keyfile=%00k.tss")


@pytest.mark.parametrize("uri", ["tpm2:keyfile=/etc/k#1.tss", "tpm2:handle=0x81000101#x",
                                 "tpm2:keyfile=/k?tcti=device:/dev/tpmrm0#f"])
def test_a_fragment_anywhere_is_refused(uri: str) -> None:
    """A '#' starts a URI's fragment wherever it stands (RFC 3986 §3.5): it
    was refused after '?' but read as part of a key file's path before it."""
    with pytest.raises(KeyURIError, match="fragment"):
        parse_tpm_uri(uri)
    assert parse_tpm_uri("tpm2:keyfile=/etc/k%231.tss").keyfile == "/etc/k#1.tss"
    assert parse_tpm_uri(parse_tpm_uri("tpm2:keyfile=/etc/k%231.tss").to_uri()).keyfile == "/etc/k#1.tss"


@pytest.mark.parametrize("tcti", ["cmd:touch /tmp/x", "/tmp/evil.so:conf", "libtss2-tcti-swtpm.so.0:host=127.0.0.1,port=2321",
                                  "pcap:swtpm:host=127.0.0.1", "SWTPM:host=127.0.0.1,port=2321", "libtpms", "bogus:x"])
def test_only_the_tctis_capseal_knows_are_accepted(tcti: str) -> None:
    """The TCTI name is a library the TSS loads (a path is dlopen()ed as it
    stands) and cmd: runs a shell command: a URI must not choose either."""
    with pytest.raises(KeyURIError, match="is not a TCTI capseal opens"):
        parse_tpm_uri(f"tpm2:handle=0x81000101?tcti={quote(tcti)}")
    with pytest.raises(KeyURIError, match="is not a TCTI capseal opens"):
        parse_tpm_uri("tpm2:handle=0x81000101", tcti=tcti)


def test_a_cmd_tcti_runs_nothing(tmp_path: Path) -> None:
    """Before: tpm2:…?tcti=cmd:touch%20FILE ran the command (the TSS's cmd TCTI)."""
    from capseal.keys import open_signer
    from capseal.keys.tpm import TPMDevice

    marker = tmp_path / "ran"
    with pytest.raises(KeyURIError):
        open_signer(f"tpm2:handle=0x81000101?tcti=cmd:touch%20{marker}")
    device = TPMDevice(f"cmd:touch {marker}")  # the device refuses it too, whoever builds one
    try:
        with pytest.raises(KeyURIError, match="is not a TCTI capseal opens"):
            device.info()
    finally:
        device.close()
    assert not marker.exists()


@pytest.mark.parametrize(("tcti", "problem"), [
    ("swtpm:host=127.0.0.1,port=99999", "port"), ("swtpm:host=127.0.0.1,port=abc", "port"),
    ("swtpm:host=127.0.0.1,port=0", "port"), ("mssim:host=127.0.0.1,port=-1", "port"),
    ("swtpm:host=127.0.0.1,port=02321", "port"), ("swtpm:host=127.0.0.1,port=2321,foo=bar", "foo"),
    ("swtpm:host=127.0.0.1,port=2321,port=2322", "twice"), ("swtpm:host=[::1],port=2321", "brackets"),
    ("swtpm:host=,port=2321", "host"), ("swtpm:port", "port"), ("swtpm:host=127.0.0.1,,port=2321", "empty"),
    ("device:/dev/tpmrm0\x00x", "control character"), ("swtpm:host=127.0.0.1\n,port=2321", "control character"),
])
def test_bad_simulator_tcti_options_are_named(tcti: str, problem: str) -> None:
    """Before: these reached the TSS and came back as SignerUnavailableError
    "not reachable … A parameter has a bad value", naming nothing."""
    with pytest.raises(KeyURIError, match=problem):
        parse_tpm_uri(f"tpm2:handle=0x81000101?tcti={quote(tcti)}")


@pytest.mark.parametrize("tcti", ["swtpm:host=::1,port=2321", "swtpm:port=2321", "swtpm:", "swtpm", "mssim:host=localhost",
                                  "device:/dev/tpmrm0", "device", "tabrmd:bus_type=session", "swtpm:host=127.0.0.1,port=65535"])
def test_good_tctis_are_accepted(tcti: str) -> None:
    assert parse_tpm_uri(f"tpm2:handle=0x81000101?tcti={quote(tcti)}").tcti == tcti


@pytest.mark.parametrize("parent", [0x140000001, -0xBFFFFFFF, -1])
def test_a_key_file_parent_that_is_not_a_32_bit_handle_is_refused(parent: int) -> None:
    """Before: the parent was masked to 32 bits, so 0x140000001 and
    -0xbfffffff both read as 0x40000001 (the SRK) and loaded under it."""
    from capseal.keys.tpm import TPMKeyFile
    from capseal.keys.tpm._uri import _der_int, _der_oid, _tlv  # DER built by hand: files no tool writes

    # _der_int writes non-negative values only: spell a negative one's two's complement here
    der_parent = _der_int(parent) if parent >= 0 else _tlv(0x02, parent.to_bytes(5, "big", signed=True))
    body = _der_oid("2.23.133.10.1.3") + der_parent + _tlv(0x04, b"\x00\x00") + _tlv(0x04, b"\x00\x00")
    with pytest.raises(KeyURIError, match="parent"):
        TPMKeyFile.from_der(_tlv(0x30, body))
    good = TPMKeyFile(public=b"\x00\x00", private=b"\x00\x00", parent=0x81000001)
    assert TPMKeyFile.from_der(good.to_der()).parent == 0x81000001
