"""The ``capseal`` command line's subcommands (private: ``capseal.cli`` is the
entry point). One module per group of subcommands, each with ``add_parser(sub)``;
this module holds what they share: exit codes, the one error type, reading a
PIN, a JSON file, and printing JSON.

Modules: ``seal``, ``verify``, ``ledger``, ``keys`` (keys, token, tpm, doctor),
``referee``, ``interpret``. Importing any of them imports only argparse and
the standard library: each command imports what it needs when it runs, so
``capseal --help`` is immediate.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import CapsealError

if TYPE_CHECKING:
    from ...keys._pin import Secret

__all__ = ["EXIT_OK", "EXIT_NOT_OK", "EXIT_ERROR", "EXIT_INTERRUPTED", "CLIError", "read_pin", "pin_from_prompt",
           "load_json_file", "emit", "env_option", "add_pin_args"]

EXIT_OK, EXIT_NOT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


class CLIError(CapsealError):
    """A refusal of the command line's own (an option, a file), printed as one line; exit 2."""


def read_pin(args: argparse.Namespace, prompt: str = "PIN") -> Secret | None:
    """The PIN from ``--pin-file``, else ``--pin-env`` (default CAPSEAL_PIN),
    else ``--pin-prompt``, held as a Secret from the moment it is read (a
    captured frame local shows only its redacted form); None when none is
    given. Checked here, where its source is known: an empty or non-UTF-8 PIN
    is refused before it reaches a token (each refused login uses up a try).
    Errors name the source, never the PIN, and chain no exception (a Unicode
    error's args hold the text). Hints from here on name the CLI's options."""
    from ...keys._pin import Secret, caller_is_cli, usable_pin

    caller_is_cli()
    if getattr(args, "pin_file", None):
        from ...keys._pkcs11_uri import read_pin_file

        return read_pin_file(args.pin_file, f"PIN file {args.pin_file}").usable_pin()
    named = getattr(args, "pin_env", None)
    env = named or "CAPSEAL_PIN"
    if env in os.environ and (named or os.environ[env] != ""):  # CAPSEAL_PIN set but empty: as if unset
        return usable_pin(Secret(os.environ[env], f"environment variable {env}"), env)
    if named:
        raise CLIError(f"--pin-env {named}: environment variable {named} is not set")
    if getattr(args, "pin_prompt", False):
        return pin_from_prompt(prompt).usable_pin()
    return None


def pin_from_prompt(prompt: str) -> Secret:
    """The PIN typed at the terminal. No terminal, or end of input (Ctrl-D),
    is an error: never a PIN-less run the operator asked a prompt for."""
    from ...keys._pin import Secret

    if not sys.stdin.isatty():
        raise CLIError("--pin-prompt needs a terminal; use --pin-file FILE or --pin-env VAR")
    try:
        return Secret(getpass.getpass(f"{prompt}: "), "the PIN prompt")
    except EOFError:
        pass
    raise CLIError("no PIN entered at the prompt (end of input)")


def load_json_file(path: str) -> Any:
    from ...record import strict_json

    try:
        raw = Path(path).read_bytes() if path != "-" else sys.stdin.buffer.read()
    except OSError as exc:
        raise CLIError(f"cannot read {path}: {exc.strerror}") from None
    return strict_json(raw, path)


def emit(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def env_option(p: argparse.ArgumentParser, flag: str, env: str, help: str) -> None:
    """``flag``, defaulting to environment variable ``env`` (required when it is unset or empty)."""
    default = os.environ.get(env) or None
    p.add_argument(flag, default=default, required=default is None, help=f"{help} (default: ${env})")


def add_pin_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pin-env", metavar="VAR", help="environment variable holding the PIN (default CAPSEAL_PIN)")
    p.add_argument("--pin-file", metavar="FILE", help="file holding the PIN")
    p.add_argument("--pin-prompt", action="store_true", help="ask for the PIN on the terminal")


