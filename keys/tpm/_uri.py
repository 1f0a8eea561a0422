"""``tpm2:`` key URIs and ``TSS2 PRIVATE KEY`` files. Pure Python, no TPM needed.

URI grammar, attributes as in RFC 7512 (``;`` in the path, ``&`` in
the query, values percent-encoded where they contain those characters)::

    tpm2:handle=0x81000101?tcti=swtpm:host=127.0.0.1,port=2321&ak-handle=0x81000102
    tpm2:keyfile=/etc/capseal/seal.tss?tcti=device:/dev/tpmrm0
    tpm2:?tcti=…                       (a TPM, not a key: for ``keys list`` and ``doctor``)

The TCTI defaults to ``device:/dev/tpmrm0`` (the kernel resource manager)
when ``tcti`` is absent; an empty ``tcti=`` is refused (it is a mistake, and
must not silently select a TPM), and only the ``device``, ``swtpm``, ``mssim``
and ``tabrmd`` TCTIs are opened (the TSS loads any other name as a library, and
``cmd:`` runs a command; see :func:`check_tcti`). Handles are ``0x`` and 1–8 hex digits, or
decimal digits, nothing else. ``ak-handle`` must differ from ``handle``.
Auth values never go in a URI: ``pin-value`` is refused.

Key files use the ASN.1 ``TPMKey`` format of openssl_tpm2_engine,
tpm2-tss-engine and tpm2-openssl (and ``tpm2_pytss.tsskey``)::

    TPMKey ::= SEQUENCE {
        type        OBJECT IDENTIFIER,        -- 2.23.133.10.1.3: loadable key
        emptyAuth   [0] EXPLICIT BOOLEAN OPTIONAL,
        policy      [1] EXPLICIT SEQUENCE OF TPMPolicy OPTIONAL,
        secret      [2] EXPLICIT OCTET STRING OPTIONAL,
        authPolicy  [3] EXPLICIT SEQUENCE OF TPMAuthPolicy OPTIONAL,
        description [4] EXPLICIT UTF8String OPTIONAL,
        rsaParent   [5] EXPLICIT BOOLEAN OPTIONAL,
        parent      INTEGER,                  -- 0x40000001: the SRK from the standard template
        pubkey      OCTET STRING,             -- TPM2B_PUBLIC
        privkey     OCTET STRING }            -- TPM2B_PRIVATE

Only loadable keys without policies are accepted: capseal cannot satisfy a
policy session, and saying so is better than failing at the first signature.
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

from capseal.errors import KeyURIError

__all__ = [
    "DEFAULT_TCTI",
    "TCTI_NAMES",
    "TPM_RH_OWNER",
    "TPMKeyURI",
    "TPMKeyFile",
    "parse_tpm_uri",
    "parse_handle",
    "check_tcti",
    "explicit_tcti",
    "format_handle",
    "handle_argument",
    "is_persistent_handle",
]

DEFAULT_TCTI = "device:/dev/tpmrm0"
TPM_RH_OWNER = 0x40000001
_LOADABLE_OID = "2.23.133.10.1.3"
_PEM_LABEL = "TSS2 PRIVATE KEY"
_QUERY_KEYS = frozenset({"tcti", "ak-handle"})
_PATH_KEYS = frozenset({"handle", "keyfile"})


_HEX_HANDLE = re.compile(r"0[xX][0-9a-fA-F]{1,8}", re.ASCII)
_DEC_HANDLE = re.compile(r"0|[1-9][0-9]{0,9}", re.ASCII)
_HEX_DIGITS = re.compile(r"[0-9a-fA-F]+", re.ASCII)  # no leading zero: C tools read 0123 as octal
_PORT = re.compile(r"[1-9][0-9]{0,4}", re.ASCII)

#: The TCTIs capseal opens (the kernel device, the simulators, tpm2-abrmd).
TCTI_NAMES = ("device", "swtpm", "mssim", "tabrmd")


def parse_handle(text: str, what: str = "handle") -> int:
    """A TPM handle written as ``0x`` (or ``0X``) and 1–8 hex digits, or in
    decimal without a leading zero. Why this strict: ``int(text, 0)`` would
    also take ``0x8100_0101``, ``+0x…``, octal, binary, surrounding spaces and
    non-ASCII digits, so two spellings that look different could name the same
    key (or a typo could name another one); tpm2-tools read ``0123`` as octal,
    Python as decimal.

    Args:
        text: the handle as written.
        what: names it in errors (``handle``, ``--ak-handle``, …).

    Returns:
        The handle.

    Raises:
        KeyURIError: any other spelling, or more than 32 bits.
    """
    if not isinstance(text, str) or not (_HEX_HANDLE.fullmatch(text) or _DEC_HANDLE.fullmatch(text)):
        leading_zero = isinstance(text, str) and text[:1] == "0" and text[1:].isdigit() and text.isascii()
        raise KeyURIError(f"{what} {text!r} is not a TPM handle: write 0x and 1-8 hex digits (0x81000101) "
                          "or decimal digits" + (" without a leading zero (tpm2-tools read it as octal)"
                                                 if leading_zero else "") + hex_hint(text))
    value = int(text, 16) if text[:2] in ("0x", "0X") else int(text, 10)
    if value > 0xFFFFFFFF:
        raise KeyURIError(f"{what} {text!r} is not a 32-bit TPM handle")
    return value


def handle_argument(value: object, what: str) -> int:
    """A handle given to the Python API, which takes an int (``0x81000101``).
    Text is parsed with :func:`parse_handle`, never guessed at.

    Args:
        value: the argument.
        what: names it in errors.

    Returns:
        The handle.

    Raises:
        KeyURIError: not an int (a bool is not one).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise KeyURIError(f"{what} is a {type(value).__name__}, not an int TPM handle (e.g. 0x81000101)")
    return value


