"""Solving one exact model (:mod:`.exact_model`): :func:`solve_ruled` builds it, sets the
objective and hints, runs CP-SAT and reads the answer back as an :class:`ExactAnswer`.

Objective, lexicographic by weights: per priority tier (highest first) work within fair
share, then all work (:func:`~.hybrid.admission_key`'s measure); then pods placed (extras
count); then, as the minor term, pods kept on the node the greedy chose for them (the
greedy's node choice is what applied preferences and packing).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from scheduler.cluster.pod import Pod
from scheduler.cluster.snapshot import Snapshot
from scheduler.solver.exact_context import ExactContext
from scheduler.solver.exact_model import MAX_ORDER_TERMS, ExactModel, ModelTooBig
from scheduler.solver.greedy import GangRequest
from scheduler.solver.problem import Problem
from scheduler.solver.queues import QueueBook
from scheduler.solver.rows import ModelGang, fair_rooms
from scheduler.solver.state import ClusterState

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

__all__ = ["ExactAnswer", "solve_ruled"]

# The same logger name as before the split: operators' log filters keep working.
log = structlog.get_logger("scheduler.solver.cpsat_topology")

#: Objective weights must stay well inside CP-SAT's 64-bit integers.
_MAX_WEIGHT = 2**60


@dataclass(frozen=True)
class ExactAnswer:
    """What the model chose: per model gang (in the order found) its pods and nodes, in the
    order they are to be placed; and CP-SAT's status name."""

    order: list[tuple[str, list[tuple[Pod, str]]]]
    status: str
    seconds: float


def solve_ruled(
    snapshot: Snapshot,
    problem: Problem,
    gangs: Sequence[GangRequest],
    state: ClusterState,
    book: QueueBook,
    hint: Mapping[str, str],
    hint_order: Sequence[str],
    *,
    seconds: float,
    ctx: ExactContext | None = None,
    cand: Mapping[str, list[str]] | None = None,
) -> ExactAnswer | None:
    """The model over ``gangs`` on ``state`` (which must not hold their pods), solved; None
    when it is too big or CP-SAT found nothing. ``hint``: pod uid -> node of a valid answer
    (the greedy's); ``hint_order``: gang keys in that answer's order. ``ctx`` and ``cand``
    (candidates by pod uid), when given, were computed on this ``state``."""
    started = time.perf_counter()
    try:
        b = ExactModel(ctx or ExactContext(state), gangs, hint, hint_order, cand)
        y, model_gangs = b.gangs_and_queues(book, problem)
        b.capacity()
        b.anti_affinity()
        b.affinity()
        b.spread()
        b.orders()
    except ModelTooBig:
        log.info("ruled_exact_skipped", reason="order terms", limit=MAX_ORDER_TERMS)
        return None
    objective = _objective(b, y, model_gangs, problem, book)
    if objective is None:
        return None
    b.m.maximize(objective)
    b.add_hints(y)
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, seconds)
    # One worker: the answer does not depend on thread timing (these models are tiny).
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    code = solver.solve(b.m)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    chosen: list[tuple[int, int, str]] = []  # (gang position, pod position, node) per pod
    by_gang: dict[int, list[tuple[int, Pod, str]]] = {}
    for i, pod in enumerate(b.pods):
        node = next((n for n, v in b.x[i].items() if solver.boolean_value(v)), None)
        if node is not None:
            by_gang.setdefault(b.gang_of[i], []).append((solver.value(b.ipos[i]), pod, node))
            chosen.append((b.gang_of[i], i, node))
    order = sorted(by_gang, key=lambda gi: (solver.value(b.gpos[gi]), b.gang_rank[gi]))
    out = [
        (b.gangs[gi].key, [(pod, node) for _, pod, node in sorted(by_gang[gi], key=lambda t: t[0])])
        for gi in order
    ]
    return ExactAnswer(out, solver.status_name(code), time.perf_counter() - started)


def _objective(
    b: ExactModel,
    y: Sequence[cp_model.IntVar | int],
    model_gangs: Sequence[ModelGang],
    problem: Problem,
    book: QueueBook,
) -> cp_model.LinearExprT | None:
    """Levels, least significant first: pods kept on the greedy's node, pods placed, then
    per tier (lowest priority first) ``K * work within fair share + work``."""
    from ortools.sat.python import cp_model

    m = b.m
    kept = [v for i, p in enumerate(b.pods) for n, v in b.x[i].items() if b.hint.get(p.uid) == n]
    levels: list[tuple[cp_model.LinearExprT, int]] = [
        (sum(kept), len(kept)),
        (sum(b.placed), len(b.pods)),
    ]
    y_of = {g.key: y[gi] for gi, g in enumerate(b.gangs)}
    rooms = fair_rooms(model_gangs, problem.report, book.charged)
    # Fair room is shared by the tiers of a queue: per room, the tiers' parts.
    by_room: dict[tuple[str, str], list[cp_model.IntVar]] = {}
    for prio in sorted({g.request.priority for g in model_gangs}):
        tier = [g for g in model_gangs if g.request.priority == prio]
        work = sum(g.work * y_of[g.request.key] for g in tier)
        work_max = sum(g.work for g in tier)
        fair_terms = []
        fair_max = 0
        for (q, r), room in rooms.items():
            units = [
                (g.units[r], y_of[g.request.key])
                for g in tier
                if g.request.queue == q and g.units[r] > 0
            ]
            if not units:
                continue
            cap = min(room, sum(u for u, _ in units))
            f = m.new_int_var(0, cap, f"fair{prio}_{q}_{r}")
            m.add(f <= sum(u * lit for u, lit in units))
            by_room.setdefault((q, r), []).append(f)
            fair_terms.append(f)
            fair_max += cap
        k = work_max + 1
        levels.append((k * sum(fair_terms) + work, k * fair_max + work_max))
    for key, vs in by_room.items():
        if len(vs) > 1:
            m.add(sum(vs) <= rooms[key])
    weights = []
    weight = 1
    for _, most in levels:
        weights.append(weight)
        weight *= most + 1
        if weight > _MAX_WEIGHT:
            log.info("ruled_exact_skipped", reason="objective weights")
            return None
    return cp_model.LinearExpr.weighted_sum([e for e, _ in levels], weights)
