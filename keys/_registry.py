"""Key URI scheme registry and ``open_signer``.

``SIGNER_FOR_URI_SCHEME`` maps a URI scheme to a loader: either a class/callable
with ``from_uri(uri, pin=…, secrets_handler=…, **options)`` or a
``"module:attribute"`` string imported lazily, so optional backends
(``capseal[pkcs11]``, ``capseal[tpm]``) cost nothing until used and a missing
extra raises :class:`~capseal.errors.MissingExtraError` naming what to install.
Users may register their own schemes.
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from capseal.errors import KeyURIError, MissingExtraError, UnknownOptionError

from ._base import Signer
from .secret import Secret, as_secret

__all__ = ["SIGNER_FOR_URI_SCHEME", "open_signer", "register_scheme", "redact_uri", "SecretsHandler", "check_options",
           "load_target"]

#: Called with a prompt (e.g. "PIN for token 'agents'") and returns the secret.
SecretsHandler = Callable[[str], str]

SIGNER_FOR_URI_SCHEME: dict[str, Any] = {
    "file": "capseal.keys._software:FileSigner",
    "unsafe-ephemeral": "capseal.keys._software:UnsafeEphemeralSigner",
    "ephemeral": "capseal.keys._software:refuse_ephemeral_uri",
    "pkcs11": "capseal.keys.pkcs11:PKCS11Signer",
    "tpm2": "capseal.keys.tpm:TPMSigner",
}

_EXTRAS = {
    "pkcs11": ("capseal[pkcs11]", "python-pkcs11", "softhsm2 (or your HSM's PKCS#11 module)"),
    "tpm2": ("capseal[tpm]", "tpm2-pytss", "libtss2-dev pkg-config (build), tpm2-tools"),
}

_SECRET_QUERY = re.compile(r"(?i)([?&;]pin-value=)[^&;#]*")


def redact_uri(uri: str) -> str:
    """A key URI fit to print.

    Args:
        uri: any key URI.

    Returns:
        The URI with every ``pin-value`` attribute's value replaced by ``***``.
    """
    return _SECRET_QUERY.sub(r"\1***", uri)


def check_options(what: str, options: dict[str, Any], valid: tuple[str, ...]) -> None:
    """Refuse the keyword arguments a backend was given beyond those it names.

    Args:
        what: names the call, e.g. "open_signer for a pkcs11: key".
        options: the leftover keyword arguments.
        valid: every option the call takes (the ones the backend took itself too).

    Raises:
        UnknownOptionError: when ``options`` is not empty, naming each, its
            closest valid spelling and every valid option.
    """
    if not options:
        return
    names = sorted(str(name) for name in options)
    guesses = [difflib.get_close_matches(name, valid, n=1, cutoff=0.6) for name in names]
    said = ", ".join(f"{name!r}" + (f" (did you mean {guess[0]!r}?)" if guess else "")
                     for name, guess in zip(names, guesses))
    plural = "s" if len(names) > 1 else ""
    raise UnknownOptionError(f"{what}: unknown option{plural} {said}; the valid options are {', '.join(sorted(valid))}")


def register_scheme(scheme: str, loader: Any) -> None:
    """Register a signer loader for a URI scheme (overriding an existing one).

    Args:
        scheme: the URI scheme (case-insensitive).
        loader: a class or callable with ``from_uri(uri, pin=…, secrets_handler=…, **options)``
            (or a plain callable taking the same), or a ``"module:attribute"`` string loaded on first use.
    """
    SIGNER_FOR_URI_SCHEME[scheme.lower()] = loader


def load_target(scheme: str, target: str) -> Any:
    """Import a backend's function or class by name, so that an optional
    backend costs nothing until it is used.

    Args:
        scheme: the backend's URI scheme (``pkcs11``, ``tpm2``), named in errors.
        target: ``"module:attribute"``, e.g. ``"capseal.keys.pkcs11:init_softhsm_token"``.

    Returns:
        The attribute.

    Raises:
        MissingExtraError: the backend's optional package (or a system library
            it needs) is missing, naming the extra and the system packages.
        KeyURIError: the module has no such attribute.
    """
    module_name, _, attr = target.partition(":")
    failure: ImportError | None = None
    try:
        # a lazy facade imports the backend's leaves on getattr: a missing extra shows there
        return getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        failure = exc
    except AttributeError:
        pass
    if failure is not None:  # raised outside the handler: the ImportError is not chained
        raise missing_extra(scheme, failure)
    raise KeyURIError(f"the {scheme}: backend has no {attr}")


def lazy_export(scheme: str, package: str, leaves: Mapping[str, str], namespace: dict[str, Any], name: str) -> Any:
    """A backend facade's ``__getattr__``: ``name`` loaded from the leaf module
    ``leaves`` names for it (:func:`load_target`), and kept in ``namespace``.

    Args:
        scheme: the backend's URI scheme, named in errors.
        package: the facade's ``__name__``.
        leaves: public name -> leaf module (``"_signer"``).
        namespace: the facade's ``globals()``.
        name: the attribute asked for.

    Returns:
        The attribute.

    Raises:
        AttributeError: ``name`` is not one of the facade's lazy names.
        MissingExtraError: the backend's optional package is missing (see :func:`load_target`).
    """
    leaf = leaves.get(name)
    if leaf is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = load_target(scheme, f"{package}.{leaf}:{name}")
    namespace[name] = value
    return value


def missing_extra(scheme: str, exc: ImportError) -> MissingExtraError:
    """The error for a backend whose import failed: the extra to install and
    the system packages it needs, said once, with what was missing (a
    MissingExtraError of the backend's own, or one made here already, is
    not quoted inside the new one: it would say the same thing again).

    Args:
        scheme: the backend's URI scheme.
        exc: the ImportError (or MissingExtraError) raised.

    Returns:
        The error; its ``name`` is the missing Python module, when known.
    """
    extra = _EXTRAS.get(scheme)
    if extra is None:
        return MissingExtraError(f"cannot load the {scheme}: backend: {exc}")
    name = exc.name
    if isinstance(exc, MissingExtraError) and not name:  # the backend's own: it may name a system library instead
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ImportError) and cause.name:
            name = cause.name
    missing = f"Python module {name!r} is missing" if name else str(exc)
    error = MissingExtraError(f"the {scheme}: backend needs {extra[1]}: pip install '{extra[0]}' "
                              f"(system packages: {extra[2]}); {missing}",
                              hint=f"pip install '{extra[0]}'")
    error.name = name
    return error


def _resolve(scheme: str) -> Any:
    loader = SIGNER_FOR_URI_SCHEME.get(scheme)
    if loader is None:
        raise KeyURIError(
            f"unknown key URI scheme {scheme!r}; known: {sorted(SIGNER_FOR_URI_SCHEME)}"
        )
    return load_target(scheme, loader) if isinstance(loader, str) else loader


def open_signer(
    uri: str,
    *,
    pin: str | Secret | None = None,
    secrets_handler: SecretsHandler | None = None,
    **options: Any,
) -> Signer:
    """Open the key named by ``uri``.

    Args:
        uri: ``file:/path.pem``, ``pkcs11:…`` (RFC 7512), ``tpm2:handle=…`` /
            ``tpm2:keyfile=…``, ``unsafe-ephemeral:EdDSA`` (tests and demos only:
            a key that dies with the process; plain ``ephemeral:`` is refused), or
            a scheme added with :func:`register_scheme`.
        pin: the PIN, passphrase or auth value, kept out of the URI. capseal
            holds it in its secret type from here on (a frame's captured locals
            show only ``<secret … redacted>``).
        secrets_handler: asked for the PIN when the key needs one and none is given.
        options: backend options (each backend refuses those it does not take).

    Returns:
        The signer.

    Raises:
        KeyURIError: the URI is malformed or its scheme unknown.
        UnknownOptionError: an option the backend does not take.
        MissingExtraError: the backend's optional package is not installed.
        SignerError: the backend's own refusals (see each backend).
    """
    pin = as_secret(pin, "pin=")
    if not isinstance(uri, str) or ":" not in uri:
        raise KeyURIError("a key URI looks like scheme:…, e.g. file:/etc/capseal/key.pem")
    scheme = uri.split(":", 1)[0].lower()
    # a pin-value in the URI is a PIN too: only the redacted text stays in this frame
    held = Secret(uri, "the key URI") if _SECRET_QUERY.search(uri) is not None else None
    if held is not None:
        uri = redact_uri(uri)
    loader = _resolve(scheme)
    factory = getattr(loader, "from_uri", loader)
    ours = getattr(loader, "__module__", "").startswith("capseal.")
    # capseal's own backends take the secret; a registered loader gets the text it always got
    signer = factory(uri if held is None else held.reveal(), pin=pin if ours or pin is None else pin.reveal(),
                     secrets_handler=secrets_handler, **options)
    if not isinstance(signer, Signer):
        raise KeyURIError(f"the loader for {scheme}: did not return a Signer")
    return signer