def parse_persistent_handle(text: str, what: str) -> int:
    """:func:`parse_handle`, refusing anything outside the persistent range,
    with :func:`hex_hint` (``--handle 81000101`` means 0x81000101).

    Args:
        text: the handle as written.
        what: names it in errors.

    Returns:
        The handle.

    Raises:
        KeyURIError: not a handle, or not a persistent one.
    """
    value = parse_handle(text, what)
    if not is_persistent_handle(value):
        raise KeyURIError(f"{what} {format_handle(value)} is not a persistent handle (0x81000000–0x817fffff)"
                          + hex_hint(text, value))
    return value


def hex_hint(text: str, value: int | None = None) -> str:
    """For a handle of eight hex digits written without ``0x`` (``81000101``,
    read as decimal, or ``8100010a``, not a number at all): the handle it
    most likely meant.

    Args:
        text: the handle as written.
        value: what it was read as, if it was read.

    Returns:
        `` (… did you mean 0x81000101?)``; empty otherwise.
    """
    if not isinstance(text, str) or len(text) != 8 or not _HEX_DIGITS.fullmatch(text):
        return ""
    read = f"{text} is decimal, 0x{value:08x}; " if value is not None else ""
    return f" ({read}did you mean 0x{text}?)"


def check_tcti(tcti: str, where: str = "tcti") -> str:
    """Check a TCTI before the TSS sees it. Why: an empty ``tcti=`` (or
    ``--tcti ""``) must not fall back to ``device:/dev/tpmrm0``, silently
    selecting a TPM nobody named. The part before ``:`` is a library the TSS
    loads: a path there is ``dlopen()``ed as it stands, and ``cmd:`` runs its
    configuration as a shell command, so a key URI could run any code; only
    the TCTIs capseal documents are opened. A bad ``swtpm:``/``mssim:``
    option is named here, not left to the TSS's "a parameter has a bad value".

    Args:
        tcti: the TCTI.
        where: names it in errors (``tcti=``, ``--tcti``, …).

    Returns:
        The TCTI with surrounding spaces removed.

    Raises:
        KeyURIError: not a str, empty, a control character, a TCTI other than
            :data:`TCTI_NAMES`, or simulator options the TSS would refuse.
    """
    if not isinstance(tcti, str):
        raise KeyURIError(f"{where} is a {type(tcti).__name__}, not a TCTI string")
    text = tcti.strip()
    if not text:
        raise KeyURIError(f"{where} is empty; name the TPM, e.g. device:/dev/tpmrm0 or swtpm:host=127.0.0.1,port=2321 "
                          "(leave it out for the default device:/dev/tpmrm0)")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise KeyURIError(f"TCTI {text!r} holds a control character (the TSS reads it as a C string)")
    name, _, conf = text.partition(":")
    if name not in TCTI_NAMES:
        raise KeyURIError(f"TCTI {text!r}: {name!r} is not a TCTI capseal opens; use device:/dev/tpmrm0, "
                          "swtpm:host=127.0.0.1,port=2321, mssim:host=…,port=… or tabrmd:… (the TSS loads the name "
                          "as a library, and cmd: runs a command)")
    if name in ("swtpm", "mssim") and conf:
        _check_socket_conf(text, conf)
    return text


