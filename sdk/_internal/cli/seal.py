"""``capseal seal``: capsules from JSON specs into a ledger."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from ...errors import CapsealError, DuplicateRecordError, MalformedJSONError
from . import EXIT_OK, CLIError, add_pin_args, emit, env_option, load_json_file, read_pin

__all__ = ["add_parser", "cmd_seal"]

log = logging.getLogger("capseal.cli")


def add_parser(sub: Any) -> None:
    """Add ``seal`` to the CLI's subparsers."""
    p = sub.add_parser("seal", help="seal capsule(s) from a JSON spec into a ledger",
                       description="Seal capsule(s) into a ledger. Each run opens a new epoch (an epoch-boundary "
                                   "capsule describing the key as observed), unless --continue-epoch finds the "
                                   "last one unchanged.")
    p.add_argument("spec", help="JSON file with a capsule spec (or an array of specs); - for stdin")
    env_option(p, "--key", "CAPSEAL_KEY", "signing key URI (file:, pkcs11:, tpm2:; unsafe-ephemeral: for a "
                                           "throwaway key in tests)")
    env_option(p, "--ledger", "CAPSEAL_LEDGER", "ledger file (created if missing)")
    env_option(p, "--operator", "CAPSEAL_OPERATOR", "the operator (tenant) the capsules are sealed for")
    env_option(p, "--developer", "CAPSEAL_DEVELOPER", "the agent identity and version, e.g. buyer-agent@1.4")
    p.add_argument("--continue-epoch", action="store_true",
                   help="carry on the last epoch this operator and developer opened in the ledger when its "
                        "boundary describes exactly this key, custody and model (else a new epoch is opened)")
    p.add_argument("--record", action="store_true", help="with --json: print the whole sealed record, not only the capsule")
    p.add_argument("--json", action="store_true", help="print the sealed capsules (or records) as JSON")
    add_pin_args(p)
    p.set_defaults(fn=cmd_seal)



def cmd_seal(args: argparse.Namespace) -> int:
    from capseal.keys import open_signer

    from ...producer import Producer

    specs = load_json_file(args.spec)
    items = specs if isinstance(specs, list) else [specs]
    if not items or not all(isinstance(s, dict) for s in items):
        raise MalformedJSONError(f"{args.spec}: a spec is a JSON object (or an array of them)")
    signer = open_signer(args.key, pin=read_pin(args))
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
        emit(sealed if isinstance(specs, list) else sealed[0])
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
            raise CLIError(f"{source}[{i}]: {exc}; nothing was sealed", hint=exc.hint or None) from None
