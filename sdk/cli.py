"""``capseal`` command line. Subcommands mirror the API.

Exit codes (as the reference verifier's CLI): 0 ok, 1 not ok (a verification
found an error), 2 could not run (bad input, missing device, …). Never a bare
traceback: errors print one line (and a hint) to stderr. PINs are read from an
environment variable or a file, never from the command line.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import CapsealError, DuplicateRecordError, InputError, MalformedJSONError
from .record import strict_json

if TYPE_CHECKING:
    from .keys._pin import Secret

__all__ = ["main"]

EXIT_OK, EXIT_NOT_OK, EXIT_ERROR = 0, 1, 2


class _CLIError(CapsealError):
    pass


def _read_pin(args: argparse.Namespace, prompt: str = "PIN") -> Secret | None:
    """The PIN from ``--pin-file``, else ``--pin-env`` (default CAPSEAL_PIN),
    else ``--pin-prompt``, held as a Secret from the moment it is read (a
    captured frame local shows only its redacted form); None when none is
    given. Checked here, where its source is known: an empty or non-UTF-8 PIN
    is refused before it reaches a token (each refused login uses up a try).
    Errors name the source, never the PIN, and chain no exception (a Unicode
    error's args hold the text). Hints from here on name the CLI's options."""
    from .keys._pin import Secret, caller_is_cli, usable_pin

    caller_is_cli()
    if getattr(args, "pin_file", None):
        from .keys._pkcs11_uri import read_pin_file

        return read_pin_file(args.pin_file, f"PIN file {args.pin_file}").usable_pin()
    named = getattr(args, "pin_env", None)
    env = named or "CAPSEAL_PIN"
    if env in os.environ and (named or os.environ[env] != ""):  # CAPSEAL_PIN set but empty: as if unset
        return usable_pin(Secret(os.environ[env], f"environment variable {env}"), env)
    if named:
        raise _CLIError(f"--pin-env {named}: environment variable {named} is not set")
    if getattr(args, "pin_prompt", False):
        return _pin_from_prompt(prompt).usable_pin()
    return None


def _pin_from_prompt(prompt: str) -> Secret:
    """The PIN typed at the terminal. No terminal, or end of input (Ctrl-D),
    is an error: never a PIN-less run the operator asked a prompt for."""
    from .keys._pin import Secret

    if not sys.stdin.isatty():
        raise _CLIError("--pin-prompt needs a terminal; use --pin-file FILE or --pin-env VAR")
    try:
        return Secret(getpass.getpass(f"{prompt}: "), "the PIN prompt")
    except EOFError:
        pass
    raise _CLIError("no PIN entered at the prompt (end of input)")


def _load_json_file(path: str) -> Any:
    try:
        raw = Path(path).read_bytes() if path != "-" else sys.stdin.buffer.read()
    except OSError as exc:
        raise _CLIError(f"cannot read {path}: {exc.strerror}") from None
    return strict_json(raw, path)


def _emit(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _add_pin_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pin-env", metavar="VAR", help="environment variable holding the PIN (default CAPSEAL_PIN)")
    p.add_argument("--pin-file", metavar="FILE", help="file holding the PIN")
    p.add_argument("--pin-prompt", action="store_true", help="ask for the PIN on the terminal")


# ---------------------------------------------------------------------------- seal


def cmd_seal(args: argparse.Namespace) -> int:
    from capseal.keys import open_signer

    from .producer import Producer

    specs = _load_json_file(args.spec)
    items = specs if isinstance(specs, list) else [specs]
    if not items or not all(isinstance(s, dict) for s in items):
        raise MalformedJSONError(f"{args.spec}: a spec is a JSON object (or an array of them)")
    signer = open_signer(args.key, pin=_read_pin(args))
    with signer, Producer(args.operator, args.developer, signer, args.ledger) as producer:
        _check_batch(producer, items, args.spec)
        sealed = []
        for spec in items:
            record = producer.seal(spec)
            sealed.append(record.to_json() if args.record else record.capsule)
    _emit(sealed if isinstance(specs, list) else sealed[0])
    return EXIT_OK


def _check_batch(producer: Any, items: list[dict[str, Any]], source: str) -> None:
    """Every spec of a batch through ``Producer.check`` (and an action_id the
    batch repeats refused) before any is sealed. Why: sealing them one by one
    wrote the specs before a bad one, and the error said neither that nor
    which spec was bad; refused input writes nothing (design §3.5)."""
    seen: set[str] = set()
    for i, spec in enumerate(items):
        try:
            action_id = producer.check(spec)["action_id"]
            if action_id in seen:
                raise DuplicateRecordError(f"action_id {action_id!r} appears twice in the batch")
            seen.add(action_id)
        except CapsealError as exc:
            raise _CLIError(f"{source}[{i}]: {exc}; nothing was sealed", hint=exc.hint or None) from None


# ---------------------------------------------------------------------------- verify


def _is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def cmd_verify(args: argparse.Namespace) -> int:
    from .audit import verify_ledger

    trusted = [_trusted_key(p) for p in args.trust or []]
    path = Path(args.target)
    if not path.exists() and args.target != "-":
        raise _CLIError(f"no such file: {args.target}")
    if args.target != "-" and _is_sqlite(path):
        report = verify_ledger(path, trusted_keys=trusted, evidence=args.evidence, evidence_trust=_evidence_trust(args))
        if args.json:
            _emit(report.to_dict())
        else:
            _print_ledger_report(report, verbose=args.verbose)
        if any(f.code == "ledger_unreadable" for f in report.findings):
            return EXIT_ERROR
        return EXIT_OK if report.ok else EXIT_NOT_OK
    return _verify_json_file(args, trusted, _evidence_trust(args) if args.evidence else None)


def _trusted_key(path: str) -> Any:
    """A ``--trust`` key, read and parsed before anything is verified: a bad
    one is the caller's mistake, never reported as the ledger's."""
    from cryptography.hazmat.primitives import serialization

    pem = _read_trust_file(path)
    try:
        return serialization.load_pem_public_key(pem)
    except Exception as exc:  # ValueError, and cryptography's UnsupportedAlgorithm
        raise _CLIError(f"--trust {path} is not a PEM public key capseal can use ({type(exc).__name__}: {exc})") from None


def _read_trust_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise _CLIError(f"cannot read {path}: {exc.strerror}") from None


def _evidence_trust(args: argparse.Namespace) -> Any:
    """The relying party's trust policy for TPM quotes: AKs enrolled as software
    (``--ak``) or as hardware TPMs (``--ak-hardware``), and EK roots."""
    aks, hw, roots = getattr(args, "ak", None) or [], getattr(args, "ak_hardware", None) or [], getattr(args, "ek_root", None) or []
    if not (aks or hw or roots):
        return None
    from cryptography import x509

    from capseal.attest import PinnedAK, TrustPolicy

    pins: list[Any] = []
    for flag, paths, software in (("--ak", aks, None), ("--ak-hardware", hw, False)):
        for p in paths:
            try:
                pins.append(PinnedAK.from_pem(_read_trust_file(p), software=software))
            except InputError as exc:
                raise _CLIError(f"{flag} {p}: {exc}") from None
    try:
        certs = [x509.load_pem_x509_certificate(_read_trust_file(p)) for p in roots]
    except ValueError as exc:
        raise _CLIError(f"cannot load a trust anchor: {exc}") from None
    return TrustPolicy(aks=tuple(pins), ek_roots=tuple(certs))


def _verify_json_file(args: argparse.Namespace, trusted: list[Any], evidence_trust: Any) -> int:
    """Capsules or ``capseal-record/1`` records from a JSON file (or an array of
    them). With ``--evidence`` each record's hardware-evidence slot is checked
    too, under the same trust policy as a ledger's; a bare capsule has no slot
    (``no-evidence``)."""
    from .audit import KeyDirectory, check_signatures, evidence_of
    from .verify import verify, verify_store

    data = _load_json_file(args.target)
    items = data if isinstance(data, list) else [data]
    if not items:
        raise _CLIError(f"{args.target} holds an empty array: nothing to verify")
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
    if args.json:
        _emit(out if isinstance(data, list) else out[0])
    else:
        for entry in out:
            ev = f"  evidence={entry['evidence']}" if "evidence" in entry else ""
            print(f"{'ok' if entry['ok'] else 'NOT OK'}  capsule_id={entry['capsule_id_recomputed']}  "
                  f"derived={json.dumps(entry['derived'], sort_keys=True)}  signature={entry.get('signature', 'unclaimed')}{ev}")
            for f in entry["findings"]:
                if args.verbose or f["severity"] != "info":
                    check = f"check {f['check']} " if f["check"] is not None else ""  # not every finding has a §6 check
                    print(f"    [{f['severity']}] {check}{f['code']}: {f['detail']}")
    return EXIT_OK if all_ok else EXIT_NOT_OK


def _print_ledger_report(report: Any, *, verbose: bool) -> None:
    counts = report.counts()
    print(f"{'ok' if report.ok else 'NOT OK'}  {report.path}: {counts['records']} records, "
          f"{counts['ok']} ok, {counts['not_ok']} not ok")
    for f in report.findings:
        print(f"  [{f.severity}] {f.code}: {f.detail}")
    for r in report.records:
        problems = [f for f in r.findings if f.severity != "info" or verbose]
        if r.ok and not problems and not verbose and r.evidence is None:
            continue
        ev = f" evidence={r.evidence}" if r.evidence is not None else ""
        print(f"  seq {r.seq} {r.record_type} {r.record_id[:16]}… {'ok' if r.ok else 'NOT OK'} signature={r.signature}{ev}")
        for f in problems:
            print(f"      [{f.severity}] {f.code}: {f.detail}")
    if report.records and any(r.evidence is not None for r in report.records):
        tally = {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("evidence:")}
        print("  evidence: " + ", ".join(f"{k}={v}" for k, v in sorted(tally.items())))


# ---------------------------------------------------------------------------- ledger


def cmd_ledger_show(args: argparse.Namespace) -> int:
    from .ledger import Ledger

    with Ledger(args.ledger, readonly=True) as ledger:
        rows = []
        for e in ledger.entries():
            if args.id and e.record_id != args.id:
                continue
            item: dict[str, Any] = {"header": e.header(), "record": e.record()}
            if e.record_type == "capsule":
                item["hardware_evidence"] = ledger.current_evidence(e.record_id)
            rows.append(item)
    if args.json:
        _emit(rows)
        return EXIT_OK
    for item in rows:
        h = item["header"]
        rec = item["record"]
        cap = rec.get("capsule", {}) if isinstance(rec, dict) else {}
        verdict = (cap.get("disposition") or {}).get("verdict_class", "")
        status = (cap.get("effect") or {}).get("status", "")
        ev = "evidence" if item.get("hardware_evidence") else "no-evidence"
        print(f"{h['seq']:>6}  {h['record_type']:<10} {h['record_id'][:16]}…  {h['epistemic_type']:<15} "
              f"{cap.get('action_id', ''):<32} {status:<10} {verdict:<14} {ev if h['record_type'] == 'capsule' else ''}")
    return EXIT_OK


def cmd_ledger_export(args: argparse.Namespace) -> int:
    from .ledger import Ledger

    with Ledger(args.ledger, readonly=True) as ledger:
        if args.output in (None, "-"):
            n = ledger.export_jsonl(sys.stdout.buffer)
        else:
            with open(args.output, "wb") as fh:
                n = ledger.export_jsonl(fh)
    print(f"exported {n} lines", file=sys.stderr)
    return EXIT_OK


def cmd_ledger_import(args: argparse.Namespace) -> int:
    from .ledger import Ledger

    with open(args.jsonl, "rb") as fh, Ledger.import_jsonl(fh, args.ledger) as ledger:
        print(f"imported {ledger.count()} records into {args.ledger}", file=sys.stderr)
    return EXIT_OK


# ---------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="capseal", description="Seal and verify Agent Action Capsules (draft -05).")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("seal", help="seal capsule(s) from a JSON spec into a ledger")
    p.add_argument("spec", help="JSON file with a capsule spec (or an array of specs); - for stdin")
    p.add_argument("--key", required=True, help="signing key URI (file:, pkcs11:, tpm2:)")
    p.add_argument("--ledger", required=True, help="ledger file (created if missing)")
    p.add_argument("--operator", required=True)
    p.add_argument("--developer", required=True)
    p.add_argument("--record", action="store_true", help="print the whole sealed record, not only the capsule")
    _add_pin_args(p)
    p.set_defaults(fn=cmd_seal)

    p = sub.add_parser("verify", help="verify a capsule/record JSON file or a ledger")
    p.add_argument("target", help="capsule or record JSON (or an array), or a ledger file")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--evidence", action="store_true", help="also verify hardware evidence (TPM quotes)")
    p.add_argument("--ak", action="append", metavar="PEM", help="trusted attestation key (PEM); repeatable")
    p.add_argument("--ak-hardware", action="append", metavar="PEM",
                   help="attestation key you enrolled from a hardware TPM (PEM); only these give 'verified'")
    p.add_argument("--ek-root", action="append", metavar="CERT", help="trusted EK root certificate (PEM), to check a slot's EK chain (which never gives 'verified'); repeatable")
    p.add_argument("--trust", action="append", metavar="PEM", help="trusted signing key (PEM); repeatable")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(fn=cmd_verify)

    ledger = sub.add_parser("ledger", help="inspect, export and import ledgers").add_subparsers(dest="ledger_cmd", required=True)
    p = ledger.add_parser("show", help="list records")
    p.add_argument("ledger")
    p.add_argument("--id", help="only this record id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_ledger_show)
    p = ledger.add_parser("export", help="export to JSON Lines")
    p.add_argument("ledger")
    p.add_argument("-o", "--output", help="output file (default stdout)")
    p.set_defaults(fn=cmd_ledger_export)
    p = ledger.add_parser("import", help="build a new ledger from a JSON Lines export")
    p.add_argument("jsonl")
    p.add_argument("ledger")
    p.set_defaults(fn=cmd_ledger_import)

    from ._cli_keys import add_key_commands  # keys, token, tpm, doctor

    add_key_commands(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except CapsealError as exc:
        print(f"capseal: error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"capseal: hint: {exc.hint}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_ERROR
    except BrokenPipeError:
        # the reader went away (``capseal … | head``): its choice, not a failure to
        # report. Later writes, and the flush at exit, go nowhere instead of raising again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except Exception as exc:  # never a bare traceback
        print(f"capseal: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
