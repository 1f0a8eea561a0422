"""Pure-Python readers for the few TPM 2.0 wire structures a quote verifier needs.

Why not tpm2-pytss here: verification must run where no TSS is installed (an
auditor's laptop, CI), and a verifier that parses with the same library that
produced the bytes shares its bugs. These readers follow TPM 2.0 Part 2
(Structures) for ``TPMS_ATTEST`` (quote), ``TPMT_SIGNATURE`` (ECDSA, RSASSA,
RSAPSS) and ``TPMT_PUBLIC`` (ECC, RSA); anything else is refused with
:class:`WireError`. The test suite cross-checks them against tpm2-pytss.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, rsa

__all__ = [
    "WireError",
    "TPM_GENERATED_VALUE",
    "TPM_ST_ATTEST_QUOTE",
    "ALG",
    "HASH_NAMES",
    "HASH_ALGS",
    "PCRBank",
    "Attest",
    "Signature",
    "PublicArea",
    "parse_attest",
    "parse_signature",
    "parse_public",
    "marshal_pcr_selection",
]

TPM_GENERATED_VALUE = 0xFF544347
TPM_ST_ATTEST_QUOTE = 0x8018


class ALG:
    RSA = 0x0001
    SHA1 = 0x0004
    SHA256 = 0x000B
    SHA384 = 0x000C
    SHA512 = 0x000D
    NULL = 0x0010
    RSASSA = 0x0014
    RSAPSS = 0x0016
    ECDSA = 0x0018
    ECC = 0x0023


#: TPM hash algorithm id -> hashlib name
HASH_NAMES: dict[int, str] = {ALG.SHA1: "sha1", ALG.SHA256: "sha256", ALG.SHA384: "sha384", ALG.SHA512: "sha512"}
HASH_ALGS: dict[str, int] = {v: k for k, v in HASH_NAMES.items()}

_CURVES: dict[int, ec.EllipticCurve] = {0x0003: ec.SECP256R1(), 0x0004: ec.SECP384R1(), 0x0005: ec.SECP521R1()}

# TPMA_OBJECT bits
FIXED_TPM = 0x00000002
FIXED_PARENT = 0x00000010
SENSITIVE_DATA_ORIGIN = 0x00000020
RESTRICTED = 0x00010000
DECRYPT = 0x00020000
SIGN_ENCRYPT = 0x00040000


class WireError(ValueError):
    """Bytes that are not the TPM structure they were supposed to be."""


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise WireError(f"truncated at byte {self.pos} (wanted {n} more)")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int(struct.unpack(">H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def tpm2b(self) -> bytes:
        return self.take(self.u16())

    def end(self, what: str) -> None:
        if self.pos != len(self.data):
            raise WireError(f"{len(self.data) - self.pos} trailing bytes after {what}")


@dataclass(frozen=True)
class PCRBank:
    """One TPMS_PCR_SELECTION: a hash bank and the PCR indices selected in it."""

    hash_alg: int
    pcrs: tuple[int, ...]
    size_of_select: int = 3

    @property
    def hash_name(self) -> str:
        """The bank's hash name (``sha256``, …; ``0x…`` for one capseal does not name)."""
        return HASH_NAMES.get(self.hash_alg, f"0x{self.hash_alg:04x}")


@dataclass(frozen=True)
class Attest:
    """A parsed TPMS_ATTEST of type TPM_ST_ATTEST_QUOTE (other types keep
    ``pcr_select``/``pcr_digest`` empty)."""

    magic: int
    type: int
    qualified_signer: bytes
    extra_data: bytes
    clock: int
    reset_count: int
    restart_count: int
    safe: bool
    firmware_version: int
    pcr_select: tuple[PCRBank, ...]
    pcr_digest: bytes


def _pcr_selection(r: _Reader) -> tuple[PCRBank, ...]:
    count = r.u32()
    if count > 16:
        raise WireError(f"implausible PCR selection count {count}")
    banks = []
    for _ in range(count):
        alg = r.u16()
        size = r.u8()
        bitmap = r.take(size)
        pcrs = tuple(i * 8 + b for i, byte in enumerate(bitmap) for b in range(8) if byte >> b & 1)
        banks.append(PCRBank(alg, pcrs, size))
    return tuple(banks)


