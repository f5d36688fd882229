"""Greedy first, then CP-SAT stage by stage down the priority tiers.

Stage 1 is the *frontier*: the highest priority where greedy left a gang out. Gangs above it
stay admitted (greedy proved they fit together and priority dominates), their pods may move;
gangs at the frontier are decided by CP-SAT. Each lower priority is then a stage of its
own on what is left: greedy backfill gives the hint, CP-SAT improves it while the cycle's
time budget lasts. Optional extras come last. When greedy admitted every gang, one stage
improves placement quality only.

Before the first stage, the relaxation of :mod:`.bound` is solved once: its bound is the
reported ``best_bound``, and when the greedy answer falls short of it, a second greedy
answer guided by the relaxation's choice of gangs (:mod:`.guided`) competes with it; the
better one is CP-SAT's hint (and the answer if CP-SAT has no time left to search).

The result is used only if it beats the plain greedy answer lexicographically by tier
(fair-share work, then all work), which with keep-greedy-unless-strictly-better at every
stage makes "never worse than greedy" hold by construction; the validator still checks it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import cast

import structlog

from scheduler.cluster.pod import Pod
from scheduler.cluster.resources import CPU, MEMORY
from scheduler.cluster.snapshot import Snapshot
from scheduler.framework.scoring import NodeScorer
from scheduler.plugins.packing import PackingScorer
from scheduler.solver.bound import Relaxation, admission_bound
from scheduler.solver.cpsat import UNITS, CpResult, ModelGang, Scale, optimize, work_units
from scheduler.solver.greedy import (
    ClassIndex,
    GangRequest,
    GreedyResult,
    ShapeKey,
    place_extra_pods,
    place_gangs,
    pod_size,
    shape_key,
)
from scheduler.solver.guided import place_guided, quality_change, stage_value
from scheduler.solver.patterns import ClassInfo, pack
from scheduler.solver.placement import PlacementSettings, PodAssignment
from scheduler.solver.problem import Problem
from scheduler.solver.quality import NodeQuality, quality_for
from scheduler.solver.queues import QueueBook
from scheduler.solver.rows import admission_value, fair_weight
from scheduler.solver.state import ClassKey, ClusterState
from scheduler.solver.why_not import NO_FIT

__all__ = ["admission_key", "current_classes", "improve", "model_classes", "model_gang"]

log = structlog.get_logger(__name__)


def current_classes(state: ClusterState) -> list[ClassInfo]:
    """The node classes of ``state`` as it is now."""
    return [
        ClassInfo(key, state.nodes[next(iter(members))].node, list(members))
        for key, members in state.classes.items()
    ]


def model_classes(initial: list[ClassInfo], touched: set[str], limit: int) -> list[ClassInfo]:
    """Classes for the CP-SAT model, at most about ``limit`` of them.

    When running pods leave every node a slightly different CPU/memory remainder, exact
    classes approach one per node. Classes the greedy did not touch are then merged by
    static traits, device state and *rounded-down* free CPU/memory, and the merged class
    offers the smallest free amount of its members - so any pattern feasible for it is
    feasible on each member, and the greedy hint (on classes kept exact) stays complete.
    Buckets double until the count fits.
    """
    if len(initial) <= limit:
        return initial
    keep = [c for c in initial if touched.intersection(c.members)]
    rest = [c for c in initial if not touched.intersection(c.members)]
    bucket = {CPU: 1000, MEMORY: 2**30}
    while True:
        merged: dict[tuple[object, ...], list[ClassInfo]] = {}
        for c in rest:
            coarse = tuple((k, v // bucket[k] if k in bucket else v) for k, v in c.key[1])
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


def model_gang(g: GangRequest, fixed: bool) -> ModelGang:
    units = work_units(g.ask)
    return ModelGang(g, fixed, max(1, units["gpu"] or units["cpu"]), units, g.ask)


def admission_key(problem: Problem, admitted: set[str]) -> tuple[tuple[int, int], ...]:
    """Per priority (highest first): (work within fair share, all work) of ``admitted``.

    The same measure as the model's objective, in the same units, so two answers can be
    compared tier by tier.
    """
    gangs = [g for g in problem.order if g.required and g.key in admitted]
    used: dict[str, dict[str, int]] = {}
    out: list[tuple[int, int]] = []
    for prio in sorted({g.priority for g in problem.order if g.required}, reverse=True):
        tier = [g for g in gangs if g.priority == prio]
        per_queue: dict[str, dict[str, int]] = {}
        for g in tier:
            row = per_queue.setdefault(g.queue, dict.fromkeys(UNITS, 0))
            for r, v in work_units(g.ask).items():
                row[r] += v
        fair = 0
        for q, units in per_queue.items():
            status = problem.report.queues.get(q)
            if status is None:
                continue
            for r, unit in UNITS.items():
                room = status.fair_share.get(r, 0) - status.allocated.get(r, 0)
                room = max(0, room - used.get(q, {}).get(r, 0)) // unit
                fair += min(room, units[r])
        for g in tier:
            row = used.setdefault(g.queue, {})
            for r, v in g.ask.items():
                row[r] = row.get(r, 0) + v
        work = sum(model_gang(g, False).work for g in tier)
        out.append((fair, work))
    return tuple(out)


def _apply_patterns(
    state: ClusterState, node_pods: Mapping[str, list[Pod]], spread: bool
) -> list[PodAssignment]:
    """Concrete device grants for CP-SAT's per-node pod lists (canonical packing)."""
    out: list[PodAssignment] = []
    for name, pods in node_pods.items():
        slot = state.nodes[name]
        ordered = sorted(pods, key=pod_size, reverse=True)
        grants = pack(slot.node, dict(slot.free), list(slot.gpu_free), ordered, spread=spread)
        if grants is None:
            raise ValueError(f"pattern does not fit node {name}")
        for pod, grant in zip(ordered, grants, strict=True):
            a = PodAssignment(pod.uid, pod.key, pod.gang, name, grant)
            state.apply(a, pod)
            out.append(a)
    return out


