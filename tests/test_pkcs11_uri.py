"""RFC 7512 ``pkcs11:`` URIs: the RFC's own examples parse, anything malformed
or ambiguous is refused with KeyURIError, the PIN never leaks, and the module
allow-list refuses a module before it is loaded."""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import shutil
from pathlib import Path

import pkcs11
import pytest

from capseal.errors import KeyURIError, SignerUnavailableError
from capseal.keys import open_signer, redact_uri
from capseal.keys._pkcs11_uri import (
    MODULE_ALLOWLIST_ENV,
    PKCS11URI,
    check_module_allowed,
    parse_pkcs11_uri,
    read_pin_source,
    resolve_module,
)

from .secret_files import write_secret

SOFTHSM = "/usr/lib/softhsm/libsofthsm2.so"


# ---------------------------------------------------------------------- RFC 7512 §3 examples


def test_empty_uri_matches_everything() -> None:
    assert parse_pkcs11_uri("pkcs11:") == PKCS11URI()


def test_rfc_example_with_every_token_attribute() -> None:
    uri = parse_pkcs11_uri(
        "pkcs11:token=The%20Software%20PKCS%2311%20Softtoken;manufacturer=Snake%20Oil,%20Inc.;model=1.0;"
        "object=my-certificate;type=cert;id=%69%95%3E%5C%F4%BD%EC%91;serial=?pin-source=file:/etc/token_pin"
    )
    assert uri.token == "The Software PKCS#11 Softtoken"
    assert uri.manufacturer == "Snake Oil, Inc."
    assert uri.model == "1.0"
    assert uri.object == "my-certificate"
    assert uri.type == "cert"
    assert uri.id == bytes.fromhex("69953e5cf4bdec91")
    assert uri.serial == ""  # present and empty is not absent
    assert uri.pin_source == "file:/etc/token_pin"


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ("pkcs11:object=my-pubkey;type=public", "type", "public"),
        ("pkcs11:object=my-key;type=private?pin-source=file:/etc/token", "pin_source", "file:/etc/token"),
        ("pkcs11:object=my-sign-key;type=private?module-name=mypkcs11", "module_name", "mypkcs11"),
        ("pkcs11:object=my-sign-key;type=private?module-path=/mnt/libmypkcs11.so.1", "module_path", "/mnt/libmypkcs11.so.1"),
        ("pkcs11:slot-description=Sun%20Metaslot", "slot_description", "Sun Metaslot"),
        ("pkcs11:library-manufacturer=Snake%20Oil,%20Inc.;library-description=Soft%20Token%20Library;library-version=1.23",
         "library_version", "1.23"),
        ("pkcs11:token=A%20name%20with%20a%20substring%20%25%3B;object=my-certificate;type=cert", "token",
         "A name with a substring %;"),
        ("pkcs11:token=Name%20with%20a%20small%20A%20with%20acute:%20%C3%A1;object=my-certificate;type=cert", "token",
         "Name with a small A with acute: á"),
        ("pkcs11:slot-id=4;object=k", "slot_id", 4),
        ("pkcs11:object=a=b&c", "object", "a=b&c"),  # '=' and '&' are allowed unencoded in path values
    ],
)
def test_rfc_examples(text: str, field: str, value: object) -> None:
    assert getattr(parse_pkcs11_uri(text), field) == value


def test_vendor_query_attributes_are_accepted_and_ignored() -> None:
    uri = parse_pkcs11_uri("pkcs11:token=my-token;object=k?pin-source=file:/etc/token_pin&vendor-bbb=value-b")
    assert uri.vendor_query == (("vendor-bbb", "value-b"),)
    assert "vendor-bbb" not in uri.to_string()


def test_round_trip_and_id_is_fully_pct_encoded() -> None:
    original = parse_pkcs11_uri(
        "pkcs11:token=a%20b;object=k%2F1;id=%01%02AB?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-value=12%2634"
    )
    assert original.pin_value == "12&34"
    text = original.to_string(include_pin=True)
    assert "id=%01%02%41%42" in text
    assert parse_pkcs11_uri(text) == original
    assert parse_pkcs11_uri(text).pin_value == "12&34"


