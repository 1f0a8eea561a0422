"""RFC 7512 ``pkcs11:`` URIs: parse strictly, print without secrets, find the module.

Why strict: a key URI decides *which key signs*. A URI this module cannot fully
honour (an unknown path attribute, a repeated attribute, an unencoded space, a
query attribute in the path) is refused with :class:`KeyURIError` instead of
being read loosely and maybe matching a key the operator did not mean.

Grammar (RFC 7512 §2.3)::

    pk11-URI   = "pkcs11:" pk11-path [ "?" pk11-query ]
    pk11-path  = [ pk11-pattr *(";" pk11-pattr) ]
    pk11-query = [ pk11-qattr *("&" pk11-qattr) ]

Path attributes: token, manufacturer, serial, model, library-manufacturer,
library-description, library-version, object, type, id, slot-manufacturer,
slot-description, slot-id. Query attributes: pin-source, pin-value,
module-name, module-path (vendor query attributes are accepted and ignored:
they say how to reach a token, never which key). Values are pct-decoded;
``id`` is raw bytes, everything else UTF-8 text.

Secrets: ``pin-value`` is never echoed in an error, ``repr`` or
:meth:`PKCS11URI.to_string` (unless asked explicitly), and errors about query
values never quote the value.
"""

from __future__ import annotations

import os
import re
import sysconfig
from dataclasses import InitVar, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote_to_bytes, urlsplit

from capseal.errors import KeyURIError, SignerUnavailableError
from capseal.keys.secret import Secret, as_secret, read_pin_file

__all__ = [
    "PKCS11URI",
    "parse_pkcs11_uri",
    "pct_encode",
    "resolve_module",
    "check_module_allowed",
    "module_allowlist",
    "read_pin_source",
    "MODULE_ALLOWLIST_ENV",
    "KNOWN_MODULES",
]

SCHEME = "pkcs11:"
MODULE_ALLOWLIST_ENV = "CAPSEAL_PKCS11_MODULES"

PATH_ATTRS = (
    "token", "manufacturer", "serial", "model",
    "library-manufacturer", "library-description", "library-version",
    "object", "type", "id",
    "slot-manufacturer", "slot-description", "slot-id",
)
QUERY_ATTRS = ("pin-source", "pin-value", "module-name", "module-path")
TYPES = ("public", "private", "cert", "secret-key", "data")

_UNRESERVED = "A-Za-z0-9\\-._~"
# RFC 7512: pk11-res-avail = ":" / "[" / "]" / "@" / "!" / "$" / "'" / "(" / ")" / "*" / "+" / "," / "="
_RES_AVAIL = ":\\[\\]@!$'()*+,="
_PCT = "%[0-9A-Fa-f]{2}"
_PATH_VALUE = re.compile(f"(?:[{_UNRESERVED}{_RES_AVAIL}&]|{_PCT})*")
_QUERY_VALUE = re.compile(f"(?:[{_UNRESERVED}{_RES_AVAIL}/?|]|{_PCT})*")
_ATTR_NAME = re.compile(r"[A-Za-z0-9_-]+")
_DIGITS = re.compile(r"[0-9]+")
_LIB_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_SECRET_QUERY = frozenset({"pin-value"})

# characters printed unencoded by to_string(); everything else is %XX
_SAFE_PATH = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~:[]@!$'()*+,=&")
_SAFE_QUERY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~:[]@!$'()*+,=/?|")

#: Where common PKCS#11 modules live (Debian/Ubuntu paths first). For the README
#: and ``doctor``; capseal never loads one that the URI does not name.
KNOWN_MODULES = {
    "SoftHSM2": "/usr/lib/softhsm/libsofthsm2.so",
    "YubiHSM 2": "/usr/lib/x86_64-linux-gnu/pkcs11/yubihsm_pkcs11.so",
    "Nitrokey HSM (OpenSC)": "/usr/lib/x86_64-linux-gnu/opensc-pkcs11.so",
    "OpenSC": "/usr/lib/x86_64-linux-gnu/opensc-pkcs11.so",
    "p11-kit proxy": "/usr/lib/x86_64-linux-gnu/p11-kit-proxy.so",
    "tpm2-pkcs11": "/usr/lib/x86_64-linux-gnu/pkcs11/libtpm2_pkcs11.so",
}