def _check_socket_conf(text: str, conf: str) -> None:
    """The ``host=…,port=…`` options of the swtpm and mssim TCTIs, as the TSS
    reads them: those two keys, each once, a decimal port 1–65535."""
    seen: set[str] = set()
    for part in conf.split(","):
        key, eq, value = part.partition("=")
        if not part:
            raise KeyURIError(f"TCTI {text!r} has an empty option (two commas); write host=…,port=…")
        if key not in ("host", "port") or not eq:
            raise KeyURIError(f"TCTI {text!r}: unknown option {part!r}; the simulator TCTIs take host=… and port=…")
        if key in seen:
            raise KeyURIError(f"TCTI {text!r}: {key}= given twice")
        seen.add(key)
        if key == "port" and not (_PORT.fullmatch(value) and int(value) <= 0xFFFF):
            raise KeyURIError(f"TCTI {text!r}: port {value!r} is not a TCP port (decimal 1-65535)")
        if key == "host" and not value:
            raise KeyURIError(f"TCTI {text!r}: host= is empty")
        if key == "host" and value.startswith("["):
            raise KeyURIError(f"TCTI {text!r}: write an IPv6 host without brackets (host=::1)")


def format_handle(handle: int) -> str:
    """A handle as capseal prints it.

    Args:
        handle: the handle.

    Returns:
        ``0x`` and eight lower-case hex digits.
    """
    return f"0x{handle:08x}"


def is_persistent_handle(handle: int) -> bool:
    """Whether a handle is in the owner hierarchy's persistent range (TCG handle registry).

    Args:
        handle: the handle.

    Returns:
        True for 0x81000000–0x817FFFFF.
    """
    return 0x81000000 <= handle <= 0x817FFFFF


@dataclass(frozen=True)
class TPMKeyURI:
    """A parsed ``tpm2:`` URI: one of ``handle``/``keyfile`` (or neither: the TPM itself)."""

    tcti: str = DEFAULT_TCTI
    handle: int | None = None
    keyfile: str | None = None
    ak_handle: int | None = None

    @property
    def names_key(self) -> bool:
        """Whether the URI names a key (a handle or a key file), not only a TPM."""
        return self.handle is not None or self.keyfile is not None

    def describe_key(self) -> str:
        """How the key is named in messages (never a secret).

        Returns:
            ``TPM key 0x81000101 on swtpm:…``, ``TPM key file /path on …`` or ``TPM …``.
        """
        if self.handle is not None:
            return f"TPM key {format_handle(self.handle)} on {self.tcti}"
        if self.keyfile is not None:
            return f"TPM key file {self.keyfile} on {self.tcti}"
        return f"TPM {self.tcti}"

    def to_uri(self) -> str:
        """The URI in canonical form: explicit TCTI, lower-case hex handles.

        Returns:
            The URI text.
        """
        if self.handle is not None:
            path = f"handle={format_handle(self.handle)}"
        elif self.keyfile is not None:
            path = f"keyfile={quote(self.keyfile, safe='/._-~+,:@')}"
        else:
            path = ""
        query = f"tcti={quote(self.tcti, safe='/:=,.-_@')}"
        if self.ak_handle is not None:
            query += f"&ak-handle={format_handle(self.ak_handle)}"
        return f"tpm2:{path}?{query}"


