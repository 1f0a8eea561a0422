"""Signing-key trust anchors: the keys a relying party pins.

A valid signature says only "the holder of this key signed": a capsule or
judgment record carries its signer's public key (or a custody statement
introduces it), so anyone can re-sign an edited record under a key of their
own and it verifies. Which keys are accepted is the relying party's policy
(-05 §3.2), so the verifiers name every signer and:

* with no anchor, report each signature as not pinned (``signer_not_pinned``,
  a warning: the record is intact and signed by the key named, and nothing
  says whose key that is);
* with anchors, make a record that no pinned key signed an error
  (``signer_not_trusted``).

Anchors are public keys (``cryptography`` objects or PEM), key ids (64 hex
digits, as ``capseal keys show`` prints them), :class:`TrustedKey` entries, or
a file read by :func:`read_trust_file`: PEM public keys, or a trust file::

    {"trust_version": "capseal-trust/1",
     "keys": [{"kid": "<64 hex>", "public_key_pem": "-----BEGIN PUBLIC KEY-----…", "label": "sealer-1"}]}

Each entry has a ``kid``, a ``public_key_pem`` or both (which must name the
same key), and an optional ``label``; no other member. A kid alone pins a key
the record itself carries (Ed25519 profile envelopes, judgment envelopes) or a
custody statement in the ledger introduces; a PEM also lets a plain COSE
envelope be checked when nothing else names its key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from .canonical import is_hex64
from .errors import InputError

__all__ = ["TRUST_FILE_VERSION", "TrustedKey", "trusted_key", "trusted_keys", "read_trust_file", "parse_trust"]

TRUST_FILE_VERSION = "capseal-trust/1"

#: The most a trust file may hold: far more than any list of keys, bounded so a
#: wrong path (a disk image, a device) is refused instead of read.
MAX_TRUST_FILE = 1 << 20

_ENTRY_MEMBERS = frozenset({"kid", "public_key_pem", "label"})
_PEM_BEGIN = b"-----BEGIN PUBLIC KEY-----"
_PEM_END = b"-----END PUBLIC KEY-----"


@dataclass(frozen=True)
class TrustedKey:
    """One pinned signing key: its kid (lower-case hex), its public key when
    known (a ``cryptography`` public key), and a label for reports."""

    kid: str
    public_key: Any = None
    label: str = ""


def _kid_of(public_key: Any) -> str:
    from capseal.keys import kid_for

    return str(kid_for(public_key))


def _load_pem(data: bytes, where: str) -> Any:
    if b"PRIVATE KEY-----" in data:
        raise InputError(f"{where} holds a private key; a trust anchor is a public key (not used, not echoed)")
    try:
        return serialization.load_pem_public_key(data)
    except UnsupportedAlgorithm as exc:
        raise InputError(f"{where} is a public key of a type capseal cannot use ({exc})") from None
    except ValueError:  # cryptography's message would only say the bytes are not a key
        raise InputError(f"{where} is not a PEM public key (-----BEGIN PUBLIC KEY-----)") from None


def trusted_key(item: Any, where: str = "trusted key") -> TrustedKey:
    """``item`` as a :class:`TrustedKey`.

    Args:
        item: a TrustedKey, a ``cryptography`` public key, PEM text or bytes of
            one public key, or a kid (64 hex digits).
        where: what to call the item in an error.

    Returns:
        The pinned key.

    Raises:
        InputError: a private key, text that is neither a PEM public key nor a
            kid, or any other type. The message never echoes the input.
    """
    if isinstance(item, TrustedKey):
        return item
    if hasattr(item, "private_bytes"):
        raise InputError(f"{where} is a private key ({type(item).__name__}); a trust anchor is a public key")
    if hasattr(item, "public_bytes"):
        try:
            return TrustedKey(_kid_of(item), item)
        except Exception as exc:  # a key type no kid exists for
            raise InputError(f"{where}: no key id can be made for a {type(item).__name__} ({exc})") from None
    if isinstance(item, str):
        if is_hex64(item.lower()):
            return TrustedKey(item.lower())
        try:
            item = item.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"{where} is text that cannot be UTF-8 (a lone surrogate)") from None
    if isinstance(item, (bytes, bytearray, memoryview)):
        key = _load_pem(bytes(item), where)
        return TrustedKey(_kid_of(key), key)
    raise InputError(f"{where} is a public key, its PEM or its kid (64 hex digits), not {type(item).__name__}")


def trusted_keys(items: Iterable[Any]) -> list[TrustedKey]:
    """Every item of ``items`` through :func:`trusted_key`.

    Args:
        items: public keys, PEMs, kids or TrustedKey entries (a lone PEM, kid or
            key counts as one).

    Returns:
        The pinned keys, in order.

    Raises:
        InputError: as :func:`trusted_key`, naming the entry's index.
    """
    if isinstance(items, (str, bytes, bytearray, memoryview, TrustedKey)) or hasattr(items, "public_bytes"):
        items = [items]
    if isinstance(items, Mapping) or not isinstance(items, Iterable):
        raise InputError(f"trusted keys are a list of public keys, PEMs or kids, not {type(items).__name__}")
    return [trusted_key(item, f"trusted key {i}") for i, item in enumerate(items)]


def parse_trust(data: bytes, source: str) -> list[TrustedKey]:
    """The keys in a trust file's bytes: a ``capseal-trust/1`` JSON object, or
    one or more PEM public keys one after the other.

    Args:
        data: the file's bytes.
        source: what to call the file in an error (its path).

    Returns:
        The pinned keys (at least one).

    Raises:
        InputError: the bytes are neither form, an entry is malformed, a kid
            and a PEM of one entry name different keys, or no key is given.
    """
    if data.lstrip().startswith(b"{"):
        return _parse_json(data, source)
    blocks: list[bytes] = []
    rest = data
    while _PEM_BEGIN in rest:
        start = rest.index(_PEM_BEGIN)
        end = rest.find(_PEM_END, start)
        if end < 0:
            raise InputError(f"{source}: a PEM block is not closed ({_PEM_END.decode()})")
        end += len(_PEM_END)
        blocks.append(rest[start:end])
        rest = rest[end:]
    if not blocks:  # another PEM form of one public key (PKCS#1 RSA), or not a key at all
        key = _load_pem(data, source)
        return [TrustedKey(_kid_of(key), key)]
    out = []
    for i, block in enumerate(blocks):
        key = _load_pem(block, source if len(blocks) == 1 else f"{source}: PEM block {i + 1}")
        out.append(TrustedKey(_kid_of(key), key))
    return out


def _parse_json(data: bytes, source: str) -> list[TrustedKey]:
    from .record import strict_json

    doc = strict_json(data, source)  # a MalformedJSONError (an InputError) names the file
    if not isinstance(doc, Mapping) or doc.get("trust_version") != TRUST_FILE_VERSION:
        raise InputError(f"{source}: a trust file is a JSON object with \"trust_version\": \"{TRUST_FILE_VERSION}\"")
    unknown = sorted(set(doc) - {"trust_version", "keys"})
    if unknown:
        raise InputError(f"{source}: unknown member(s) {', '.join(map(repr, unknown))} (a trust file has trust_version and keys)")
    entries = doc.get("keys")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{source}: \"keys\" is a non-empty list of {{kid, public_key_pem, label}} entries")
    return [_entry(entry, f"{source}: keys[{i}]") for i, entry in enumerate(entries)]


def _entry(entry: Any, where: str) -> TrustedKey:
    if not isinstance(entry, Mapping):
        raise InputError(f"{where} is an object {{kid, public_key_pem, label}}, not {type(entry).__name__}")
    unknown = sorted(set(entry) - _ENTRY_MEMBERS)
    if unknown:
        raise InputError(f"{where}: unknown member(s) {', '.join(map(repr, unknown))} (an entry has kid, public_key_pem, label)")
    kid, pem, label = entry.get("kid"), entry.get("public_key_pem"), entry.get("label", "")
    if not isinstance(label, str):
        raise InputError(f"{where}: label is text")
    if kid is not None and not (isinstance(kid, str) and is_hex64(kid.lower())):
        raise InputError(f"{where}: kid is 64 hex digits (as capseal keys show prints it)")
    if pem is None:
        if kid is None:
            raise InputError(f"{where} names no key: give kid, public_key_pem or both")
        return TrustedKey(kid.lower(), None, label)
    if not isinstance(pem, str):
        raise InputError(f"{where}: public_key_pem is PEM text")
    key = trusted_key(pem, f"{where}.public_key_pem")
    if kid is not None and kid.lower() != key.kid:
        raise InputError(f"{where}: kid {kid[:16]}… is not the key id of public_key_pem ({key.kid[:16]}…)")
    return TrustedKey(key.kid, key.public_key, label)


def read_trust_file(path: str | Path) -> list[TrustedKey]:
    """The keys a trust file pins (see :func:`parse_trust` for its forms).

    Args:
        path: the file.

    Returns:
        The pinned keys.

    Raises:
        InputError: the file cannot be read, is larger than ``MAX_TRUST_FILE``,
            or is not a trust file.
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_TRUST_FILE + 1)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_TRUST_FILE:
        raise InputError(f"{path} is larger than a trust file may be ({MAX_TRUST_FILE} bytes)")
    return parse_trust(data, str(path))