#: the modules a "names no module" hint lists (one line each, no duplicates)
_HINTED_MODULES = tuple((name, path) for name, path in KNOWN_MODULES.items() if name not in ("OpenSC", "p11-kit proxy"))


def pct_encode(value: str | bytes, *, query: bool = False, all_bytes: bool = False) -> str:
    """Percent-encode a value for a path (default) or query attribute.

    Args:
        value: text (encoded as UTF-8) or bytes.
        query: encode for the query (``/``, ``?`` and ``|`` stay as they are).
        all_bytes: encode every byte (RFC 7512's advice for ``id``).

    Returns:
        The encoded value.
    """
    raw = value.encode("utf-8") if isinstance(value, str) else value
    safe = _SAFE_QUERY if query else _SAFE_PATH
    out = []
    for b in raw:
        ch = chr(b)
        out.append(ch if (not all_bytes and b < 0x80 and ch in safe) else f"%{b:02X}")
    return "".join(out)


class _PinValue:
    """``PKCS11URI.pin_value``: the constructor takes it (an ``InitVar``, text
    or a :class:`Secret`), the instance keeps it only as a Secret in ``_pin``,
    so ``dataclasses.asdict``/``astuple``/``fields``, ``vars()`` and the repr
    never hold the PIN as text; reading ``uri.pin_value`` gives the text back
    (``uri.pin_secret``, the Secret)."""

    def __get__(self, obj: object, objtype: type | None = None) -> str | None:
        if obj is None:
            return None  # the dataclass reads this as the default
        hidden = vars(obj).get("_pin")
        return hidden.reveal() if isinstance(hidden, Secret) else None


@dataclass(frozen=True)
class PKCS11URI:
    """A parsed ``pkcs11:`` URI. Text attributes are decoded; ``id`` is bytes.
    ``pin_value`` is not a dataclass field (see :class:`_PinValue`)."""

    token: str | None = None
    manufacturer: str | None = None
    serial: str | None = None
    model: str | None = None
    library_manufacturer: str | None = None
    library_description: str | None = None
    library_version: str | None = None
    object: str | None = None
    type: str | None = None
    id: bytes | None = None
    slot_manufacturer: str | None = None
    slot_description: str | None = None
    slot_id: int | None = None
    module_path: str | None = None
    module_name: str | None = None
    pin_source: str | None = None
    if TYPE_CHECKING:  # what callers see: an optional str attribute and constructor keyword
        pin_value: str | None = None
    else:
        pin_value: InitVar[str | None] = _PinValue()
    vendor_query: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self, pin_value: str | Secret | None = None) -> None:
        object.__setattr__(self, "_pin", as_secret(pin_value, "the URI's pin-value"))

    @property
    def pin_secret(self) -> Secret | None:
        """The URI's pin-value, held as a :class:`Secret` (None when it has none)."""
        hidden = vars(self).get("_pin")
        return hidden if isinstance(hidden, Secret) else None

    # ------------------------------------------------------------------ printing

    def to_string(self, *, include_pin: bool = False) -> str:
        """The URI in canonical form (path attributes in RFC order).

        Args:
            include_pin: keep the ``pin-value`` (left out by default).

        Returns:
            The URI text.
        """
        path: list[str] = []
        for name in PATH_ATTRS:
            value = getattr(self, name.replace("-", "_"))
            if value is None:
                continue
            if name == "id":
                path.append(f"id={pct_encode(value, all_bytes=True)}")
            elif name == "slot-id":
                path.append(f"slot-id={value}")
            else:
                path.append(f"{name}={pct_encode(value)}")
        query: list[str] = []
        for name in QUERY_ATTRS:
            value = getattr(self, name.replace("-", "_"))
            if value is None or (name == "pin-value" and not include_pin):
                continue
            query.append(f"{name}={pct_encode(value, query=True)}")
        return SCHEME + ";".join(path) + ("?" + "&".join(query) if query else "")

    def __str__(self) -> str:
        return self.to_string()

    def without_pin(self) -> PKCS11URI:
        """The same URI without its pin-value.

        Returns:
            A new PKCS11URI.
        """
        return replace(self, pin_value=None)

    def with_id(self, key_id: bytes) -> PKCS11URI:
        """The same URI naming another ``id``.

        Args:
            key_id: the CKA_ID.

        Returns:
            A new PKCS11URI.
        """
        return replace(self, id=key_id)

    def describe_key(self) -> str:
        """How the key is named, for messages.

        Returns:
            ``object='k1' id=01``, or "any private key".
        """
        parts = []
        if self.object is not None:
            parts.append(f"object={self.object!r}")
        if self.id is not None:
            parts.append(f"id={self.id.hex()}")
        return " ".join(parts) or "any private key"

    def describe_token(self) -> str:
        """How the token is named, for messages.

        Returns:
            ``token 'agents'`` (or by serial, model or manufacturer), or "the module's only token".
        """
        if self.token is not None:
            return f"token {self.token!r}"
        for attr in ("serial", "model", "manufacturer"):
            value = getattr(self, attr)
            if value is not None:
                return f"token with {attr} {value!r}"
        return "the module's only token"