def _split_uri(uri: str) -> tuple[dict[str, str], dict[str, str]]:
    """(path attributes, query attributes) of a ``tpm2:`` URI, percent-decoded;
    refuses unknown, repeated and secret-carrying attributes."""
    if not isinstance(uri, str) or not uri.lower().startswith("tpm2:"):
        raise KeyURIError("a TPM key URI starts with tpm2:")
    body = uri[5:]
    if "#" in body:  # a fragment starts wherever '#' stands (RFC 3986 §3.5), in the path too
        raise KeyURIError("tpm2: URIs have no fragment; write a '#' in a key file's path as %23")
    path, _, query = body.partition("?")
    attrs: dict[str, str] = {}
    for part in filter(None, path.split(";")):
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in _PATH_KEYS:
            raise KeyURIError(f"unknown tpm2: path attribute {key!r}; use handle=0x81000101 or keyfile=/path")
        if key in attrs:
            raise KeyURIError(f"tpm2: attribute {key!r} given twice")
        attrs[key] = unquote(value)
    params: dict[str, str] = {}
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if key in ("pin-value", "pin", "auth", "password"):
            raise KeyURIError("TPM auth values are never accepted in a URI; pass pin= (or a secrets handler)")
        if not eq or key not in _QUERY_KEYS:
            raise KeyURIError(f"unknown tpm2: query attribute {key!r}; known: {sorted(_QUERY_KEYS)}")
        if key in params:
            raise KeyURIError(f"tpm2: query attribute {key!r} given twice")
        params[key] = unquote(value)
    return attrs, params


def explicit_tcti(uri: str) -> str | None:
    """The TCTI a ``tpm2:`` URI names in its ``tcti=`` attribute, checked as
    :func:`parse_tpm_uri` checks it.

    Args:
        uri: the URI.

    Returns:
        The TCTI, or None when the URI names none.

    Raises:
        KeyURIError: a malformed URI or TCTI.
    """
    _attrs, params = _split_uri(uri)
    return check_tcti(params["tcti"], "tcti=") if "tcti" in params else None


def parse_tpm_uri(uri: str, *, tcti: str | None = None, ak_handle: int | None = None) -> TPMKeyURI:
    """Parse a ``tpm2:`` URI, refusing anything unknown or ambiguous (a typo
    must not silently select another key or TPM). A relative key file path is
    made absolute against the working directory.

    Args:
        uri: the URI.
        tcti: overrides the URI's ``tcti=``.
        ak_handle: overrides the URI's ``ak-handle=``.

    Returns:
        The parsed URI (the default TCTI ``device:/dev/tpmrm0`` when none is named).

    Raises:
        KeyURIError: unknown or repeated attributes, an auth value in the URI,
            both handle= and keyfile=, a handle that is not persistent, an empty
            or NUL-holding key file path, a bad TCTI, or an ak-handle equal to the key's.
    """
    attrs, params = _split_uri(uri)
    if "handle" in attrs and "keyfile" in attrs:
        raise KeyURIError("a tpm2: URI names either handle= or keyfile=, not both")
    handle = parse_handle(attrs["handle"]) if "handle" in attrs else None
    if handle is not None and not is_persistent_handle(handle):
        raise KeyURIError(f"handle {format_handle(handle)} is not a persistent handle (0x81000000–0x817fffff)"
                          + hex_hint(attrs["handle"], handle))
    keyfile = attrs.get("keyfile")
    if keyfile is not None and not keyfile:
        raise KeyURIError("tpm2: keyfile= is empty")
    if keyfile is not None and "\x00" in keyfile:
        raise KeyURIError(f"tpm2: keyfile= {keyfile!r} contains a NUL byte (%00), which no file path can hold")
    if keyfile is not None and not keyfile.startswith("/"):
        # the file the working directory holds now, named so from anywhere: `keys create` printed
        # tpm2:keyfile=seal.tss (and custody recorded "seal.tss"), which a service started in
        # another directory could not open. Joined, not normalised: "link/.." is the kernel's to resolve
        keyfile = os.path.join(os.getcwd(), keyfile)
    if tcti is not None:
        resolved_tcti = check_tcti(tcti, "the TCTI given")
    elif "tcti" in params:
        resolved_tcti = check_tcti(params["tcti"], "tcti=")
    else:
        resolved_tcti = DEFAULT_TCTI
    ak = ak_handle if ak_handle is not None else (parse_handle(params["ak-handle"], "ak-handle")
                                                  if "ak-handle" in params else None)
    if ak is not None and not is_persistent_handle(ak):
        raise KeyURIError(f"ak-handle {format_handle(ak)} is not a persistent handle"
                          + (hex_hint(params["ak-handle"], ak) if ak_handle is None else ""))
    if ak is not None and ak == handle:
        raise KeyURIError(f"ak-handle {format_handle(ak)} is the signing key's own handle; the attestation key "
                          "is a different (restricted) key at a handle of its own, e.g. 0x81000102")
    return TPMKeyURI(tcti=resolved_tcti, handle=handle, keyfile=keyfile, ak_handle=ak)