# ---------------------------------------------------------------------- refused


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("file:/tmp/x", "starts with 'pkcs11:'"),
        ("pkcs11:token=a#frag", "fragment"),
        ("pkcs11:token=a;", "empty attribute"),
        ("pkcs11:token=a;;object=b", "empty attribute"),
        ("pkcs11:token=a?module-path=/x.so&", "empty attribute"),
        ("pkcs11:token", "no '=value'"),
        ("pkcs11:token=a;token=b", "more than once"),
        ("pkcs11:token=a?module-path=/a.so&module-path=/b.so", "more than once"),
        ("pkcs11:object=my key", "' '"),
        ("pkcs11:object=a/b", "'/'"),
        ("pkcs11:object=a%zz", "bad pct escape"),
        ("pkcs11:object=a%4", "bad pct escape"),
        ("pkcs11:object=%FF%FE", "not UTF-8"),
        ("pkcs11:type=secret", "type must be one of"),
        ("pkcs11:slot-id=0x4", "slot-id"),
        ("pkcs11:library-version=1.x", "library-version"),
        ("pkcs11:x-vendor=1;object=k", "unknown path attribute"),
        ("pkcs11:token=a;module-path=/x.so", "query attribute"),
        ("pkcs11:object=k?token=a", "path attribute"),
        ("pkcs11:object=k?module-path=relative/x.so", "absolute path"),
        ("pkcs11:object=k?module-name=../x", "module-name"),
        ("pkcs11:object=k?module-path=/a b.so", "' '"),
        ("pkcs11:object=k?pin-source=/f&pin-value=1234", "not both"),
        ("pkcs11:b@d=1", "not an attribute name"),
    ],
)
def test_malformed_uris_are_refused(text: str, needle: str) -> None:
    with pytest.raises(KeyURIError) as err:
        parse_pkcs11_uri(text)
    assert needle in str(err.value)


# ---------------------------------------------------------------------- the PIN stays secret

PIN = "s3cr3t-9731"


@pytest.mark.parametrize(
    "text",
    [
        f"pkcs11:token=a;pin-value={PIN}",  # misplaced in the path
        f"pkcs11:token=a?pin-value={PIN}&pin-source=/x",  # both
        f"pkcs11:token=a?pin-value={PIN}%zz",  # bad escape inside the PIN
        f"pkcs11:token=a?pin-value={PIN} x",  # space inside the PIN
        f"pkcs11:token=a?pin-value={PIN}&pin-value={PIN}",  # twice
        f"pkcs11:token=a?pin-value={PIN}",  # no module
    ],
)
def test_pin_value_never_in_errors(text: str) -> None:
    with pytest.raises(KeyURIError) as err:
        open_signer(text)
    assert PIN not in str(err.value)
    assert PIN not in repr(err.value)
    assert PIN not in err.value.diagnostics()
    assert err.value.__cause__ is None
    assert err.value.__context__ is None or err.value.__suppress_context__


def test_pin_value_never_printed() -> None:
    uri = parse_pkcs11_uri(f"pkcs11:token=a;object=k?module-path={SOFTHSM}&pin-value={PIN}")
    assert uri.pin_value == PIN
    assert PIN not in repr(uri)
    assert PIN not in str(uri)
    assert PIN not in uri.to_string()
    assert PIN not in redact_uri(f"pkcs11:token=a?module-path={SOFTHSM}&pin-value={PIN}")


def test_pin_source_file_and_file_uri(tmp_path: Path) -> None:
    f = write_secret(tmp_path / "pin", PIN + "\n")
    assert read_pin_source(str(f)).reveal() == PIN  # held as a Secret: its repr shows none of it
    assert read_pin_source(f"file:{f}").reveal() == PIN and PIN not in repr(read_pin_source(f"file:{f}"))
    assert read_pin_source(f"file://{f}").reveal() == PIN
    with pytest.raises(KeyURIError, match="not supported"):
        read_pin_source("|/usr/bin/pinentry")
    with pytest.raises(KeyURIError) as err:
        read_pin_source(str(tmp_path / "missing"))
    assert str(tmp_path / "missing") in str(err.value)


# ---------------------------------------------------------------------- modules


def test_module_name_and_directory_resolution() -> None:
    assert os.path.realpath(resolve_module(parse_pkcs11_uri("pkcs11:?module-name=softhsm2"))) == os.path.realpath(SOFTHSM)
    by_dir = parse_pkcs11_uri("pkcs11:?module-path=/usr/lib/softhsm&module-name=softhsm2")
    assert resolve_module(by_dir) == SOFTHSM
    with pytest.raises(KeyURIError, match="directory"):
        resolve_module(parse_pkcs11_uri("pkcs11:?module-path=/usr/lib/softhsm"))
    with pytest.raises(KeyURIError, match="names no module"):
        resolve_module(parse_pkcs11_uri("pkcs11:token=a"))
    with pytest.raises(SignerUnavailableError, match="not found"):
        resolve_module(parse_pkcs11_uri("pkcs11:?module-name=no-such-module-xyz"))