def _decode(value: str, name: str, *, secret: bool) -> bytes:
    try:
        return unquote_to_bytes(value)
    except Exception:  # pragma: no cover - unquote_to_bytes is lenient; validated before
        raise KeyURIError(f"pkcs11 URI: cannot pct-decode {name}") from None


def _text(raw: bytes, name: str, *, secret: bool) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        what = name if secret else f"{name} value"
        raise KeyURIError(f"pkcs11 URI: {what} is not UTF-8 after pct-decoding") from None


def _what_is_wrong(value: str, allowed: re.Pattern[str]) -> str:
    for i, c in enumerate(value):
        if c == "%":
            if not re.fullmatch(_PCT, value[i : i + 3]):
                return f"has a bad pct escape {value[i:i + 3]!r} (want %XX with two hex digits)"
        elif not allowed.fullmatch(c):
            return f"contains {c!r}, which must be pct-encoded (e.g. a space is %20)"
    return "is malformed"  # pragma: no cover


def _split_attr(attr: str, where: str) -> tuple[str, str]:
    if attr == "":
        sep = ";" if where == "path" else "&"
        raise KeyURIError(f"pkcs11 URI: empty attribute in the {where} (a stray {sep!r})")
    name, eq, value = attr.partition("=")
    if (not eq or not _ATTR_NAME.fullmatch(name)) and name[:3].lower() == "pin":
        # a pin-value with its '=' mistyped (pin-value:1234, pin-value%3D1234): the "name" holds the PIN
        raise KeyURIError(f"pkcs11 URI: a {where} attribute starting with 'pin' is malformed (not quoted: it may "
                          "hold the PIN); write pin-value=… with a plain '='")
    if not eq:
        raise KeyURIError(f"pkcs11 URI: {where} attribute {name[:40]!r} has no '=value'")
    if not _ATTR_NAME.fullmatch(name):
        raise KeyURIError(f"pkcs11 URI: {name[:40]!r} is not an attribute name (letters, digits, '-', '_')")
    return name.lower() if name.lower() in PATH_ATTRS + QUERY_ATTRS else name, value


#: Said instead of anything about a query attribute that follows a pin-value:
#: with an unencoded '&' in the PIN, the "attribute" is the PIN's tail.
_AFTER_PIN = ("pkcs11 URI: a query attribute after pin-value is malformed or not one capseal knows "
              "(not quoted: it may be part of the PIN); pct-encode '&' in pin-value as %26, and put other "
              "query attributes before pin-value")


