"""A linear-programming ceiling on GPU allocation for a trace replay, any scheduler.

:func:`scheduler.bench.openb.share_gap_bound` reasons about the whole cluster as one pool of
devices. This bound keeps the cluster's node *shapes* apart (GPU model, devices, CPU,
memory: 15 shapes on the openb GPU node list), so it also sees that a pod pinned to a
model can only use that model's capacity, that CPU and memory beside the GPUs run out, and
that a multi-GPU pod needs a node with that many devices.

Variables ``n[t, h]`` (continuous, >= 0): pods of type ``t`` (CPU, memory, devices,
thousandths per device, allowed models) placed on nodes of shape ``h``; the objective is the
GPU thousandths they ask. Why it is a true upper bound: take any valid placement of a subset
of ``pods`` (any scheduler, any order, nothing departs) and set ``n[t, h]`` to the number of
its pods of type ``t`` on nodes of shape ``h``. That point satisfies every row below, because
each row is an inequality that every single node (or device) of ``h`` satisfies, summed over
the ``count`` nodes of ``h``; so the LP optimum is at least the placement's thousandths:

- count: ``sum_h n[t, h] <= count(t)`` (a pod is placed at most once);
- fit: ``n[t, h] = 0`` where one pod of ``t`` does not fit an empty node of ``h`` (model not
  in its allowed set, fewer devices, CPU or memory than it asks);
- per type alone: ``n[t, h] <= count(h) x`` the most pods of ``t`` one empty node of ``h``
  holds by CPU, by memory, or by device slots (whole numbers of pods per node);
- CPU, memory, GPU thousandths of ``h``: what the pods on a node ask is at most what it has;
- stranded room: a device hosting a pod of share ``s > 500`` can hold besides it only pods
  of at most ``1000 - s`` (two shares above 500 never fit one device). For each threshold
  ``s_min`` (a share above 500 seen on ``h``) and ``g = 1000 - s_min``, every device ``d``
  satisfies ``used(d) + (1000 - s) [d holds a pod of share s >= s_min] - small(d) <= 1000``,
  where ``small(d)`` is what pods of at most ``g`` thousandths per device take on ``d``: with
  such a pod, everything else on ``d`` is small, so the left side is exactly 1000; without,
  it is at most ``used(d) <= 1000``. Summing over devices: thousandths on ``h`` <= ``C_h -
  sum (1000 - s) n[s, h] + sum small thousandths``.
- device patterns: a *pattern* is a multiset of shares that fits one device (at most 1000
  thousandths) and cannot take one more share of any size allowed on ``h``. ``y[p, h] >= 0``
  counts devices of ``h`` filled like ``p``, with ``sum_p y[p, h] <=`` the devices of ``h``,
  plus one variable for devices given whole to pods. For each share size ``s``:
  ``sum_t n[t, h] (devices of t at s) <= sum_p y[p, h] (copies of s in p)``, and the whole
  devices cover what whole-GPU pods ask. Any placement fills each device with a multiset that
  some pattern contains (add shares until none fits), so it satisfies these rows too. They
  see what the gap rows cannot: two 470s on a device leave 60 that no share of the trace
  uses, so the LP pairs shares the way the sizes allow, the bin-packing ceiling. Shapes that
  allow the same share sizes get one set of these rows, the sum of theirs (still valid, and
  a much smaller model: two sets on openb). Patterns are enumerated per set of sizes (about
  1,400 for the openb trace's 20 share sizes); a set that would need more than
  :data:`MAX_PATTERNS` (or :data:`MAX_VISITS` to find them) goes without these rows (a looser,
  still valid bound).

The LP optimum (GLOP) is returned as % of GPU capacity. CPU-only pods place no GPU and only
take CPU and memory, so leaving them out relaxes the rows (the LP may also drop any pod, as
``--drop-unplaced`` may).

With ``placed`` (a subset of ``pods``, e.g. the pods arriving before 90 % of capacity) the
count rows also ask ``sum_h n[t, h] >= `` the number of ``placed`` pods of type ``t``: a
ceiling for any scheduler that places all of them; ``None`` when no placement can (the LP is
infeasible), so the condition is not met by anyone and bounds nothing.

Without ``placed``, at 130 % arrived enough pods have arrived to fill every shape and the
LP says 100 %: the ceiling that bites there is the one with ``placed``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.cluster.node import GPU_MILLI
from scheduler.simulate.trace import TraceNode, TracePod, gpu_capacity_milli

if TYPE_CHECKING:
    from ortools.linear_solver import pywraplp

__all__ = [
    "MAX_PATTERNS",
    "MAX_VISITS",
    "NodeShape",
    "arrived_prefix",
    "ceilings_at",
    "device_patterns",
    "lp_bound",
    "node_shapes",
]

#: Device patterns enumerated per set of share sizes before the pattern rows are left out.
MAX_PATTERNS = 20_000
#: Ways of filling a device looked at (full or not) before the same: many small sizes (a
#: trace asking 10, 20, 30, ... thousandths) have millions of them.
MAX_VISITS = 1_000_000


@dataclass(frozen=True, slots=True)
class NodeShape:
    """Nodes that are interchangeable for the bound, and how many there are."""

    model: str
    gpus: int
    cpu_milli: int
    memory_mib: int
    count: int


def node_shapes(nodes: Sequence[TraceNode]) -> list[NodeShape]:
    """GPU nodes grouped by (model, devices, CPU, memory)."""
    c = Counter((n.model, n.gpus, n.cpu_milli, n.memory_mib) for n in nodes if n.gpus)
    return [NodeShape(m, g, cpu, mem, k) for (m, g, cpu, mem), k in sorted(c.items())]


def _fits(p: TracePod, h: NodeShape) -> bool:
    if p.gpu_spec and h.model not in p.gpu_spec:
        return False
    return p.num_gpu <= h.gpus and p.cpu_milli <= h.cpu_milli and p.memory_mib <= h.memory_mib


def _most(p: TracePod, h: NodeShape) -> int:
    """How many pods like ``p`` one empty node of ``h`` holds at most (each resource alone)."""
    # Device slots: a device holds 1000 // milli pods' shares; a pod needs num_gpu of them on
    # distinct devices (the loader makes multi-GPU pods whole, so 1 slot per device there).
    most = (h.gpus * (GPU_MILLI // p.gpu_milli)) // p.num_gpu
    if p.cpu_milli:
        most = min(most, h.cpu_milli // p.cpu_milli)
    if p.memory_mib:
        most = min(most, h.memory_mib // p.memory_mib)
    return most


def device_patterns(sizes: Sequence[tuple[int, int]]) -> list[tuple[int, ...]] | None:
    """Every way to fill one device with shares that leaves no room for another: ``sizes``
    are (thousandths, most copies there are) pairs; each pattern gives the copies of each
    size, in that order. None when there are more than :data:`MAX_PATTERNS`, or more than
    :data:`MAX_VISITS` ways to look at."""
    out: list[tuple[int, ...]] = []
    counts = [0] * len(sizes)
    visits = 0

    def fill(i: int, room: int) -> bool:
        nonlocal visits
        if i == len(sizes):
            visits += 1
            if visits > MAX_VISITS:
                return False
            if any(c < cap and s <= room for (s, cap), c in zip(sizes, counts, strict=True)):
                return True  # not full: a larger pattern holds it
            out.append(tuple(counts))
            return len(out) <= MAX_PATTERNS
        s, cap = sizes[i]
        for c in range(min(cap, room // s), -1, -1):
            counts[i] = c
            if not fill(i + 1, room - c * s):
                return False
        counts[i] = 0
        return True

    return out if fill(0, GPU_MILLI) else None


def arrived_prefix(pods: Sequence[TracePod], milli: float, batch: int) -> int:
    """Pods arrived by the end of the cycle (``batch`` pods each) in which arrivals (GPU
    thousandths asked, in order) reach ``milli``; all of them if they never do."""
    arrived = 0
    for i, p in enumerate(pods):
        arrived += p.gpu_request_milli
        if arrived >= milli:
            return -(-(i + 1) // batch) * batch
    return len(pods)


def ceilings_at(
    pods: Sequence[TracePod], nodes: Sequence[TraceNode], percents: Iterable[int], batch: int
) -> dict[str, float]:
    """:func:`lp_bound` of the pods arrived (in order) by each checkpoint of ``percents`` (%
    of GPU capacity asked, taken at the end of the crossing cycle as a replay measures it),
    rounded to hundredths; a checkpoint the arrivals never reach is left out. A ceiling for
    any scheduler that places pods of the trace and never removes one."""
    capacity = gpu_capacity_milli(nodes)
    total = sum(p.gpu_request_milli for p in pods)
    out: dict[str, float] = {}
    for pct in percents:
        if not capacity or total * 100 < pct * capacity:
            continue
        bound = lp_bound(pods[: arrived_prefix(pods, capacity * pct / 100, batch)], nodes)
        if bound is not None:
            out[str(pct)] = round(bound, 2)
    return out


def _type(p: TracePod) -> tuple[int, int, int, int, tuple[str, ...]]:
    return (p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec)


def lp_bound(
    pods: Sequence[TracePod],
    nodes: Sequence[TraceNode],
    placed: Sequence[TracePod] = (),
) -> float | None:
    """Upper bound (% of GPU capacity) on the GPU thousandths any scheduler can place from
    ``pods`` on ``nodes`` (nothing departs), for one that places every pod of ``placed`` if
    given (``None``: none can); see the module docstring."""
    from ortools.linear_solver import pywraplp

    shapes = node_shapes(nodes)
    capacity = sum(h.gpus * h.count for h in shapes) * GPU_MILLI
    if not capacity:
        return 0.0
    types = Counter(_type(p) for p in pods if p.num_gpu and p.gpu_request_milli)
    must = Counter(_type(p) for p in placed if p.num_gpu and p.gpu_request_milli)
    for t, k in must.items():  # ``placed`` belongs to ``pods``; be safe if it does not
        types[t] = max(types[t], k)
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:  # pragma: no cover - GLOP ships with OR-Tools
        raise RuntimeError("OR-Tools GLOP is not available")
    # per shape: (variable, type) pairs of what may go there
    on: list[list[tuple[pywraplp.Variable, tuple[int, int, int, int, tuple[str, ...]]]]] = [
        [] for _ in shapes
    ]
    objective = solver.Objective()
    for ti, (t, count) in enumerate(types.items()):
        cpu, mem, k, milli, spec = t
        probe = TracePod(
            name="", cpu_milli=cpu, memory_mib=mem, num_gpu=k, gpu_milli=milli, gpu_spec=spec
        )
        row = solver.Constraint(min(must.get(t, 0), count), count, f"count{ti}")
        for hi, h in enumerate(shapes):
            if not _fits(probe, h):
                continue
            v = solver.NumVar(0, min(count, h.count * _most(probe, h)), f"n{ti}_{hi}")
            row.SetCoefficient(v, 1)
            objective.SetCoefficient(v, k * milli)
            on[hi].append((v, t))
    objective.SetMaximization()
    for hi, h in enumerate(shapes):
        if not on[hi]:
            continue
        gpu_cap = h.gpus * h.count * GPU_MILLI
        cpu_row = solver.Constraint(0, h.cpu_milli * h.count, f"cpu{hi}")
        mem_row = solver.Constraint(0, h.memory_mib * h.count, f"mem{hi}")
        gpu_row = solver.Constraint(0, gpu_cap, f"gpu{hi}")
        for v, t in on[hi]:
            cpu_row.SetCoefficient(v, t[0])
            mem_row.SetCoefficient(v, t[1])
            gpu_row.SetCoefficient(v, t[2] * t[3])
        shares = sorted({t[3] for _, t in on[hi] if t[2] == 1 and t[3] > GPU_MILLI // 2})
        for s_min in shares:
            gap = GPU_MILLI - s_min  # threshold g: pods of at most g fill the leftovers
            row = solver.Constraint(-solver.infinity(), gpu_cap, f"gap{hi}_{s_min}")
            for v, t in on[hi]:
                coef = t[2] * t[3]
                if t[2] == 1 and t[3] >= s_min:
                    coef += GPU_MILLI - t[3]
                if t[3] <= gap:  # small: fills leftovers (on each of its devices)
                    coef -= t[2] * t[3]
                row.SetCoefficient(v, coef)
    # Pattern rows per set of share sizes, over the shapes that allow that set: the sum of
    # each shape's rows, so still valid, and the model stays small (2 sets on openb, where
    # one set of rows per shape took 0.5 s to build and gave the same ceiling).
    groups: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for hi, pairs in enumerate(on):
        if pairs:
            groups.setdefault(_sizes(pairs, types), []).append(hi)
    for sizes, members in groups.items():
        _pattern_rows(
            solver,
            [pair for hi in members for pair in on[hi]],
            sizes,
            sum(shapes[hi].gpus * shapes[hi].count for hi in members),
        )
    status = solver.Solve()
    if status == pywraplp.Solver.INFEASIBLE and must:
        return None
    if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        raise RuntimeError(f"LP bound: GLOP status {status}")
    # GLOP's optimum is a float; the dual bound equals it at OPTIMAL. Round up a hair so the
    # printed ceiling never sits below an achieved value through floating-point noise.
    best = float(objective.Value())
    return 100 * min(capacity, best + 1e-6 * capacity) / capacity


_Type = tuple[int, int, int, int, tuple[str, ...]]


def _sizes(
    on: list[tuple[pywraplp.Variable, _Type]], types: Counter[_Type]
) -> tuple[tuple[int, int], ...]:
    """The (thousandths, most devices asking them) of the shares in ``on``, largest first."""
    caps: Counter[int] = Counter()
    for _, t in on:
        if t[3] < GPU_MILLI:
            caps[t[3]] += t[2] * types[t]
    return tuple(sorted(caps.items(), reverse=True))


def _pattern_rows(
    solver: pywraplp.Solver,
    on: list[tuple[pywraplp.Variable, _Type]],
    sizes: tuple[tuple[int, int], ...],
    devices: int,
) -> None:
    """The device-pattern rows (see the module docstring) of shapes with ``devices`` devices
    in all; ``on``: their (variable, type) pairs; ``sizes``: :func:`_sizes` of them."""
    found = device_patterns(sizes)
    if found is None:
        return
    inf = solver.infinity()
    count_row = solver.Constraint(0, devices)
    whole = solver.NumVar(0, devices, "")
    count_row.SetCoefficient(whole, 1)
    whole_row = solver.Constraint(-inf, 0)
    whole_row.SetCoefficient(whole, -1)
    size_rows = {s: solver.Constraint(-inf, 0) for s, _ in sizes}
    for v, t in on:
        row = whole_row if t[3] >= GPU_MILLI else size_rows[t[3]]
        row.SetCoefficient(v, t[2])
    for pattern in found:
        y = solver.NumVar(0, devices, "")
        count_row.SetCoefficient(y, 1)
        for (s, _), c in zip(sizes, pattern, strict=True):
            if c:
                size_rows[s].SetCoefficient(y, -c)