def test_allow_list_compares_real_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.path.realpath(SOFTHSM)
    assert SOFTHSM != real  # the Debian path is a symlink
    monkeypatch.setenv(MODULE_ALLOWLIST_ENV, f"/nonexistent.so:{real}")
    assert check_module_allowed(SOFTHSM) == real
    assert check_module_allowed(SOFTHSM, [SOFTHSM]) == real
    with pytest.raises(SignerUnavailableError, match="allow-list"):
        check_module_allowed(SOFTHSM, ["/usr/lib/x86_64-linux-gnu/opensc-pkcs11.so"])  # both lists apply
    monkeypatch.setenv(MODULE_ALLOWLIST_ENV, "/usr/lib/x86_64-linux-gnu/opensc-pkcs11.so")
    with pytest.raises(SignerUnavailableError, match="allow-list"):
        check_module_allowed(SOFTHSM, [SOFTHSM])  # a caller cannot widen the environment's list


def test_module_off_the_allow_list_is_never_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "libcopy-pkcs11.so"
    shutil.copy(os.path.realpath(SOFTHSM), copy)  # a real module, at a path nobody allowed
    monkeypatch.setenv(MODULE_ALLOWLIST_ENV, SOFTHSM)
    with pytest.raises(SignerUnavailableError) as err:
        open_signer(f"pkcs11:token=x;object=k?module-path={copy}", pin="1234")
    assert str(copy) in str(err.value) and "allow-list" in str(err.value)
    assert not any(os.path.realpath(so) == str(copy) for so in pkcs11._loaded)
    with pytest.raises(SignerUnavailableError, match="allow-list"):
        open_signer(f"pkcs11:token=x;object=k?module-path={copy}", pin="1234", module_allowlist=[SOFTHSM])


@pytest.mark.parametrize(
    ("tail", "pieces"),
    [
        ("&34Qz", ["34Qz"]),  # no '='
        ("&tail7=93Qz", ["tail7", "93Qz"]),  # an "unknown vendor attribute" made of the PIN's tail
        ("&cdQz=eQ fQ", ["cdQz", "eQ"]),  # a space in it
        ("&cQz dQ", ["cQz"]),
        ("&token=x9Qz", ["x9Qz"]),  # a path attribute's name
        ("&pin-value=x9Qz", ["x9Qz"]),  # twice
        ("&module-path=rel9Qz", ["rel9Qz"]),  # then the module-path check: it says nothing of the value either
    ],
)
def test_nothing_after_a_pin_value_is_quoted(tail: str, pieces: list[str]) -> None:
    """An unencoded '&' in pin-value splits the PIN: what follows is refused,
    never quoted and never dropped (a cut-short PIN would burn a login try)."""
    text = f"pkcs11:token=a?module-path={SOFTHSM}&pin-value=4821{tail}"
    with pytest.raises(KeyURIError) as err:
        parse_pkcs11_uri(text)
    message = str(err.value)
    assert "4821" not in message and not any(piece in message for piece in pieces), message
    assert "%26" in message or "absolute" in message
    assert err.value.__cause__ is None and (err.value.__context__ is None or err.value.__suppress_context__)


def test_vendor_attributes_before_the_pin_value_are_kept() -> None:
    uri = parse_pkcs11_uri(f"pkcs11:token=a?x-vendor=1&module-path={SOFTHSM}&pin-value=12%2634")
    assert uri.vendor_query == (("x-vendor", "1"),) and uri.pin_value == "12&34"


def test_pin_value_out_of_reach_of_asdict_astuple_vars() -> None:
    """The PIN is held as an object that does not print; the public attribute,
    the constructor keyword and dataclasses.replace behave as before."""
    uri = parse_pkcs11_uri(f"pkcs11:token=a;object=k?module-path={SOFTHSM}&pin-value={PIN}")
    for view in (dataclasses.asdict(uri), dataclasses.astuple(uri), vars(uri)):
        assert PIN not in repr(view) and PIN not in str(view)
    with pytest.raises(TypeError):
        pickle.dumps(uri)
    assert uri.pin_value == PIN and PKCS11URI(token="a", pin_value=PIN).pin_value == PIN
    assert dataclasses.replace(uri, object="other").pin_value == PIN and uri.with_id(b"\x01").pin_value == PIN
    assert uri.without_pin().pin_value is None and uri.without_pin() == uri
    assert copy.deepcopy(uri).pin_value == PIN
    assert f"pin-value={PIN}" in uri.to_string(include_pin=True)


