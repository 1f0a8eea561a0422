"""``capseal`` command line. Subcommands mirror the API.

Exit codes (as the reference verifier's CLI): 0 ok, 1 not ok (a verification
found an error, or a named object does not exist), 2 could not run (bad
input, missing device, …), 130 interrupted (Ctrl-C). Never a bare traceback:
errors print one line (and a hint) to stderr. PINs are read from an
environment variable or a file, never from the command line.

Options given on every call have environment defaults: ``CAPSEAL_KEY``,
``CAPSEAL_LEDGER``, ``CAPSEAL_OPERATOR``, ``CAPSEAL_DEVELOPER`` (``seal``),
and ``CAPSEAL_LOG_LEVEL`` (``--log-level``). Only this module and argparse
are imported before the arguments are parsed, so ``--help`` is immediate.
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import CapsealError, DuplicateRecordError, InputError, MalformedJSONError

if TYPE_CHECKING:
    from .keys.secret import Secret

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_NOT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130

log = logging.getLogger("capseal.cli")

LOG_LEVELS = ("debug", "info", "warning", "error")


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
    from .keys.secret import Secret, caller_is_cli, usable_pin

    caller_is_cli()
    if getattr(args, "pin_file", None):
        from .keys.secret import read_pin_file

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
    from .keys.secret import Secret

    if not sys.stdin.isatty():
        raise _CLIError("--pin-prompt needs a terminal; use --pin-file FILE or --pin-env VAR")
    try:
        return Secret(getpass.getpass(f"{prompt}: "), "the PIN prompt")
    except EOFError:
        pass
    raise _CLIError("no PIN entered at the prompt (end of input)")


def _load_json_file(path: str) -> Any:
    from .record import strict_json

    try:
        raw = Path(path).read_bytes() if path != "-" else sys.stdin.buffer.read()
    except OSError as exc:
        raise _CLIError(f"cannot read {path}: {exc.strerror}") from None
    return strict_json(raw, path)


def _emit(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _env_option(p: argparse.ArgumentParser, flag: str, env: str, help: str) -> None:
    """``flag``, defaulting to environment variable ``env`` (required when it is unset or empty)."""
    default = os.environ.get(env) or None
    p.add_argument(flag, default=default, required=default is None, help=f"{help} (default: ${env})")


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
    if args.key.split(":", 1)[0].lower() == "unsafe-ephemeral":
        print("capseal: warning: unsafe-ephemeral: the key dies with this process; nobody can pin it or sign as it "
              "again, so these records verify only as signed by an unpinned key", file=sys.stderr)
    log.info("opened %s key %s… (%s)", signer.alg, signer.kid[:16], signer.describe().get("backend"))
    with signer, Producer(args.operator, args.developer, signer, args.ledger,
                          continue_epoch=args.continue_epoch) as producer:
        continued = producer.epoch_opened
        _check_batch(producer, items, args.spec)
        records = [producer.seal(spec) for spec in items]
        epoch = producer.epoch_id
    if args.json:
        sealed = [record.to_json() if args.record else record.capsule for record in records]
        _emit(sealed if isinstance(specs, list) else sealed[0])
        return EXIT_OK
    for record in records:
        capsule = record.capsule
        what = (capsule.get("effect") or {}).get("status") or (capsule.get("disposition") or {}).get("verdict_class") or ""
        print(f"sealed  {capsule['action_id']}  {record.capsule_id}  {what}")
    how = "continued" if continued else "opened"
    print(f"{len(records)} record(s) sealed into {args.ledger} (epoch {epoch}, {how})")
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
    from ._cli_verify import trusted_keys

    trusted = [key for p in args.trust or [] for key in trusted_keys(p, _read_trust_file(p))]
    evidence_trust = _evidence_trust(args)  # read before anything is verified: a bad file is named, once
    targets = args.target if isinstance(args.target, list) else [args.target]
    if len(targets) > 1:
        from ._cli_verify import verify_targets

        return verify_targets(args, targets, lambda t: _verify_target(args, t, trusted, evidence_trust))
    code, payload = _verify_target(args, targets[0], trusted, evidence_trust)
    if args.json:
        _emit(payload)
    return code


def _verify_target(args: argparse.Namespace, target: str, trusted: list[Any], evidence_trust: Any) -> tuple[int, Any]:
    """(exit code, JSON report) of one target; the text report is printed here."""
    from .audit import verify_ledger

    path = Path(target)
    if not path.exists() and target != "-":
        raise _CLIError(f"no such file: {target}")
    if target != "-" and _is_ledger_file(path):
        report = verify_ledger(path, trusted_keys=trusted, evidence=args.evidence, evidence_trust=evidence_trust)
        if not args.json:
            _print_ledger_report(report, verbose=args.verbose)
        if any(f.code == "ledger_unreadable" for f in report.findings):
            return EXIT_ERROR, report.to_dict()
        return (EXIT_OK if report.ok else EXIT_NOT_OK), report.to_dict()
    return _verify_json_file(args, target, trusted, evidence_trust if args.evidence else None)


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

    from capseal.attest import TrustPolicy

    from ._cli_verify import ak_pin

    pins: list[Any] = []
    for flag, paths, hardware in (("--ak", aks, False), ("--ak-hardware", hw, True)):
        for p in paths:
            try:
                pins.append(ak_pin(_read_trust_file(p), hardware=hardware))
            except InputError as exc:
                raise _CLIError(f"{flag} {p}: {exc}") from None
    try:
        certs = [x509.load_pem_x509_certificate(_read_trust_file(p)) for p in roots]
    except ValueError as exc:
        raise _CLIError(f"cannot load a trust anchor: {exc}") from None
    return TrustPolicy(aks=tuple(pins), ek_roots=tuple(certs))


def _verify_json_file(args: argparse.Namespace, target: str, trusted: list[Any], evidence_trust: Any) -> tuple[int, Any]:
    """Capsules or ``capseal-record/1`` records from a JSON file (or an array of
    them). With ``--evidence`` each record's hardware-evidence slot is checked
    too, under the same trust policy as a ledger's; a bare capsule has no slot
    (``no-evidence``)."""
    from .audit import KeyDirectory, check_signatures, evidence_of
    from .verify import verify, verify_store

    data = _load_json_file(target)
    items = data if isinstance(data, list) else [data]
    if not items:
        raise _CLIError(f"{target} holds an empty array: nothing to verify")
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


def _print_ledger_report(report: Any, *, verbose: bool) -> None:
    """The text form: a headline, the ledger's findings, the signers and
    whether they are pinned, then the records that are not ok (every record
    with ``-v``); the warnings of ok records and the evidence statuses are
    tallied unless ``-v``."""
    counts = report.counts()
    unpinned = report.ok and report.signers and not report.pinned
    print(f"{'ok' if report.ok else 'NOT OK'}{' (signers not pinned)' if unpinned else ''}  {report.path}: "
          f"{counts['records']} records, {counts['ok']} ok, {counts['not_ok']} not ok")
    for f in report.findings:
        print(f"  [{f.severity}] {f.code}: {f.detail}")
    from ._cli_verify import print_signers

    print_signers(report)
    tally: dict[str, int] = {}
    for r in report.records:
        problems = [f for f in r.findings if f.severity != "info" or verbose]
        if r.ok and not verbose:
            for f in problems:
                tally[f.code] = tally.get(f.code, 0) + 1
            continue
        ev = f" evidence={r.evidence}" if r.evidence is not None else ""
        print(f"  seq {r.seq} {r.record_type} {r.record_id[:16]}… {'ok' if r.ok else 'NOT OK'} signature={r.signature}{ev}")
        for f in problems:
            print(f"      [{f.severity}] {f.code}: {f.detail}")
    if tally:
        print("  on ok records: " + ", ".join(f"{code} ×{n}" for code, n in sorted(tally.items())) + " (-v lists them)")
    if report.records and any(r.evidence is not None for r in report.records):
        statuses = {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("evidence:")}
        print("  evidence: " + ", ".join(f"{k}={v}" for k, v in sorted(statuses.items())))


# ---------------------------------------------------------------------------- ledger


def cmd_ledger_show(args: argparse.Namespace) -> int:
    """Exit 1 when ``--id`` names no record, or a row is damaged (each shown as such)."""
    from .ledger import Ledger

    damaged: list[str] = []
    with Ledger(args.ledger, readonly=True) as ledger:
        if args.id:
            found = ledger.entry(args.id)
            entries = [found] if found is not None else []
        else:
            entries = list(ledger.entries(damaged=damaged))
        rows = []
        for e in entries:
            item: dict[str, Any] = {"header": e.header()}
            try:
                item["record"] = None if e.damage else e.record()
            except (ValueError, RecursionError) as exc:
                item["record"] = None
                item["damage"] = f"its body is not JSON ({exc})"
            if e.damage:
                item["damage"] = e.damage
            if e.record_type == "capsule" and "damage" not in item:
                item["hardware_evidence"] = ledger.current_evidence(e.record_id)
            rows.append(item)
    missing = bool(args.id) and not rows
    bad = damaged + [f"seq {item['header']['seq']}: {item['damage']}" for item in rows if "damage" in item]
    if args.json:
        _emit(rows)
    else:
        for item in rows:
            _print_ledger_row(item)
    if missing:
        print(f"capseal: no record {args.id} in {args.ledger}", file=sys.stderr)
    for problem in bad:
        print(f"capseal: damaged: {problem} (capseal verify reports the ledger in full)", file=sys.stderr)
    return EXIT_NOT_OK if missing or bad else EXIT_OK


def _print_ledger_row(item: dict[str, Any]) -> None:
    h = item["header"]
    if "damage" in item:
        print(f"{h['seq']:>6}  {h['record_type']:<10} DAMAGED: {item['damage']}")
        return
    rec = item["record"]
    cap = rec.get("capsule", {}) if isinstance(rec, dict) else {}
    verdict = (cap.get("disposition") or {}).get("verdict_class", "")
    status = (cap.get("effect") or {}).get("status", "")
    ev = "evidence" if item.get("hardware_evidence") else "no-evidence"
    print(f"{h['seq']:>6}  {h['record_type']:<10} {h['record_id'][:16]}…  {h['epistemic_type']:<15} "
          f"{cap.get('action_id', ''):<32} {status:<10} {verdict:<14} {ev if h['record_type'] == 'capsule' else ''}")


def cmd_ledger_export(args: argparse.Namespace) -> int:
    from .ledger import Ledger

    with Ledger(args.ledger, readonly=True) as ledger:
        if args.output in (None, "-"):
            n = ledger.export_jsonl(sys.stdout.buffer)
        else:
            with open(args.output, "wb") as fh:
                n = ledger.export_jsonl(fh)
    to_stdout = args.output in (None, "-")
    if args.json:  # the summary on stdout, unless the export itself went there
        summary = json.dumps({"ledger": args.ledger, "output": args.output or "-", "lines": n})
        print(summary, file=sys.stderr if to_stdout else sys.stdout)
    else:
        print(f"exported {n} lines", file=sys.stderr)
    return EXIT_OK


def cmd_ledger_import(args: argparse.Namespace) -> int:
    from .ledger import Ledger

    with open(args.jsonl, "rb") as fh, Ledger.import_jsonl(fh, args.ledger) as ledger:
        n = ledger.count()
    if args.json:
        _emit({"ledger": args.ledger, "source": args.jsonl, "records": n})
    else:
        print(f"imported {n} records into {args.ledger}", file=sys.stderr)
    return EXIT_OK


# ---------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="capseal", description="Seal and verify Agent Action Capsules (draft -05).")
    ap.add_argument("--version", action="version", version=f"capseal {__version__}")
    ap.add_argument("-v", dest="log_verbosity", action="count", default=0,
                    help="log more to stderr: -v info, -vv debug (before the subcommand)")
    ap.add_argument("--log-level", choices=LOG_LEVELS, default=None,
                    help="log level for stderr (default: $CAPSEAL_LOG_LEVEL, else warning)")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("seal", help="seal capsule(s) from a JSON spec into a ledger",
                       description="Seal capsule(s) into a ledger. Each run opens a new epoch (an epoch-boundary "
                                   "capsule describing the key as observed), unless --continue-epoch finds the "
                                   "last one unchanged.")
    p.add_argument("spec", help="JSON file with a capsule spec (or an array of specs); - for stdin")
    _env_option(p, "--key", "CAPSEAL_KEY", "signing key URI (file:, pkcs11:, tpm2:; unsafe-ephemeral: for a "
                                           "throwaway key in tests)")
    _env_option(p, "--ledger", "CAPSEAL_LEDGER", "ledger file (created if missing)")
    _env_option(p, "--operator", "CAPSEAL_OPERATOR", "the operator (tenant) the capsules are sealed for")
    _env_option(p, "--developer", "CAPSEAL_DEVELOPER", "the agent identity and version, e.g. buyer-agent@1.4")
    p.add_argument("--continue-epoch", action="store_true",
                   help="carry on the last epoch this operator and developer opened in the ledger when its "
                        "boundary describes exactly this key, custody and model (else a new epoch is opened)")
    p.add_argument("--record", action="store_true", help="with --json: print the whole sealed record, not only the capsule")
    p.add_argument("--json", action="store_true", help="print the sealed capsules (or records) as JSON")
    _add_pin_args(p)
    p.set_defaults(fn=cmd_seal)

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

    ledger = sub.add_parser("ledger", help="inspect, export and import ledgers").add_subparsers(dest="ledger_cmd", required=True)
    p = ledger.add_parser("show", help="list records")
    p.add_argument("ledger")
    p.add_argument("--id", help="only this record id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_ledger_show)
    p = ledger.add_parser("export", help="export to JSON Lines")
    p.add_argument("ledger")
    p.add_argument("-o", "--output", help="output file (default stdout)")
    p.add_argument("--json", action="store_true", help="a JSON summary (on stderr when the export goes to stdout)")
    p.set_defaults(fn=cmd_ledger_export)
    p = ledger.add_parser("import", help="build a new ledger from a JSON Lines export")
    p.add_argument("jsonl")
    p.add_argument("ledger")
    p.add_argument("--json", action="store_true", help="a JSON summary")
    p.set_defaults(fn=cmd_ledger_import)

    from ._cli_keys import add_key_commands  # keys, token, tpm, doctor

    add_key_commands(sub)
    from ._cli_referee import add_referee_parser  # capseal referee: twins and a referee
    add_referee_parser(sub)
    from ._cli_interpret import add_parser as add_interpret_parser
    add_interpret_parser(sub)
    return ap


def _log_level(args: argparse.Namespace) -> int:
    """``--log-level``, else ``-v``/``-vv``, else ``CAPSEAL_LOG_LEVEL``, else warning."""
    if args.log_level is not None:
        return int(getattr(logging, args.log_level.upper()))
    if args.log_verbosity:
        return logging.INFO if args.log_verbosity == 1 else logging.DEBUG
    named = os.environ.get("CAPSEAL_LOG_LEVEL", "").strip().lower()
    if named and named not in LOG_LEVELS:
        raise _CLIError(f"CAPSEAL_LOG_LEVEL={named[:20]!r} is not one of {', '.join(LOG_LEVELS)}")
    return int(getattr(logging, (named or "warning").upper()))


def main(argv: list[str] | None = None) -> int:
    """Run the ``capseal`` command line.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 ok, 1 not ok, 2 could not run, 130 interrupted.
    """
    try:
        return _main(argv)
    except KeyboardInterrupt:  # also while arguments are parsed and modules load
        print("capseal: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        logging.basicConfig(level=_log_level(args), stream=sys.stderr,
                            format="capseal: %(levelname)s: %(name)s: %(message)s")
        return int(args.fn(args))
    except CapsealError as exc:
        print(f"capseal: error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"capseal: hint: {exc.hint}", file=sys.stderr)
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
