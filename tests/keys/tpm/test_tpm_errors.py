"""The TSS2 return-code mapping, without a TPM: each code capseal acts on,
built from tpm2-pytss's own ``TPM2_RC`` / ``TSS2_RC`` names (with a handle,
parameter or session number where the TPM would add one), becomes the typed
error it must, and the predicates the signer and provisioning code retry on
say yes to exactly their codes."""

from __future__ import annotations

import pytest
from tpm2_pytss import TSS2_Exception
from tpm2_pytss.constants import TPM2_RC, TSS2_RC

from capseal.errors import (
    CapsealError,
    DeviceError,
    KeyNotFoundError,
    PinIncorrectError,
    PinLockedError,
    SignerUnavailableError,
    TPMObjectMemoryError,
)
from capseal.keys.tpm import map_tss_error
from capseal.keys.tpm._errors import (  # the predicates themselves: what the signer retries on
    OBJECT_MEMORY_HINT,
    is_auth_failure,
    is_integrity_failure,
    is_object_memory,
    is_stale_name,
    is_transport_error,
    names_no_object,
)

TCTI = "swtpm:host=127.0.0.1,port=2321"


def _tpm(code: int, *, handle: int = 0, parameter: int = 0, session: int = 0) -> TSS2_Exception:
    """The exception ESAPI raises for a TPM response code: a format-one code
    carries the number of the handle, parameter or session it is about."""
    rc = int(code)
    if handle:
        rc |= int(TPM2_RC.H) | (handle << 8)
    elif parameter:
        rc |= int(TPM2_RC.P) | (parameter << 8)
    elif session:
        rc |= int(TPM2_RC.S) | (session << 8)
    return TSS2_Exception(rc)


def _layer(layer: int, base: int) -> TSS2_Exception:
    """The exception for a code of one of the TSS's own layers."""
    return TSS2_Exception(int(layer) | int(base))


@pytest.mark.parametrize(("exc", "error", "words"), [
    (_tpm(TPM2_RC.OBJECT_MEMORY), TPMObjectMemoryError, "TPM_RC_OBJECT_MEMORY"),
    (_tpm(TPM2_RC.SESSION_MEMORY), TPMObjectMemoryError, "out of memory"),
    (_tpm(TPM2_RC.MEMORY), TPMObjectMemoryError, "out of memory"),
    (_tpm(TPM2_RC.LOCKOUT), PinLockedError, "dictionary-attack lockout"),
    (_tpm(TPM2_RC.AUTH_FAIL, session=1), PinIncorrectError, "refused the authorization value"),
    (_tpm(TPM2_RC.BAD_AUTH, session=1), PinIncorrectError, "refused the authorization value"),
    (_tpm(TPM2_RC.HANDLE, handle=1), KeyNotFoundError, "no such object"),
    (_tpm(TPM2_RC.HANDLE, handle=2), KeyNotFoundError, "no such object"),
    (_tpm(TPM2_RC.REFERENCE_H0), KeyNotFoundError, "no such object"),
    (_tpm(TPM2_RC.RETRY), SignerUnavailableError, "busy"),
    (_tpm(TPM2_RC.YIELDED), SignerUnavailableError, "busy"),
    (_tpm(TPM2_RC.CANCELED), SignerUnavailableError, "busy"),
    (_tpm(TPM2_RC.TESTING), SignerUnavailableError, "busy"),
    (_tpm(TPM2_RC.INTEGRITY, parameter=1), DeviceError, "failed"),
    (_tpm(TPM2_RC.VALUE, parameter=2), DeviceError, "failed"),
    (_layer(TSS2_RC.TCTI_RC_LAYER, TSS2_RC.BASE_RC_IO_ERROR), SignerUnavailableError, "not reachable"),
    (_layer(TSS2_RC.TCTI_RC_LAYER, TSS2_RC.BASE_RC_GENERAL_FAILURE), SignerUnavailableError, "not reachable"),
    (_layer(TSS2_RC.ESAPI_RC_LAYER, TSS2_RC.BASE_RC_BAD_SEQUENCE), SignerUnavailableError, "not reachable"),
    (_layer(TSS2_RC.ESAPI_RC_LAYER, TSS2_RC.BASE_RC_TRY_AGAIN), SignerUnavailableError, "not reachable"),
    (_layer(TSS2_RC.SYS_RC_LAYER, TSS2_RC.BASE_RC_INSUFFICIENT_RESPONSE), SignerUnavailableError, "not reachable"),
    (_layer(TSS2_RC.SYS_RC_LAYER, TSS2_RC.BASE_RC_MALFORMED_RESPONSE), SignerUnavailableError, "not reachable"),
    # a software layer's refusal that is not a broken stream: a DeviceError, never a TPM code's meaning
    (_layer(TSS2_RC.ESAPI_RC_LAYER, TSS2_RC.BASE_RC_BAD_REFERENCE), DeviceError, "failed"),
    (_layer(TSS2_RC.ESAPI_RC_LAYER, TSS2_RC.BASE_RC_GENERAL_FAILURE), DeviceError, "failed"),
])
def test_each_code_becomes_its_typed_error(exc: TSS2_Exception, error: type[CapsealError], words: str) -> None:
    mapped = map_tss_error(exc, TCTI, "signing with TPM key 0x81000101")
    assert type(mapped) is error, (hex(int(exc.rc)), mapped)
    assert words in str(mapped) and TCTI in str(mapped) and "signing with TPM key 0x81000101" in str(mapped)
    if error in (DeviceError, KeyNotFoundError, PinIncorrectError) or words in ("busy", "not reachable"):
        assert f"rc 0x{int(exc.rc):x}" in str(mapped)  # the code itself, for whoever reads the TSS's documentation


