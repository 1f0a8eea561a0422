"""What a TPM says it is: manufacturer, vendor strings, firmware and
specification version, the algorithms it lists, and from these whether it
is a software TPM (reported so, never as hardware).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpm2_pytss.constants import TPM2_CAP, TPM2_PT

__all__ = ["TPMInfo", "classify_software", "read_info", "HARDWARE_MANUFACTURERS", "VIRTUAL_MANUFACTURERS"]

# TPM_PT properties (TPM 2.0 Part 2, TPM_PT) that tpm2-pytss names no constant for
_PT_VENDOR_STRINGS = tuple(int(TPM2_PT.FIXED) + i for i in (6, 7, 8, 9))  # TPM_PT_VENDOR_STRING_1..4
_PT_FIRMWARE_VERSION_1 = int(TPM2_PT.FIXED) + 11
_PT_FIRMWARE_VERSION_2 = int(TPM2_PT.FIXED) + 12

#: TCG vendor IDs (TPM_PT_MANUFACTURER) of companies that make TPM chips or
#: firmware TPMs inside a CPU/SoC. A TPM reporting one of these is recorded as
#: not a software device (False only when the device says so).
HARDWARE_MANUFACTURERS = frozenset(
    {"AMD", "ATML", "BRCM", "CSCO", "HISI", "IFX", "INTC", "NSM", "NTC", "NTZ", "QCOM", "ROCC", "SMSC",
     "SMSN", "SNS", "STM", "TXN", "WEC"}
)
#: Hypervisor TPMs (Hyper-V, Google Compute Engine): neither a chip nor a local emulator.
VIRTUAL_MANUFACTURERS = frozenset({"MSFT", "GOOG"})


def classify_software(manufacturer: str, vendor: str, tcti: str) -> tuple[bool | None, str]:
    """Whether a TPM is software, from what it reported: ``IBM`` with vendor
    string ``SW TPM`` is the TCG reference implementation as shipped by
    libtpms/swtpm (and the IBM/Microsoft simulators) → True; a ``swtpm:`` or
    ``mssim:`` TCTI only ever reaches a simulator → True; a chip or
    firmware-TPM vendor → False; anything else → None (unknown).

    Args:
        manufacturer: TPM_PT_MANUFACTURER as text.
        vendor: the vendor strings.
        tcti: the TCTI it was reached through.

    Returns:
        ``(software_device, reason)``.
    """
    kind = tcti.split(":", 1)[0].strip().lower()
    if manufacturer == "IBM" and " ".join(vendor.split()) == "SW TPM":
        return True, "manufacturer IBM with vendor string 'SW TPM': the TCG reference TPM in software (libtpms/swtpm)"
    if kind in ("swtpm", "mssim"):
        return True, f"reached over the {kind} simulator protocol"
    if manufacturer in HARDWARE_MANUFACTURERS:
        return False, f"manufacturer {manufacturer} makes TPM chips or firmware TPMs"
    if manufacturer in VIRTUAL_MANUFACTURERS:
        return None, f"manufacturer {manufacturer} is a hypervisor (virtual) TPM"
    return None, f"manufacturer {manufacturer!r} is not one capseal recognises"


def _fourcc(value: int) -> str:
    return value.to_bytes(4, "big").rstrip(b"\x00").decode("ascii", "replace")


@dataclass(frozen=True)
class TPMInfo:
    """What the TPM reported about itself (TPM_CAP_TPM_PROPERTIES, TPM_CAP_ALGS)."""

    tcti: str
    manufacturer: str
    vendor: str  # VENDOR_STRING_1..4 concatenated, NULs removed
    firmware_version_1: int
    firmware_version_2: int
    spec_family: str
    spec_level: int
    spec_revision: int  # e.g. 164 for 1.64
    spec_year: int
    spec_day_of_year: int
    algorithms: frozenset[int] = field(repr=False)
    software: bool | None = None
    software_reason: str = ""

    @property
    def firmware(self) -> str:
        """Dotted firmware version: the two 32-bit words split into 16-bit halves
        (the convention tpm2-tools and fwupd use)."""
        v1, v2 = self.firmware_version_1, self.firmware_version_2
        return f"{v1 >> 16}.{v1 & 0xFFFF}.{v2 >> 16}.{v2 & 0xFFFF}"

    @property
    def spec_version(self) -> str:
        """The specification version, e.g. ``2.0 rev 1.59``."""
        return f"{self.spec_family} rev {self.spec_revision // 100}.{self.spec_revision % 100:02d}"

    def supports(self, alg_id: int) -> bool:
        """Whether the TPM lists an algorithm in TPM_CAP_ALGS.

        Args:
            alg_id: a TPM2_ALG value.

        Returns:
            True when listed.
        """
        return int(alg_id) in self.algorithms

    def evidence_device(self) -> dict[str, Any]:
        """The ``device`` member of a quote's evidence slot.

        Returns:
            ``manufacturer``, ``vendor``, ``firmware`` and ``software``.
        """
        return {"manufacturer": self.manufacturer, "vendor": self.vendor, "firmware": self.firmware,
                "software": self.software}

    def to_dict(self) -> dict[str, Any]:
        """The custody statement's ``device`` member.

        Returns:
            JSON values only: no float, no secret.
        """
        return {
            "manufacturer": self.manufacturer,
            "vendor": self.vendor,
            "firmware": self.firmware,
            "firmware_version_1": f"0x{self.firmware_version_1:08x}",
            "firmware_version_2": f"0x{self.firmware_version_2:08x}",
            "spec": self.spec_version,
            "spec_level": self.spec_level,
            "spec_date": f"{self.spec_year}/{self.spec_day_of_year}",
            "software": self.software,
            "software_reason": self.software_reason,
        }


def read_info(ectx: Any, tcti: str) -> TPMInfo:
    """Read what the TPM reports about itself (TPM_CAP_TPM_PROPERTIES, TPM_CAP_ALGS).

    Args:
        ectx: an ESAPI context (on the device's worker).
        tcti: the TPM's TCTI, for :func:`classify_software`.

    Returns:
        The TPM's :class:`TPMInfo`.
    """
    props: dict[int, int] = {}
    more, prop = True, int(TPM2_PT.FIXED)
    while more:
        more, data = ectx.get_capability(TPM2_CAP.TPM_PROPERTIES, prop, 64)
        items = list(data.data.tpmProperties)
        for p in items:
            props[int(p.property)] = int(p.value)
        if not items:
            break
        prop = int(items[-1].property) + 1
        if prop >= int(TPM2_PT.FIXED) + int(TPM2_PT.GROUP):  # past the TPM_PT_FIXED group
            break
    algs: set[int] = set()
    more, alg = True, 0
    while more:
        more, data = ectx.get_capability(TPM2_CAP.ALGS, alg, 128)
        items = list(data.data.algorithms)
        algs.update(int(a.alg) for a in items)
        if not items:
            break
        alg = int(items[-1].alg) + 1
    manufacturer = _fourcc(props.get(int(TPM2_PT.MANUFACTURER), 0))
    vendor = "".join(_fourcc(props.get(pt, 0)) for pt in _PT_VENDOR_STRINGS)
    software, reason = classify_software(manufacturer, vendor, tcti)
    return TPMInfo(
        tcti=tcti,
        manufacturer=manufacturer,
        vendor=vendor,
        firmware_version_1=props.get(_PT_FIRMWARE_VERSION_1, 0),
        firmware_version_2=props.get(_PT_FIRMWARE_VERSION_2, 0),
        spec_family=_fourcc(props.get(int(TPM2_PT.FAMILY_INDICATOR), 0)),
        spec_level=props.get(int(TPM2_PT.LEVEL), 0),
        spec_revision=props.get(int(TPM2_PT.REVISION), 0),
        spec_year=props.get(int(TPM2_PT.YEAR), 0),
        spec_day_of_year=props.get(int(TPM2_PT.DAY_OF_YEAR), 0),
        algorithms=frozenset(algs),
        software=software,
        software_reason=reason,
    )