def _hint(
    state: ClusterState, placed: Mapping[str, Sequence[PodAssignment]], gangs: Sequence[GangRequest]
) -> dict[str, list[Pod]]:
    """Node -> required pods the greedy put there, for the given gangs."""
    out: dict[str, list[Pod]] = {}
    for g in gangs:
        for a in list(placed.get(g.key, ()))[: len(g.required)]:
            out.setdefault(a.node, []).append(state.pods[a.pod_uid])
    return out


def improve(
    snapshot: Snapshot,
    problem: Problem,
    state: ClusterState,
    initial: list[ClassInfo],
    greedy: GreedyResult,
    scorer: NodeScorer,
    settings: PlacementSettings,
    cycle: int | None,
    place_skipped: Callable[[], GreedyResult] | None = None,
) -> tuple[CpResult | None, list[PodAssignment] | None, str]:
    """(first stage's result, improved assignments or None, status).

    The status is the CP-SAT status of the first stage that improved, or GREEDY when only
    re-running the greedy by tier did.

    ``state`` has greedy's placement applied on entry; on return it holds the returned
    assignments, or greedy's placement again when None is returned.

    ``place_skipped``: given when the greedy did not place the frontier tier (proven short,
    :func:`.frontier.surely_short`); it places the greedy's answer for that tier onto
    ``state`` (holding the greedy's placement) and returns the greedy's whole answer. It is
    called only when that answer is needed: there is no guided answer, or the guided answer
    does not reach the relaxation's bound (then it is compared with the greedy's as always).
    """
    deadline = time.perf_counter() + settings.time_limit_seconds
    spread = settings.gpu_strategy == "spread"
    # The model's quality term is the scorer's own measure (binpack/spread or
    # fragmentation); with another scorer it judges admission only.
    quality = quality_for(scorer, settings.gpu_strategy, settings.cpu_strategy)
    gangs = [g for g in problem.order if g.required]
    admitted = {g.key for g in gangs if g.key in greedy.placed}
    failed = [g.priority for g in gangs if g.key not in admitted]
    frontier = max(failed) if failed else None
    if not gangs or (
        frontier is None and not (settings.quality_when_all_admitted and quality is not None)
    ):
        return None, None, ""
    top = [g for g in gangs if frontier is None or g.priority >= frontier]
    lower = [g for g in gangs if frontier is not None and g.priority < frontier]
    by_priority: dict[int, list[GangRequest]] = {}
    for g in lower:  # admission order may interleave priorities across queues; keep it
        by_priority.setdefault(g.priority, []).append(g)
    tiers = [by_priority[p] for p in sorted(by_priority, reverse=True)]

    run = partial(
        optimize,
        tree=snapshot.queue_tree,
        report=problem.report,
        gpu_strategy=settings.gpu_strategy,
        workers=settings.workers,
        pattern_cap=settings.patterns_per_class,
        quality=quality,
        presolve=settings.presolve,
        cycle=cycle,
    )
    model_gangs = [model_gang(g, frontier is None or g.priority > frontier) for g in top]
    relaxed = (
        admission_bound(
            classes=initial,
            gangs=model_gangs,
            tree=snapshot.queue_tree,
            report=problem.report,
            charged={},
            fair_weight=fair_weight(model_gangs),
            time_limit=min(0.1, settings.time_limit_seconds / 5),
            workers=settings.workers,
            cycle=cycle,
        )
        if frontier is not None
        # Greedy admitted every gang: that is the most admission there is (no relaxation
        # needed to bound it), and this stage is about quality alone.
        else Relaxation(admission_value(model_gangs, admitted, problem.report, {}), [])
    )
    top_keys = {g.key for g in top}
    greedy_list = greedy.assignments
    base_placed: Mapping[str, Sequence[PodAssignment]] = greedy.placed
    base_admitted = admitted & top_keys
    released = guided_better = False
    # What ``state`` holds of this stage's and lower tiers' gangs: greedy's placement, then
    # nothing once released, or the guided answer when it is kept (it stays applied: taking
    # it off to put it back below cost a release and an apply per pod).
    on_state: Sequence[PodAssignment] = greedy_list
    if relaxed is not None and relaxed.admitted and frontier is not None:
        value = admission_value(model_gangs, base_admitted, problem.report, {})
        if value < relaxed.bound:
            for a in reversed(greedy_list):
                state.release(a.pod_uid)
            released = True
            fixed = {m.request.key for m in model_gangs if m.fixed}
            guided = place_guided(
                state,
                top,
                set(relaxed.admitted),
                fixed,
                scorer,
                QueueBook(snapshot.queue_tree, problem.report),
                spread_devices=spread,
                cycle=cycle,
            )
            now = set(guided.placed)
            guided_value = admission_value(model_gangs, now, problem.report, {})
            if place_skipped is not None and not (fixed <= now and guided_value >= relaxed.bound):
                # Not proven best: the greedy's answer for the tier it skipped is placed now,
                # under the guided one, to compare (the guided answer is put back after).
                for a in reversed(guided.assignments):
                    state.release(a.pod_uid)
                for a in greedy_list:
                    state.apply(a)
                greedy, greedy_list, admitted = _with_skipped(place_skipped, gangs)
                base_placed, base_admitted, place_skipped = greedy.placed, admitted & top_keys, None
                value = admission_value(model_gangs, base_admitted, problem.report, {})
                for a in reversed(greedy_list):
                    state.release(a.pod_uid)
                for a in guided.assignments:
                    state.apply(a)
            if fixed <= now and guided_value > value:
                base_placed, base_admitted, guided_better = guided.placed, now, True
                on_state = guided.assignments
            else:
                for a in reversed(guided.assignments):
                    state.release(a.pod_uid)
                on_state = ()
            log.info(
                "guided",
                cycle=cycle,
                better=guided_better,
                greedy=value if place_skipped is None else None,  # None: not placed
                guided=guided_value,
                bound=relaxed.bound,
                chosen=len(relaxed.admitted),
                placed=len(now),
            )

    if place_skipped is not None and not guided_better:
        # No guided answer (no usable relaxation): the greedy's own for the skipped tier.
        greedy, greedy_list, admitted = _with_skipped(place_skipped, gangs)
        base_placed, base_admitted, place_skipped = greedy.placed, admitted & top_keys, None
        on_state = greedy_list

    hint = _hint(state, base_placed, top)
    classes = model_classes(initial, set(hint), settings.max_model_classes)
    scale = Scale.of(
        classes,
        quality,
        exact=initial,
        pods=sum(len(g.required) for g in top),
    )
    admit_bound = relaxed.bound if relaxed is not None else None
    value_of = partial(stage_value, state, top, model_gangs, problem.report, scale)
    first: CpResult | None
    # Greedy's admission already at the relaxation's bound (it cannot be beaten): the model
    # could only improve placement quality, not worth its build time unless asked for.
    # The same when the relaxation-guided answer reached that bound: CP-SAT could only
    # prove it optimal (the answer kept is the same).
    proven = (
        frontier is not None
        and admit_bound is not None
        and not settings.quality_when_admission_proven
        and admission_value(model_gangs, base_admitted, problem.report, {}) >= admit_bound
    )
    short = guided_better and deadline - time.perf_counter() < settings.time_limit_seconds / 5
    if proven or short:
        # (short: too little time left for the model to search; keep the guided answer.)
        base_value = value_of(base_placed, quality=quality, held=on_state)
        first = CpResult(
            status="UNKNOWN",
            objective=base_value,
            bound=scale.bound(admit_bound) if admit_bound is not None else 0,
            greedy_objective=base_value,
            usable=False,
            scale=scale,
        )
    else:
        first = run(
            classes=classes,
            gangs=model_gangs,
            hint_nodes=hint,
            hint_admitted=base_admitted,
            time_limit=deadline - time.perf_counter(),
            admit_bound=admit_bound,
            scale=scale,
        )
    if first is not None and guided_better:
        # 0 when the greedy never placed this stage (its tier was skipped as proven short
        # and the guided answer reached the bound): there is no plain answer to measure.
        first.baseline_objective = (
            0
            if place_skipped is not None
            else value_of(greedy.placed, quality=quality, held=on_state)
        )
    first_better = first is not None and first.usable and first.objective > first.greedy_objective
    lower_failed = settings.lower_tier_stages and any(g.key not in admitted for g in lower)
    if not first_better and not lower_failed and not guided_better:
        if released:
            for a in greedy_list:
                state.apply(a)
        return first, None, ""
    status = (first.status if first is not None else "") if first_better else ""
    if guided_better and not first_better and first is not None and first.status == "OPTIMAL":
        status = first.status  # CP-SAT proved the guided answer optimal for this stage

    if not released:
        for a in reversed(greedy_list):
            state.release(a.pod_uid)
    out: list[PodAssignment] = []
    try:
        book = QueueBook(snapshot.queue_tree, problem.report)
        if first_better and first is not None:
            if guided_better:
                for a in reversed(on_state):  # the guided answer, still applied
                    state.release(a.pod_uid)
            applied = _apply_patterns(state, first.node_pods, spread)
            if _quality_only_worse(state, top, applied, first, base_placed, base_admitted, quality):
                for a in reversed(applied):
                    state.release(a.pod_uid)
                if guided_better:
                    for a in on_state:
                        state.apply(a)
                first_better, status = False, ""
            else:
                out += applied
                now_admitted = set(first.admitted)
        if not (first_better and first is not None):
            now_admitted = set(base_admitted)
            for g in top:
                for a in list(base_placed.get(g.key, []))[: len(g.required)]:
                    if not guided_better:  # the guided answer is applied already
                        state.apply(a)
                    out.append(a)
        for g in top:
            if g.key in now_admitted:
                book.charge(g.queue, g.ask, preemptible=g.preemptible)
        for tier in tiers:
            before = {q: dict(row) for q, row in book.charged.items()}
            pinned_before = {q: dict(row) for q, row in book.pinned.items()}
            classes = current_classes(state)
            back = _place_again(state, tier, greedy.placed, scorer, book, spread, cycle)
            left = deadline - time.perf_counter()
            plain = back
            if settings.lower_tier_stages and len(back.placed) < len(tier) and left > 0.02:
                back = _guided_tier(
                    snapshot,
                    problem,
                    state,
                    tier,
                    classes,
                    (before, pinned_before),
                    back,
                    book,
                    scorer,
                    left,
                )
            chosen, chosen_admitted = back.assignments, set(back.placed)
            left = deadline - time.perf_counter()
            if settings.lower_tier_stages and len(back.placed) < len(tier) and left > 0.02:
                hint = _hint(state, back.placed, tier)
                stage = run(
                    classes=model_classes(classes, set(hint), settings.max_model_classes),
                    gangs=[model_gang(g, False) for g in tier],
                    hint_nodes=hint,
                    hint_admitted=set(back.placed),
                    time_limit=left,
                    charged=before,
                    pinned=pinned_before,
                )
                if stage is not None and stage.usable and stage.objective > stage.greedy_objective:
                    for a in reversed(chosen):
                        state.release(a.pod_uid)
                    by_key = {g.key: g for g in tier}
                    for key in back.placed:
                        book.charge(
                            by_key[key].queue,
                            by_key[key].ask,
                            -1,
                            preemptible=by_key[key].preemptible,
                        )
                    chosen = _apply_patterns(state, stage.node_pods, spread)
                    chosen_admitted = set(stage.admitted)
                    for key in chosen_admitted:
                        book.charge(
                            by_key[key].queue,
                            by_key[key].ask,
                            preemptible=by_key[key].preemptible,
                        )
                    status = status or stage.status
                elif stage is not None and back is not plain and stage.status == "OPTIMAL":
                    status = status or stage.status  # proved the guided answer optimal
            out += chosen
            now_admitted |= chosen_admitted
        extra = place_extra_pods(
            state, problem.order, now_admitted, scorer, book=book, spread_devices=spread
        )
        out += [a for pods in extra.values() for a in pods]
    except ValueError as e:
        log.error("cpsat_disaggregation_failed", cycle=cycle, error=str(e))
        _restore(state, out, greedy_list)
        return first, None, ""
    if not first_better and admission_key(problem, now_admitted) <= admission_key(
        problem, admitted
    ):
        _restore(state, out, greedy_list)
        return first, None, ""
    return first, out, status or "GREEDY"


