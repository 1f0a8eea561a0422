"""``capseal verify``: capsules, records and ledgers, several targets at once;
the ``--trust`` and ``--ak``/``--ak-hardware`` files; the text reports."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...errors import CapsealError, InputError
from . import EXIT_ERROR, EXIT_NOT_OK, EXIT_OK, CLIError, load_json_file

__all__ = ["add_parser", "cmd_verify", "verify_targets", "trusted_keys", "ak_pin", "print_signers", "RecordSpool",
           "write_json"]


def add_parser(sub: Any) -> None:
    """Add ``verify`` to the CLI's subparsers."""
    p = sub.add_parser("verify", help="verify capsule/record JSON files or ledgers")
    p.add_argument("target", nargs="+", help="capsule or record JSON (or an array), or a ledger file; several are "
                                             "each verified (the exit code is the worst)")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--evidence", action="store_true", help="also verify hardware evidence (TPM quotes)")
    p.add_argument("--ak", action="append", metavar="FILE",
                   help="trusted attestation key: its PEM, or the JSON capseal tpm provision printed; repeatable")
    p.add_argument("--ak-hardware", action="append", metavar="FILE",
                   help="attestation key you enrolled as a hardware TPM's: the JSON capseal tpm provision printed "
                        "(software_device false); only these give 'verified'")
    p.add_argument("--ek-root", action="append", metavar="CERT", help="trusted EK root certificate (PEM), to check a slot's EK chain (which never gives 'verified'); repeatable")
    p.add_argument("--trust", action="append", metavar="FILE",
                   help="trusted signing keys: a PEM public key (or several), or a capseal-trust/1 JSON trust file "
                        "listing kids and PEMs; repeatable. A record no trusted key signed is then an error; without "
                        "--trust every signer is reported as not pinned")
    p.add_argument("-v", "--verbose", action="store_true", help="every record and finding (default: a summary)")
    p.set_defaults(fn=cmd_verify)



