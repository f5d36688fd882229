"""One solve: snapshot -> greedy (-> CP-SAT) -> validated placement with a reason per gang.

Objective, in this order (the greedy follows it by construction, CP-SAT by weights; see
:mod:`scheduler.solver.objective`):

1. priority - admitting a gang of a higher priority is worth more than any number of gangs
   of lower priorities;
2. fairness - within a priority, work of queues below their fair share first;
3. more work admitted;
4. placement quality - binpack (fewest partly used nodes and devices) or spread, chosen
   separately for GPU and CPU nodes (:mod:`scheduler.plugins.packing`).

Optional extras (pods beyond ``min_member``) are placed after every admissible gang.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import structlog

from scheduler.cluster.snapshot import Snapshot
from scheduler.explain import explain_unplaced
from scheduler.fairness import FairShareReport, compute_fair_shares
from scheduler.framework.scoring import NodeScorer
from scheduler.plugins.packing import PackingScorer
from scheduler.solver.greedy import place_gangs
from scheduler.solver.placement import (
    GangOutcome,
    Placement,
    PlacementSettings,
    PodAssignment,
    SolveStatus,
)
from scheduler.solver.problem import Problem, build_problem
from scheduler.solver.queues import QueueBook
from scheduler.solver.state import ClusterState
from scheduler.solver.validate import validate

__all__ = ["solve"]

log = structlog.get_logger(__name__)


def solve(
    snapshot: Snapshot,
    settings: PlacementSettings = PlacementSettings(),  # noqa: B008 - frozen, never mutated
    report: FairShareReport | None = None,
    *,
    scorer: NodeScorer | None = None,
    cycle: int | None = None,
) -> Placement:
    """Place pending gangs of ``snapshot``; synchronous (run it in a worker thread).

    Every pending gang gets a :class:`GangOutcome`; unplaced ones carry the reason from
    :func:`scheduler.explain.explain_unplaced`. The returned assignments passed
    :func:`validate`; if neither engine produced a valid answer, nothing is placed.
    """
    started = time.perf_counter()
    report = report if report is not None else compute_fair_shares(snapshot)
    problem = build_problem(snapshot, report)
    if not problem.pending:
        return Placement(status=SolveStatus.EMPTY, build_seconds=time.perf_counter() - started)
    state = ClusterState.from_snapshot(snapshot)
    scorer = scorer or PackingScorer(settings.gpu_strategy, settings.cpu_strategy)
    book = QueueBook(snapshot.queue_tree, report)
    greedy = place_gangs(
        state,
        problem.order,
        scorer,
        book=book,
        spread_devices=settings.gpu_strategy == "spread",
        cycle=cycle,
    )
    build_seconds = time.perf_counter() - started
    assignments: list[PodAssignment] = greedy.assignments
    status = SolveStatus.GREEDY
    violations = validate(snapshot, assignments)
    if violations:
        log.error("placement_invalid", cycle=cycle, engine="greedy", violations=violations[:20])
        assignments = []
    outcomes = _outcomes(problem, assignments)
    placement = Placement(
        assignments=tuple(assignments),
        outcomes=outcomes,
        status=status if assignments or not violations else SolveStatus.EMPTY,
        build_seconds=build_seconds,
        solve_seconds=time.perf_counter() - started - build_seconds,
        violations=tuple(violations),
    )
    log.info(
        "solved",
        cycle=cycle,
        status=placement.status.value,
        gangs=len(problem.pending),
        placed=sum(1 for o in outcomes.values() if o.placed),
        pods=len(assignments),
        seconds=round(time.perf_counter() - started, 4),
    )
    return placement


def _outcomes(problem: Problem, assignments: Sequence[PodAssignment]) -> dict[str, GangOutcome]:
    by_gang: dict[str, list[PodAssignment]] = {}
    for a in assignments:
        by_gang.setdefault(a.gang, []).append(a)
    unplaced = [k for k in problem.pending if k not in by_gang]
    reasons = (
        explain_unplaced(problem.snapshot, problem.report, assignments, unplaced)
        if unplaced
        else {}
    )
    out: dict[str, GangOutcome] = {}
    for key, gang in problem.pending.items():
        pods = by_gang.get(key)
        if pods:
            out[key] = GangOutcome(key, gang.queue, True, tuple(pods))
        else:
            code, message = reasons.get(key, ("NotPlacedThisCycle", "not placed this cycle"))
            out[key] = GangOutcome(key, gang.queue, False, (), code, message)
    return out
