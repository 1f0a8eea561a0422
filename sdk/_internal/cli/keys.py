"""``capseal keys|token|tpm|doctor``: the key commands of the command line.

Each prints a text form by default and JSON with ``--json``. Exit codes are
the CLI's: 0 ok, 1 not ok (a missing key, a failed doctor check), 2 could not
run. PINs come from ``--pin-file``, ``--pin-env``/``CAPSEAL_PIN`` or
``--pin-prompt`` (``capseal._internal.cli.read_pin``), never the command line. The TPM
commands take their TCTI from ``--tcti`` or the URI's ``tcti=``, else from
``CAPSEAL_TCTI``, else ``TPM2TOOLS_TCTI`` (as tpm2-tools do), else
``device:/dev/tpmrm0``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ...errors import CapsealError, KeyNotFoundError
from . import EXIT_NOT_OK, EXIT_OK, CLIError, add_pin_args, emit, read_pin

__all__ = ["add_parser"]

#: environment variables a TPM command takes its TCTI from, in this order
TCTI_ENV = ("CAPSEAL_TCTI", "TPM2TOOLS_TCTI")


def add_parser(sub: Any) -> None:
    """Add ``keys``, ``token``, ``tpm`` and ``doctor`` to the CLI's subparsers.

    Args:
        sub: the ``add_subparsers()`` object of ``capseal``'s parser.
    """
    keys = sub.add_parser("keys", help="provision signing keys").add_subparsers(dest="keys_cmd", required=True)
    p = keys.add_parser("create", help="create a non-extractable key at URI")
    p.add_argument("uri", help="where the new key goes (never overwritten): pkcs11:token=…;object=LABEL?module-path=…, "
                               "tpm2:handle=0x81000103?tcti=… or tpm2:keyfile=/path, file:/path.pem")
    p.add_argument("--alg", required=True, choices=["ed25519", "p256", "p384", "rsa-pss"],
                   help="ed25519 (EdDSA), p256 (ES256), p384 (ES384), rsa-pss (PS256)")
    _add_json(p)
    add_pin_args(p)
    p.set_defaults(fn=cmd_keys_create)
    p = keys.add_parser("show", help="public key, kid and custody of the key at URI")
    p.add_argument("uri", help="the key: pkcs11:…, tpm2:…, file:…")
    p.add_argument("--outfile", metavar="FILE", help="also write the public key PEM to FILE (for verify --trust)")
    _add_json(p)
    add_pin_args(p)
    p.set_defaults(fn=cmd_keys_show)
    p = keys.add_parser("list", help="keys on a token, TPM or directory")
    p.add_argument("uri", help="pkcs11:token=…?module-path=…, tpm2:?tcti=… (persistent keys), file:/directory")
    _add_json(p)
    add_pin_args(p)
    p.set_defaults(fn=cmd_keys_list)
    p = keys.add_parser("delete", help="delete the one key at URI (after a confirmation)")
    p.add_argument("uri", help="the key: pkcs11:…;object=…, tpm2:handle=… or tpm2:keyfile=…, file:/path.pem")
    p.add_argument("--yes", action="store_true", help="delete without asking (needed when there is no terminal)")
    _add_json(p)
    add_pin_args(p)
    p.set_defaults(fn=cmd_keys_delete)

    token = sub.add_parser("token", help="development tokens").add_subparsers(dest="token_cmd", required=True)
    p = token.add_parser("init", help="create a SoftHSM2 token in a private directory (software, for development)")
    p.add_argument("--dir", required=True, help="directory for softhsm2.conf and the token store")
    p.add_argument("--label", required=True)
    p.add_argument("--so-pin-env", metavar="VAR", help="environment variable holding the SO PIN")
    _add_json(p)
    add_pin_args(p)
    p.set_defaults(fn=cmd_token_init)

    tpm = sub.add_parser("tpm", help="TPM 2.0 provisioning").add_subparsers(dest="tpm_cmd", required=True)
    p = tpm.add_parser("provision", help="create a primary, a persistent signing key and an attestation key")
    p.add_argument("--tcti", help="the TPM (default: CAPSEAL_TCTI, else TPM2TOOLS_TCTI, else device:/dev/tpmrm0; "
                                  "swtpm: swtpm:host=…,port=…)")
    p.add_argument("--handle", default="0x81000101", help="persistent handle for the signing key (default %(default)s)")
    p.add_argument("--ak-handle", default="0x81000102", help="persistent handle for the attestation key (default %(default)s)")
    p.add_argument("--alg", default="p256", choices=["p256", "rsa-pss", "ed25519"],
                   help="signing key: p256 (ES256, default), rsa-pss (PS256); ed25519 is refused unless TPM and TSS "
                        "support EdDSA (TPM2_SignSequenceComplete, TPM 2.0 rev 1.83)")
    p.add_argument("--force", action="store_true", help="replace keys already at those handles")
    p.add_argument("--ak-pem", metavar="FILE", help="write the attestation key's public PEM to FILE (for verify --ak)")
    _add_json(p)
    p.set_defaults(fn=cmd_tpm_provision)

    p = sub.add_parser("doctor", help="check that keys and devices are usable, and say how to fix what is not")
    p.add_argument("uri", nargs="?", help="a key URI to check (pkcs11:…, tpm2:…, file:…)")
    p.add_argument("--tcti", help="TPM TCTI to check (default: the URI's tcti=, else CAPSEAL_TCTI, else "
                                  "TPM2TOOLS_TCTI, else device:/dev/tpmrm0)")
    _add_json(p)
    add_pin_args(p)
    p.set_defaults(fn=cmd_doctor)


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


# ---------------------------------------------------------------------------- TCTI


def _env_tcti() -> str | None:
    """The TCTI the environment names (CAPSEAL_TCTI, else TPM2TOOLS_TCTI),
    checked and refused naming the variable; None when neither is set."""
    from capseal.errors import KeyURIError
    from capseal.keys._tpm_uri import check_tcti

    for name in TCTI_ENV:
        value = os.environ.get(name)
        if value is None or not value.strip():
            continue
        try:
            return check_tcti(value, name)
        except KeyURIError as exc:
            problem = exc
        raise KeyURIError(f"environment variable {name}: {problem}", hint=problem.hint or None)
    return None


def _tpm_options(uri: str) -> dict[str, Any]:
    """``tcti=`` from the environment for a ``tpm2:`` URI that names none
    (the URI's own ``tcti=`` wins); nothing for other URIs."""
    if not uri.lower().startswith("tpm2:"):
        return {}
    _quiet_tss()
    from capseal.keys._tpm_uri import explicit_tcti

    if explicit_tcti(uri) is not None:
        return {}
    tcti = _env_tcti()
    return {} if tcti is None else {"tcti": tcti}


def _quiet_tss() -> None:
    """This process is the CLI, not a library's host: libtss2's own ERROR lines
    (a TCTI that cannot connect) would repeat, less clearly, the error and
    hint capseal prints. The user's own TSS2_LOG is kept."""
    os.environ.setdefault("TSS2_LOG", "all+NONE")


# ---------------------------------------------------------------------------- output


def _not_found(exc: CapsealError) -> int:
    """A missing key: reported as main() reports errors, and exit 1 (the
    command ran; what it looked for is not there)."""
    print(f"capseal: error: {exc}", file=sys.stderr)
    if exc.hint:
        print(f"capseal: hint: {exc.hint}", file=sys.stderr)
    return EXIT_NOT_OK


def _yes_no(value: Any) -> str:
    return {True: "yes", False: "no", None: "unknown"}.get(value, str(value))


def _print_key(info: dict[str, Any]) -> None:
    """The text form of ``keys create`` and ``keys show``."""
    custody = info.get("custody", {})
    print(f"uri: {info['uri']}")
    print(f"alg: {info['alg']}")
    print(f"kid: {info['kid']}")
    print(f"backend: {custody.get('backend', '?')}, key store: {custody.get('key_store', '?')}")
    reason = custody.get("software_device_reason")
    print(f"software device: {_yes_no(custody.get('software_device'))}" + (f" ({reason})" if reason else ""))
    device = custody.get("device")
    if isinstance(device, dict) and device:
        print("device: " + ", ".join(f"{k}={v}" for k, v in device.items() if not isinstance(v, (dict, list))))
    attrs = custody.get("key_attributes")
    if isinstance(attrs, dict) and attrs:
        print("key attributes: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in attrs.items()))
    for name in ("tpm_certify", "tpm_certify_omitted"):
        if name in custody:
            print(f"{name.replace('_', ' ')}: " + ("verified (TPM2_Certify by the AK)" if name == "tpm_certify"
                                                   else str(custody[name])))
    print(info["public_key_pem"], end="")


def _write_pem(path: str, pem: str, flag: str) -> None:
    """Write a public key PEM to ``path``; a file already there is replaced
    only if it holds that very PEM (nothing of the operator's is lost)."""
    target = Path(path)
    try:
        if target.exists():
            if target.read_text(errors="replace") == pem:
                return
            raise CLIError(f"{flag} {path}: the file exists and holds something else; not overwritten")
        tmp = target.with_name(f".{target.name}.capseal-tmp")
        tmp.write_text(pem)
        os.replace(tmp, target)
    except OSError as exc:
        raise CLIError(f"{flag} {path}: cannot write it: {exc.strerror}") from None


# ---------------------------------------------------------------------------- keys


def cmd_keys_create(args: argparse.Namespace) -> int:
    """``capseal keys create URI --alg A``: a new key, printed with its custody.

    A Ctrl-C (or a failure) before the key is printed removes it again; if
    that fails too, the key left is named, with the command that deletes it.
    """
    from capseal.keys._leftover import left_behind
    from capseal.keys.provision import create_key

    options = _tpm_options(args.uri)
    try:
        with create_key(args.uri, args.alg, pin=read_pin(args), **options) as signer:
            info = {"uri": signer.uri, "alg": signer.alg, "kid": signer.kid,
                    "public_key_pem": signer.public_key_pem(), "custody": signer.describe()}
    except BaseException as exc:
        left = left_behind(exc)
        if left is not None:
            print(f"capseal: the key being created was left at {left}: remove it with: capseal keys delete '{left}'",
                  file=sys.stderr)
        raise
    if args.json:
        emit(info)
    else:
        print(f"created {info['alg']} key")
        _print_key(info)
    return EXIT_OK


def cmd_keys_show(args: argparse.Namespace) -> int:
    """``capseal keys show URI``: public key, kid and custody (a missing key exits 1)."""
    from capseal.keys.provision import show_key

    try:
        info = show_key(args.uri, pin=read_pin(args), **_tpm_options(args.uri))
    except KeyNotFoundError as exc:
        return _not_found(exc)
    if args.outfile:
        _write_pem(args.outfile, info["public_key_pem"], "--outfile")
    if args.json:
        emit(info)
    else:
        _print_key(info)
    if args.outfile:
        print(f"capseal: public key written to {args.outfile} (pin it with: capseal verify LEDGER --trust "
              f"{args.outfile})", file=sys.stderr)
    return EXIT_OK


def _names_objects(uri: str) -> bool:
    """Whether a listing URI names particular keys (so an empty list means they are missing)."""
    from capseal.keys._pkcs11_uri import parse_pkcs11_uri
    from capseal.keys._tpm_uri import parse_tpm_uri

    low = uri.lower()
    try:
        if low.startswith("pkcs11:"):
            parsed = parse_pkcs11_uri(uri)
            return parsed.object is not None or parsed.id is not None
        if low.startswith("tpm2:"):
            return parse_tpm_uri(uri).names_key
        if low.startswith("file:"):
            from capseal.keys._software import FileSigner

            return not Path(FileSigner.path_of(uri)).is_dir()  # a file names its key; a directory may hold none
    except CapsealError:
        return False
    return False


def cmd_keys_list(args: argparse.Namespace) -> int:
    """``capseal keys list URI``: the keys there. Exit 1 when the URI names
    keys and none is there (a path, an object=, a handle), or when a key
    listed cannot be read."""
    from capseal.keys.provision import list_keys

    try:
        entries = list_keys(args.uri, pin=read_pin(args), **_tpm_options(args.uri))
    except KeyNotFoundError as exc:
        return _not_found(exc)
    if args.json:
        emit(entries)
    elif not entries:
        print(f"no keys at {_shown_uri(args.uri)}")
    else:
        for entry in entries:
            what = entry.get("alg") or entry.get("type") or "?"
            kid = f"{entry['kid'][:16]}…" if isinstance(entry.get("kid"), str) else "-"
            extra = "  ".join(str(entry[k]) for k in ("role", "label") if entry.get(k))
            line = f"{what:<8} {kid:<18} {entry.get('uri', '')}" + (f"  {extra}" if extra else "")
            if "error" in entry:
                line = f"{'unusable':<8} {'-':<18} {entry.get('uri', '')}  ({entry['error']})"
            print(line)
    missing = not entries and _names_objects(args.uri)
    if missing and not args.json:
        print(f"capseal: error: no key at {_shown_uri(args.uri)}", file=sys.stderr)
    return EXIT_NOT_OK if missing or any("error" in e for e in entries) else EXIT_OK


def _shown_uri(uri: str) -> str:
    from capseal.keys._registry import redact_uri

    return redact_uri(uri)


def cmd_keys_delete(args: argparse.Namespace) -> int:
    """``capseal keys delete URI``: show the one key the URI names, ask (or
    take ``--yes``), then delete exactly that key (its kid is checked again)."""
    from capseal.keys.provision import delete_key, list_keys

    pin = read_pin(args)
    options = _tpm_options(args.uri)
    try:
        entries = list_keys(args.uri, pin=pin, **options)
    except KeyNotFoundError as exc:
        return _not_found(exc)
    if not entries:
        return _not_found(KeyNotFoundError(f"no key at {_shown_uri(args.uri)}"))
    if len(entries) > 1:
        raise CLIError(f"{_shown_uri(args.uri)} names {len(entries)} keys; name one (object= and id=, a handle, "
                        "a file): capseal deletes one key at a time")
    entry = entries[0]
    kid = entry.get("kid") if isinstance(entry.get("kid"), str) else None
    shown = f"{entry.get('uri', _shown_uri(args.uri))} ({entry.get('alg') or entry.get('type') or 'key'}" + (
        f", kid {kid})" if kid else ", kid unknown)")
    if not args.yes:
        if not sys.stdin.isatty():
            raise CLIError(f"keys delete would delete {shown}; with no terminal to confirm on, pass --yes")
        sys.stderr.write(f"delete {shown}? This cannot be undone. [y/N] ")
        sys.stderr.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            print("capseal: nothing deleted", file=sys.stderr)
            return EXIT_NOT_OK
    try:
        result = delete_key(args.uri, kid=kid, pin=pin, **options)
    except KeyNotFoundError as exc:
        return _not_found(exc)
    if args.json:
        emit(result)
    else:
        print(f"deleted {shown}: {', '.join(result.get('deleted', []))}")
    return EXIT_OK


# ---------------------------------------------------------------------------- token, tpm


def cmd_token_init(args: argparse.Namespace) -> int:
    """``capseal token init``: a SoftHSM2 token in a directory of its own."""
    from capseal.keys._pin import Secret
    from capseal.keys._registry import load_target

    init_softhsm_token = load_target("pkcs11", "capseal.keys._pkcs11:init_softhsm_token")  # the extra, by name
    so_pin = None
    if args.so_pin_env:  # named but unset is an error: never a silently generated SO PIN
        if args.so_pin_env not in os.environ:
            raise CLIError(f"--so-pin-env {args.so_pin_env}: environment variable {args.so_pin_env} is not set")
        so_pin = Secret(os.environ[args.so_pin_env], f"environment variable {args.so_pin_env}").usable_pin()
    info = init_softhsm_token(Path(args.dir), args.label, pin=read_pin(args), so_pin=so_pin)
    if args.json:
        emit(info)
        return EXIT_OK
    print(f"created SoftHSM2 token {info['label']!r} (serial {info.get('serial')}): a software token, for "
          "development (its keys are files)")
    print(f"uri: {info['uri']}")
    print(f"export {info['env']}")
    if "pin_source" in info:
        print(f"user PIN: generated into {info['pin_source']} (mode 0600; the uri reads it with pin-source=)")
    if "so_pin_file" in info:
        print(f"SO PIN: generated into {info['so_pin_file']} (mode 0600)")
    return EXIT_OK


def cmd_tpm_provision(args: argparse.Namespace) -> int:
    """``capseal tpm provision``: SRK, signing key and AK; ``--ak-pem`` writes
    the AK's public key for ``capseal verify --ak``."""
    from capseal.keys._registry import load_target
    from capseal.keys._tpm_uri import parse_persistent_handle

    _quiet_tss()
    provision = load_target("tpm2", "capseal.keys._tpm:provision")  # without the extra: MissingExtraError, by name
    tcti = args.tcti if args.tcti is not None else _env_tcti()
    # parse_persistent_handle, not int(): a typo is a KeyURIError naming the option, never a traceback
    info = provision(tcti, signing_handle=parse_persistent_handle(args.handle, "--handle"),
                     ak_handle=parse_persistent_handle(args.ak_handle, "--ak-handle"), alg=args.alg, force=args.force)
    if args.ak_pem:
        _write_pem(args.ak_pem, info["attestation_key"]["public_key_pem"], "--ak-pem")
        info["ak_pem_file"] = str(Path(args.ak_pem).absolute())
    if args.json:
        emit(info)
        return EXIT_OK
    device = info.get("device", {})
    print(f"TPM {info['tcti']}: {device.get('manufacturer')} '{str(device.get('vendor', '')).strip()}', "
          f"software device: {_yes_no(info.get('software_device'))}")
    signing, ak = info["signing_key"], info["attestation_key"]
    print(f"signing key: {signing['handle']} {signing['alg']} kid {signing['kid']}\n  uri: {signing['uri']}")
    print(f"attestation key: {ak['handle']} name {ak['name']}\n  uri: {ak['uri']}")
    if info.get("replaced"):
        print(f"replaced: {', '.join(info['replaced'])}")
    if args.ak_pem:
        print(f"attestation key public PEM written to {args.ak_pem}: verifiers pin it with "
              f"capseal verify LEDGER --evidence --ak {args.ak_pem}")
    else:
        print("pass --ak-pem FILE to write the attestation key's public PEM for capseal verify --ak")
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    """``capseal doctor [URI]``: one line per check, a fix under each failure."""
    from capseal.keys._tpm_uri import explicit_tcti
    from capseal.keys.doctor import run_doctor

    tcti = args.tcti
    uri = args.uri
    if tcti is None and (uri is None or uri.lower().startswith("tpm2:")):
        _quiet_tss()
        try:
            named = explicit_tcti(uri) if uri else None
        except CapsealError:
            named = None  # a malformed URI: doctor's own check says why
        if named is None:
            tcti = _env_tcti()
    pin, pin_problem = None, None
    try:
        pin = read_pin(args)
    except CapsealError as exc:  # reported as a failed check; the checks that need no PIN still run
        pin_problem = exc
    checks = run_doctor(uri=uri, pin=pin, tcti=tcti, pin_problem=pin_problem)
    if args.json:
        emit([c.to_dict() for c in checks])
    else:
        for c in checks:
            mark = "ok" if c.ok and c.checked else ("not checked" if c.ok else "FAIL")
            print(f"[{mark}] {c.name}: {c.detail}")
            if c.fix and (not c.ok or not c.checked):
                print(f"       fix: {c.fix}")
    return EXIT_OK if all(c.ok for c in checks) else EXIT_NOT_OK

