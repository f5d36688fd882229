"""Every pending gang's outcome of a solve: placed with its pods, or the reason it waits.
The reasons come from :func:`scheduler.explain.explain_unplaced`, fed with free capacity
built from the node classes the solver already holds (:func:`capacities`), so explaining
makes no second pass over nodes and pods. Used by :func:`.solve.solve` once the placement
and take-back stages are done.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import structlog

from scheduler.explain import explain_unplaced
from scheduler.explain.capacity import FreeCapacity, NodeGroup
from scheduler.solver.patterns import ClassInfo
from scheduler.solver.placement import GangOutcome, PodAssignment
from scheduler.solver.problem import Problem
from scheduler.solver.state import ClusterState

__all__ = ["capacities", "gang_outcomes"]

log = structlog.get_logger(__name__)


def capacities(
    state: ClusterState, initial: Sequence[ClassInfo]
) -> tuple[FreeCapacity | None, FreeCapacity | None]:
    """Free capacity after this cycle's decisions (``state``) and before the cycle, from the
    node classes the solver already has, so the explainer recomputes nothing per node."""
    off: list[NodeGroup] = [
        (slot.node, slot.free.items(), slot.gpu_free, 1, False)
        for slot in state.nodes.values()
        if not slot.placeable
    ]
    nodes = state.static_nodes
    now = FreeCapacity.from_groups(
        [*((nodes[k[0]], k[1], k[2], len(m), True) for k, m in state.classes.items()), *off],
        by_name=state.by_name,
    )
    before = FreeCapacity.from_groups(
        [*((nodes[c.key[0]], c.key[1], c.key[2], len(c.members), True) for c in initial), *off],
        by_name=state.by_name,
    )
    return now, before


def gang_outcomes(
    problem: Problem,
    assignments: Sequence[PodAssignment],
    now: FreeCapacity | None = None,
    before: FreeCapacity | None = None,
    *,
    freed: set[str] | None = None,
    known: Mapping[str, tuple[str, str]] | None = None,
) -> dict[str, GangOutcome]:
    """A :class:`GangOutcome` for every pending gang of ``problem``: its pods among
    ``assignments``, or why it has none (:func:`scheduler.explain.explain_unplaced`, given
    the free capacity ``now`` and ``before`` the cycle, the uids whose room the placements
    use, ``freed``, and the reasons already ``known``)."""
    by_gang: dict[str, list[PodAssignment]] = {}
    for a in assignments:
        by_gang.setdefault(a.gang, []).append(a)
    unplaced = [k for k in problem.pending if k not in by_gang]
    reasons: dict[str, tuple[str, str]] = {}
    if unplaced:
        try:
            reasons = explain_unplaced(
                problem.snapshot,
                problem.report,
                assignments,
                unplaced,
                now=now,
                before=before,
                freed=freed or (),
                known=known,
            )
        except Exception:  # an explanation must never cost the cycle its placement
            log.exception("explain_failed", gangs=len(unplaced))
    out: dict[str, GangOutcome] = {}
    for key, gang in problem.pending.items():
        pods = by_gang.get(key)
        if pods:
            out[key] = GangOutcome(key, gang.queue, True, tuple(pods))
        else:
            code, message = reasons.get(key, ("NotPlacedThisCycle", "not placed this cycle"))
            out[key] = GangOutcome(key, gang.queue, False, (), code, message)
    return out
