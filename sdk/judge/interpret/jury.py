"""Reading a stored jury verdict map, whatever its age.

Three stored shapes read through one tolerant procedure (no shape is detected
explicitly; the shape shows only in the defects and ``sourceVersion``):

* 0.13: composites under ``subVerdicts``, upper-case statuses, ``{value, min,
  max}`` or ``{value: boolean}`` scores, no evidence block;
* 0.14–0.16: ``compositeAttempts`` with names, relations and policies, an
  evidence block, bare-number scores; no seats, decision or dispositions;
* 0.17: the seven components ``aggregated``, ``individual``,
  ``individualByName``, ``weights``, ``seats``, ``decision``,
  ``compositeAttempts`` (``sourceVersion`` 1).

Order: root node, stages, decision walk, reading, support checks, support.
"""

from __future__ import annotations

from typing import Any

from .defects import Findings
from .jury_decision import walk_decision
from .jury_nodes import read_node
from .jury_stages import collect_stages
from .jury_support import check_support
from .model import SCHEMA_VERSION, Interpretation, Stage
from .reading import jury_reading, support

__all__ = ["read_jury_verdict"]


def read_jury_verdict(verdict: Any) -> Interpretation:
    """The interpretation of one stored jury verdict map (summary left empty).

    Args:
        verdict: a stored jury verdict map (any value: a non-object degrades into defects).

    Returns:
        Its Interpretation, summary still empty.
    """
    found = Findings()
    if not isinstance(verdict, dict):
        found.unparseable("verdict", "value", f"a stored verdict is a JSON object, not {type(verdict).__name__}")
        found.absent("verdict", "aggregated", "the verdict has no aggregate")
        return Interpretation(SCHEMA_VERSION, 0, None, support(found, None), None, Stage(), (), tuple(found.defects), "")
    source_version = 1 if verdict.get("decision") is not None and verdict.get("seats") is not None else 0
    node = read_node(verdict, "verdict", found, root=True)
    j = node.judgment
    root = Stage(status=j.status, reason_code=j.reason_code, reasoning=j.reasoning, evidence=node.evidence, judges=node.judges)
    stages = collect_stages(verdict, found)
    walk = walk_decision(verdict, found)
    reading = jury_reading(walk.rejection, j.status)
    check_support(verdict, walk, node.evidence, j.status, j.reason_code, found)
    return Interpretation(SCHEMA_VERSION, source_version, reading, support(found, reading), walk.decided_by, root, stages,
                          tuple(found.defects), "")