def _quality_only_worse(
    state: ClusterState,
    top: Sequence[GangRequest],
    applied: Sequence[PodAssignment],
    first: CpResult,
    base_placed: Mapping[str, Sequence[PodAssignment]],
    base_admitted: set[str],
    quality: NodeQuality | None,
) -> bool:
    """True when CP-SAT's answer (``applied`` to ``state``) admits the same gangs as the
    hint's (``base_placed``) and does not leave the nodes in a better state, measured on
    the real nodes. The model measures a merged class on its members' floor, and packs
    shares as the canonical packer does where the greedy may have chosen other devices,
    so its quality gain is an estimate: a batch is moved only for a real one."""
    if quality is None or first.admitted != base_admitted:
        return False
    placed: dict[str, list[PodAssignment]] = {}
    for a in applied:
        placed.setdefault(a.gang, []).append(a)
    model = quality_change(state, top, placed, quality, applied)
    hint = quality_change(state, top, base_placed, quality, applied)
    log.debug("quality_checked", model=model, hint=hint)
    return model >= hint


def _with_skipped(
    place_skipped: Callable[[], GreedyResult], gangs: Sequence[GangRequest]
) -> tuple[GreedyResult, list[PodAssignment], set[str]]:
    """The greedy's answer once it placed the tier it skipped (see :func:`improve`): the
    result, its assignments and the gangs of ``gangs`` it admits."""
    greedy = place_skipped()
    return greedy, greedy.assignments, {g.key for g in gangs if g.key in greedy.placed}