def test_hints_say_what_to_do() -> None:
    assert map_tss_error(_tpm(TPM2_RC.OBJECT_MEMORY), TCTI).hint == OBJECT_MEMORY_HINT
    assert "tpm2_dictionarylockout" in (map_tss_error(_tpm(TPM2_RC.LOCKOUT), TCTI).hint or "")
    auth = map_tss_error(_tpm(TPM2_RC.AUTH_FAIL, session=1), TCTI).hint or ""
    assert "dictionary-attack lockout" in auth and "pin=" in auth
    unreachable = map_tss_error(_layer(TSS2_RC.TCTI_RC_LAYER, TSS2_RC.BASE_RC_IO_ERROR), TCTI).hint or ""
    assert "swtpm socket --tpm2" in unreachable and "reconnects" in unreachable


def test_other_errors_pass_through_or_become_device_errors() -> None:
    own = PinIncorrectError("already typed")
    assert map_tss_error(own, TCTI) is own
    other = map_tss_error(ValueError("a tpm2-pytss type check"), TCTI, "reading properties")
    assert type(other) is DeviceError and "ValueError: a tpm2-pytss type check" in str(other)


def test_the_predicates_say_yes_to_their_codes_only() -> None:
    every = [_tpm(code, handle=1) if code == TPM2_RC.HANDLE else _tpm(code) for code in (
        TPM2_RC.OBJECT_MEMORY, TPM2_RC.HANDLE, TPM2_RC.REFERENCE_H0, TPM2_RC.AUTH_FAIL, TPM2_RC.BAD_AUTH,
        TPM2_RC.INTEGRITY, TPM2_RC.LOCKOUT, TPM2_RC.VALUE)]
    every += [_layer(TSS2_RC.TCTI_RC_LAYER, TSS2_RC.BASE_RC_IO_ERROR),
              _layer(TSS2_RC.ESAPI_RC_LAYER, TSS2_RC.BASE_RC_BAD_REFERENCE),
              _layer(TSS2_RC.ESAPI_RC_LAYER, TSS2_RC.BASE_RC_GENERAL_FAILURE),
              _layer(TSS2_RC.SYS_RC_LAYER, TSS2_RC.BASE_RC_GENERAL_FAILURE)]

    def which(predicate: object) -> list[str]:
        return [f"0x{int(e.rc):x}" for e in every if predicate(e)]  # type: ignore[operator]

    assert which(is_object_memory) == [f"0x{int(TPM2_RC.OBJECT_MEMORY):x}"]
    assert which(names_no_object) == [f"0x{int(TPM2_RC.HANDLE) | int(TPM2_RC.H) | 0x100:x}",
                                      f"0x{int(TPM2_RC.REFERENCE_H0):x}"]
    assert which(is_auth_failure) == [f"0x{int(TPM2_RC.AUTH_FAIL):x}", f"0x{int(TPM2_RC.BAD_AUTH):x}"]
    assert which(is_integrity_failure) == [f"0x{int(TPM2_RC.INTEGRITY):x}"]
    assert which(is_transport_error) == [f"0x{int(TSS2_RC.TCTI_RC_LAYER) | int(TSS2_RC.BASE_RC_IO_ERROR):x}"]
    assert not is_transport_error(OSError("not a TSS2 failure"))
    # the name mismatch Esys_TR_FromTPMPublic reports: ESAPI's catch-all, no other layer's
    assert which(is_stale_name) == [f"0x{int(TSS2_RC.ESYS_RC_GENERAL_FAILURE):x}"]
    # an auth failure names its session: the number is stripped before the code is read
    assert is_auth_failure(_tpm(TPM2_RC.AUTH_FAIL, session=2)) and is_auth_failure(_tpm(TPM2_RC.BAD_AUTH, session=3))
