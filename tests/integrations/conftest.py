"""Fixtures of the adapter tests: a producer on a SoftHSM2 key whose ledger
gives up on a lock quickly (the fault tests lock it and take the token away)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capseal import Producer
from capseal.keys import open_signer
from capseal.keys.provision import create_key
from capseal.ledger import Ledger

from .support import Token

PIN = "i22-token-pin~4"


@pytest.fixture(scope="module")
def token(softhsm: Any) -> Token:
    """A token of the module's own (taking its storage away disturbs no other test) with an Ed25519 key."""
    tokens = Path(softhsm.dir) / "tokens"
    before = set(os.listdir(tokens))
    label = f"i22-{os.urandom(3).hex()}"
    softhsm.add_token(label, pin=PIN)
    (token_dir,) = set(os.listdir(tokens)) - before
    uri = softhsm.uri("seal-key", label=label)
    create_key(uri, "ed25519", pin=PIN).close()
    return Token(uri=uri, pin=PIN, dir=tokens / token_dir, module=softhsm.module, label=label)


@pytest.fixture()
def token_producer(token: Token, tmp_path: Path) -> Iterator[Producer]:
    """A producer sealing with the token's key into a ledger whose commits give up after 0.1 s of a lock."""
    ledger = Ledger(tmp_path / "faults.db", lock_timeout=0.1)
    with open_signer(token.uri, pin=token.pin) as signer, Producer("acme", "agent@1", signer, ledger) as producer:
        yield producer
    ledger.close()