def _place_again(
    state: ClusterState,
    tier: Sequence[GangRequest],
    before: Mapping[str, Sequence[PodAssignment]],
    scorer: NodeScorer,
    book: QueueBook,
    spread: bool,
    cycle: int | None,
) -> GreedyResult:
    """Place a tier again below a stage that changed: the greedy, in the same order, except
    that a gang whose greedy placement (``before``) is still free and still admitted by its
    queue keeps it. Most gangs of a lower tier are untouched by what the stage above moved,
    and keeping them costs a fraction of a search each."""
    result = GreedyResult()
    index = ClassIndex(state, scorer, spread_devices=spread)
    batch: list[GangRequest] = []
    # Capacity only shrinks in this pass (kept or placed, gangs only take), so a set of pod
    # shapes that found no room once finds none later either.
    no_room: set[tuple[int, ...]] = set()
    interned: dict[ShapeKey, int] = {}

    def signature(g: GangRequest) -> tuple[int, ...]:
        # Shape keys interned to ints: sorting the keys themselves (by repr) was a hot spot.
        return tuple(sorted(interned.setdefault(shape_key(p), len(interned)) for p in g.required))

    def flush() -> None:
        if not batch:
            return
        again = place_gangs(
            state, batch, scorer, book=book, extras=False, spread_devices=spread, cycle=cycle,
            index=index,
        )  # fmt: skip
        result.placed.update(again.placed)
        result.failed.update(again.failed)
        for g in batch:
            if again.failed.get(g.key, ("",))[0] == NO_FIT:
                no_room.add(signature(g))
        batch.clear()

    try:
        for g in tier:
            mine = list(before.get(g.key, ()))[: len(g.required)]
            if g.required and len(mine) == len(g.required):
                flush()
                if _keep(state, g, mine, book):
                    result.placed[g.key] = mine
                    continue
            if g.required and no_room and signature(g) in no_room:
                result.failed[g.key] = (NO_FIT, "no room for the whole gang")
                continue
            batch.append(g)
        flush()
    finally:
        index.close()
    return result


