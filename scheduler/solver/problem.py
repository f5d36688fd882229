"""From a snapshot to the list of gangs the placement passes work on, in admission order."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.cluster.gang import Gang
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import FairShareReport, gang_need, pending_gangs_in_order, pending_pods
from scheduler.solver.greedy import GangRequest

__all__ = ["Problem", "build_problem"]


@dataclass
class Problem:
    """Pending gangs of one cycle.

    ``order`` holds the gangs that may be placed, in admission order (gang priority, then
    the fairness order of :func:`scheduler.fairness.pending_gangs_in_order`); gangs that
    must not be scheduled (queue findings, too few pods created) are in ``pending`` but not
    in ``order`` and are explained after the solve.
    """

    snapshot: Snapshot
    report: FairShareReport
    pending: dict[str, Gang] = field(default_factory=dict)
    order: list[GangRequest] = field(default_factory=list)

    @property
    def by_key(self) -> dict[str, GangRequest]:
        """Placeable gangs by key."""
        return {g.key: g for g in self.order}


def build_problem(snapshot: Snapshot, report: FairShareReport) -> Problem:
    """Collect pending gangs and split their pods into required and extras."""
    problem = Problem(snapshot, report)
    waiting = snapshot.pending_by_gang
    for gang in snapshot.gangs:
        if gang.key in waiting:
            problem.pending[gang.key] = gang
    for key in pending_gangs_in_order(snapshot, report):
        found = problem.pending.get(key)
        if found is None or key in report.gang_findings:
            continue
        gang = found
        pods = pending_pods(snapshot, gang)
        need = gang_need(snapshot, gang)
        if len(pods) < need:
            continue  # "gang 3/4 pods created": the explainer says so
        problem.order.append(
            GangRequest(
                key=key,
                queue=gang.queue,
                priority=gang.priority,
                preemptible=gang.preemptible,
                required=tuple(pods[:need]),
                extras=tuple(pods[need:]),
                restoring=key in snapshot.restoring,
            )
        )
    # Gangs that consolidation moved first (they are taking back the room planned for them,
    # which another gang must not take in between), then priority, then the fairness order
    # within a priority (the sort is stable): the objective's first level. Fairness orders
    # queues, not priorities, so it may interleave them.
    problem.order.sort(key=lambda g: (not g.restoring, -g.priority))
    return problem