def _is_ledger_file(path: Path) -> bool:
    """Whether ``path`` is verified as a ledger: SQLite's header, or bytes no
    JSON document has (none at all, or a NUL byte in the first 4 KiB), which a
    truncated or header-damaged ledger has; such a file is reported as a
    damaged ledger, not as malformed JSON."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return head.startswith(b"SQLite format 3\x00") or not head or b"\x00" in head


def cmd_verify(args: argparse.Namespace) -> int:
    trusted = [key for p in args.trust or [] for key in trusted_keys(p, _read_trust_file(p))]
    evidence_trust = _evidence_trust(args)  # read before anything is verified: a bad file is named, once
    targets = args.target if isinstance(args.target, list) else [args.target]
    if len(targets) > 1:
        return verify_targets(args, targets, lambda t: _verify_target(args, t, trusted, evidence_trust))
    code, payload = _verify_target(args, targets[0], trusted, evidence_trust)
    if args.json:
        write_json(payload, sys.stdout)
    return code


def _verify_target(args: argparse.Namespace, target: str, trusted: list[Any], evidence_trust: Any) -> tuple[int, Any]:
    """(exit code, JSON report) of one target; the text report is printed here."""
    from ...audit import verify_ledger
    from ...ledger import is_database_url

    path = Path(target)
    server = is_database_url(target)
    if not server and not path.exists() and target != "-":
        raise CLIError(f"no such file: {target}")
    if server or (target != "-" and _is_ledger_file(path)):
        ledger: Any = target if server else path
        if args.json:  # every record's report goes into the JSON, spooled to a file as it comes
            spool = RecordSpool()
            report = verify_ledger(ledger, trusted_keys=trusted, evidence=args.evidence, evidence_trust=evidence_trust,
                                   keep_records=False, on_record=spool.add)
            payload = report.to_dict()
            payload["records"] = spool
            code = EXIT_ERROR if any(f.code == "ledger_unreadable" for f in report.findings) else \
                EXIT_OK if report.ok else EXIT_NOT_OK
            return code, payload
        else:
            lines = RecordLines(verbose=args.verbose)
            bar = ProgressBar(sys.stderr) if sys.stderr.isatty() and sys.stdout.isatty() else None
            try:
                report = verify_ledger(ledger, trusted_keys=trusted, evidence=args.evidence,
                                       evidence_trust=evidence_trust, keep_records=False, on_record=lines.add,
                                       progress=bar)
            finally:
                if bar is not None:
                    bar.clear()
            _print_ledger_report(report, verbose=args.verbose, lines=lines)
        if any(f.code == "ledger_unreadable" for f in report.findings):
            return EXIT_ERROR, report.to_dict()
        return (EXIT_OK if report.ok else EXIT_NOT_OK), report.to_dict()
    return _verify_json_file(args, target, trusted, evidence_trust if args.evidence else None)


def _read_trust_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CLIError(f"cannot read {path}: {exc.strerror}") from None


def _evidence_trust(args: argparse.Namespace) -> Any:
    """The relying party's trust policy for TPM quotes: AKs enrolled as software
    (``--ak``) or as hardware TPMs (``--ak-hardware``), and EK roots."""
    aks, hw, roots = getattr(args, "ak", None) or [], getattr(args, "ak_hardware", None) or [], getattr(args, "ek_root", None) or []
    if not (aks or hw or roots):
        return None
    from cryptography import x509

    from capseal.attest import TrustPolicy

    pins: list[Any] = []
    for flag, paths, hardware in (("--ak", aks, False), ("--ak-hardware", hw, True)):
        for p in paths:
            try:
                pins.append(ak_pin(_read_trust_file(p), hardware=hardware))
            except InputError as exc:
                raise CLIError(f"{flag} {p}: {exc}") from None
    try:
        certs = [x509.load_pem_x509_certificate(_read_trust_file(p)) for p in roots]
    except ValueError as exc:
        raise CLIError(f"cannot load a trust anchor: {exc}") from None
    return TrustPolicy(aks=tuple(pins), ek_roots=tuple(certs))


def _verify_json_file(args: argparse.Namespace, target: str, trusted: list[Any], evidence_trust: Any) -> tuple[int, Any]:
    """Capsules or ``capseal-record/1`` records from a JSON file (or an array of
    them). With ``--evidence`` each record's hardware-evidence slot is checked
    too, under the same trust policy as a ledger's; a bare capsule has no slot
    (``no-evidence``)."""
    from ...audit import KeyDirectory, check_signatures, evidence_of
    from ...verify import verify, verify_store

    data = load_json_file(target)
    items = data if isinstance(data, list) else [data]
    if not items:
        raise CLIError(f"{target} holds an empty array: nothing to verify")
    capsules: list[Any] = []
    envelopes: list[Any] = []
    records: list[dict[str, Any] | None] = []
    for item in items:
        if isinstance(item, dict) and item.get("record_version") == "capseal-record/1":
            capsules.append(item.get("capsule"))
            envelopes.append(item.get("envelopes", []))
            records.append(item)
        else:
            capsules.append(item)
            envelopes.append([])
            records.append(None)
    results = verify_store(capsules) if len(capsules) > 1 else [verify(capsules[0])]
    keys = KeyDirectory(trusted)
    out, all_ok = [], True
    for capsule, envs, record, result in zip(capsules, envelopes, records, results):
        entry = result.to_dict()
        if isinstance(capsule, dict) and ("signature" in capsule or "key_id" in capsule or envs or keys.trusted is not None):
            verdict, kid, findings = check_signatures(capsule, envs if isinstance(envs, list) else [], keys)
            entry["signature"], entry["signer_kid"] = verdict, kid
            entry["signer_pinned"] = verdict == "authored" and keys.pinned(kid)
            entry["findings"] += [f.to_dict() for f in findings]
            if verdict == "invalid" or any(f.severity == "error" for f in findings):
                entry["ok"] = False
        if args.evidence:
            status, ev_findings = ("no-evidence", []) if record is None else evidence_of(record, evidence_trust)
            entry["evidence"] = status
            entry["findings"] += [f.to_dict() for f in ev_findings]
            if any(f.severity == "error" for f in ev_findings):
                entry["ok"] = False
        all_ok &= bool(entry["ok"])
        out.append(entry)
    if not args.json:
        for entry in out:
            ev = f"  evidence={entry['evidence']}" if "evidence" in entry else ""
            unpinned = " (signer not pinned)" if entry.get("signature") == "authored" and not entry.get("signer_pinned") else ""
            print(f"{'ok' if entry['ok'] else 'NOT OK'}  capsule_id={entry['capsule_id_recomputed']}  "
                  f"derived={json.dumps(entry['derived'], sort_keys=True)}  signature={entry.get('signature', 'unclaimed')}{unpinned}{ev}")
            for f in entry["findings"]:
                if args.verbose or f["severity"] != "info":
                    check = f"check {f['check']} " if f["check"] is not None else ""  # not every finding has a §6 check
                    print(f"    [{f['severity']}] {check}{f['code']}: {f['detail']}")
    return (EXIT_OK if all_ok else EXIT_NOT_OK), (out if isinstance(data, list) else out[0])


def _print_ledger_report(report: Any, *, verbose: bool, lines: RecordLines) -> None:
    """The text form: a headline, the ledger's findings, the signers and
    whether they are pinned, the records that are not ok (the first
    :data:`SHOWN_NOT_OK` of them; every record with ``-v``), then the
    finding codes with how many records carry each, the open items and the
    evidence statuses."""
    counts = report.counts()
    unpinned = report.ok and report.signers and not report.pinned
    print(f"{'ok' if report.ok else 'NOT OK'}{' (signers not pinned)' if unpinned else ''}  {report.path}: "
          f"{counts['records']} records, {counts['ok']} ok, {counts['not_ok']} not ok")
    for f in report.findings:
        print(f"  [{f.severity}] {f.code}: {f.detail}")
    print_signers(report)
    lines.write_to(sys.stdout)
    if lines.hidden:
        print(f"  … and {lines.hidden} more record(s) not ok (-v lists them)")
    if lines.tally:
        print("  on ok records: " + ", ".join(f"{code} ×{n}" for code, n in sorted(lines.tally.items())) + " (-v lists them)")
    if report.finding_counts:
        print("  findings by code (records): " +
              ", ".join(f"{code} ×{n}" for code, n in sorted(report.finding_counts.items())))
    if lines.still_open:
        print(f"  open items: {lines.still_open} planned or dispatched effect(s) with no outcome in the ledger (-v lists them)")
    statuses = {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("evidence:")}
    if statuses:
        print("  evidence: " + ", ".join(f"{k}={v}" for k, v in sorted(statuses.items())))


#: records not ok listed without -v (the others are counted)
SHOWN_NOT_OK = 20


class RecordLines:
    """The per-record part of a ledger's text report, gathered as the
    verifier hands each record on, in a temporary file (a ledger of any
    size, listed with ``-v``, is not held in memory).

    Args:
        verbose: list every record and finding (else the first records not ok).
    """

    def __init__(self, *, verbose: bool) -> None:
        import tempfile

        self.verbose = verbose
        self.tally: dict[str, int] = {}  # finding code -> ok records carrying it (not listed)
        self.still_open = 0
        self.hidden = 0
        self.shown = 0
        self._file = tempfile.TemporaryFile("w+", encoding="utf-8")

    def add(self, r: Any) -> None:
        """One record's report (``capseal.audit.RecordReport``)."""
        from ...audit import OPEN_EFFECT

        verbose = self.verbose
        problems = [f for f in r.findings if f.severity != "info" or verbose]
        self.still_open += any(f.code == OPEN_EFFECT for f in r.findings)
        if r.ok and not verbose:
            for f in problems:
                self.tally[f.code] = self.tally.get(f.code, 0) + 1
            return
        if not verbose and self.shown >= SHOWN_NOT_OK:
            self.hidden += 1
            return
        self.shown += 1
        ev = f" evidence={r.evidence}" if r.evidence is not None else ""
        out = [f"  seq {r.seq} {r.record_type} {r.record_id[:16]}… {'ok' if r.ok else 'NOT OK'} signature={r.signature}{ev}"]
        out += [f"      [{f.severity}] {f.code}: {f.detail}" for f in problems]
        self._file.write("\n".join(out) + "\n")

    def write_to(self, out: Any) -> None:
        """Copy the lines gathered to ``out``, and let the temporary file go."""
        self._file.seek(0)
        while True:
            chunk = self._file.read(1 << 16)
            if not chunk:
                break
            out.write(chunk)
        self._file.close()


