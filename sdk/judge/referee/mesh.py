"""Reading the mesh plugin's own referee verdict record, and mapping it onto ``adjudication/v1``.

The mesh referee seals a capsule whose ``model_attestation.compute_attestation``
carries ``epistemic_type: adjudication`` and an ``adjudication`` block (schema
``capsule-emit-mesh/adjudication/v1``): ``verdict`` (``corroborated``,
``inconclusive``, ``not_comparable`` or ``contradicted:<node>``), ``status``,
``divergence_index``, ``prefix_digest``, ``half_a/b_capsule_id``,
``half_a/b_node_id``, ``referee_capsule_id``, ``referee_node_id``,
``selection_tier``, ``model_hash``, ``weights_digest``, ``twins_request_digest``,
``referee_answer_digest``, ``twin_bracket_id`` and its fixed labels. At record
level it writes ``verdict_class: assessed`` and ``chain.relation: adjudicates``.

:func:`read_mesh_verdict` reads that record (a deep copy: the original is never
changed) and reports, as findings, what a reader must not take at face value:

* ``legacy_chain_relation`` — ``chain.relation: adjudicates`` is a legacy
  spelling, read as ``confirms``; it is not the Evidence Layer's ``adjudicates``
  link (info);
* ``unregistered_verdict_class`` — ``assessed`` is not a registered verdict
  class (info);
* ``mesh_schema`` — the block is the plugin's own shape, not ``adjudication/v1`` (info);
* ``no_counterpart`` — schema, source, capture_method, status and prefix_digest
  have no ``adjudication/v1`` member (info);
* ``status_inconsistent`` — ``status`` is not the one its verdict implies (error);
* ``contradicted_party_not_a_party`` — the contradicted node is neither half's (error).

:func:`to_adjudication` maps it (judge-record-family §9): the halves become
``parties``, the referee's answer capsule the ``referee``, ``contradicted:X``
becomes ``verdict: contradicted`` plus ``contradicted_party`` (X's half),
the divergence a decimal string, the weights ``basis.weights_digest``, the model
``basis.model_id`` and the twins' request ``basis.prompt_digest``.
``not_comparable`` has no token there: it maps to a ``not_adjudicated`` row.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from capseal.canonical import capsule_id, is_hex64
from capseal.errors import JudgmentRefusedError
from capseal.findings import Finding, HasFindings
from capseal.judge.shapes import Adjudication

from .verdict import status_for_verdict
from .vocab import CONTRADICTED_PREFIX, VERDICT_NOT_COMPARABLE, not_adjudicated

__all__ = ["MESH_SCHEMA", "MeshVerdict", "read_mesh_verdict", "to_adjudication"]

MESH_SCHEMA = "capsule-emit-mesh/adjudication/v1"
_NO_COUNTERPART = ("schema", "source", "capture_method", "status", "prefix_digest")


@dataclass
class MeshVerdict(HasFindings):
    """A mesh verdict record as read: its capsule (a copy), its block, and findings."""

    capsule: dict[str, Any]
    block: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)

    @property
    def verdict(self) -> str | None:
        """The block's verdict token, as written."""
        v = self.block.get("verdict")
        return v if isinstance(v, str) else None


def read_mesh_verdict(record: Any) -> MeshVerdict:
    """Read a mesh referee verdict capsule. Never raises; never changes ``record``.

    Args:
        record: the capsule (a dict), or a record ``{"capsule": …}``.

    Returns:
        The :class:`MeshVerdict`; a record that is not one has an error finding
        (``not_a_mesh_verdict``) and an empty block.
    """
    capsule = record.get("capsule") if isinstance(record, Mapping) and isinstance(record.get("capsule"), Mapping) else record
    if not isinstance(capsule, Mapping):
        return MeshVerdict({}, {}, [Finding("not_a_mesh_verdict", f"a verdict record is a capsule, not {type(record).__name__}")])
    try:
        capsule = copy.deepcopy(dict(capsule))
    except RecursionError:
        return MeshVerdict({}, {}, [Finding("not_a_mesh_verdict", "the record nests too deeply to read")])
    out = MeshVerdict(capsule, {})
    add = out.findings.append
    ma = capsule.get("model_attestation")
    ca = ma.get("compute_attestation") if isinstance(ma, Mapping) else None
    block = ca.get("adjudication") if isinstance(ca, Mapping) else None
    if not isinstance(ca, Mapping) or not isinstance(block, Mapping):
        add(Finding("not_a_mesh_verdict", "no model_attestation.compute_attestation.adjudication block"))
        return out
    out.block = dict(block)
    if ca.get("epistemic_type") != "adjudication":
        add(Finding("epistemic_type_mismatch", f"the block's record says epistemic_type {ca.get('epistemic_type')!r}, not adjudication"))
    if block.get("schema") != MESH_SCHEMA:
        add(Finding("not_a_mesh_verdict", f"schema {block.get('schema')!r} is not {MESH_SCHEMA}"))
    else:
        add(Finding("mesh_schema", f"{MESH_SCHEMA} is the plugin's own block, not adjudication/v1", severity="info"))
    present = [k for k in _NO_COUNTERPART if k in block]
    if present:
        add(Finding("no_counterpart", f"{', '.join(present)} have no adjudication/v1 member", severity="info"))
    chain = capsule.get("chain")
    if isinstance(chain, Mapping) and chain.get("relation") == "adjudicates":
        add(Finding("legacy_chain_relation", "chain.relation 'adjudicates' is a legacy spelling read as 'confirms'; it "
                    "is not the Evidence Layer's adjudicates link", severity="info"))
    disposition = capsule.get("disposition")
    if isinstance(disposition, Mapping) and disposition.get("verdict_class") == "assessed":
        add(Finding("unregistered_verdict_class", "verdict_class 'assessed' is not a registered value", severity="info"))
    verdict = block.get("verdict")
    expected = status_for_verdict(verdict) if isinstance(verdict, str) else None
    if isinstance(verdict, str) and expected is None:
        add(Finding("unknown_verdict", f"verdict {verdict!r} is not a mesh verdict token (kept as it is)"))
    if "status" in block and expected is not None and block.get("status") != expected:
        add(Finding("status_inconsistent", f"status {block.get('status')!r} is not {expected!r}, which verdict {verdict!r} implies"))
    if isinstance(verdict, str) and verdict.startswith(CONTRADICTED_PREFIX):
        named = verdict[len(CONTRADICTED_PREFIX):]
        if named not in (block.get("half_a_node_id"), block.get("half_b_node_id")):
            add(Finding("contradicted_party_not_a_party", f"{named[:16]}… is neither half's node"))
    try:
        carried = capsule.get("capsule_id")
        if carried is not None and carried != capsule_id(capsule):
            add(Finding("capsule_id_mismatch", "the record's capsule_id is not the digest of its bytes"))
    except Exception as exc:
        add(Finding("capsule_id_mismatch", f"the record cannot be canonicalized: {exc}"))
    return out


