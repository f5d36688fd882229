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

import asyncio
import time
from collections.abc import Sequence
from typing import cast

import structlog

from scheduler.cluster.pod import Pod
from scheduler.cluster.resources import CPU, MEMORY
from scheduler.cluster.snapshot import Snapshot
from scheduler.explain import explain_unplaced
from scheduler.fairness import FairShareReport, compute_fair_shares
from scheduler.framework.scoring import NodeScorer
from scheduler.plugins.packing import PackingScorer
from scheduler.solver.cpsat import CpResult, ModelGang, optimize, work_units
from scheduler.solver.greedy import (
    GangRequest,
    GreedyResult,
    place_extra_pods,
    place_gangs,
    pod_size,
)
from scheduler.solver.patterns import ClassInfo, pack
from scheduler.solver.placement import (
    GangOutcome,
    Placement,
    PlacementSettings,
    PodAssignment,
    SolveStatus,
)
from scheduler.solver.problem import Problem, build_problem
from scheduler.solver.queues import QueueBook
from scheduler.solver.state import ClassKey, ClusterState
from scheduler.solver.validate import validate

__all__ = ["solve", "solve_in_thread"]

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
    phases: dict[str, float] = {}
    mark = started

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name] = round(now - mark, 4)
        mark = now

    report = report if report is not None else compute_fair_shares(snapshot)
    lap("fair_share")
    problem = build_problem(snapshot, report)
    lap("problem")
    if not problem.pending:
        return Placement(status=SolveStatus.EMPTY, build_seconds=time.perf_counter() - started)
    state = ClusterState.from_snapshot(snapshot)
    initial = _initial_classes(state)
    lap("state")
    scorer = scorer or PackingScorer(settings.gpu_strategy, settings.cpu_strategy)
    spread = settings.gpu_strategy == "spread"
    greedy = place_gangs(
        state,
        problem.order,
        scorer,
        book=QueueBook(snapshot.queue_tree, report),
        spread_devices=spread,
        cycle=cycle,
    )
    build_seconds = time.perf_counter() - started
    lap("greedy")
    candidates: list[tuple[SolveStatus, list[PodAssignment]]] = []
    cp: CpResult | None = None
    if not settings.greedy_only:
        try:
            cp, cp_assignments = _cp_candidate(
                snapshot, problem, state, initial, greedy, scorer, settings, cycle
            )
        except Exception:  # CP-SAT is an improvement; its failure must not cost the cycle
            log.exception("cpsat_failed", cycle=cycle)
            cp, cp_assignments = None, None
        if cp_assignments is not None and cp is not None:
            status = SolveStatus.OPTIMAL if cp.status == "OPTIMAL" else SolveStatus.FEASIBLE
            candidates.append((status, cp_assignments))
    lap("cpsat")
    candidates.append((SolveStatus.GREEDY, greedy.assignments))
    assignments: list[PodAssignment] = []
    status = SolveStatus.EMPTY
    all_violations: list[str] = []
    for engine, found in candidates:
        violations = validate(snapshot, found)
        if not violations:
            assignments, status = found, engine
            break
        all_violations.extend(violations)
        log.error("placement_invalid", cycle=cycle, engine=engine.value, violations=violations[:20])
    lap("validate")
    explain_started = time.perf_counter()
    outcomes = _outcomes(problem, assignments)
    explain_seconds = time.perf_counter() - explain_started
    lap("explain")
    placement = Placement(
        assignments=tuple(assignments),
        outcomes=outcomes,
        status=status,
        objective=(cp.objective if status is not SolveStatus.GREEDY else cp.greedy_objective)
        if cp is not None
        else 0,
        greedy_objective=cp.greedy_objective if cp is not None else 0,
        best_bound=cp.bound if cp is not None else 0,
        build_seconds=build_seconds + (cp.build_seconds if cp is not None else 0.0),
        solve_seconds=cp.solve_seconds if cp is not None else 0.0,
        violations=tuple(all_violations),
        explain_seconds=explain_seconds,
        total_seconds=time.perf_counter() - started,
    )
    log.info(
        "solved",
        cycle=cycle,
        status=placement.status.value,
        gangs=len(problem.pending),
        placed=sum(1 for o in outcomes.values() if o.placed),
        pods=len(assignments),
        seconds=round(time.perf_counter() - started, 4),
        phases=phases,
    )
    return placement


