"""One solve: snapshot -> greedy -> CP-SAT -> validated placement with a reason per gang.

Pipeline: fair shares and admission order (:mod:`scheduler.fairness`) -> pending gangs split
into required pods and extras (:mod:`.problem`) -> :class:`~.state.ClusterState` (node
equivalence classes) -> greedy in admission order (:mod:`.greedy`; up to the first priority
tier that leaves a gang out, or before a tier proven short, :mod:`.frontier`) -> relaxation
bound and relaxation-guided greedy, then CP-SAT on the aggregated model, stage by priority
tier (:mod:`.hybrid`, :mod:`.bound`, :mod:`.guided`, :mod:`.cpsat`) -> the better answer ->
:func:`~.validate.validate` (fall back to greedy, then to nothing) ->
:func:`scheduler.explain.explain_unplaced` for every gang left waiting (:mod:`.outcomes`), fed
with the node classes the solver already has (no second pass over nodes and pods). Gangs whose
placement depends on where pods run keep the greedy's placement, which CP-SAT works around
(:mod:`.ruled_gangs`); taking back (:mod:`.takeback`) runs on what placement left out.

Objective, in this order (the greedy follows it by construction of its order; CP-SAT by
integer weights that make each level dominate the next, see :mod:`.cpsat`):

1. priority - a gang of a higher priority is worth more than any number of gangs of lower
   priorities (tiers are solved in order; a tier's admissions are never traded for lower
   ones);
2. fairness - within a priority, work that keeps queues within their fair share
   (``fair_share - allocated`` per queue, GPU in tenths and CPU in cores) first;
3. more work admitted (GPU tenths; CPU cores for CPU-only gangs);
4. placement quality - binpack (fewest partly used nodes and devices) or spread, chosen
   separately for GPU and CPU nodes (:func:`scheduler.plugins.packing.node_cost`); with
   ``scoring: fragmentation``, the fragmentation (and model scarcity) the batch leaves on
   the nodes (:mod:`.quality`).

Optional extras (pods beyond ``min_member``) are placed after every admissible gang.
Hard rules (never traded): node fit for every resource and device, taints/tolerations,
nodeSelector, required node affinity, cordoned/NotReady nodes, whole gangs, queue limits
at every level, leaf quota for non-preemptible gangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Collection, Iterator, Sequence
from functools import partial

import structlog

from scheduler.cluster.dracodes import DEVICES_UNAVAILABLE
from scheduler.cluster.snapshot import Snapshot
from scheduler.explain.codes import POD_AFFINITY, POD_ANTI_AFFINITY, TOPOLOGY_SPREAD
from scheduler.fairness import FairShareReport, compute_fair_shares
from scheduler.framework.scoring import NodeScorer
from scheduler.plugins.fragmentation import (
    FragmentationScorer,
    free_gpu_by_model,
    scorer_for_snapshot,
)
from scheduler.plugins.packing import PackingScorer
from scheduler.plugins.scorer_memory import ScorerMemory
from scheduler.plugins.strand_guard import HELD_CODE
from scheduler.solver.batch_order import better_batch, reorders
from scheduler.solver.cpsat import CpResult
from scheduler.solver.cpsat_topology import place_ruled_exactly
from scheduler.solver.frontier import finish_greedy, place_to_frontier
from scheduler.solver.greedy import (
    ClassIndex,
    GangRequest,
    GreedyResult,
    place_gangs,
    shared_index,
)
from scheduler.solver.held_shares import ShareHold
from scheduler.solver.hybrid import admission_key, current_classes
from scheduler.solver.outcomes import capacities, gang_outcomes
from scheduler.solver.placement import (
    Placement,
    PlacementSettings,
    PodAssignment,
    SolveStatus,
)
from scheduler.solver.problem import Problem, build_problem
from scheduler.solver.queues import QueueBook
from scheduler.solver.ruled_gangs import (
    improve_around,
    place_ruled_again,
    topology_gang_sets,
    topology_gangs,
)
from scheduler.solver.state import ClusterState, selected_label_keys
from scheduler.solver.takeback import TakeBack, take_back
from scheduler.solver.validate import forget_passed, validate
from scheduler.solver.validate_evictions import validate_evictions

__all__ = ["solve", "solve_in_thread", "topology_gangs"]

#: Reason codes only the greedy's filter chain can give (see :func:`_solve`).
TOPOLOGY_CODES = frozenset({POD_AFFINITY, POD_ANTI_AFFINITY, TOPOLOGY_SPREAD})

log = structlog.get_logger(__name__)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic garbage collection inside the block (restored after, as it was).

    A cycle allocates millions of short-lived objects that reference counting frees; what
    the cyclic collector does meanwhile is walk, again and again, everything the cycle
    reads (a snapshot of 50,000 pods). Measured on the 5,000-node benchmark: 0.4-0.7 s of
    collections in a 2.5-3.3 s cycle. Garbage with cycles made by a cycle is collected
    after it.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def solve(
    snapshot: Snapshot,
    settings: PlacementSettings = PlacementSettings(),  # noqa: B008 - frozen, never mutated
    report: FairShareReport | None = None,
    *,
    scorer: NodeScorer | None = None,
    cycle: int | None = None,
    max_gangs: int | None = None,
    scorers: ScorerMemory | None = None,
) -> Placement:
    """Place pending gangs of ``snapshot``; synchronous (run it in a worker thread).

    Every pending gang gets a :class:`GangOutcome`; unplaced ones carry the reason from
    :func:`scheduler.explain.explain_unplaced`. The returned assignments passed
    :func:`validate`; if neither engine produced a valid answer, nothing is placed.

    ``max_gangs``: consider only the first that many placeable gangs in admission order;
    the others are left for the next cycle (:attr:`Placement.deferred`, no outcome). The
    live loop uses it for its first cycle, so that after a restart the first binds do not
    wait for a solve of the whole backlog.

    ``scorers``: kept by a caller that solves cycle after cycle (the live loop, the
    simulator), so ``placement.scoring: fragmentation`` reuses the node states the last
    cycle's scorer measured (:class:`~scheduler.plugins.scorer_memory.ScorerMemory`).
    """
    with collector_paused():
        return _solve(
            snapshot,
            settings,
            report,
            scorer=scorer,
            cycle=cycle,
            max_gangs=max_gangs,
            scorers=scorers,
        )


def _first_gangs(problem: Problem, max_gangs: int) -> tuple[Problem, frozenset[str]]:
    """``problem`` with only its first ``max_gangs`` placeable gangs (admission order); the
    keys of the others. Gangs that are not placeable keep their outcomes (they are only
    explained, which costs little)."""
    kept, rest = problem.order[:max_gangs], problem.order[max_gangs:]
    deferred = frozenset(g.key for g in rest)
    pending = {k: g for k, g in problem.pending.items() if k not in deferred}
    return Problem(problem.snapshot, problem.report, pending, kept), deferred


def _solve(
    snapshot: Snapshot,
    settings: PlacementSettings,
    report: FairShareReport | None,
    *,
    scorer: NodeScorer | None,
    cycle: int | None,
    max_gangs: int | None = None,
    scorers: ScorerMemory | None = None,
) -> Placement:
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
    deferred: frozenset[str] = frozenset()
    if max_gangs is not None and 0 < max_gangs < len(problem.order):
        problem, deferred = _first_gangs(problem, max_gangs)
    lap("problem")
    if not problem.pending:
        return Placement(status=SolveStatus.EMPTY, build_seconds=time.perf_counter() - started)
    label_keys = selected_label_keys(snapshot.pods)
    state = ClusterState.from_snapshot(snapshot, label_keys=label_keys)
    initial = current_classes(state)
    lap("state")
    packing = PackingScorer(settings.gpu_strategy, settings.cpu_strategy)
    spread = settings.gpu_strategy == "spread"

    def run_greedy(
        state: ClusterState,
        scorer: NodeScorer,
        order: Sequence[GangRequest] | None = None,
        *,
        index: ClassIndex | None = None,
    ) -> GreedyResult:
        return place_gangs(
            state,
            problem.order if order is None else order,
            scorer,
            book=QueueBook(snapshot.queue_tree, report),
            spread_devices=spread,
            cycle=cycle,
            index=index,
        )

    topology = topology_gang_sets(snapshot, problem)
    # Gangs whose pods use ResourceClaims: only the greedy sees devices (dra_state), so
    # every later stage keeps them as it placed them, and taking back leaves them out.
    with_claims = frozenset(
        g.key
        for g in problem.order
        if any(state.needs_devices(p) for p in (*g.required, *g.extras))
    )
    # Gangs of the tiers below the greedy's frontier, not placed yet (see .frontier); the
    # book holds the queue charges of what the greedy placed before them.
    rest: list[GangRequest] = []
    # The tier the greedy did not place at all, proven short (a prefix of ``rest``), and
    # whether the greedy's pass stopped before its end (then its answer must be finished).
    skipped: list[GangRequest] = []
    stopped = False
    book = QueueBook(snapshot.queue_tree, report)

    hold: ShareHold | None = None
    try:
        if scorer is None and settings.scoring == "fragmentation":
            free = free_gpu_by_model((s.node.gpu_model, s.gpu_free) for s in state.nodes.values())
            scorer = (
                scorers.scorer_for(snapshot, free, settings.share_price_weight)
                if scorers is not None
                else scorer_for_snapshot(snapshot, free, settings.share_price_weight)
            )
            scorer.hold_stranding = settings.hold_stranding_shares
            scorer.limit_holds(snapshot.now, settings.hold_stranding_max_wait)
        scorer = scorer or packing
        hold = (
            ShareHold.at_start(state, scorer)
            if isinstance(scorer, FragmentationScorer) and scorer.hold_stranding
            else None
        )
        # One class ranking for both passes: the second starts from the same state with the
        # same scorer, so it reuses the first one's scores instead of ranking every class
        # again (openb seed 42, batch 64: 120 -> 111 s for the replay).
        shared = shared_index(state, scorer, problem.order, spread_devices=spread)
        try:
            # Only where every later stage may place any gang again: no gang kept as the
            # greedy placed it (topology rules, claims, restoring), no second order of the
            # batch, no strand guard reading the greedy's failures.
            if (
                not settings.greedy_only
                and hold is None
                and not reorders(scorer, problem.order)
                and not (topology.ruled or topology.left_to_greedy or with_claims)
                and not any(g.restoring for g in problem.order)
            ):
                greedy, rest, skipped = place_to_frontier(
                    state, problem.order, scorer, shared, book, spread_devices=spread, cycle=cycle
                )
                stopped = bool(rest)
            else:
                greedy = run_greedy(state, scorer, index=shared)
            if not settings.greedy_only:
                # The batch as a whole (fragmentation scorer, batches up to 128 gangs): a
                # second, largest-first pass.
                greedy = better_batch(
                    state,
                    problem.order,
                    greedy,
                    scorer,
                    partial(run_greedy, state, scorer, index=shared),
                    partial(admission_key, problem),
                    cycle,
                )
        finally:
            shared.close()
    except Exception:
        if scorer is packing:
            raise
        # A pluggable scorer (fragmentation) that trips on unusual input must not stop
        # scheduling: this cycle places with binpack/spread instead, on a fresh state.
        log.exception("scorer_failed", cycle=cycle, scorer=type(scorer).__name__)
        scorer, hold, rest, skipped, stopped = packing, None, [], [], False
        state = ClusterState.from_snapshot(snapshot, label_keys=label_keys)
        initial = current_classes(state)
        greedy = run_greedy(state, scorer)
    if any(p.topology_rules for g in problem.order for p in g.required):
        greedy = place_ruled_again(snapshot, problem, topology.ruled, state, greedy, cycle)
    exact_ruled = topology.ruled - with_claims
    if exact_ruled and not settings.greedy_only:
        # Small instances: a pod-level exact search for the ruled gangs (skips large ones).
        greedy = place_ruled_exactly(snapshot, problem, exact_ruled, state, greedy, settings, cycle)
    build_seconds = time.perf_counter() - started
    lap("greedy")
    candidates: list[tuple[SolveStatus, list[PodAssignment]]] = []
    # One optimising budget per cycle: what placement's stage leaves of it goes to taking
    # back (which gets at least its own minimum).
    optimise_started = time.perf_counter()
    cp: CpResult | None = None
    cp_assignments: list[PodAssignment] | None = None
    # Kept as greedy placed them: gangs whose topology rules the model cannot see, and gangs
    # consolidation moved (admitted first; the later stages must not trade them away).
    ruled = (
        topology.left_to_greedy
        | with_claims
        | {g.key for g in problem.order if g.restoring and g.key in greedy.placed}
    )
    free_problem = problem
    if ruled:
        free_problem = Problem(
            snapshot, report, problem.pending, [g for g in problem.order if g.key not in ruled]
        )

    def place_skipped() -> GreedyResult:
        """The greedy's answer for the tier it skipped, placed now as the pass would have
        placed it (onto ``state``, which holds the greedy's answer above it); the greedy's
        answer so far."""
        nonlocal greedy, rest, skipped
        part = place_gangs(
            state, skipped, scorer, book=book, extras=False, spread_devices=spread, cycle=cycle
        )
        greedy = GreedyResult({**greedy.placed, **part.placed}, {**greedy.failed, **part.failed})
        rest, skipped = rest[len(skipped) :], []
        return greedy

    if not settings.greedy_only:
        try:
            cp, cp_assignments, engine = improve_around(
                snapshot,
                free_problem,
                ruled,
                state,
                initial,
                greedy,
                scorer,
                settings,
                cycle,
                place_skipped if skipped else None,
            )
        except Exception:  # CP-SAT is an improvement; its failure must not cost the cycle
            log.exception("cpsat_failed", cycle=cycle)
            cp, cp_assignments, engine = None, None, ""
            _bring_to(state, list(state.placed.values()), greedy.assignments)
        if cp_assignments is not None:
            candidates.append((SolveStatus(engine), cp_assignments))
    lap("cpsat")
    greedy_list = greedy.assignments  # a property that builds a new list: take it once
    # What ``state`` holds (None: it cannot be trusted any more).
    on_state: list[PodAssignment] | None = (
        cp_assignments if cp_assignments is not None else greedy_list
    )
    candidates.append((SolveStatus.GREEDY, greedy_list))
    assignments: list[PodAssignment] = []
    status = SolveStatus.EMPTY
    all_violations: list[str] = []
    for engine, found in candidates:
        if found is greedy_list and stopped and on_state is not None:
            # The greedy's answer is wanted (the model stage kept it, failed, or was refused)
            # and it stopped at its frontier: the tiers below are placed now, as the pass
            # would have placed them, from its own placement.
            if _bring_to(state, on_state, greedy_list):
                greedy = finish_greedy(
                    state, greedy, rest, problem.order, scorer, book, spread_devices=spread,
                    cycle=cycle,
                )  # fmt: skip
                rest, skipped, stopped = [], [], False
                found = greedy_list = on_state = greedy.assignments
            else:
                on_state = None
        violations = validate(snapshot, found)
        if not violations:
            assignments, status = found, engine
            break
        all_violations.extend(violations)
        log.error("placement_invalid", cycle=cycle, engine=engine.value, violations=violations[:20])
    # The CP-SAT stage picks devices without asking the strand guard: its answer is checked.
    stranding = hold.held(snapshot, assignments) if hold is not None and assignments else {}
    if stranding:
        assignments = [a for a in assignments if a.gang not in stranding]
    lap("validate")
    in_step = on_state is not None and _bring_to(state, on_state, assignments)
    taken = TakeBack()
    if in_step and settings.take_back and len({a.gang for a in assignments}) < len(problem.order):
        budget = settings.time_limit_seconds - (time.perf_counter() - optimise_started)
        # Gangs the strand guard holds wait for capacity: nothing is evicted for them.
        placed_gangs = {a.gang for a in assignments}
        waiting = set(stranding) | {
            k for k, v in greedy.failed.items() if v[0] == HELD_CODE and k not in placed_gangs
        }
        backed = _take_back(
            snapshot,
            _without(free_problem, waiting),
            state,
            assignments,
            settings,
            scorer,
            cycle,
            budget=budget,
        )
        taken = backed or TakeBack()
        in_step = backed is not None
    forget_passed()  # the last validation of this cycle is done
    lap("take_back")
    explain_started = time.perf_counter()
    final = [*assignments, *taken.assignments]
    now, before = capacities(state, initial) if in_step else (None, None)
    # The greedy's filter chain already said which topology rule refused a gang's pod, at
    # the moment it did (the explainer would place the gang's pods again to find out).
    known = {
        k: v
        for k, v in greedy.failed.items()
        if v[0] in TOPOLOGY_CODES or v[0] in (DEVICES_UNAVAILABLE, HELD_CODE)
    }
    known.update(stranding)
    outcomes = gang_outcomes(problem, final, now, before, freed=taken.freed(), known=known)
    explain_seconds = time.perf_counter() - explain_started
    lap("explain")
    placement = Placement(
        assignments=tuple(final),
        evictions=tuple(taken.evictions),
        waits_for=dict(taken.waits_for),
        min_evicted_gpu_milli=taken.min_evicted_gpu_milli,
        outcomes=outcomes,
        status=status,
        objective=_reported_objective(cp, hybrid=assignments is cp_assignments),
        greedy_objective=cp.plain_objective if cp is not None else 0,
        best_bound=cp.bound if cp is not None else 0,
        build_seconds=build_seconds + (cp.build_seconds if cp is not None else 0.0),
        solve_seconds=cp.solve_seconds if cp is not None else 0.0,
        violations=tuple(all_violations),
        explain_seconds=explain_seconds,
        total_seconds=time.perf_counter() - started,
        deferred=deferred,
    )
    log.info(
        "solved",
        cycle=cycle,
        status=placement.status.value,
        gangs=len(problem.pending),
        placed=sum(1 for o in outcomes.values() if o.placed),
        pods=len(final),
        evicted=len(taken.evictions),
        seconds=round(time.perf_counter() - started, 4),
        phases=phases,
    )
    return placement


def _without(problem: Problem, gangs: Collection[str]) -> Problem:
    """``problem`` without ``gangs`` (held back by the strand guard: taking back must not
    place them either)."""
    if not gangs:
        return problem
    order = [g for g in problem.order if g.key not in gangs]
    return Problem(problem.snapshot, problem.report, problem.pending, order)


def _reported_objective(cp: CpResult | None, *, hybrid: bool) -> int:
    """The first stage's value of what is returned: CP-SAT's answer if it beat its hint, else
    the hint's (greedy or relaxation-guided), or the plain greedy's when that is returned."""
    if cp is None:
        return 0
    if not hybrid:
        return cp.plain_objective
    if cp.usable and cp.objective > cp.greedy_objective:
        return cp.objective
    return cp.greedy_objective


def _bring_to(
    state: ClusterState, applied: Sequence[PodAssignment], final: Sequence[PodAssignment]
) -> bool:
    """Make ``state`` (which holds ``applied``) hold ``final`` instead; False when it cannot
    (then the state must not be used again)."""
    if final is applied:
        return True
    try:
        for a in reversed(applied):
            state.release(a.pod_uid)
        for a in final:
            state.apply(a)
    except (KeyError, ValueError):
        log.exception("explain_state_failed")
        return False
    return True


def _take_back(
    snapshot: Snapshot,
    problem: Problem,
    state: ClusterState,
    assignments: Sequence[PodAssignment],
    settings: PlacementSettings,
    scorer: NodeScorer | None,
    cycle: int | None,
    *,
    budget: float | None = None,
) -> TakeBack | None:
    """The take-back stage on the placed ``state``, checked by the validators. None when it
    failed or its answer was invalid (dropped whole); ``state`` is then not to be trusted."""
    book = QueueBook(snapshot.queue_tree, problem.report)
    gangs = snapshot.gang_by_key
    pods = snapshot.pod_by_uid
    book.charge_pods(
        (gang.queue, pods[a.pod_uid], gang.preemptible)
        for a in assignments
        if (gang := gangs.get(a.gang)) is not None
    )
    admitted = {a.gang for a in assignments}
    try:
        taken = take_back(
            snapshot,
            problem.report,
            problem.order,
            admitted,
            state,
            book,
            settings,
            scorer,
            cycle=cycle,
            budget=budget,
        )
    except Exception:  # taking back is an extra: its failure must not cost the placement
        log.exception("take_back_failed", cycle=cycle)
        return None
    if not taken.evictions and not taken.waits_for:
        return taken
    # Room the held gangs use: their victims', and that of pods already terminating.
    evicted = taken.freed()
    # ``assignments`` passed the validator already: only their totals are counted again.
    violations = validate(
        snapshot, [*assignments, *taken.assignments], evicted=evicted, checked=len(assignments)
    )
    violations += validate_evictions(
        snapshot,
        problem.report,
        assignments,
        taken.assignments,
        taken.evictions,
        taken.waits_for,
        settings,
    )
    if violations:
        log.error("take_back_invalid", cycle=cycle, violations=violations[:20])
        return None
    return taken


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