class RecordSpool:
    """The records' reports of a ledger's ``--json`` report, kept in a
    temporary file as the verifier hands them on (one JSON object a line), so
    a ledger of any size is reported without its reports held in memory;
    :func:`write_json` writes them out as the report's ``records`` array."""

    def __init__(self) -> None:
        import tempfile

        self._file = tempfile.TemporaryFile("w+", encoding="utf-8")
        self.count = 0

    def add(self, r: Any) -> None:
        """One record's report (``capseal.audit.RecordReport``)."""
        self._file.write(json.dumps(r.to_dict(), ensure_ascii=False) + "\n")
        self.count += 1

    def __iter__(self) -> Iterator[Any]:
        self._file.seek(0)
        for line in self._file:
            yield json.loads(line)


def write_json(data: Any, out: Any) -> None:
    """``data`` as ``json.dumps(data, indent=2, ensure_ascii=False)`` gives
    it, and a newline, to ``out``; each :class:`RecordSpool` in it written as
    the array of its records, read back one at a time.

    Args:
        data: a JSON value, which may hold RecordSpool objects.
        out: a text stream.
    """
    spools: dict[str, RecordSpool] = {}

    def stand_in(value: Any) -> Any:
        if isinstance(value, RecordSpool):
            token = f"\x00records-{os.urandom(8).hex()}\x00"  # no value of the report can spell it
            spools[json.dumps(token)] = value
            return token
        if isinstance(value, dict):
            return {k: stand_in(v) for k, v in value.items()}
        if isinstance(value, list):
            return [stand_in(v) for v in value]
        return value

    text = json.dumps(stand_in(data), indent=2, ensure_ascii=False)
    for token, spool in spools.items():
        before, _, text = text.partition(token)
        out.write(before)
        line = before.rsplit("\n", 1)[-1]  # the line the array opens on: its items go one level deeper
        indent = " " * (len(line) - len(line.lstrip(" ")))
        first = True
        for item in spool:
            item_text = json.dumps(item, indent=2, ensure_ascii=False).replace("\n", "\n" + indent + "  ")
            out.write(("[\n" if first else ",\n") + indent + "  " + item_text)
            first = False
        out.write("[]" if first else "\n" + indent + "]")
    out.write(text + "\n")


class ProgressBar:
    """A progress bar on a terminal, redrawn in place (``verify_ledger``'s
    ``progress``): the pass, rows done of all, and rows per second.

    Args:
        out: the terminal's stream (stderr).
    """

    def __init__(self, out: Any) -> None:
        import time

        self._out, self._clock = out, time.monotonic
        self._start = self._clock()
        self._last = 0.0

    def __call__(self, name: str, done: int, total: int) -> None:
        now = self._clock()
        if now - self._last < 0.1 and done < total:
            return
        self._last = now
        width = 30
        filled = width * done // total if total else width
        rate = done / (now - self._start) if now > self._start else 0.0
        self._out.write(f"\r  {name:<8} [{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,} "
                        f"({rate:,.0f} rows/s)\033[K")
        self._out.flush()
        if done >= total:
            self._start = now  # the next pass counts from here

    def clear(self) -> None:
        """Take the bar off the terminal."""
        self._out.write("\r\033[K")
        self._out.flush()


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
        write_json({"ok": worst == EXIT_OK, "targets": results}, sys.stdout)
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
    from ...trust import parse_trust

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

    from ...record import strict_json

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