def _initial_classes(state: ClusterState) -> list[ClassInfo]:
    """The node classes at the start of the cycle (before anything is placed)."""
    return [
        ClassInfo(key, state.nodes[next(iter(members))].node, list(members))
        for key, members in state.classes.items()
    ]


def _model_classes(initial: list[ClassInfo], touched: set[str], limit: int) -> list[ClassInfo]:
    """Classes for the CP-SAT model, at most about ``limit`` of them.

    When running pods leave every node a slightly different CPU/memory remainder, exact
    classes approach one per node. Classes the greedy did not touch are then merged by
    static traits, device state and *rounded-down* free CPU/memory, and the merged class
    offers the smallest free amount of its members - so any pattern feasible for it is
    feasible on each member, and the greedy hint (on untouched-by-merging classes) stays
    complete. Buckets double until the count fits.
    """
    if len(initial) <= limit:
        return initial
    keep = [c for c in initial if touched.intersection(c.members)]
    rest = [c for c in initial if not touched.intersection(c.members)]
    bucket = {CPU: 1000, MEMORY: 2**30}
    while True:
        merged: dict[tuple[object, ...], list[ClassInfo]] = {}
        for c in rest:
            free = dict(c.key[1])
            coarse = tuple(
                (k, v // bucket[k] if k in bucket else v) for k, v in sorted(free.items())
            )
            merged.setdefault((c.key[0], coarse, c.key[2]), []).append(c)
        if len(keep) + len(merged) <= limit or bucket[CPU] > 2**20:
            break
        bucket = {k: v * 2 for k, v in bucket.items()}
    out = list(keep)
    for (sid, _, gpu), group in merged.items():
        if len(group) == 1:
            out.append(group[0])
            continue
        floor: dict[str, int] = dict(group[0].key[1])
        for c in group[1:]:
            for k, v in c.key[1]:
                floor[k] = min(floor.get(k, v), v)
        key: ClassKey = (cast(int, sid), tuple(sorted(floor.items())), cast(tuple[int, ...], gpu))
        out.append(ClassInfo(key, group[0].node, [m for c in group for m in c.members]))
    return out


def _model_gangs(problem: Problem, admitted: set[str]) -> tuple[list[ModelGang], list[GangRequest]]:
    """Gangs CP-SAT decides on, and the lower-priority rest left to the greedy backfill.

    The frontier is the highest priority with a gang greedy could not admit: gangs above it
    are fixed admitted, gangs at it are free, gangs below it are backfilled afterwards. When
    greedy admitted everything, every gang is fixed and CP-SAT only improves quality.
    """
    gangs = [g for g in problem.order if g.required]
    failed = [g.priority for g in gangs if g.key not in admitted]
    frontier = max(failed) if failed else None
    model: list[ModelGang] = []
    rest: list[GangRequest] = []
    for g in gangs:
        if frontier is not None and g.priority < frontier:
            rest.append(g)
            continue
        fixed = frontier is None or g.priority > frontier
        ask = g.ask
        units = work_units(ask)
        work = max(1, units["gpu"] or units["cpu"])
        model.append(ModelGang(g, fixed, work, units, ask))
    return model, rest


def _cp_candidate(
    snapshot: Snapshot,
    problem: Problem,
    state: ClusterState,
    classes: list[ClassInfo],
    greedy: GreedyResult,
    scorer: NodeScorer,
    settings: PlacementSettings,
    cycle: int | None,
) -> tuple[CpResult | None, list[PodAssignment] | None]:
    """Run CP-SAT; if it beats greedy, rebuild a full placement from it on ``state``.

    ``state`` is left as it was (greedy's placement applied) whatever happens.
    """
    by_key = problem.by_key
    admitted = {k for k, pods in greedy.placed.items() if by_key[k].required}
    model_gangs, rest = _model_gangs(problem, admitted)
    if not model_gangs:
        return None, None
    # The model's quality term is binpack/spread; with another scorer it judges admission only.
    quality = isinstance(scorer, PackingScorer)
    if all(g.fixed for g in model_gangs) and not (settings.quality_when_all_admitted and quality):
        return None, None
    in_model = {g.request.key for g in model_gangs}
    hint_nodes: dict[str, list[Pod]] = {}
    for key in in_model & admitted:
        required = len(by_key[key].required)
        for a in greedy.placed[key][:required]:
            hint_nodes.setdefault(a.node, []).append(state.pods[a.pod_uid])
    touched = set(hint_nodes)
    cp = optimize(
        classes=_model_classes(classes, touched, settings.max_model_classes),
        gangs=model_gangs,
        hint_nodes=hint_nodes,
        hint_admitted=admitted & in_model,
        tree=snapshot.queue_tree,
        report=problem.report,
        gpu_strategy=settings.gpu_strategy,
        cpu_strategy=settings.cpu_strategy,
        time_limit=settings.time_limit_seconds,
        workers=settings.workers,
        pattern_cap=settings.patterns_per_class,
        quality=quality,
        cycle=cycle,
    )
    if cp is None or not cp.usable or cp.objective <= cp.greedy_objective:
        return cp, None
    spread = settings.gpu_strategy == "spread"
    greedy_list = greedy.assignments
    for a in reversed(greedy_list):
        state.release(a.pod_uid)
    out: list[PodAssignment] = []
    try:
        for name, pods in cp.node_pods.items():
            slot = state.nodes[name]
            ordered = sorted(pods, key=pod_size, reverse=True)
            grants = pack(slot.node, dict(slot.free), list(slot.gpu_free), ordered, spread=spread)
            if grants is None:
                raise ValueError(f"pattern does not fit node {name}")
            for pod, grant in zip(ordered, grants, strict=True):
                a = PodAssignment(pod.uid, pod.key, pod.gang, name, grant)
                state.apply(a, pod)
                out.append(a)
        book = QueueBook(snapshot.queue_tree, problem.report)
        for key in cp.admitted:
            book.charge(by_key[key].queue, by_key[key].ask)
        back = place_gangs(
            state, rest, scorer, book=book, extras=False, spread_devices=spread, cycle=cycle
        )
        out.extend(back.assignments)
        extra = place_extra_pods(
            state,
            problem.order,
            cp.admitted | set(back.placed),
            scorer,
            book=book,
            spread_devices=spread,
        )
        out.extend(a for pods in extra.values() for a in pods)
    except ValueError as e:
        log.error("cpsat_disaggregation_failed", cycle=cycle, error=str(e))
        out_failed = out
        out = []
        for a in reversed(out_failed):
            state.release(a.pod_uid)
        for a in greedy_list:
            state.apply(a)
        return cp, None
    # leave the state as greedy had it, so callers see one consistent picture
    for a in reversed(out):
        state.release(a.pod_uid)
    for a in greedy_list:
        state.apply(a)
    return cp, out


def _outcomes(problem: Problem, assignments: Sequence[PodAssignment]) -> dict[str, GangOutcome]:
    by_gang: dict[str, list[PodAssignment]] = {}
    for a in assignments:
        by_gang.setdefault(a.gang, []).append(a)
    unplaced = [k for k in problem.pending if k not in by_gang]
    reasons: dict[str, tuple[str, str]] = {}
    if unplaced:
        try:
            reasons = explain_unplaced(problem.snapshot, problem.report, assignments, unplaced)
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


async def solve_in_thread(
    snapshot: Snapshot,
    settings: PlacementSettings = PlacementSettings(),  # noqa: B008 - frozen, never mutated
    report: FairShareReport | None = None,
    *,
    cycle: int | None = None,
) -> Placement:
    """:func:`solve` in a worker thread, so the event loop keeps running.

    CP-SAT releases the GIL while it searches; model building does not, which is why the
    model is aggregated (see :mod:`scheduler.solver.cpsat`).
    """
    return await asyncio.to_thread(solve, snapshot, settings, report, cycle=cycle)