def marshal_pcr_selection(banks: tuple[PCRBank, ...]) -> bytes:
    """The TPML_PCR_SELECTION bytes of banks (for comparing selections exactly).

    Args:
        banks: the banks.

    Returns:
        The marshaled bytes.
    """
    out = struct.pack(">I", len(banks))
    for bank in banks:
        bitmap = bytearray(max(bank.size_of_select, (max(bank.pcrs, default=0) // 8) + 1))
        for i in bank.pcrs:
            bitmap[i // 8] |= 1 << (i % 8)
        out += struct.pack(">HB", bank.hash_alg, len(bitmap)) + bytes(bitmap)
    return out


def parse_attest(data: bytes) -> Attest:
    """Read a marshaled TPMS_ATTEST (the bytes the AK signed).

    Args:
        data: the bytes.

    Returns:
        The structure.

    Raises:
        WireError: the bytes are not one whole TPMS_ATTEST.
    """
    r = _Reader(bytes(data))
    magic = r.u32()
    typ = r.u16()
    signer = r.tpm2b()
    extra = r.tpm2b()
    clock, reset, restart, safe = r.u64(), r.u32(), r.u32(), r.u8()
    firmware = r.u64()
    banks: tuple[PCRBank, ...] = ()
    digest = b""
    if typ == TPM_ST_ATTEST_QUOTE:
        banks = _pcr_selection(r)
        digest = r.tpm2b()
        r.end("TPMS_ATTEST")
    return Attest(magic, typ, signer, extra, clock, reset, restart, bool(safe), firmware, banks, digest)


@dataclass(frozen=True)
class Signature:
    """A parsed TPMT_SIGNATURE. ``der`` is the ECDSA signature in DER form
    (what ``cryptography`` verifies); ``raw`` the RSA signature bytes."""

    sig_alg: int
    hash_alg: int
    der: bytes = b""
    raw: bytes = b""


def _der_int(value: bytes) -> bytes:
    v = value.lstrip(b"\x00") or b"\x00"
    if v[0] & 0x80:
        v = b"\x00" + v
    return b"\x02" + _der_len(len(v)) + v


def _der_len(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def parse_signature(data: bytes) -> Signature:
    """Read a marshaled TPMT_SIGNATURE (ECDSA, RSASSA or RSAPSS).

    Args:
        data: the bytes.

    Returns:
        The signature.

    Raises:
        WireError: another scheme, an empty component, or bytes left over.
    """
    r = _Reader(bytes(data))
    alg = r.u16()
    if alg == ALG.ECDSA:
        hash_alg = r.u16()
        sig_r, sig_s = r.tpm2b(), r.tpm2b()
        r.end("TPMT_SIGNATURE")
        if not sig_r or not sig_s:
            raise WireError("empty ECDSA r or s")
        body = _der_int(sig_r) + _der_int(sig_s)
        return Signature(alg, hash_alg, der=b"\x30" + _der_len(len(body)) + body)
    if alg in (ALG.RSASSA, ALG.RSAPSS):
        hash_alg = r.u16()
        raw = r.tpm2b()
        r.end("TPMT_SIGNATURE")
        return Signature(alg, hash_alg, raw=raw)
    raise WireError(f"signature algorithm 0x{alg:04x} is not supported")


@dataclass(frozen=True)
class PublicArea:
    """A parsed TPMT_PUBLIC: enough to name the key and check it is an AK."""

    type: int
    name_alg: int
    attributes: int
    scheme: int
    scheme_hash: int
    public_key: Any
    marshaled: bytes

    @property
    def name(self) -> bytes:
        """The TPM Name: nameAlg || H_nameAlg(TPMT_PUBLIC)."""
        hname = HASH_NAMES.get(self.name_alg)
        if hname is None:
            raise WireError(f"name algorithm 0x{self.name_alg:04x} is not supported")
        return struct.pack(">H", self.name_alg) + hashlib.new(hname, self.marshaled).digest()

    @property
    def is_restricted_signing_key(self) -> bool:
        """Whether the object is a restricted, fixedTPM|fixedParent, sensitiveDataOrigin signing key that cannot decrypt (an AK)."""
        want = RESTRICTED | SIGN_ENCRYPT | FIXED_TPM | FIXED_PARENT | SENSITIVE_DATA_ORIGIN
        return self.attributes & want == want and not self.attributes & DECRYPT


def _sym_def(r: _Reader) -> None:
    if r.u16() != ALG.NULL:
        r.u16()  # keyBits
        r.u16()  # mode


def parse_public(data: bytes) -> PublicArea:
    """Read a marshaled TPMT_PUBLIC (without the TPM2B size prefix).

    Args:
        data: the bytes.

    Returns:
        The public area.

    Raises:
        WireError: the bytes are not one whole TPMT_PUBLIC of an ECC or RSA key.
    """
    data = bytes(data)
    r = _Reader(data)
    typ, name_alg, attrs = r.u16(), r.u16(), r.u32()
    r.tpm2b()  # authPolicy
    if typ == ALG.ECC:
        _sym_def(r)
        scheme = r.u16()
        scheme_hash = r.u16() if scheme != ALG.NULL else ALG.NULL
        curve_id = r.u16()
        if r.u16() != ALG.NULL:  # kdf
            r.u16()
        x, y = r.tpm2b(), r.tpm2b()
        r.end("TPMT_PUBLIC")
        curve = _CURVES.get(curve_id)
        if curve is None:
            raise WireError(f"ECC curve 0x{curve_id:04x} is not supported")
        size = (curve.key_size + 7) // 8
        try:
            key: Any = ec.EllipticCurvePublicKey.from_encoded_point(
                curve, b"\x04" + x.rjust(size, b"\x00") + y.rjust(size, b"\x00")
            )
        except ValueError as exc:
            raise WireError(f"ECC point is not on the curve ({exc})") from None
    elif typ == ALG.RSA:
        _sym_def(r)
        scheme = r.u16()
        scheme_hash = r.u16() if scheme != ALG.NULL else ALG.NULL
        r.u16()  # keyBits
        exponent = r.u32() or 65537
        modulus = r.tpm2b()
        r.end("TPMT_PUBLIC")
        try:  # cryptography refuses n < 3 or a bad e with a bare ValueError: not the structure either
            key = rsa.RSAPublicNumbers(exponent, int.from_bytes(modulus, "big")).public_key()
        except ValueError as exc:
            raise WireError(f"RSA public key is not usable ({exc})") from None
    else:
        raise WireError(f"public key type 0x{typ:04x} is not supported")
    return PublicArea(typ, name_alg, attrs, scheme, scheme_hash, key, data)
