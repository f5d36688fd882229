"""An upper bound on admission that holds for every valid placement (not just the model's).

The CP-SAT stage model (:mod:`.cpsat`) only offers each node class a capped list of patterns,
so the bound CP-SAT proves for it does not cover placements that need a pattern left out.
This module solves a *relaxation* of the real problem instead, and its bound is what
:attr:`~scheduler.solver.Placement.best_bound` reports.

The relaxation R (every valid placement maps to a feasible point of R with the same
admission value, so max R >= max over valid placements, and CP-SAT's best bound for R >=
max R):

- gangs of one *kind* (queue, preemptibility, fixed or not, same pods) are interchangeable:
  ``x[kind]`` in 0..count (fixed kinds: all of them), so y of single gangs is summed;
- ``n[s, t]`` pods of shape ``s`` on nodes with static traits ``t`` (taints, labels,
  allocatable, GPU model): pods of all admitted gangs land somewhere, so
  ``sum_t n[s, t] = sum_kind pods_s(kind) * x[kind]``, and ``n[s, t] = 0`` where the traits
  reject the pod;
- capacities are *summed* over the nodes of ``t`` - each row is the sum over nodes of an
  inequality every single node satisfies in any valid placement:

  * every resource ``r``: ``sum_s req[s, r] * n[s, t] <= sum_nodes free_r``;
  * thousandths: ``sum_s devices_s * milli_s * n[s, t] <= sum_nodes free thousandths``;
  * whole devices, for each device count ``k`` of a whole-GPU shape: pods whose device
    count is a multiple of ``k`` take, on one node, a multiple of ``k`` of its wholly free
    devices ``w``, so at most ``k * floor(w / k)``;
  * per shape alone: ``n[s, t] <= sum_nodes most_s(node)``, where ``most_s`` bounds how
    many pods of ``s`` one node can hold: ``floor(free_r / req_r)`` for every resource, and
    ``floor(slots / k)`` for a pod on ``k`` devices, with ``slots`` the wholly free devices
    (whole GPUs) or ``sum_d floor(free_d / share)`` (shares);

- queue limits (every level) and non-preemptible quota rows, and the fair-share terms
  ``f[q, r] <= room``, ``f[q, r] <= admitted work``, exactly as in the stage model.

Objective: ``K_F * sum f + sum work * x`` - the stage model's admission value. It ignores
placement quality; :func:`scheduler.solver.cpsat.optimize` adds a quality allowance that
bounds any quality change (node cost never drops below zero).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import QueueTree
from scheduler.fairness import FairShareReport
from scheduler.framework.filters import node_rules_allow
from scheduler.solver.greedy import shape_key
from scheduler.solver.patterns import ClassInfo, Demand, demand_of
from scheduler.solver.rows import ModelGang, fair_rooms, queue_rows

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

__all__ = ["Relaxation", "admission_bound"]

log = structlog.get_logger(__name__)


@dataclass
class _Caps:
    """Summed capacity rows of the nodes with one set of static traits."""

    resources: Counter[str] = field(default_factory=Counter)
    milli: int = 0
    #: device count k -> sum over nodes of k * floor(wholly free devices / k)
    whole: Counter[int] = field(default_factory=Counter)
    #: shape -> sum over nodes of how many fit alone
    most: Counter[int] = field(default_factory=Counter)
    #: shape -> its demand on these nodes (None: rejected or cannot be sized)
    demand: dict[int, Demand | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Relaxation:
    """R solved: a bound of admission, and the free gangs R's best answer admits (which
    may not fit together for real - R ignores how pods share single nodes)."""

    bound: int
    admitted: list[str]


def _most(free: Mapping[str, int], gpu_free: Sequence[int], d: Demand) -> int:
    """At most how many pods of one demand fit a node when nothing else is added."""
    requests, count, milli = d
    most = min((max(0, free.get(r, 0)) // v for r, v in requests if v > 0), default=10**9)
    if count:
        if milli >= GPU_MILLI:
            slots = sum(1 for f in gpu_free if f >= GPU_MILLI)
        else:
            slots = sum(max(0, f) // milli for f in gpu_free) if milli > 0 else 10**9
        most = min(most, slots // count)
    return most


def _capacity(classes: Sequence[ClassInfo], shapes: Sequence[Pod]) -> dict[int, _Caps]:
    """Per static traits id: summed capacity rows (see the module docstring)."""
    out: dict[int, _Caps] = {}
    for info in classes:
        caps = out.get(info.key[0])
        if caps is None:
            caps = out[info.key[0]] = _Caps()
            for s, pod in enumerate(shapes):
                ok = node_rules_allow(pod, info.node)
                caps.demand[s] = demand_of(pod, info.node) if ok else None
    for caps in out.values():
        for d in caps.demand.values():
            if d is not None and d[1] and d[2] >= GPU_MILLI:
                caps.whole[d[1]] = 0
        caps.whole[1] = 0
    # _most depends only on the free state and the demand: classes that differ only in
    # their static traits (every node its own class, once pods select by hostname) share it.
    known: dict[tuple[Demand, object, object], int] = {}
    for info in classes:
        n = len(info.members)
        caps = out[info.key[0]]
        free, gpu_free = info.free, info.gpu_free
        free_key, gpu_key = info.key[1], info.key[2]  # the same free state, hashable
        for r, v in free.items():
            caps.resources[r] += n * max(0, v)
        caps.milli += n * sum(max(0, f) for f in gpu_free)
        wholly = sum(1 for f in gpu_free if f >= GPU_MILLI)
        for k in caps.whole:
            caps.whole[k] += n * k * (wholly // k)
        for s, d in caps.demand.items():
            if d is not None:
                most = known.get((d, free_key, gpu_key))
                if most is None:
                    most = known[d, free_key, gpu_key] = _most(free, gpu_free, d)
                caps.most[s] += n * most
    return out


def admission_bound(
    *,
    classes: Sequence[ClassInfo],
    gangs: Sequence[ModelGang],
    tree: QueueTree,
    report: FairShareReport,
    charged: Mapping[str, Mapping[str, int]],
    fair_weight: int,
    pinned: Mapping[str, Mapping[str, int]] | None = None,
    time_limit: float,
    workers: int,
    cycle: int | None = None,
) -> Relaxation | None:
    """Upper bound of ``fair_weight * sum f + sum work * y`` over every valid placement of
    ``gangs`` on the nodes of ``classes`` (exact, unmerged classes: all placeable nodes),
    and R's best answer (which free gangs to admit; the earliest gangs of each kind).

    None when CP-SAT found R infeasible or proved nothing in time (then no bound is known).
    """
    # Deferred: OR-Tools (with pandas) is the largest import of the process; the
    # scheduler's start and the CLI should not wait for it (see scheduler.runner.warm_up).
    from ortools.sat.python import cp_model

    by_key: dict[object, Pod] = {}
    for g in gangs:
        for pod in g.request.required:
            by_key.setdefault(shape_key(pod), pod)
    shapes = list(by_key.values())
    shape_ids = {k: i for i, k in enumerate(by_key)}
    kinds: dict[tuple[object, ...], list[int]] = {}
    counts: list[Counter[int]] = []
    for i, g in enumerate(gangs):
        c = Counter(shape_ids[shape_key(p)] for p in g.request.required)
        counts.append(c)
        kind = (g.request.queue, g.request.preemptible, g.fixed, tuple(sorted(c.items())))
        kinds.setdefault(kind, []).append(i)
    demand = [0] * len(shapes)
    for c in counts:
        for s, k in c.items():
            demand[s] += k

    model = cp_model.CpModel()
    x: dict[int, cp_model.IntVar] = {}  # first gang index of a kind -> admitted count
    of_kind: dict[int, int] = {}
    for members in kinds.values():
        first = members[0]
        for i in members:
            of_kind[i] = first
        if gangs[first].fixed:
            x[first] = model.new_constant(len(members))
        else:
            x[first] = model.new_int_var(0, len(members), f"x{first}")

    placed: list[list[cp_model.IntVar]] = [[] for _ in shapes]
    for sid, caps in _capacity(classes, shapes).items():
        resources: dict[str, list[tuple[int, cp_model.IntVar]]] = {}
        milli: list[tuple[int, cp_model.IntVar]] = []
        whole: dict[int, list[tuple[int, cp_model.IntVar]]] = {}
        for s, most in caps.most.items():
            d = caps.demand[s]
            if most <= 0 or d is None:
                continue
            var = model.new_int_var(0, min(most, demand[s]), f"n{sid}_{s}")
            placed[s].append(var)
            requests, count, share = d
            for r, v in requests:
                if v > 0:
                    resources.setdefault(r, []).append((v, var))
            if count:
                milli.append((count * share, var))
            if count and share >= GPU_MILLI:
                for k in caps.whole:
                    if count % k == 0:
                        whole.setdefault(k, []).append((count, var))
        for r, terms in resources.items():
            model.add(sum(a * v for a, v in terms) <= caps.resources[r])
        if milli:
            model.add(sum(a * v for a, v in milli) <= caps.milli)
        for k, terms in whole.items():
            model.add(sum(a * v for a, v in terms) <= caps.whole[k])
    for s in range(len(shapes)):
        per_kind = {of_kind[i]: c[s] for i, c in enumerate(counts) if c.get(s)}
        model.add(sum(placed[s]) == sum(k * x[first] for first, k in per_kind.items()))

    for _, row_terms, cap in queue_rows(gangs, tree, report, charged, pinned):
        model.add(sum(a * x[i] for i, a in _by_kind(row_terms, of_kind)) <= max(0, cap))
    fair: list[cp_model.IntVar] = []
    for (q, r), room in fair_rooms(gangs, report, charged).items():
        units = _by_kind(
            [
                (i, g.units[r])
                for i, g in enumerate(gangs)
                if g.request.queue == q and not g.fixed and g.units[r] > 0
            ],
            of_kind,
        )
        if not units:
            continue
        f = model.new_int_var(0, room, f"f_{q}_{r}")
        model.add(f <= sum(a * x[i] for i, a in units))
        fair.append(f)
    firsts = sorted({of_kind[i] for i, g in enumerate(gangs) if not g.fixed})
    model.maximize(fair_weight * sum(fair) + sum(gangs[i].work * x[i] for i in firsts))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit)
    solver.parameters.num_workers = max(1, workers)
    code = solver.solve(model)
    log.debug("bound_done", cycle=cycle, status=solver.status_name(code), kinds=len(kinds))
    if code in (cp_model.INFEASIBLE, cp_model.MODEL_INVALID):
        log.error("bound_relaxation_infeasible", cycle=cycle, status=solver.status_name(code))
        return None
    if code == cp_model.UNKNOWN and not math.isfinite(solver.best_objective_bound):
        return None
    admitted: list[str] = []
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        for members in kinds.values():
            if not gangs[members[0]].fixed:
                take = solver.value(x[members[0]])
                admitted += [gangs[i].request.key for i in members[:take]]
    return Relaxation(math.ceil(solver.best_objective_bound - 1e-6), admitted)


def _by_kind(terms: Sequence[tuple[int, int]], of_kind: Mapping[int, int]) -> list[tuple[int, int]]:
    """(gang index, amount) terms -> (kind's first index, amount): gangs of a kind are equal."""
    out: dict[int, int] = {}
    for i, a in terms:
        out[of_kind[i]] = a
    return list(out.items())
