"""Parts of ``capseal verify`` kept out of ``cli.py``: several targets, the
``--trust`` and ``--ak``/``--ak-hardware`` files, and the signers' lines of a
ledger's text report."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from .errors import CapsealError, InputError
from .record import strict_json

__all__ = ["verify_targets", "trusted_keys", "ak_pin", "print_signers"]

EXIT_OK, EXIT_ERROR = 0, 2


def verify_targets(args: argparse.Namespace, targets: list[str], verify_one: Callable[[str], tuple[int, Any]]) -> int:
    """Several targets, each verified on its own: one that cannot be read is
    named and the others are still verified.

    Args:
        args: the parsed ``verify`` arguments (``--json`` is read).
        targets: the files named on the command line.
        verify_one: verifies one target, printing its text report unless
            ``--json``; returns (exit code, JSON report); raises CapsealError
            when the target cannot be verified at all.

    Returns:
        The worst exit code (2 could not run > 1 not ok > 0 ok). With
        ``--json`` one object ``{ok, targets: [{target, exit, report | error}]}``
        is printed.
    """
    worst, results = EXIT_OK, []
    for target in targets:
        if not args.json:
            print(f"== {target}")
        try:
            code, payload = verify_one(target)
            results.append({"target": target, "exit": code, "report": payload})
        except CapsealError as exc:
            code = EXIT_ERROR
            print(f"capseal: error: {exc if target in str(exc) else f'{target}: {exc}'}", file=sys.stderr)
            results.append({"target": target, "exit": code, "error": str(exc)})
        worst = max(worst, code)
    if args.json:
        sys.stdout.write(json.dumps({"ok": worst == EXIT_OK, "targets": results}, indent=2, ensure_ascii=False) + "\n")
    return worst


def trusted_keys(path: str, data: bytes) -> list[Any]:
    """The keys a ``--trust`` file pins.

    Args:
        path: the file, as named on the command line.
        data: its bytes.

    Returns:
        ``capseal.trust.TrustedKey`` entries.

    Raises:
        InputError: not PEM public keys nor a capseal-trust/1 trust file,
            naming ``--trust PATH`` (and the entry).
    """
    from .trust import parse_trust

    return list(parse_trust(data, f"--trust {path}"))


def ak_pin(data: bytes, *, hardware: bool) -> Any:
    """An AK pin from a PEM public key, or from a provisioning result (the JSON
    ``capseal tpm provision`` prints), whose ``software_device`` the pin
    carries.

    Args:
        data: the file's bytes.
        hardware: enrol the AK as a hardware TPM's (``--ak-hardware``).

    Returns:
        A ``capseal.attest.PinnedAK``.

    Raises:
        InputError: not a PEM public key nor a provisioning result; or
            hardware asked for with a PEM (which says nothing about the TPM
            its key lives in) or with a result that did not find hardware.
    """
    from capseal.attest import PinnedAK

    if data.lstrip().startswith(b"{"):
        return PinnedAK.from_provisioning(strict_json(data, "the provisioning result"), hardware=hardware)
    if hardware:
        raise InputError("a PEM says nothing about the TPM the AK lives in; enrol a hardware TPM's AK from its "
                         "provisioning result (the JSON capseal tpm provision prints, with software_device false)")
    return PinnedAK.from_pem(data)


def print_signers(report: Any) -> None:
    """One line per key that signed records of a ledger (``LedgerReport``),
    pinned or not, and a hint when nothing was pinned."""
    for s in report.signers:
        label = f" ({s.label})" if s.label else ""
        custody = ", ".join(f"{k}={v}" for k, v in s.custody.items())
        said = f"; its own custody statement says {custody}" if custody else ""
        print(f"  signer {s.kid[:16]}…{label}: {s.records} records, {'pinned' if s.pinned else 'NOT PINNED'}{said}")
    if report.signers and not report.pinned:
        print("  no trust anchor was given: the records are intact under the keys named, and nothing says whose keys "
              "they are; pin them with --trust KEY.pem or a trust file")