def _digest_ref(value: Any) -> dict[str, str] | None:
    return {"digest_alg": "SHA-256", "digest": value} if isinstance(value, str) and is_hex64(value) else None


def to_adjudication(mesh: MeshVerdict) -> tuple[dict[str, Any] | None, dict[str, Any] | None, list[Finding]]:
    """Map a read mesh verdict onto ``adjudication/v1``.

    Args:
        mesh: from :func:`read_mesh_verdict`.

    Returns:
        ``(body, row, findings)``: the ``adjudication/v1`` body (checked by the
        refusal engine) or None, the ``not_adjudicated`` row for
        ``not_comparable`` (else None), and the findings of the mapping
        (the reader's included).
    """
    findings = list(mesh.findings)
    block = mesh.block
    verdict = mesh.verdict
    if not block or any(f.code == "not_a_mesh_verdict" for f in findings):
        return None, None, findings
    if verdict == VERDICT_NOT_COMPARABLE:
        because = block.get("not_comparable_because")
        row = not_adjudicated("not_comparable", because if because in ("sampled", "weights_unknown", "weights_differ")
                              else "weights_unknown")
        findings.append(Finding("not_comparable_no_token", "not_comparable has no adjudication/v1 token: a not_adjudicated row",
                                severity="info"))
        return None, row, findings
    halves = [(block.get("half_a_capsule_id"), block.get("half_a_node_id")),
              (block.get("half_b_capsule_id"), block.get("half_b_node_id"))]
    parties = [{"type": "twin-half", "digest_alg": "SHA-256", "digest": c, "judge_purpose": "adjudicated_party"}
               for c, _ in halves if isinstance(c, str)]
    token, party = verdict, None
    if isinstance(verdict, str) and verdict.startswith(CONTRADICTED_PREFIX):
        named = verdict[len(CONTRADICTED_PREFIX):]
        token = "contradicted"
        party = next((c for c, n in halves if n == named), None)
    basis: dict[str, Any] = {"model_id": block.get("model_hash") or "unknown-model", "sampling": {}}
    prompt = _digest_ref(block.get("twins_request_digest"))
    if prompt is not None:
        basis["prompt_digest"] = prompt
    weights = _digest_ref(block.get("weights_digest"))
    if weights is not None:
        basis["weights_digest"] = weights
    body: dict[str, Any] = {
        "record_version": "adjudication/v1", "epistemic_type": "adjudication",
        "record_id": f"mesh-verdict:{mesh.capsule.get('capsule_id')}",
        "adjudicated_at": mesh.capsule.get("timestamp"), "verdict": token, "basis": basis, "parties": parties,
    }
    if party is not None:
        body["contradicted_party"] = party
    if type(block.get("divergence_index")) is int:
        body["divergence_index"] = str(block["divergence_index"])
    referee = block.get("referee_capsule_id")
    if isinstance(referee, str) and is_hex64(referee):
        body["referee"] = {"type": "referee-answer", "digest_alg": "SHA-256", "digest": referee, "judge_purpose": "referee"}
    try:
        Adjudication.from_body(body)
    except JudgmentRefusedError as exc:
        findings.append(Finding(exc.rule, f"the mapped adjudication/v1 is refused: {exc}"))
        return None, None, findings
    return body, None, findings