def test_type_is_case_insensitive_and_allow_list_takes_a_path() -> None:
    assert parse_pkcs11_uri("pkcs11:token=a;type=PRIVATE").type == "private"
    assert parse_pkcs11_uri("pkcs11:token=a;type=Public").type == "public"
    assert check_module_allowed(SOFTHSM, Path(SOFTHSM)) == os.path.realpath(SOFTHSM)
    with pytest.raises(SignerUnavailableError, match="allow-list"):
        check_module_allowed(SOFTHSM, Path("/usr/lib/x86_64-linux-gnu/opensc-pkcs11.so"))


@pytest.mark.parametrize(
    "text",
    [
        f"pkcs11:token=a;object=k?module-path={SOFTHSM}%00x",  # a NUL in the module's file name
        f"pkcs11:token=a;object=k?module-path={SOFTHSM}&pin-source=/tmp/a%00b",  # in a pin-source path
        f"pkcs11:token=a;object=k?module-path={SOFTHSM}&pin-source=file:/tmp/a%2500b",  # in a file: URI's path
        f"pkcs11:token=a;object=k?module-path={SOFTHSM}&pin-source=file:/tmp/%25FF",  # not UTF-8 once decoded
    ],
)
def test_file_names_no_file_can_have_are_key_uri_errors(text: str) -> None:
    """A NUL byte, or bytes that are not UTF-8, in a module or PIN file name:
    KeyURIError naming the attribute. They escaped as a bare ValueError
    ("embedded null byte") or UnicodeDecodeError."""
    with pytest.raises(KeyURIError) as err:
        open_signer(text, pin=None)
    assert "module-path" in str(err.value) or "pin-source" in str(err.value)
    assert err.value.__cause__ is None and (err.value.__context__ is None or err.value.__suppress_context__)


@pytest.mark.parametrize(
    "text",
    [
        f"pkcs11:token=a?module-path={SOFTHSM}&pin-value:Zq7SECRET",  # ':' for '='
        "pkcs11:token=a?pin-value%3DZq7SECRET",  # '=' pct-encoded
        "pkcs11:token=a?PIN-VALUEZq7SECRET&module-path=/x.so",  # '=' left out
        "pkcs11:token=a;pin-value:Zq7SECRET",  # and in the path
        "pkcs11:token=a?pin-value@Zq7SECRET=1",  # a name that is not one
    ],
)
def test_a_pin_value_with_its_equals_sign_mistyped_is_not_quoted(text: str) -> None:
    """A pin-value whose '=' is mistyped is one malformed attribute, name and
    PIN together: the error quoted it whole ("query attribute
    'pin-value:Zq7SECRET' has no '=value'")."""
    with pytest.raises(KeyURIError) as err:
        parse_pkcs11_uri(text)
    assert "Zq7SECRET" not in str(err.value) and "pin-value" in str(err.value), str(err.value)


def test_a_pin_file_other_users_can_read_is_refused(tmp_path: Path) -> None:
    """A PIN file every user of the host could read (the default umask's
    0644) was used: whoever read it could log in wherever they reach the
    token. It is refused, by pin-source and by the CLI's --pin-file alike,
    naming the file, never the PIN; at 0600 it is read."""
    import argparse

    from capseal._internal.cli import read_pin as _read_pin
    from capseal.errors import SecretFileExposedError

    f = tmp_path / "pin"
    f.write_text(PIN + "\n")
    f.chmod(0o644)
    with pytest.raises(SecretFileExposedError) as caught:
        read_pin_source(f"file:{f}")
    assert str(caught.value) == (f"pkcs11 URI: pin-source {f} can be read by every user of this host (mode 0644): "
                                 "whoever can read it can log in to the token as this user; refused")
    assert caught.value.hint == f"chmod 600 {f}"
    assert PIN not in repr(caught.value)
    with pytest.raises(SecretFileExposedError, match=f"^PIN file {f} can be read by every user"):
        _read_pin(argparse.Namespace(pin_file=str(f)))
    f.chmod(0o620)
    with pytest.raises(SecretFileExposedError, match="can be changed by its group"):
        read_pin_source(str(f))
    f.chmod(0o600)
    read = _read_pin(argparse.Namespace(pin_file=str(f)))
    assert read is not None and read_pin_source(str(f)).reveal() == PIN == read.reveal()
