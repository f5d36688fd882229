"""CP-SAT over the aggregated model: node classes x patterns, gangs admitted or not.

Data -> variables -> constraints -> objective -> solve -> read back:

- ``z[c, p]`` (int, 0..|c|): nodes of class ``c`` that take pattern ``p`` (a multiset of pod
  shapes; see :mod:`scheduler.solver.patterns`). The empty pattern is the slack.
- ``y[g]`` (bool): gang ``g`` admitted - all its required pods placed. Gangs of priorities
  above the frontier (the highest priority where greedy left a gang out) are fixed to 1:
  greedy proved they all fit together, and priority dominates everything below it. Lower
  priorities are later stages (:mod:`scheduler.solver.hybrid`): one tier per model keeps
  the lexicographic weights far below 2**63.
- ``f[q, r]`` (int): work of leaf queue ``q`` in resource ``r`` admitted within what is left
  of its fair share.

Constraints: per class, patterns use at most its nodes; per shape, pattern slots equal the
pods of admitted gangs (so gangs are whole); queue limits at every level; the quota of
every level for non-preemptible gangs (only non-preemptible usage counts); ``f`` bounded
by the remaining fair share and the admitted work.

Objective (maximise, lexicographic by integer weights; numbers in
:class:`ObjectiveWeights`): ``K_A * (K_F * sum f + sum w_g y_g) + Q_off - sum dq z``,
i.e. fairness, then admitted work, then placement quality (``dq`` = change of the node
cost of :mod:`scheduler.solver.quality` from the class's state to the one pattern ``p``
leaves: binpack/spread, or the fragmentation scorer's measure; ``Q_off`` keeps the value
non-negative). Summed over nodes, it measures what the whole batch leaves free.

CP-SAT's own best bound is a bound of *this* model only: patterns are enumerated up to a
cap per class, so it does not bound placements that need a pattern left out. The reported
objective and bound use :class:`Scale`; the bound comes from a relaxation of the real
problem (:mod:`scheduler.solver.bound`).

Where running pods come in (reclaim, preemption, consolidation, elastic shrink): today a
class is keyed by a node's *free* state and patterns only add shapes. The extension keys a
class by (free state, multiset of running *movable* shapes) and lets a pattern also name
how many running pods of each shape it removes: ``z[c, p]`` stays the count of nodes doing
``p``. Per running gang a bool ``keep[g]`` (all its pods stay, or all go - gangs stay
whole) ties removals to gangs the same way the shape-balance rows tie placements to
``y``; an evicted gang's pods may re-enter as pending shapes (consolidation = evict and
re-place in one cycle). Elastic shrink is ``keep`` over extra pods only. Reclaim between
queues adds rows "a queue above its fair share may lose work only to a queue below it";
preemption inside a queue "only lower priority may be evicted". Eviction costs join the
objective between admission and quality. None of this changes the variables above, only
adds columns and rows.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import QueueTree
from scheduler.fairness import FairShareReport
from scheduler.plugins.packing import MAX_NODE_COST, Strategy
from scheduler.solver.greedy import pod_size, shape_key
from scheduler.solver.patterns import (
    ClassInfo,
    Demand,
    Pattern,
    PatternSet,
    enumerate_patterns,
    pack,
)
from scheduler.solver.quality import NodeQuality
from scheduler.solver.rows import (
    UNITS,
    ModelGang,
    fair_rooms,
    fair_weight,
    queue_rows,
    work_units,
)

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

__all__ = ["CpResult", "ModelGang", "ObjectiveWeights", "Scale", "optimize"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ObjectiveWeights:
    """Integer weights of the lexicographic objective."""

    fair: int  # K_F: one unit of within-fair-share work beats all plain work
    admit: int  # K_A: one unit of admitted work beats any quality change
    quality_offset: int  # Q_off


@dataclass(frozen=True)
class Scale:
    """The reported objective of a stage, in a scale that does not depend on the patterns.

    ``value = K * admission + Q - quality_change`` with ``N`` the nodes that can change
    (those of the model, at most one per pod of the stage), ``S`` the largest span of the
    quality measure on the model's nodes (:meth:`~scheduler.solver.quality.NodeQuality.span`;
    ``MAX_NODE_COST`` for binpack/spread), ``Q = S * N`` and ``K = 2 * Q + 1``: a node's
    cost change lies in ``[-S, S]``, so the quality part stays in ``[0, 2Q]`` and one
    unit of admission outweighs any quality change. ``admission`` is ``K_F * f + work``
    as in the model.

    :meth:`bound` is honest: ``admission`` is bounded by the relaxation of
    :mod:`scheduler.solver.bound` (valid for every placement, not only the model's
    patterns), and ``-quality_change`` by ``D`` = the summed cost of the model's nodes
    before the cycle (the larger of the merged classes' and the exact classes' measure),
    since no node's cost drops below zero. The quality allowance is loose when every gang
    is admitted (then only quality is left to compare); with gangs left out, ``K`` makes
    admission dominate the ratio.
    """

    admit_weight: int
    offset: int
    drop: int

    @classmethod
    def of(
        cls,
        classes: Sequence[ClassInfo],
        quality: NodeQuality | None,
        *,
        exact: Sequence[ClassInfo] = (),
        pods: int | None = None,
    ) -> Scale:
        """The scale of a model over ``classes``; ``exact`` are the unmerged classes of the
        same nodes (merged classes offer their members' floor, whose cost may differ from
        the members' own, so ``D`` covers both measures). Only nodes that receive one of
        the stage's ``pods`` can change cost, so ``N`` and ``D`` count at most that many
        nodes (the costliest ones for ``D``)."""
        total = sum(len(c.members) for c in classes)
        changed = total if pods is None else min(pods, total)

        def drop_of(of: Sequence[ClassInfo]) -> int:
            assert quality is not None
            each = quality.node_costs([(c.node, (c.free, c.gpu_free)) for c in of])
            costs = sorted(zip(each, (len(c.members) for c in of), strict=True), reverse=True)
            out, left = 0, changed
            for cost, count in costs:
                take = min(left, count)
                out += cost * take
                left -= take
                if not left:
                    break
            return out

        span = max((quality.span(c.node) for c in classes), default=0) if quality else 0
        offset = max(MAX_NODE_COST, span) * changed
        drop = max(drop_of(classes), drop_of(exact)) if quality else 0
        return cls(2 * offset + 1, offset, drop)

    def value(self, admission: int, quality_change: int) -> int:
        """The reported objective of one answer."""
        return self.admit_weight * admission + self.offset - quality_change

    def bound(self, admission_bound: int) -> int:
        """Upper bound of :meth:`value` given an upper bound of admission."""
        return self.admit_weight * admission_bound + self.offset + self.drop


@dataclass
class CpResult:
    """What CP-SAT found, in the reported scale (:class:`Scale`), ready to disaggregate."""

    status: str
    objective: int
    bound: int
    greedy_objective: int
    admitted: set[str] = field(default_factory=set)
    #: node name -> pods to place there (canonical packing gives their devices)
    node_pods: dict[str, list[Pod]] = field(default_factory=dict)
    build_seconds: float = 0.0
    solve_seconds: float = 0.0
    #: False when CP-SAT returned no solution (UNKNOWN/INFEASIBLE/MODEL_INVALID)
    usable: bool = True
    #: The scale of the values above (the same for every answer of this stage).
    scale: Scale = field(default_factory=lambda: Scale(1, 0, 0))
    #: The plain greedy answer's value when the hint came from elsewhere (the
    #: relaxation-guided pass); None when the hint was the greedy answer.
    baseline_objective: int | None = None

    @property
    def plain_objective(self) -> int:
        """Value of the plain greedy answer."""
        return self.greedy_objective if self.baseline_objective is None else self.baseline_objective


def optimize(
    *,
    classes: Sequence[ClassInfo],
    gangs: Sequence[ModelGang],
    hint_nodes: Mapping[str, list[Pod]],
    hint_admitted: set[str],
    tree: QueueTree,
    report: FairShareReport,
    gpu_strategy: Strategy,
    time_limit: float,
    workers: int,
    pattern_cap: int = 48,
    quality: NodeQuality | None = None,
    presolve: bool = False,
    charged: Mapping[str, Mapping[str, int]] | None = None,
    pinned: Mapping[str, Mapping[str, int]] | None = None,
    admit_bound: int | None = None,
    scale: Scale | None = None,
    cycle: int | None = None,
) -> CpResult | None:
    """Build and solve the model; None when the greedy hint cannot be expressed in it.

    ``quality`` is the placement-quality measure (:mod:`scheduler.solver.quality`); None
    drops the term (a greedy scorer whose notion of quality the model does not share).
    ``charged`` is queue usage already admitted earlier in this cycle (by higher-priority
    stages), ``pinned`` its non-preemptible part.
    ``admit_bound`` is an upper bound of the admission value over every valid placement
    (from :func:`scheduler.solver.bound.admission_bound`); the reported ``bound`` is
    derived from it (:class:`Scale`), 0 when it is not given (unknown).
    """
    # Deferred: OR-Tools (with pandas) is the largest import of the process; the
    # scheduler's start and the CLI should not wait for it (see scheduler.runner.warm_up).
    from ortools.sat.python import cp_model

    charged = charged or {}
    started = time.perf_counter()
    deadline = started + time_limit
    model = cp_model.CpModel()

    # --- data: shapes and per-gang counts ----------------------------------------------
    # shape ids in canonical order (larger first) - the packer relies on it
    by_key: dict[object, Pod] = {}
    for g in gangs:
        for pod in g.request.required:
            by_key.setdefault(shape_key(pod), pod)
    ordered = sorted(by_key.items(), key=lambda kv: pod_size(kv[1]), reverse=True)
    shapes: list[Pod] = [pod for _, pod in ordered]
    shape_ids: dict[object, int] = {key: i for i, (key, _) in enumerate(ordered)}
    counts: list[Counter[int]] = [
        Counter(shape_ids[shape_key(p)] for p in g.request.required) for g in gangs
    ]
    demand = [0] * len(shapes)
    for c in counts:
        for s, n in c.items():
            demand[s] += n

    # --- hint patterns from greedy: node -> multiset of shapes --------------------------
    node_class = {name: ci for ci, info in enumerate(classes) for name in info.members}
    hint_z: list[Counter[Pattern]] = [Counter() for _ in classes]
    for name, pods in hint_nodes.items():
        ci = node_class.get(name)
        if ci is None:
            return None  # greedy used a node outside the classes: nothing sound to compare
        pattern = tuple(sorted(Counter(shape_ids[shape_key(p)] for p in pods).items()))
        hint_z[ci][pattern] += 1

    # --- variables: z[c, p] nodes of class c on pattern p --------------------------------
    z: list[list[cp_model.IntVar]] = []
    pattern_sets: list[PatternSet] = []
    slots: list[list[tuple[int, cp_model.IntVar]]] = [[] for _ in shapes]
    quality_terms: list[tuple[cp_model.IntVar, int]] = []
    q_min = q_max = 0
    sized: dict[tuple[int, object], Demand | None] = {}
    for ci, info in enumerate(classes):
        ps = enumerate_patterns(
            info,
            shapes,
            demand,
            list(hint_z[ci]),
            gpu=gpu_strategy,
            quality=quality,
            cap=pattern_cap,
            sized=sized,
        )
        missing = set(hint_z[ci]) - set(ps.patterns)
        if missing:
            log.warning("hint_pattern_infeasible", cycle=cycle, patterns=len(missing))
            return None
        pattern_sets.append(ps)
        n = len(info.members)
        row = []
        for pi, pattern in enumerate(ps.patterns):
            var = model.new_int_var(0, n, f"z{ci}_{pi}")
            row.append(var)
            for s, k in pattern:
                slots[s].append((k, var))
            if quality and ps.delta[pi]:
                quality_terms.append((var, ps.delta[pi]))
        z.append(row)
        if row:
            # class c: patterns use at most its nodes
            model.add(sum(row) <= n)
            if quality:
                q_min += n * min(0, *ps.delta)
                q_max += n * max(0, *ps.delta)

    # --- y[g] admitted (fixed gangs are 1) ------------------------------------------------
    y = [
        model.new_constant(1) if g.fixed else model.new_bool_var(f"y{i}")
        for i, g in enumerate(gangs)
    ]
    # identical gangs (same queue, priority, preemptibility and pods): the earlier one in
    # admission order goes first - breaks symmetry, and is what fairness order says anyway
    last_of_type: dict[tuple[object, ...], int] = {}
    for i, g in enumerate(gangs):
        if g.fixed:
            continue
        kind = (
            g.request.queue,
            g.request.priority,
            g.request.preemptible,
            tuple(sorted(counts[i].items())),
        )
        if kind in last_of_type:
            model.add(y[last_of_type[kind]] >= y[i])
        last_of_type[kind] = i
    # shape s: slots in patterns == pods of admitted gangs (whole gangs only)
    for s in range(len(shapes)):
        pods_of_s = [(c[s], y[i]) for i, c in enumerate(counts) if c.get(s)]
        model.add(sum(k * v for k, v in slots[s]) == sum(k * v for k, v in pods_of_s))

    # queue limits and non-preemptible quota at every level
    for name, terms, cap in queue_rows(gangs, tree, report, charged, pinned):
        # a queue already past its limit takes nothing more (not "gives back")
        model.add(sum(a * y[i] for i, a in terms) <= max(0, cap)).with_name(name)

    # fairness: f[q, r] <= remaining fair share, <= admitted work of q
    fair_vars: list[cp_model.IntVar] = []
    free_idx = [i for i, g in enumerate(gangs) if not g.fixed]
    hint_f: list[int] = []
    for (q, r), room in fair_rooms(gangs, report, charged).items():
        idx = [i for i in free_idx if gangs[i].request.queue == q and gangs[i].units[r] > 0]
        if not idx:
            continue
        f = model.new_int_var(0, room, f"f_{q}_{r}")
        model.add(f <= sum(gangs[i].units[r] * y[i] for i in idx))
        fair_vars.append(f)
        hinted = sum(gangs[i].units[r] for i in idx if gangs[i].request.key in hint_admitted)
        hint_f.append(min(room, hinted))

    work_max = sum(gangs[i].work for i in free_idx)
    weights = ObjectiveWeights(
        fair=fair_weight(gangs), admit=(q_max - q_min) + 1, quality_offset=q_max
    )
    admit_expr = weights.fair * sum(fair_vars) + sum(gangs[i].work * y[i] for i in free_idx)
    quality_expr = sum(d * v for v, d in quality_terms)
    model.maximize(weights.admit * admit_expr + weights.quality_offset - quality_expr)

    # --- hint: the greedy answer, complete ------------------------------------------------
    for ci, ps in enumerate(pattern_sets):
        for pi, pattern in enumerate(ps.patterns):
            model.add_hint(z[ci][pi], hint_z[ci].get(pattern, 0))
    for i in free_idx:
        model.add_hint(y[i], 1 if gangs[i].request.key in hint_admitted else 0)
    for f, v in zip(fair_vars, hint_f, strict=True):
        model.add_hint(f, v)
    greedy_quality = (
        sum(
            n * ps.delta[ps.patterns.index(p)]
            for ci, ps in enumerate(pattern_sets)
            for p, n in hint_z[ci].items()
        )
        if quality
        else 0
    )
    greedy_admit = weights.fair * sum(hint_f) + sum(
        gangs[i].work for i in free_idx if gangs[i].request.key in hint_admitted
    )
    scale = scale or Scale.of(classes, quality)
    greedy_objective = scale.value(greedy_admit, greedy_quality)
    log.debug(
        "cpsat_weights",
        cycle=cycle,
        fair=weights.fair,
        admit=weights.admit,
        q_off=weights.quality_offset,
        hint_f=sum(hint_f),
        hint_u=greedy_admit - weights.fair * sum(hint_f),
        work_max=work_max,
    )

    build_seconds = time.perf_counter() - started
    bound = scale.bound(admit_bound) if admit_bound is not None else 0
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, deadline - time.perf_counter())
    solver.parameters.num_workers = max(1, workers)
    solver.parameters.cp_model_presolve = presolve
    code = solver.solve(model)
    solve_seconds = time.perf_counter() - started - build_seconds
    status = solver.status_name(code)
    log.info(
        "cpsat_done",
        cycle=cycle,
        status=status,
        classes=len(classes),
        shapes=len(shapes),
        patterns=sum(len(ps.patterns) for ps in pattern_sets),
        gangs=len(gangs),
        free_gangs=len(free_idx),
        build_s=round(build_seconds, 4),
        solve_s=round(solve_seconds, 4),
    )
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # INFEASIBLE cannot happen while the hint is feasible; UNKNOWN means no answer in
        # time. Either way the caller keeps the greedy answer (usable=False).
        return CpResult(
            status=status,
            objective=greedy_objective,
            bound=bound,
            greedy_objective=greedy_objective,
            build_seconds=build_seconds,
            solve_seconds=solve_seconds,
            usable=False,
            scale=scale,
        )
    result = CpResult(
        status=status,
        objective=scale.value(solver.value(admit_expr), solver.value(quality_expr)),
        bound=bound,
        greedy_objective=greedy_objective,
        build_seconds=build_seconds,
        solve_seconds=solve_seconds,
        scale=scale,
    )
    if bound and max(result.objective, greedy_objective) > bound:
        log.error("bound_below_objective", cycle=cycle, bound=bound, objective=result.objective)
    result.admitted = {g.request.key for i, g in enumerate(gangs) if solver.value(y[i])}
    result.node_pods = _disaggregate(
        classes, pattern_sets, z, solver, shapes, gangs, counts, result.admitted, shape_ids
    )
    return result


def _disaggregate(
    classes: Sequence[ClassInfo],
    pattern_sets: Sequence[PatternSet],
    z: Sequence[Sequence[cp_model.IntVar]],
    solver: cp_model.CpSolver,
    shapes: Sequence[Pod],
    gangs: Sequence[ModelGang],
    counts: Sequence[Counter[int]],
    admitted: set[str],
    shape_ids: Mapping[object, int],
) -> dict[str, list[Pod]]:
    """Concrete nodes per chosen pattern, and concrete pods per pattern slot."""
    queues: list[list[Pod]] = [[] for _ in shapes]
    for g in gangs:
        if g.request.key in admitted:
            for pod in g.request.required:
                queues[shape_ids[shape_key(pod)]].append(pod)
    for q in queues:
        q.reverse()  # pop() takes them in gang order
    out: dict[str, list[Pod]] = {}
    for ci, info in enumerate(classes):
        ps = pattern_sets[ci]
        members = iter(info.members)
        for pi, pattern in enumerate(ps.patterns):
            for _ in range(solver.value(z[ci][pi])):
                name = next(members)
                out[name] = [queues[s].pop() for s, k in pattern for _ in range(k)]
    return out


__all__ += ["UNITS", "pack", "work_units"]