# ---------------------------------------------------------------------------- minimal DER


def _der_len(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw


def _tlv(tag: int, value: bytes) -> bytes:
    return bytes([tag]) + _der_len(len(value)) + value


def _der_int(value: int) -> bytes:
    raw = value.to_bytes(max(1, (value.bit_length() + 8) // 8), "big")  # room for a sign bit
    while len(raw) > 1 and raw[0] == 0 and raw[1] < 0x80:
        raw = raw[1:]
    return _tlv(0x02, raw)


def _der_oid(dotted: str) -> bytes:
    parts = [int(p) for p in dotted.split(".")]
    out = bytearray([40 * parts[0] + parts[1]])
    for p in parts[2:]:
        chunk = [p & 0x7F]
        p >>= 7
        while p:
            chunk.append(0x80 | (p & 0x7F))
            p >>= 7
        out += bytes(reversed(chunk))
    return _tlv(0x06, bytes(out))


def _oid_text(raw: bytes) -> str:
    if not raw:
        raise ValueError("empty OID")
    parts = [raw[0] // 40, raw[0] % 40]
    acc = 0
    for b in raw[1:]:
        acc = (acc << 7) | (b & 0x7F)
        if not b & 0x80:
            parts.append(acc)
            acc = 0
    return ".".join(str(p) for p in parts)


def _read_tlv(data: bytes, pos: int) -> tuple[int, bytes, int]:
    """(tag, value, next position); single-byte tags only (all TPMKey uses)."""
    if pos + 2 > len(data):
        raise ValueError("truncated DER")
    tag = data[pos]
    length = data[pos + 1]
    pos += 2
    if length & 0x80:
        n = length & 0x7F
        if n == 0 or n > 4 or pos + n > len(data):
            raise ValueError("bad DER length")
        length = int.from_bytes(data[pos:pos + n], "big")
        pos += n
    if pos + length > len(data):
        raise ValueError("truncated DER value")
    return tag, data[pos:pos + length], pos + length


@dataclass(frozen=True)
class TPMKeyFile:
    """A ``TSS2 PRIVATE KEY``: the public and (SRK-wrapped) private blobs of a
    TPM key, its parent, and whether its auth value is empty. The private
    blob is encrypted by the parent, so the file is useless off this TPM."""

    public: bytes  # marshaled TPM2B_PUBLIC
    private: bytes  # marshaled TPM2B_PRIVATE
    parent: int = TPM_RH_OWNER
    empty_auth: bool = True
    description: str | None = None

    def __repr__(self) -> str:
        return f"TPMKeyFile(parent=0x{self.parent:08x}, empty_auth={self.empty_auth}, {len(self.private)}-byte private blob)"

    def to_der(self) -> bytes:
        """The key file's ASN.1 ``TPMKey``.

        Returns:
            The DER bytes.
        """
        body = _der_oid(_LOADABLE_OID)
        body += _tlv(0xA0, _tlv(0x01, b"\xff" if self.empty_auth else b"\x00"))
        if self.description is not None:
            body += _tlv(0xA4, _tlv(0x0C, self.description.encode("utf-8")))
        body += _der_int(self.parent) + _tlv(0x04, self.public) + _tlv(0x04, self.private)
        return _tlv(0x30, body)

    def to_pem(self) -> bytes:
        """The key file as written to disk.

        Returns:
            The ``TSS2 PRIVATE KEY`` PEM bytes.
        """
        b64 = base64.b64encode(self.to_der()).decode("ascii")
        lines = [b64[i:i + 64] for i in range(0, len(b64), 64)]
        return ("-----BEGIN TSS2 PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END TSS2 PRIVATE KEY-----\n").encode()

    @classmethod
    def from_der(cls, data: bytes, where: str = "key file") -> TPMKeyFile:
        """Read an ASN.1 ``TPMKey``; only loadable keys without policies are accepted.

        Args:
            data: the DER bytes.
            where: names the file in errors.

        Returns:
            The key file.

        Raises:
            KeyURIError: not a TPMKey, another key type, a policy or secret, or a malformed structure.
        """
        try:
            tag, seq, end = _read_tlv(data, 0)
            if tag != 0x30 or end != len(data):
                raise ValueError("not a single DER SEQUENCE")
            tag, oid, pos = _read_tlv(seq, 0)
            if tag != 0x06:
                raise ValueError("no key type OID")
            oid_text = _oid_text(oid)
            if oid_text != _LOADABLE_OID:
                raise KeyURIError(f"{where}: TPMKey type {oid_text} is not a loadable key ({_LOADABLE_OID}); "
                                  "importable and sealed keys are not supported")
            empty_auth, description, parent = False, None, None
            public = private = None
            while pos < len(seq):
                tag, value, pos = _read_tlv(seq, pos)
                if tag == 0xA0:
                    itag, ival, _ = _read_tlv(value, 0)
                    if itag != 0x01 or len(ival) != 1:
                        raise ValueError("emptyAuth is not a BOOLEAN")
                    empty_auth = ival != b"\x00"  # some engines write TRUE as 0x01
                elif tag in (0xA1, 0xA3):
                    raise KeyURIError(f"{where}: the key is bound to a TPM policy; capseal signs only with "
                                      "password (or empty) authorization")
                elif tag == 0xA2:
                    raise KeyURIError(f"{where}: importable keys (with a secret) are not supported")
                elif tag == 0xA4:
                    _, ival, _ = _read_tlv(value, 0)
                    description = ival.decode("utf-8", "replace")
                elif tag == 0xA5:
                    continue
                elif tag == 0x02 and parent is None:
                    parent = int.from_bytes(value, "big", signed=True)
                elif tag == 0x04 and public is None:
                    public = value
                elif tag == 0x04 and private is None:
                    private = value
                else:
                    raise ValueError(f"unexpected DER tag 0x{tag:02x}")
            if parent is None or public is None or private is None:
                raise ValueError("parent, pubkey or privkey missing")
            if not 0 <= parent <= 0xFFFFFFFF:  # never masked: 0x140000001 must not read as the SRK
                raise ValueError(f"parent {parent:#x} is not a 32-bit TPM handle")
        except KeyURIError:
            raise
        except ValueError as exc:
            raise KeyURIError(f"{where} is not a valid TSS2 PRIVATE KEY: {exc}") from None
        return cls(public=public, private=private, parent=parent, empty_auth=empty_auth,
                   description=description)

    @classmethod
    def from_pem(cls, data: bytes, where: str = "key file") -> TPMKeyFile:
        """Read a ``TSS2 PRIVATE KEY`` PEM.

        Args:
            data: the file's bytes.
            where: names the file in errors.

        Returns:
            The key file.

        Raises:
            KeyURIError: no such PEM block, a block that is not base64, or see :meth:`from_der`.
        """
        text = data.decode("ascii", "replace")
        m = re.search(r"-----BEGIN TSS2 PRIVATE KEY-----(.*?)-----END TSS2 PRIVATE KEY-----", text, re.S)
        if m is None:
            raise KeyURIError(f"{where} holds no '-----BEGIN {_PEM_LABEL}-----' block")
        try:
            der = base64.b64decode("".join(m.group(1).split()), validate=True)
        except ValueError:
            raise KeyURIError(f"{where}: the {_PEM_LABEL} block is not base64") from None
        return cls.from_der(der, where)