def _parse_query(query_part: str, values: dict[str, object], vendor_query: list[tuple[str, str]]) -> None:
    """The query attributes into ``values`` (vendor ones into ``vendor_query``).

    Once a pin-value has been read, no later attribute's name or value is
    quoted in an error (an unencoded '&' in the PIN splits it there), and an
    unknown attribute after it is refused rather than kept as a vendor
    attribute: ``pin-value=4821&tail7=93`` would otherwise log in with a
    cut-short PIN."""
    after_pin = False
    for attr in query_part.split("&"):
        failure: KeyURIError | None = None
        try:
            _query_attr(attr, values, vendor_query, after_pin=after_pin)
        except KeyURIError as exc:
            failure = exc
        if failure is not None:  # raised outside the handler: no chained error quoting the attribute
            raise KeyURIError(_AFTER_PIN) if after_pin else failure
        after_pin = after_pin or "pin_value" in values


def _query_attr(attr: str, values: dict[str, object], vendor_query: list[tuple[str, str]], *, after_pin: bool) -> None:
    """One ``name=value`` of the query, checked and stored."""
    name, value = _split_attr(attr, "query")
    if name in PATH_ATTRS:
        raise KeyURIError(f"pkcs11 URI: {name} is a path attribute; put it before '?'")
    secret = name in _SECRET_QUERY
    if not _QUERY_VALUE.fullmatch(value):
        if secret:  # never quote any part of a PIN
            raise KeyURIError(f"pkcs11 URI: {name} has a bad pct escape or a character that must be pct-encoded")
        raise KeyURIError(f"pkcs11 URI: {name} {_what_is_wrong(value, _QUERY_VALUE)}")
    if name not in QUERY_ATTRS:
        if after_pin:
            raise KeyURIError(_AFTER_PIN)
        vendor_query.append((name, value))  # how to reach a token; never which key
        return
    key = name.replace("-", "_")
    if key in values:
        raise KeyURIError(f"pkcs11 URI: query attribute {name} appears more than once")
    decoded = _text(_decode(value, name, secret=secret), name, secret=secret)
    values[key] = Secret(decoded, "the URI's pin-value") if secret else decoded
    del decoded


def parse_pkcs11_uri(uri: str) -> PKCS11URI:
    """Parse ``uri`` per RFC 7512, refusing anything malformed or ambiguous.

    Refused: a missing ``pkcs11:`` scheme, a fragment, empty attributes, a
    standard attribute given twice, a query attribute in the path (or the
    reverse), an unknown path attribute (capseal cannot honour it), a character
    RFC 3986 requires to be pct-encoded (e.g. a space), a bad pct escape,
    ``type`` outside RFC 7512's list, non-numeric ``slot-id`` or
    ``library-version``, and both ``pin-source`` and ``pin-value`` (RFC 7512:
    such a URI SHOULD be refused).

    Args:
        uri: the URI text.

    Returns:
        The parsed URI (its pin-value held as a Secret).

    Raises:
        KeyURIError: what is wrong, never quoting a ``pin-value``.
    """
    if not isinstance(uri, str):
        raise KeyURIError("a pkcs11 URI is a string")
    text = uri.strip()
    if text[: len(SCHEME)].lower() != SCHEME:
        raise KeyURIError("a PKCS#11 key URI starts with 'pkcs11:' (RFC 7512)")
    body = text[len(SCHEME):]
    if "#" in body:
        raise KeyURIError("pkcs11 URI: a fragment ('#') is not allowed; pct-encode '#' as %23")
    path_part, qmark, query_part = body.partition("?")
    values: dict[str, object] = {}
    vendor_query: list[tuple[str, str]] = []

    if path_part:
        for attr in path_part.split(";"):
            name, value = _split_attr(attr, "path")
            if name in QUERY_ATTRS:
                raise KeyURIError(f"pkcs11 URI: {name} is a query attribute; put it after '?'")
            if name not in PATH_ATTRS:
                raise KeyURIError(
                    f"pkcs11 URI: unknown path attribute {name!r}; capseal refuses URIs it cannot fully honour "
                    f"(known: {', '.join(PATH_ATTRS)})"
                )
            if not _PATH_VALUE.fullmatch(value):
                raise KeyURIError(f"pkcs11 URI: {name} {_what_is_wrong(value, _PATH_VALUE)}")
            key = name.replace("-", "_")
            if key in values:
                raise KeyURIError(f"pkcs11 URI: path attribute {name} appears more than once")
            raw = _decode(value, name, secret=False)
            if name == "id":
                values[key] = raw
            elif name == "slot-id":
                if not _DIGITS.fullmatch(value):
                    raise KeyURIError("pkcs11 URI: slot-id is a decimal number")
                values[key] = int(value)
            elif name == "library-version":
                if not _LIB_VERSION.fullmatch(value):
                    raise KeyURIError("pkcs11 URI: library-version is M or M.N (digits)")
                values[key] = value
            elif name == "type":
                kind = _text(raw, name, secret=False).lower()  # RFC 5234 literals are case-insensitive
                if kind not in TYPES:
                    raise KeyURIError(f"pkcs11 URI: type must be one of {', '.join(TYPES)}")
                values[key] = kind
            else:
                values[key] = _text(raw, name, secret=False)

    if qmark and query_part:
        _parse_query(query_part, values, vendor_query)

    if "pin_source" in values and "pin_value" in values:
        raise KeyURIError("pkcs11 URI: give pin-source or pin-value, not both (RFC 7512 §2.3)")
    module_path = values.get("module_path")
    if isinstance(module_path, str) and not os.path.isabs(module_path):
        raise KeyURIError("pkcs11 URI: module-path must be an absolute path")
    if isinstance(module_path, str) and "\x00" in module_path:  # os calls would raise a bare ValueError
        raise KeyURIError("pkcs11 URI: module-path holds a NUL byte (%00), which no file name can")
    module_name = values.get("module_name")
    if isinstance(module_name, str) and ("/" in module_name or module_name in ("", ".", "..")):
        raise KeyURIError("pkcs11 URI: module-name is a file name without '/', e.g. softhsm2")
    return PKCS11URI(**values, vendor_query=tuple(vendor_query))  # type: ignore[arg-type]


