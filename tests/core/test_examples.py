"""Every script in examples/ runs, and what it prints is checked."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ..secret_files import write_secret

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: what examples/twins_referee.py prints for the rules' three regimes, whatever its keys
TWINS_REFEREE = [
    r'^operator_off_calls_nothing_and_says_so: \{"counts_against":null,"referee_calls":0,"row":\{"reason":"off",'
    r'"state":"not_adjudicated"\}\} \(the rules\' answer: yes\)$',
    r'^differing_pair_triggers_one_call: \{"counts_against":"node-b","referee_calls":1,"row":\{"referee":"node-c",'
    r'"state":"adjudicated","tier":1,"verdict":"contradicted:node-b"\}\} \(the rules\' answer: yes\)$',
    r'^no_eligible_referee: \{"counts_against":null,"referee_calls":0,"row":\{"reason":"no_eligible_referee",'
    r'"state":"not_adjudicated"\}\} \(the rules\' answer: yes\)$',
    r"^  ruling [0-9a-f]{64} adjudication/v1: verify_judgment ok=True signature=authored epistemic_type=adjudication; "
    r"under node-c's announced key ok=True",
    r"^  verify_ledger book-differing_pair_triggers_one_call\.db: ok=True",
    r"^halves unchanged: True$",
]

#: what each agent example prints: a planned capsule and its outcome for each of the two tool calls
def _agent_calls(lookup_id: str, cancel_id: str) -> list[str]:
    return [
        rf"^call {lookup_id} +lookup_order +planned → confirmed +request [0-9a-f]{{12}}… +response [0-9a-f]{{12}}…$",
        rf"^call {cancel_id} +cancel_order +planned → failed +request [0-9a-f]{{12}}…",
        r"^open calls: 0$",
        r"^ledger ok: True, 5 records, signatures authored$",
    ]


AGENTS: dict[str, list[str]] = {
    "agent_langchain.py": [r"^agent: A-100 has shipped; it cannot be cancelled\.", *_agent_calls("c-lookup", "c-cancel")],
    "agent_openai_agents.py": [r"^agent: A-100 has shipped; it cannot be cancelled\.",
                               *_agent_calls("c-lookup", "c-cancel")],
    "agent_pydantic_ai.py": [r"^agent: A-100 has shipped; it cannot be cancelled\.",
                             *_agent_calls("c-lookup", "c-cancel")],
    "agent_mcp.py": [r"^client: ok, error ", *_agent_calls(r"\d+", r"\d+")],
}

#: example file -> regular expressions its output must match (each must appear)
EXPECTED: dict[str, list[str]] = {
    **AGENTS,
    "demo.py": [
        r"sealed   po-7 +planned +effect_mode=not_applicable",
        r"sealed   po-7/confirmed +confirmed +effect_mode=confirmed +ledger_mode=chained",
        r"sealed   pay-9 +denied",
        r"sealed   pay-10/resolved +resolved .*ledger_mode=chained",
        r"refused  overclaim: assurance\.attestation_mode='anchored' overclaims",
        r"refused  float: floating-point value 59\.7 at \$\[\"x-invoice\"\]\.amount",
        r"ledger   capsules\.db: 7 records \(nothing written for the refusals\)",
        r"evidence hardware_evidence=None",
        r"capseal  verify_ledger: ok=True, 7 records, signatures 7 authored",
        r"reference agent-action-capsule 0\.12\.0: ok=True, 7/7 signatures authored",
    ],
    "quickstart.py": [
        r"^[0-9a-f]{64} \{'attestation_mode': 'self_attested', 'effect_mode': 'confirmed', 'ledger_mode': 'chained'\}$",
        r"^hardware_evidence: None$",
        r"^ledger ok: True$",
    ],
    "twins_referee.py": TWINS_REFEREE,
}


def _scripts() -> list[str]:
    return sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


#: examples whose output is checked by a dedicated test file (which must name them)
CHECKED_ELSEWHERE: dict[str, str] = {"judge_three_ways.py": "judge", "interpret_consumer.py": "judge"}


def test_every_example_has_expectations() -> None:
    tests_dir = Path(__file__).parent.parent
    for name in _scripts():
        if name in EXPECTED:
            continue
        where = CHECKED_ELSEWHERE.get(name)
        assert where is not None, f"{name} has no output checks"
        checkers = [p for p in (tests_dir / where).rglob("test_*.py") if name in p.read_text()]
        assert checkers, f"{name} is said to be checked in tests/{where}, but no test there runs it"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs_and_prints(name: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for pattern in EXPECTED[name]:
        assert re.search(pattern, proc.stdout, re.M), f"{name}: {pattern!r} not in output:\n{proc.stdout}"


def test_demo_in_a_workdir_of_an_earlier_run_says_so_and_changes_nothing(tmp_path: Path) -> None:
    """`demo.py WORKDIR` a second time in one WORKDIR: exit 2 with a message,
    the first run's key and ledger untouched. Before, write_pkcs8's
    FileExistsError stopped it with a traceback (and a kept key would have
    met the ledger's DuplicateRecordError for po-7)."""
    first = subprocess.run([sys.executable, str(EXAMPLES / "demo.py"), str(tmp_path / "w")], capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    # a kept WORKDIR: the printed commands inspect it as they stand
    commands = re.findall(r"^ {11}(capseal .*)$", first.stdout, re.M)
    assert [c.split()[1] for c in commands] == ["ledger", "verify"], first.stdout
    for command in commands:
        shown = subprocess.run(shlex.split(command), executable=CLI, capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stdout + shown.stderr
    before = {p.name: p.read_bytes() for p in (tmp_path / "w").iterdir() if p.suffix in (".pem", ".db")}
    again = subprocess.run([sys.executable, str(EXAMPLES / "demo.py"), str(tmp_path / "w")], capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 2 and again.stdout == "", again.stdout + again.stderr
    assert "holds seal-key.pem and capsules.db from an earlier run" in again.stderr
    assert "Traceback" not in again.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "w").iterdir() if p.suffix in (".pem", ".db")} == before


# ---------------------------------------------------------------------- snippets in the READMEs, run as shown

ROOT = EXAMPLES.parent
CLI = str(Path(sys.executable).parent / "capseal")


def _python_block(doc: Path, after: str) -> str:
    """The first ```python block in ``doc`` after the line ``after``."""
    text = doc.read_text()
    start = text.index(after)
    match = re.search(r"```python\n(.*?)^ *```", text[start:], re.S | re.M)
    assert match is not None, f"no python block after {after!r} in {doc}"
    return textwrap.dedent(match.group(1))


def _substitute(snippet: str, replacements: dict[str, str]) -> str:
    """``snippet`` with each placeholder replaced; each must be in it (a doc
    change that drops one should fail here, not run something else)."""
    for old, new in replacements.items():
        assert old in snippet, f"{old!r} is no longer in the snippet:\n{snippet}"
        snippet = snippet.replace(old, new)
    return snippet


def _blocks(doc: Path, after: str, lang: str) -> list[str]:
    """Every ```lang block of the section of ``doc`` that starts at the line ``after``."""
    text = doc.read_text()
    start = text.index(after)
    end = text.find("\n## ", start + len(after))
    section = text[start:] if end < 0 else text[start:end]
    return [textwrap.dedent(m) for m in re.findall(rf"```{lang}\n(.*?)^ *```", section, re.S | re.M)]


def test_readme_use_section_runs_as_shown(tmp_path: Path) -> None:
    """README.md "Use", every block as written, in an empty directory with
    the venv's capseal on PATH: the key is created by the shown
    `capseal keys create`, the Python seals into capsules.db and prints the
    capsule id and the derived assurance, the shell block seals one more and
    the ledger verifies."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    create, seal_and_verify = _blocks(ROOT / "README.md", "## Use", "bash")
    (snippet,) = _blocks(ROOT / "README.md", "## Use", "python")
    made = subprocess.run(["bash", "-euc", create], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    proc = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"[0-9a-f]{64} \{'attestation_mode': 'self_attested', 'effect_mode': 'confirmed', "
                        r"'ledger_mode': 'chained'\}\n", proc.stdout), proc.stdout
    shown = subprocess.run(["bash", "-euc", seal_and_verify], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "sealed  po-8  " in shown.stdout and "5 records, 5 ok" in shown.stdout, shown.stdout


def test_hardware_readme_token_steps_run_as_shown(softhsm: Any, tmp_path: Path) -> None:
    """hardware/README.md, "Provisioning a key on a token": step 2's
    `capseal keys create` (PIN from a file), step 4's Python with the PIN from
    pin-source=, and `capseal verify … --trust` with the printed public key,
    on a SoftHSM2 token of their own ("agents" in the doc)."""
    label = f"agents-{os.urandom(3).hex()}"
    softhsm.add_token(label)
    pin_file = write_secret(tmp_path / "token.pin", softhsm.pin + "\n")
    subs = {"token=agents": f"token={label}", "module-path=…": f"module-path={softhsm.module}",
            "/etc/capseal/token.pin": str(pin_file)}
    doc = (ROOT / "hardware" / "README.md").read_text()
    create = re.search(r"^ *(capseal keys create 'pkcs11:[^\n]*)$", doc, re.M)
    assert create is not None
    made = subprocess.run(shlex.split(_substitute(create.group(1), subs)), capture_output=True, text=True, timeout=120,
                          executable=CLI)
    assert made.returncode == 0, made.stderr
    # the text form an operator reads: "uri: …", "alg: …", then the public key PEM
    lines = dict(line.split(": ", 1) for line in made.stdout.splitlines() if line.split(": ", 1)[0] in ("uri", "alg"))
    assert lines["alg"] == "EdDSA" and ";object=seal-key;id=" in lines["uri"] and softhsm.pin not in made.stdout
    (tmp_path / "seal-key.pem").write_text(made.stdout[made.stdout.index("-----BEGIN PUBLIC KEY-----"):])

    snippet = _substitute(_python_block(ROOT / "hardware" / "README.md", "4. **Seal with it:**"), subs)
    snippet = "from capseal import Producer\nfrom capseal.keys import open_signer\n" + snippet.replace(
        "producer: ...", "producer:\n    producer.seal({'action_id': 'hw-1', 'action_type': 'fyi'})")
    proc = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    verified = subprocess.run([CLI, "verify", "capsules.db", "--trust", "seal-key.pem"], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
    assert verified.returncode == 0 and "2 records, 2 ok" in verified.stdout, verified.stdout + verified.stderr


def test_twins_referee_example_with_the_referee_key_on_softhsm(softhsm: Any, tmp_path: Path) -> None:
    """examples/twins_referee.py with node-c's key on a SoftHSM2 token (PKCS#11):
    the three regimes give the rules' answers; the reference verifier (0.12.0)
    accepts both halves and the referee's answer capsule with their ids; the
    written case file replays through ``capseal referee rule`` with the token
    key; the book verifies."""
    import agent_action_capsule as ref
    from agent_action_capsule.producer_envelope import verify_record_signature

    from capseal import SealedRecord
    from capseal.keys.provision import create_key
    from capseal.ledger import Ledger

    label = f"referee-{os.urandom(3).hex()}"
    pin_file = write_secret(tmp_path / "token.pin", softhsm.pin)
    uri = softhsm.uri(label) + f"&pin-source={pin_file}"
    create_key(softhsm.uri(label), "ed25519", pin=softhsm.pin).close()
    work = tmp_path / "work"
    proc = subprocess.run([sys.executable, str(EXAMPLES / "twins_referee.py"), "--workdir", str(work), "--referee-key", uri],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for pattern in TWINS_REFEREE + [r"^node-c   the referee signs with PKCS11Signer\("]:
        assert re.search(pattern, proc.stdout, re.M), f"{pattern!r} not in output:\n{proc.stdout}"
    assert softhsm.pin not in proc.stdout + proc.stderr
    checked = 0
    for ledger_file in ("node-a.db", "node-b.db", "book-differing_pair_triggers_one_call.db"):
        with Ledger(work / ledger_file, readonly=True) as ledger:  # its own capsules and those kept as received
            rows = [e for e in ledger.entries() if e.record_type in ("capsule", "capsule:received")]
            for record in (SealedRecord.from_json(e.record()) for e in rows):
                capsule = record.capsule
                serving = capsule.get("model_attestation", {}).get("compute_attestation", {}).get("x-twin-serving-v1")
                if serving is None:
                    continue
                result = ref.verify(capsule)
                assert result.ok and not [f for f in result.findings if f.severity == "error"], result.findings
                assert ref.compute_capsule_id(dict(capsule)) == capsule["capsule_id"] == record.capsule_id
                assert verify_record_signature(capsule) == ("authored", [])
                checked += 1
                if serving["role"] == "referee":
                    assert serving["node_id"] == "node-c"
    assert checked == 5  # two halves in their own ledgers, the same two received by the book, the referee's answer
    case = work / "differing_pair_triggers_one_call.json"
    replay = subprocess.run([CLI, "referee", "rule", str(case), "--json"], capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout) == {"counts_against": "node-b", "referee_calls": 1, "row": {
        "referee": "node-c", "state": "adjudicated", "tier": 1, "verdict": "contradicted:node-b"}}
    verified = subprocess.run([CLI, "verify", str(work / "book-differing_pair_triggers_one_call.db")], capture_output=True,
                              text=True, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_an_agent_example_sealing_with_a_softhsm_key(softhsm: Any, tmp_path: Path) -> None:
    """examples/agent_pydantic_ai.py with ``--key`` naming an Ed25519 key on a
    SoftHSM2 token (PIN from a file): both tool calls are sealed and
    verify, signed by the token's key; the PIN is printed nowhere."""
    from capseal.keys.provision import create_key

    label = f"agents-{os.urandom(3).hex()}"
    pin_file = write_secret(tmp_path / "token.pin", softhsm.pin)
    create_key(softhsm.uri(label), "ed25519", pin=softhsm.pin).close()
    uri = softhsm.uri(label) + f"&pin-source={pin_file}"
    proc = subprocess.run([sys.executable, str(EXAMPLES / "agent_pydantic_ai.py"), "--key", uri], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for pattern in [r"^agent: .*\(signed by PKCS11Signer\)$", *_agent_calls("c-lookup", "c-cancel")]:
        assert re.search(pattern, proc.stdout, re.M), f"{pattern!r} not in output:\n{proc.stdout}"
    assert softhsm.pin not in proc.stdout + proc.stderr
