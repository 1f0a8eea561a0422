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
import logging
import os
import sys

from ._internal.cli import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_NOT_OK, EXIT_OK, CLIError
from ._version import __version__
from .errors import CapsealError

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_NOT_OK", "EXIT_ERROR", "EXIT_INTERRUPTED"]

LOG_LEVELS = ("debug", "info", "warning", "error")


def build_parser() -> argparse.ArgumentParser:
    """The ``capseal`` parser: global options, then one subcommand per group
    (each registered by its module in ``capseal._internal.cli``)."""
    ap = argparse.ArgumentParser(prog="capseal", description="Seal and verify Agent Action Capsules (draft -05).")
    ap.add_argument("--version", action="version", version=f"capseal {__version__}")
    ap.add_argument("-v", dest="log_verbosity", action="count", default=0,
                    help="log more to stderr: -v info, -vv debug (before the subcommand)")
    ap.add_argument("--log-level", choices=LOG_LEVELS, default=None,
                    help="log level for stderr (default: $CAPSEAL_LOG_LEVEL, else warning)")
    sub = ap.add_subparsers(dest="command", required=True)

    from ._internal.cli import interpret, keys, ledger, referee, seal, verify

    for group in (seal, verify, ledger, keys, referee, interpret):
        group.add_parser(sub)
    return ap


def _log_level(args: argparse.Namespace) -> int:
    """``--log-level``, else ``-v``/``-vv``, else ``CAPSEAL_LOG_LEVEL``, else warning."""
    if args.log_level is not None:
        return int(getattr(logging, args.log_level.upper()))
    if args.log_verbosity:
        return logging.INFO if args.log_verbosity == 1 else logging.DEBUG
    named = os.environ.get("CAPSEAL_LOG_LEVEL", "").strip().lower()
    if named and named not in LOG_LEVELS:
        raise CLIError(f"CAPSEAL_LOG_LEVEL={named[:20]!r} is not one of {', '.join(LOG_LEVELS)}")
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