# ---------------------------------------------------------------------- modules


def _module_dirs() -> list[str]:
    multiarch = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    return [
        f"/usr/lib/{multiarch}/pkcs11", "/usr/lib/pkcs11", "/usr/lib64/pkcs11", "/usr/local/lib/pkcs11",
        "/usr/lib/softhsm", f"/usr/lib/{multiarch}/softhsm", f"/usr/lib/{multiarch}", "/usr/lib64", "/usr/local/lib",
    ]


def _candidates(directory: str, name: str) -> list[Path]:
    names = [name] if name.endswith(".so") or ".so." in name else [f"lib{name}.so", f"{name}.so", f"{name}-pkcs11.so", name]
    return [Path(directory) / n for n in names]


def resolve_module(uri: PKCS11URI) -> str:
    """The module file the URI names: ``module-path`` (a file, or a directory
    searched for ``module-name``), else ``module-name`` in the usual module
    directories. RFC 7512 leaves using both implementation-specific; here
    module-path wins and module-name only picks a file inside a directory.

    Args:
        uri: the parsed URI.

    Returns:
        The module's path.

    Raises:
        KeyURIError: the URI names no module, or a directory without module-name.
        SignerUnavailableError: the module named is not found.
    """
    if uri.module_path is not None:
        p = Path(uri.module_path)
        if p.is_dir():
            if uri.module_name is None:
                raise KeyURIError(f"pkcs11 URI: module-path {p} is a directory; add module-name= to pick the module in it")
            for cand in _candidates(str(p), uri.module_name):
                if cand.is_file():
                    return str(cand)
            raise SignerUnavailableError(f"PKCS#11 module {uri.module_name!r} not found in {p}")
        return str(p)
    if uri.module_name is not None:
        for directory in _module_dirs():
            for cand in _candidates(directory, uri.module_name):
                if cand.is_file():
                    return str(cand)
        raise SignerUnavailableError(
            f"PKCS#11 module {uri.module_name!r} not found in {', '.join(_module_dirs()[:5])}, …; give module-path="
        )
    raise KeyURIError(  # the hint is the doctor's fix: "install the module" was wrong for a URI that names none
        "pkcs11 URI names no module: add ?module-path=/path/to/module.so "
        f"(SoftHSM2: {KNOWN_MODULES['SoftHSM2']})",
        hint="name the token vendor's PKCS#11 module in the URI's query: ?module-path=/absolute/path/to/module.so "
             "(common ones on Debian/Ubuntu: " + "; ".join(f"{name} {path}" for name, path in _HINTED_MODULES) + ")",
    )