def _keep(
    state: ClusterState, g: GangRequest, mine: Sequence[PodAssignment], book: QueueBook
) -> bool:
    """Apply ``mine`` (the gang's required pods) and charge its queue; False, with nothing
    changed, when its queue no longer admits it or a pod no longer fits where it was."""
    if book.problem(g.queue, g.ask, preemptible=g.preemptible) is not None:
        return False
    done: list[PodAssignment] = []
    try:
        for a in mine:
            state.apply(a)
            done.append(a)
    except ValueError:
        for a in reversed(done):
            state.release(a.pod_uid)
        return False
    book.charge(g.queue, g.ask, preemptible=g.preemptible)
    return True


def _guided_tier(
    snapshot: Snapshot,
    problem: Problem,
    state: ClusterState,
    tier: Sequence[GangRequest],
    classes: Sequence[ClassInfo],
    charges: tuple[Mapping[str, Mapping[str, int]], Mapping[str, Mapping[str, int]]],
    back: GreedyResult,
    book: QueueBook,
    scorer: NodeScorer,
    left: float,
) -> GreedyResult:
    """A lower tier's greedy backfill ``back`` (applied to ``state`` and charged to ``book``),
    or the relaxation-guided answer for the tier when that admits more (then applied and
    charged instead). ``classes`` and ``charges`` (all, non-preemptible) are the state and
    charges before ``back``."""
    before, pinned_before = charges
    gangs = [model_gang(g, False) for g in tier]
    spread = isinstance(scorer, PackingScorer) and scorer.gpu_strategy == "spread"
    relaxed = admission_bound(
        classes=classes,
        gangs=gangs,
        tree=snapshot.queue_tree,
        report=problem.report,
        charged=before,
        pinned=pinned_before,
        fair_weight=fair_weight(gangs),
        time_limit=min(0.1, left / 3),
        workers=1,
    )
    value = admission_value(gangs, set(back.placed), problem.report, before)
    if relaxed is None or not relaxed.admitted or value >= relaxed.bound:
        return back
    for a in reversed(back.assignments):
        state.release(a.pod_uid)
    tier_book = QueueBook(snapshot.queue_tree, problem.report)
    tier_book.charged = {q: dict(row) for q, row in before.items()}
    tier_book.pinned = {q: dict(row) for q, row in pinned_before.items()}
    guided = place_guided(
        state, tier, set(relaxed.admitted), set(), scorer, tier_book, spread_devices=spread
    )
    if admission_value(gangs, set(guided.placed), problem.report, before) > value:
        book.charged, book.pinned = tier_book.charged, tier_book.pinned
        return guided
    for a in reversed(guided.assignments):
        state.release(a.pod_uid)
    for a in back.assignments:
        state.apply(a)
    return back


def _restore(state: ClusterState, out: list[PodAssignment], greedy: list[PodAssignment]) -> None:
    """Put ``state`` back to greedy's placement."""
    for a in reversed(out):
        state.release(a.pod_uid)
    for a in greedy:
        state.apply(a)
