"""A ``keys create`` stopped by Ctrl-C (or a failure) after the device made
the key, but before the caller had it, removes the key again, so no key is
left under a name nobody was told of (a second ``keys create`` then refused
the name as taken); when the removal fails too, the key left is named with
the command that deletes it. With real key files, a real SoftHSM2 token and
a real swtpm: nothing of a device is replaced. Only the interrupt is
injected, at chosen points in process (after a real device call returns, or
while the TPM's worker still runs one), and once the removal's failure, for
a file key; the last test sends a real SIGINT to ``capseal keys create``
subprocesses at any moment instead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from capseal import cli
from capseal.errors import DeviceError, KeyNotFoundError
from capseal.keys import provision
from capseal.keys.pkcs11 import _provision as pkcs11_provision  # the step between making and checking a key
from capseal.keys.provision import create_key, left_behind, list_keys
from capseal.keys.tpm import TPMDevice

CAPSEAL = str(Path(sys.executable).with_name("capseal"))


def _present(uri: str, pin: str | None = None) -> bool:
    try:
        return bool(list_keys(uri, pin=pin))
    except KeyNotFoundError:
        return False


def _interrupt_self_test(monkeypatch: Any) -> None:
    """A Ctrl-C as the new key's self-test ends: the backend made the key and
    the device really signed the self-test; the caller has nothing yet."""
    real = provision.SignerSelfTest.run

    def interrupted(signer: Any) -> None:
        real(signer)
        raise KeyboardInterrupt

    monkeypatch.setattr(provision.SignerSelfTest, "run", staticmethod(interrupted))


def test_an_interrupt_after_the_key_is_made_removes_it(softhsm: Any, swtpm: Any, tmp_path: Path,
                                                       monkeypatch: Any) -> None:
    label = f"int-{os.urandom(3).hex()}"
    cases = [(f"file:{tmp_path / 'k.pem'}", None), (softhsm.uri(label), softhsm.pin),
             (f"tpm2:handle=0x81000f41?tcti={swtpm.tcti}", None),
             (f"tpm2:keyfile={tmp_path / 'k.tss'}?tcti={swtpm.tcti}", None)]
    for uri, pin in cases:
        with monkeypatch.context() as patch:
            _interrupt_self_test(patch)
            with pytest.raises(KeyboardInterrupt) as info:
                create_key(uri, "p256", pin=pin)
        assert left_behind(info.value) is None
        assert not _present(uri, pin), uri  # removed again
        create_key(uri, "p256", pin=pin).close()  # and the name is free
        provision.delete_key(uri, pin=pin)


def test_an_interrupt_while_the_token_makes_the_key_removes_it(softhsm: Any, monkeypatch: Any) -> None:
    uri = softhsm.uri(f"int-tok-{os.urandom(3).hex()}")
    real = pkcs11_provision.check_new_key

    def made_then_interrupted(*args: Any) -> None:
        real(*args)
        raise KeyboardInterrupt  # the pair is on the token, under the lock, before anyone has it

    monkeypatch.setattr(pkcs11_provision, "check_new_key", made_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        create_key(uri, "ed25519", pin=softhsm.pin)
    monkeypatch.undo()
    assert not _present(uri, softhsm.pin)
    create_key(uri, "ed25519", pin=softhsm.pin).close()


def test_an_interrupt_while_the_tpm_makes_the_key_waits_for_it_and_removes_it(swtpm: Any, monkeypatch: Any) -> None:
    """Ctrl-C reaches the caller while the TPM's worker thread is still making
    (and persisting) the key: the worker is not stopped by it, so the undo
    waits for the job and then evicts what it persisted."""
    uri = f"tpm2:handle=0x81000f42?tcti={swtpm.tcti}"
    real = TPMDevice.wait
    fired: list[bool] = []

    def interrupted_once(self: TPMDevice, fut: Any, timeout: float | None = None) -> Any:
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt
        return real(self, fut, timeout)

    monkeypatch.setattr(TPMDevice, "wait", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        create_key(uri, "p256")
    monkeypatch.undo()
    assert fired and not _present(uri)


def test_a_key_that_cannot_be_removed_is_named_with_the_command_that_deletes_it(tmp_path: Path, monkeypatch: Any,
                                                                               capsys: Any) -> None:
    key = tmp_path / "stuck.pem"
    _interrupt_self_test(monkeypatch)

    def cannot(*args: Any, **kwargs: Any) -> None:
        raise DeviceError("the device went away")

    monkeypatch.setattr(provision, "delete_key", cannot)
    with pytest.raises(KeyboardInterrupt) as info:
        create_key(f"file:{key}", "ed25519")
    assert left_behind(info.value) == f"file:{key}" and key.exists()
    key.unlink()
    cli.main(["keys", "create", f"file:{key}", "--alg", "ed25519"])  # the CLI turns the Ctrl-C into its exit
    err = capsys.readouterr().err
    assert f"the key being created was left at file:{key}: remove it with: capseal keys delete 'file:{key}'" in err


def test_sigint_at_any_moment_of_keys_create_leaves_no_key_unaccounted_for(softhsm: Any) -> None:
    """A real Ctrl-C sent to `capseal keys create` at moments spread over its
    run (an RSA key, which the token takes a while to generate): afterwards
    the key either exists and the command printed it, or does not exist, or
    the command named it as left."""
    env = {**os.environ, "CAPSEAL_PIN": softhsm.pin}
    start = time.monotonic()
    done = subprocess.run([CAPSEAL, "keys", "create", softhsm.uri(f"sig-t-{os.urandom(3).hex()}"), "--alg", "rsa-pss"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    whole = time.monotonic() - start
    outcomes = []
    for i in range(5):
        uri = softhsm.uri(f"sig-{i}-{os.urandom(3).hex()}")
        proc = subprocess.Popen([CAPSEAL, "keys", "create", uri, "--alg", "rsa-pss"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        time.sleep(whole * (0.4 + 0.12 * i))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        present = _present(uri, softhsm.pin)
        if out.startswith("created PS256 key"):  # printed: the operator has it (the Ctrl-C may come after)
            outcomes.append("finished")
            assert present, (out, err)
        elif "was left at" in err:
            outcomes.append("named")
            assert present
        else:
            outcomes.append("removed")
            assert not present, (proc.returncode, out, err)
    assert len(outcomes) == 5
