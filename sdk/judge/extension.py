"""``x-judgment-v1``: a capsule that records a judgment (PROVISIONAL, unratified).

The member sits at ``/model_attestation/compute_attestation/x-judgment-v1`` of a
-05 capsule and is closed: ``{rubric_digest, rubric_version,
judge_parameters_digest, model_hosting?}``. Base fields keep their meaning:
``developer`` is the judge (``model_id[@version]``, or a non-identifying rater
role label), ``agent_output_digest`` is the digest of the judge's answer
``{verdict, rationale}``, and ``references[]`` holds exactly one
``judged_from`` (and optionally a ``calibrated_against``).

Digest rules implemented (judgment-extension-v1, *proposed*):
``rubric_digest = json_digest(rubric)``; ``judge_parameters_digest =
json_digest(parameters)`` where the parameters are
``{instruction_template_digest, prompt_digest, axes_digest, sampling_params,
min_confidence_micros?, judge_batch?}`` for a model judge (prompt and axes as
SHA-256 of the raw file bytes, the template as a JSON digest) or
``{protocol, packet_digest}`` for a human expert. The member name
``prompt_digest`` is the one pinned here (a stored variant calls it
``prompt_file_digest``; not implemented).

``model_hosting`` is required for a model judge and forbidden for a human one
when *building*; when *checking*, its absence on a model judge is read as
``hosted`` and reported as information (the released vectors predate it). A
hosted verdict is attributable but not re-derivable: never the sole basis for
refusing an action.

A verifier recomputes these digests from published preimages; it never re-runs
the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import Field

from capseal.canonical import capsule_id, json_digest, raw_digest
from capseal.errors import JudgmentRefusedError

from .citation import Hex64, JudgePart, NonEmpty, Target, computed
from .pin import SamplingValue, bytes_of, check_sampling
from .rules import Violation, is_json, json_violations, raise_first, schema_violations
from .schema import render_pointer

__all__ = [
    "MEMBER",
    "MEMBER_POINTER",
    "ModelJudgeParameters",
    "ExpertProtocolParameters",
    "JudgeAnswer",
    "JudgmentMember",
    "judgment_member",
    "judgment_capsule_spec",
    "check_judgment_capsule",
    "refuse_judgment_capsule",
]

MEMBER = "x-judgment-v1"
MEMBER_PATH = ("model_attestation", "compute_attestation", MEMBER)
MEMBER_POINTER = render_pointer(MEMBER_PATH)
_SCHEMA = "judgment/judgment-extension-v1.json"


def _json_object(value: Any, what: str) -> dict[str, Any]:
    """A published JSON document (rubric, template, packet) as a dict, or a typed refusal."""
    if not isinstance(value, Mapping):
        raise JudgmentRefusedError(f"the {what} is a JSON object, not {type(value).__name__}", rule="citation_content_type", path=f"$.{what}")
    return dict(value)


def _typed(value: Any, cls: type[Any] | tuple[type[Any], ...], what: str) -> None:
    if not isinstance(value, cls):
        names = " or ".join(c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,)))
        raise JudgmentRefusedError(f"{what} is a {names}, not {type(value).__name__}", rule="schema_type_mismatch", path=f"$.{what}")


class ModelJudgeParameters(JudgePart):
    """How a model judge was asked (the preimage of ``judge_parameters_digest``)."""

    instruction_template_digest: Hex64
    prompt_digest: Hex64
    axes_digest: Hex64
    sampling_params: dict[str, SamplingValue]
    min_confidence_micros: Annotated[int, Field(ge=0, le=1_000_000)] = None  # type: ignore[assignment]
    judge_batch: Annotated[int, Field(ge=1, le=2**53 - 1)] = None  # type: ignore[assignment]

    @classmethod
    def of(
        cls, *, instruction_template: Mapping[str, Any], prompt: bytes | str, axes: bytes | str,
        sampling_params: Mapping[str, Any], min_confidence_micros: int | None = None, judge_batch: int | None = None,
    ) -> ModelJudgeParameters:
        """How a model judge was asked, every digest computed here.

        Args:
            instruction_template: the instruction template (JSON, digested as
                its JCS bytes).
            prompt: the prompt's bytes (text as its UTF-8 bytes).
            axes: the axes file's bytes, likewise.
            sampling_params: the sampling settings (int, str or bool values).
            min_confidence_micros: the confidence floor in millionths, or None.
            judge_batch: how many cases were judged in one call, or None.

        Returns:
            The parameters.

        Raises:
            JudgmentRefusedError: a template that is not an object, a file given
                as anything but bytes or text (never coerced), a float or other
                refused sampling value, or a schema rule.
            CanonicalizationError: a template with no JCS form.
        """
        fields: dict[str, Any] = {
            "instruction_template_digest": json_digest(_json_object(instruction_template, "instruction_template")),
            "prompt_digest": raw_digest(bytes_of(prompt, "prompt", path="$.prompt_digest")),
            "axes_digest": raw_digest(bytes_of(axes, "axes", path="$.axes_digest")),
            "sampling_params": check_sampling(sampling_params, "$.sampling_params"),
        }
        if min_confidence_micros is not None:
            fields["min_confidence_micros"] = min_confidence_micros
        if judge_batch is not None:
            fields["judge_batch"] = judge_batch
        return cls(**fields)


class ExpertProtocolParameters(JudgePart):
    """How a human expert was asked: the protocol and the packet shown."""

    protocol: NonEmpty
    packet_digest: Hex64

    @classmethod
    def of(cls, *, protocol: str, packet: Mapping[str, Any]) -> ExpertProtocolParameters:
        """How a human expert was asked.

        Args:
            protocol: the protocol's name.
            packet: the packet shown (JSON, digested as its JCS bytes).

        Returns:
            The parameters.

        Raises:
            JudgmentRefusedError: a packet that is not an object, or a schema rule.
            CanonicalizationError: a packet with no JCS form.
        """
        return cls(protocol=protocol, packet_digest=json_digest(_json_object(packet, "packet")))


class JudgeAnswer(JudgePart):
    """The preimage of ``agent_output_digest``."""

    verdict: Literal["met", "not_met", "not_evaluable"]
    rationale: str = None  # type: ignore[assignment]


class JudgmentMember(JudgePart):
    """The closed ``x-judgment-v1`` member."""

    rubric_digest: Hex64
    rubric_version: NonEmpty
    judge_parameters_digest: Hex64
    model_hosting: Literal["hosted", "self_hosted"] = None  # type: ignore[assignment]


def judgment_member(
    *, rubric: Mapping[str, Any], rubric_version: str,
    parameters: ModelJudgeParameters | ExpertProtocolParameters, model_hosting: str | None = None,
) -> JudgmentMember:
    """Build the ``x-judgment-v1`` member; its digests come from the rubric and
    parameters themselves.

    Args:
        rubric: the published rubric (a non-empty JSON object).
        rubric_version: its version.
        parameters: how the judge was asked.
        model_hosting: ``hosted`` or ``self_hosted`` for a model judge; None
            for a human expert.

    Returns:
        The member.

    Raises:
        JudgmentRefusedError: ``model_hosting_required`` /
            ``model_hosting_forbidden``, ``rubric_empty``, a value of the wrong
            type, or a schema rule.
        CanonicalizationError: a rubric with no JCS form.
    """
    _typed(parameters, (ModelJudgeParameters, ExpertProtocolParameters), "parameters")
    rubric = _json_object(rubric, "rubric")
    if isinstance(parameters, ModelJudgeParameters) and model_hosting is None:
        raise JudgmentRefusedError("a model judge states model_hosting (hosted or self_hosted)", rule="model_hosting_required", path=f"{MEMBER_POINTER}/model_hosting")
    if isinstance(parameters, ExpertProtocolParameters) and model_hosting is not None:
        raise JudgmentRefusedError("a human expert has no model_hosting", rule="model_hosting_forbidden", path=f"{MEMBER_POINTER}/model_hosting")
    if not rubric:
        raise JudgmentRefusedError("the rubric is a non-empty published document", rule="rubric_empty")
    fields: dict[str, Any] = {
        "rubric_digest": json_digest(rubric),
        "rubric_version": rubric_version,
        "judge_parameters_digest": json_digest(parameters.to_json()),
    }
    if model_hosting is not None:
        fields["model_hosting"] = model_hosting
    return JudgmentMember(**fields)


def judgment_capsule_spec(
    *, action_id: str, judge: str, member: JudgmentMember, answer: JudgeAnswer,
    judged_from: Target, calibrated_against: Target | None = None,
) -> tuple[str, dict[str, Any]]:
    """What a producer seals for a judgment capsule.

    The judge is the capsule's ``developer``; the spec carries the member, the
    answer's digest and exactly one ``judged_from`` reference.

    Args:
        action_id: the capsule's action id.
        judge: ``model_id``, ``model_id@version`` or a rater role label.
        member: the ``x-judgment-v1`` member.
        answer: the judge's answer.
        judged_from: what was judged.
        calibrated_against: a calibration it was checked against, or None.

    Returns:
        ``(developer, spec)`` for ``Producer(developer=…).seal(spec)``.

    Raises:
        JudgmentRefusedError: ``judge_identity_malformed``, a member or answer
            of the wrong type, or a citation that is not a Target.
    """
    if not isinstance(judge, str) or not judge or judge.count("@") > 1:
        raise JudgmentRefusedError("the judge is model_id or model_id@version, or a rater role label", rule="judge_identity_malformed", path="$.developer")
    _typed(member, JudgmentMember, "member")
    _typed(answer, JudgeAnswer, "answer")
    judged_from = computed(judged_from, "judged_from")
    if calibrated_against is not None:
        calibrated_against = computed(calibrated_against, "calibrated_against")
    refs = [{"type": judged_from.type, "digest_alg": "SHA-256", "digest": judged_from.digest, "citation_purpose": "judged_from"}]
    if calibrated_against is not None:
        refs.append({"type": calibrated_against.type, "digest_alg": "SHA-256", "digest": calibrated_against.digest, "citation_purpose": "calibrated_against"})
    spec = {
        "action_id": action_id,
        "action_type": "fyi",
        "model_attestation": {"compute_attestation": {"agent_output_digest": json_digest(answer.to_json()), MEMBER: member.to_json()}},
        "references": refs,
    }
    return judge, spec


def _at(value: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _mismatch(rule: str, path: tuple[str, ...], what: str) -> Violation:
    from .schema import render_path

    return Violation(rule, render_path(path), f"{what} does not recompute from the published preimage", pointer=render_pointer(path))


def check_judgment_capsule(
    capsule: Mapping[str, Any], *, preimages: Mapping[str, Any] | None = None, raw_files: Mapping[str, str | bytes] | None = None,
) -> list[Violation]:
    """Check a judgment capsule. Never raises.

    Args:
        capsule: the capsule.
        preimages: the published ``rubric``, ``judge_parameters``,
            ``agent_output``, ``instruction_template`` and ``packet``, as
            far as known.
        raw_files: the published ``prompt``, ``axes`` and ``policy`` files.

    Returns:
        Every violation of the extension schema, the capsule id and — for
        each preimage or file given — the digest it must recompute to; each
        names its rule and carries a JSON pointer.
    """
    try:
        return _check(capsule, preimages or {}, raw_files or {})
    except Exception as exc:  # never raise
        return [Violation("checker_internal_error", "$", f"{type(exc).__name__}: {exc}")]


def refuse_judgment_capsule(capsule: Mapping[str, Any], **kw: Any) -> None:
    """Refuse a judgment capsule that breaks a rule.

    Args:
        capsule: the capsule.
        **kw: ``preimages`` and ``raw_files``, as :func:`check_judgment_capsule`.

    Raises:
        JudgmentRefusedError: for the first rule it breaks.
    """
    raise_first(check_judgment_capsule(capsule, **kw), "judgment capsule")


def _raw(value: Any, source: str, out: list[Violation]) -> bytes | None:
    """A raw file's bytes; a value that is neither bytes nor text is reported
    (``bytes(5)`` would be five zero bytes, a digest of nothing published)."""
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return bytes_of(value, f"raw file {source!r}")
    out.append(Violation("citation_content_type", f"raw_files.{source}",
                         f"raw file {source!r} is given as {type(value).__name__}, not its bytes or text", pointer=f"/raw_files/{source}"))
    return None


def _canonical(value: Any, where: str, out: list[Violation]) -> bool:
    """Can ``value`` (a published preimage) be canonicalized? If not, its number
    and JSON violations are reported under ``where`` and False is returned, so
    its digest is not compared. Why: a float (or a non-string key) has no JCS
    digest, and computing one would raise inside the checker, hiding every
    other finding behind ``checker_internal_error``."""
    bad = json_violations(value)
    for v in bad:
        out.append(Violation(v.rule, f"{where}{v.path[1:]}", v.message, pointer="/" + where.replace(".", "/")))
    return not bad


def _check(capsule: Any, pre: Any, raw: Any) -> list[Violation]:
    if not isinstance(capsule, Mapping):
        return [Violation("record_not_object", "$", f"a judgment capsule is a JSON object, not {type(capsule).__name__}")]
    out: list[Violation] = []
    if not isinstance(pre, Mapping):
        out.append(Violation("preimages_malformed", "preimages", f"preimages map names to published documents, not {type(pre).__name__}", pointer="/preimages"))
        pre = {}
    if not isinstance(raw, Mapping):
        out.append(Violation("raw_files_malformed", "raw_files", f"raw_files map names to file bytes or text, not {type(raw).__name__}", pointer="/raw_files"))
        raw = {}
    number = json_violations(capsule)
    out += number
    if not is_json(number):
        return out  # not JSON: the schema walk and the digests cannot read it
    out += schema_violations(capsule, _SCHEMA)
    cid = capsule.get("capsule_id")
    if cid is not None and not number and cid != capsule_id(capsule):
        out.append(Violation("capsule_id_mismatch", "$.capsule_id", "capsule_id does not recompute from the capsule", pointer="/capsule_id"))
    member = _at(capsule, MEMBER_PATH)
    compute = _at(capsule, MEMBER_PATH[:2])
    if not isinstance(member, Mapping) or not isinstance(compute, Mapping):
        return out
    params = pre.get("judge_parameters")
    human = isinstance(params, Mapping) and "protocol" in params
    if human and "model_hosting" in member:
        out.append(Violation("model_hosting_forbidden", "$.model_attestation.compute_attestation['x-judgment-v1'].model_hosting", "a human-expert record carries no model_hosting", pointer=f"{MEMBER_POINTER}/model_hosting"))
    if isinstance(params, Mapping) and not human and "model_hosting" not in member:
        out.append(Violation("model_hosting_absent", "$.model_attestation.compute_attestation['x-judgment-v1']", "no model_hosting on a model-judge record: read as hosted (attributable, not re-derivable)", severity="info", pointer=MEMBER_POINTER))
    if "rubric" in pre and _canonical(pre["rubric"], "preimages.rubric", out) and member.get("rubric_digest") != json_digest(pre["rubric"]):
        out.append(_mismatch("rubric_digest_mismatch", (*MEMBER_PATH, "rubric_digest"), "rubric_digest"))
    if isinstance(params, Mapping):
        definition = "ExpertProtocolParameters" if human else "JudgeParameters"
        if _canonical(params, "preimages.judge_parameters", out):
            for v in schema_violations(params, _SCHEMA, definition):
                out.append(Violation(v.rule, f"preimages.judge_parameters{v.path[1:]}", v.message, pointer=f"/preimages/judge_parameters{v.pointer}"))
            if member.get("judge_parameters_digest") != json_digest(params):
                out.append(_mismatch("judge_parameters_digest_mismatch", (*MEMBER_PATH, "judge_parameters_digest"), "judge_parameters_digest"))
        inner: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
            ("instruction_template_digest", "instruction_template", lambda v: json_digest(v)),
            ("packet_digest", "packet", lambda v: json_digest(v)),
        )
        for name, source, fn in inner:
            if name in params and source in pre and _canonical(pre[source], f"preimages.{source}", out) and params[name] != fn(pre[source]):
                out.append(_mismatch(f"{name}_mismatch", ("preimages", "judge_parameters", name), name))
        for name, source in (("prompt_digest", "prompt"), ("axes_digest", "axes")):
            if name in params and source in raw:
                data = _raw(raw[source], source, out)
                if data is not None and params[name] != raw_digest(data):
                    out.append(_mismatch(f"{name}_mismatch", ("preimages", "judge_parameters", name), name))
    rubric = pre.get("rubric")
    if isinstance(rubric, Mapping) and "policy_digest" in rubric and "policy" in raw:
        data = _raw(raw["policy"], "policy", out)
        if data is not None and rubric["policy_digest"] != raw_digest(data):
            out.append(_mismatch("policy_digest_mismatch", ("preimages", "rubric", "policy_digest"), "policy_digest"))
    answer = pre.get("agent_output")
    if answer is not None and _canonical(answer, "preimages.agent_output", out):
        for v in schema_violations(answer, _SCHEMA, "JudgeAnswer"):
            out.append(Violation(v.rule, f"preimages.agent_output{v.path[1:]}", v.message, pointer=f"/preimages/agent_output{v.pointer}"))
        if compute.get("agent_output_digest") != json_digest(answer):
            out.append(_mismatch("agent_output_digest_mismatch", (*MEMBER_PATH[:2], "agent_output_digest"), "agent_output_digest"))
    return out