def module_allowlist(explicit: object = None) -> list[list[str]]:
    """The allow-lists in force: the ``module_allowlist=`` argument and the
    ``CAPSEAL_PKCS11_MODULES`` environment variable (colon-separated). A module
    must be on *every* list that is set, so a caller cannot widen what the
    operator's environment allows.

    Args:
        explicit: a list of paths, one path, a colon-separated string, or None.

    Returns:
        Each list in force (none: any module may be loaded).
    """
    lists: list[list[str]] = []
    if explicit is not None:
        if isinstance(explicit, str):
            items = [s for s in explicit.split(os.pathsep) if s]
        elif isinstance(explicit, os.PathLike):  # one path (a Path is not a list of its characters)
            items = [os.fspath(explicit)]
        else:
            items = [os.fspath(s) if isinstance(s, os.PathLike) else str(s) for s in explicit]  # type: ignore[attr-defined]
        lists.append(items)
    env = os.environ.get(MODULE_ALLOWLIST_ENV)
    if env is not None:
        lists.append([s for s in env.split(os.pathsep) if s])
    return lists


def check_module_allowed(path: str, explicit: object = None) -> str:
    """Refuse a module unless it is on every allow-list in force, comparing
    real paths (symlinks resolved). Runs *before* the module is loaded:
    loading a shared object runs its code.

    Args:
        path: the module's path.
        explicit: the caller's allow-list (see :func:`module_allowlist`).

    Returns:
        The module's real path.

    Raises:
        SignerUnavailableError: the module is not on a list in force.
    """
    real = os.path.realpath(path)
    for allowed in module_allowlist(explicit):
        reals = {os.path.realpath(a) for a in allowed}
        if real not in reals:
            raise SignerUnavailableError(
                f"PKCS#11 module {path} is not on the module allow-list "
                f"({MODULE_ALLOWLIST_ENV} or module_allowlist=); refusing to load it",
                hint=f"add {real} to {MODULE_ALLOWLIST_ENV} (colon-separated) if this module is trusted",
            )
    return real


# ---------------------------------------------------------------------- PIN files


def read_pin_source(source: str) -> Secret:
    """The PIN from a ``pin-source`` (a ``file:`` URI or a file path), held as
    a :class:`~capseal.keys.secret.Secret`. The file holds the PIN (one
    trailing newline is dropped). Program sources (``|command``) are
    refused: capseal does not run commands named in URIs.

    Args:
        source: the URI's pin-source value.

    Returns:
        The PIN.

    Raises:
        KeyURIError: the source is a program, names no readable file, or the file is not UTF-8 text.
        SecretFileExposedError: other users can read or change the file.
    """
    if source.startswith("|"):
        raise KeyURIError("pkcs11 URI: pin-source programs ('|command') are not supported; use a file")
    if source.lower().startswith("file:"):
        parts = urlsplit(source)
        if parts.netloc not in ("", "localhost"):
            raise KeyURIError("pkcs11 URI: pin-source file: URIs must name a local file")
        try:
            path = unquote_to_bytes(parts.path).decode("utf-8", "strict")
        except UnicodeDecodeError:
            path = None
        if path is None:  # raised outside the handler: no chained error quoting the bytes
            raise KeyURIError("pkcs11 URI: pin-source file: URI's path is not UTF-8 after pct-decoding")
    else:
        path = source
    if not path:
        raise KeyURIError("pkcs11 URI: pin-source names no file")
    if "\x00" in path:  # reading it would raise a bare ValueError
        raise KeyURIError("pkcs11 URI: pin-source holds a NUL byte (%00), which no file name can")
    return read_pin_file(path, f"pkcs11 URI: pin-source {path}")
