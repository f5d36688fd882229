"""Trace replay: pods arrive one batch per cycle onto a fixed cluster, with no departures.

Each cycle takes the pods that arrived (up to ``batch``) and places them; with
``drop_unplaced`` a pod not placed in the first cycle that sees it is dropped for good (the
FGD paper's rule). Three engines run the cycles:

- ``cycle``: the live scheduler's :func:`scheduler.cycle.run_cycle` (snapshot, fair share,
  greedy + CP-SAT, validation, commit) on the simulator's in-memory backend, with
  ``placement.scoring: fragmentation`` (:mod:`scheduler.plugins.fragmentation`). This is
  what a cluster running the scheduler with that setting would do. About 0.1-0.5 s per cycle
  on the openb cluster, so it is used for batches.
- ``greedy``: only the placement pass of that cycle (:func:`scheduler.solver.place_gangs`
  with the same scorer) on one incrementally updated state: about 2 ms per pod, so a 10k-pod
  replay with one pod per cycle takes under a minute. With one single-pod gang per cycle
  and one queue, the skipped stages have nothing to decide. One difference: its workload
  mix counts every arrival, the cycle's only the pods alive in the snapshot.
- ``arrays``: a vectorised re-implementation (numpy arrays of free CPU, memory and device
  thousandths plus cached fragmentation terms) with the same arithmetic: seconds per replay;
  a cross-check, and the only engine with the ``fgd`` baseline policy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from scheduler.cluster.node import GPU_MILLI
from scheduler.plugins.fragmentation import (
    Candidates,
    DeviceTerms,
    FragmentationScorer,
    Measure,
    MixArrays,
    TaskType,
    WorkloadMix,
    candidate_fragmentation,
    device_sums,
    fragmentation,
    refresh_due,
)
from scheduler.simulate.trace import (
    TraceError,
    TraceNode,
    TracePod,
    add_trace_arguments,
    load_trace_args,
    to_node,
    to_pod,
)

__all__ = [
    "CHECKPOINTS",
    "TRACE_QUEUE",
    "Engine",
    "Policy",
    "ReplayResult",
    "ReplaySettings",
    "TracePlacement",
    "add_trace_arguments",
    "auto_engine",
    "load_trace_args",
    "replay",
    "run_trace",
    "settings_from_args",
    "write_placements",
]

#: The queue every trace pod is in (one queue: the trace has no tenants).
TRACE_QUEUE = "trace"

Engine = Literal["arrays", "greedy", "cycle"]

#: Arrived workload (% of cluster GPU capacity) at which the allocation ratio is recorded.
CHECKPOINTS = (50, 80, 90, 100, 110, 120, 130)

Policy = Literal["frag", "fgd", "bestfit"]


@dataclass(frozen=True)
class ReplaySettings:
    """How a replay schedules.

    ``policy``: ``frag`` (ours: fragmentation increase under the ``mixed`` measure, ties
    broken towards packing), ``fgd`` (FGD's single-task measure, task-count mix, no
    tie-break: a baseline), ``bestfit`` (least GPU, then tightest device, then least CPU
    left on the node).
    """

    batch: int = 1
    drop_unplaced: bool = True
    policy: Policy = "frag"
    #: Rebuild the mix arrays (and every node's cached fragmentation) after this many arrivals
    #: or this share of the arrivals before the last rebuild, whichever is more: the mix
    #: settles as pods accumulate, and fewer rebuilds keep more cached scores (measured on
    #: openb seeds 42-44, batch 1: half the time at 0.05, allocation within +-0.03 points).
    refresh_every: int = 64
    refresh_growth: float = 0.05
    #: ``frag`` policy knobs: weigh task types by GPU request (else by count), count CPU-only
    #: types in the mix, which fragmentation measure, share of task types kept.
    gpu_weighted: bool = False
    cpu_only_in_mix: bool = True
    measure: Measure = "mixed"
    coverage: float = 1.0


@dataclass(frozen=True, slots=True)
class TracePlacement:
    """One placed pod: node name, device index -> thousandths, and the cycle it was placed in."""

    pod: str
    node: str
    gpus: tuple[tuple[int, int], ...]
    cycle: int


@dataclass
class ReplayResult:
    """What a replay did."""

    placements: list[TracePlacement]
    #: checkpoint % -> allocation ratio % (None if arrivals never reached it).
    ratios: dict[int, float | None]
    capacity_milli: int
    arrived_milli: int
    allocated_milli: int
    pods_arrived: int
    dropped: list[str] = field(default_factory=list)
    cycles: int = 0
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary."""
        cap = self.capacity_milli or 1
        return {
            "pods_arrived": self.pods_arrived,
            "pods_placed": len(self.placements),
            "pods_unplaced": len(self.dropped),
            "cycles": self.cycles,
            "arrived_pct": round(100 * self.arrived_milli / cap, 2),
            "allocated_pct": round(100 * self.allocated_milli / cap, 2),
            "allocation_ratio_at_arrived": {
                str(k): (None if v is None else round(v, 2)) for k, v in self.ratios.items()
            },
            "seconds": round(self.seconds, 2),
        }


def _task(pod: TracePod) -> TaskType:
    return TaskType(pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)


class _Cluster:
    """Free resources per node plus cached fragmentation terms for the current mix."""

    def __init__(self, nodes: Sequence[TraceNode]) -> None:
        self.names = [n.name for n in nodes]
        self.models = sorted({n.model for n in nodes if n.gpus})
        index = {m: i for i, m in enumerate(self.models)}
        self.model = np.array([index[n.model] if n.gpus else -1 for n in nodes], dtype=np.int64)
        self.cpu = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        width = max(1, max(n.gpus for n in nodes))
        self.gpu = np.zeros((len(nodes), width), dtype=np.int64)
        for i, n in enumerate(nodes):
            self.gpu[i, : n.gpus] = GPU_MILLI
        self.mix_arrays: MixArrays | None = None
        #: Nodes with equal free resources share a state id (they would score the same).
        self._ids: dict[tuple[int, ...], int] = {}
        self.state = np.array([self._state_id(i) for i in range(len(nodes))], dtype=np.int64)

    def refresh(self, mix: MixArrays) -> None:
        """Recompute every node's cached terms for a new mix."""
        self.mix_arrays = mix
        self.total = self.gpu.sum(axis=1)
        self.terms = device_sums(self.gpu, mix.thresholds)
        self.frag = fragmentation(mix, self.total, self.terms, self.cpu, self.mem, self.model)

    def update_node(self, n: int) -> None:
        """Recompute one node's cached terms after a placement."""
        mix = self.mix_arrays
        assert mix is not None
        row = self.gpu[n : n + 1]
        self.total[n] = row.sum()
        t = device_sums(row, mix.thresholds)
        self.terms.sums[n], self.terms.counts[n], self.terms.fills[n] = t.sums, t.counts, t.fills
        self.frag[n] = fragmentation(
            mix,
            self.total[n : n + 1],
            t,
            self.cpu[n : n + 1],
            self.mem[n : n + 1],
            self.model[n : n + 1],
        )[0]

    def feasible(self, pod: TracePod) -> np.ndarray:
        """Nodes where the pod fits now."""
        ok = (self.cpu >= pod.cpu_milli) & (self.mem >= pod.memory_mib)
        if pod.num_gpu:
            ok &= self.model >= 0
            if pod.gpu_spec:
                allowed = np.array([m in pod.gpu_spec for m in self.models], dtype=np.bool_)
                ok &= allowed[np.maximum(self.model, 0)]
            ok &= (self.gpu >= pod.gpu_milli).sum(axis=1) >= pod.num_gpu
        return np.asarray(ok)

    def candidates(self, pod: TracePod, nodes: np.ndarray) -> Candidates:
        """One candidate per node and distinct device value the pod could take from."""
        if pod.num_gpu == 0 or not pod.fractional:
            k = pod.num_gpu
            fill = GPU_MILLI if k else 0
            return Candidates(
                nodes,
                np.full(len(nodes), fill, dtype=np.int64),
                np.zeros(len(nodes), dtype=np.int64),
                np.full(len(nodes), k, dtype=np.int64),
            )
        sub = self.gpu[nodes]
        ok = sub >= pod.gpu_milli
        for j in range(1, sub.shape[1]):
            # Devices with equal free room are interchangeable: keep the first of each value.
            ok[:, j] &= ~(sub[:, :j] == sub[:, j : j + 1]).any(axis=1)
        rows, cols = np.nonzero(ok)
        before = sub[rows, cols]
        return Candidates(
            nodes[rows], before, before - pod.gpu_milli, np.ones(len(rows), dtype=np.int64)
        )

    def choose(
        self, pod: TracePod, settings: ReplaySettings
    ) -> tuple[int, tuple[tuple[int, int], ...]]:
        """Best node and device grant for ``pod``, or (-1, ()) if it fits nowhere."""
        nodes = np.nonzero(self.feasible(pod))[0]
        if len(nodes) == 0:
            return -1, ()
        cand = self.candidates(pod, nodes)
        # Nodes in the same state give the same score: score each distinct (state, device
        # value) once, keeping the lowest node index of each group (np.unique's first hit).
        _, first = np.unique(self.state[cand.node] * (GPU_MILLI + 1) + cand.before, True)
        cand = Candidates(cand.node[first], cand.before[first], cand.after[first], cand.mult[first])
        gpu_after = self.total[cand.node] - cand.mult * (cand.before - cand.after)
        cpu_after = self.cpu[cand.node] - pod.cpu_milli
        mem_after = self.mem[cand.node] - pod.memory_mib
        if settings.policy == "bestfit":
            keys: tuple[np.ndarray, ...] = (cand.node, cpu_after, cand.after, gpu_after)
        else:
            mix = self.mix_arrays
            assert mix is not None
            after = candidate_fragmentation(
                mix, cand, self.total, self.terms, cpu_after, mem_after, self.model
            )
            delta = np.round(after - self.frag[cand.node], 6)
            if settings.policy == "fgd":
                keys = (cand.node, delta)
            else:
                # Equal fragmentation: pack (least GPU left on the node, then the tightest
                # device, then least CPU left), so whole nodes stay free for big pods.
                keys = (cand.node, cpu_after, cand.after, gpu_after, delta)
        best = int(np.lexsort(keys)[0])
        n = int(cand.node[best])
        if pod.num_gpu == 0:
            return n, ()
        devices = np.nonzero(self.gpu[n] == cand.before[best])[0][: int(cand.mult[best])]
        return n, tuple((int(d), pod.gpu_milli) for d in devices)

    def apply(self, n: int, pod: TracePod, grant: tuple[tuple[int, int], ...]) -> None:
        """Take the pod's resources on node ``n``."""
        self.cpu[n] -= pod.cpu_milli
        self.mem[n] -= pod.memory_mib
        for d, milli in grant:
            self.gpu[n, d] -= milli
        self.update_node(n)
        self.state[n] = self._state_id(n)

    def save(self) -> tuple[np.ndarray, ...]:
        """Copies of the mutable arrays (for trying a plan and rolling it back)."""
        t = self.terms
        arrays = (self.cpu, self.mem, self.gpu, self.total, self.frag, self.state)
        return (*(a.copy() for a in arrays), t.sums.copy(), t.counts.copy(), t.fills.copy())

    def restore(self, saved: tuple[np.ndarray, ...]) -> None:
        """Go back to a :meth:`save` point."""
        self.cpu, self.mem, self.gpu, self.total, self.frag, self.state = (
            a.copy() for a in saved[:6]
        )
        self.terms = DeviceTerms(*(a.copy() for a in saved[6:]))

    def _state_id(self, n: int) -> int:
        key = (
            int(self.model[n]),
            int(self.cpu[n]),
            int(self.mem[n]),
            *sorted(self.gpu[n].tolist()),
        )
        return self._ids.setdefault(key, len(self._ids))


def _cycle_order(pods: list[TracePod]) -> list[TracePod]:
    """Biggest GPU request first (ties: model-constrained, then more CPU) - first-fit
    decreasing, so small and fractional pods fill what the big ones leave."""
    return sorted(
        pods, key=lambda p: (-p.gpu_request_milli, -p.num_gpu, not p.gpu_spec, -p.cpu_milli)
    )


Decision = tuple[TracePod, int, tuple[tuple[int, int], ...]]


def _place_in_order(
    cluster: _Cluster, pods: Sequence[TracePod], settings: ReplaySettings
) -> list[Decision]:
    out: list[Decision] = []
    for p in pods:
        n, grant = cluster.choose(p, settings)
        if n >= 0:
            cluster.apply(n, p, grant)
        out.append((p, n, grant))
    return out


def _placed_milli(decisions: Sequence[Decision]) -> int:
    return sum(p.gpu_request_milli for p, n, _ in decisions if n >= 0)


def _place_cycle(
    cluster: _Cluster, batch: Sequence[TracePod], settings: ReplaySettings
) -> list[Decision]:
    """Place one cycle's pods; leaves ``cluster`` in the chosen plan's state.

    Pods go in arrival order: the fragmentation measure assumes the next pod is drawn from
    the mix, and sorting every batch biggest-first measured worse (about -1.5 points at 100%
    arrived). Only when that plan leaves pods out does the cycle also try biggest-first
    (first-fit decreasing) and keep whichever places more GPU.
    """
    if len(batch) == 1:
        return _place_in_order(cluster, batch, settings)
    start = cluster.save()
    plan = _place_in_order(cluster, batch, settings)
    if all(n >= 0 for _, n, _ in plan):
        return plan
    first = cluster.save()
    cluster.restore(start)
    other = _place_in_order(cluster, _cycle_order(list(batch)), settings)
    if _placed_milli(other) > _placed_milli(plan):
        return other
    cluster.restore(first)
    return plan


#: One cycle's outcome per pod: node name (None = not placed) and device grant.
Outcome = tuple[TracePod, str | None, tuple[tuple[int, int], ...]]
CycleEngine = Callable[[int, list[TracePod]], list[Outcome]]


def _mix_for(settings: ReplaySettings) -> WorkloadMix:
    frag = settings.policy == "frag"
    return WorkloadMix(
        weighting="gpu" if frag and settings.gpu_weighted else "count",
        include_cpu_only=settings.cpu_only_in_mix or not frag,
        measure=settings.measure if frag else "single",
        coverage=settings.coverage,
    )


def _array_engine(nodes: Sequence[TraceNode], settings: ReplaySettings) -> CycleEngine:
    """The vectorised engine: numpy node arrays, one ``choose`` per pod."""
    cluster = _Cluster(nodes)
    mix = _mix_for(settings)
    since_refresh = 0
    seen = 0

    def place(cycle: int, batch: list[TracePod]) -> list[Outcome]:
        nonlocal since_refresh, seen
        mix.extend(_task(p) for p in batch)
        since_refresh += len(batch)
        seen += len(batch)
        due = refresh_due(
            since_refresh, seen - since_refresh, settings.refresh_every, settings.refresh_growth
        )
        if cluster.mix_arrays is None or due:
            cluster.refresh(mix.arrays(cluster.models))
            since_refresh = 0
        return [
            (p, cluster.names[n] if n >= 0 else None, grant)
            for p, n, grant in _place_cycle(cluster, batch, settings)
        ]

    return place


def _greedy_engine(nodes: Sequence[TraceNode], settings: ReplaySettings) -> CycleEngine:
    """Each cycle through the live scheduler's placement pass
    (:func:`scheduler.solver.place_gangs`) with :class:`FragmentationScorer` plugged in, on one
    :class:`~scheduler.solver.ClusterState` kept across cycles; every pod is its own gang."""
    from scheduler.cluster.snapshot import Snapshot
    from scheduler.solver import ClusterState, GangRequest, place_gangs
    from scheduler.solver.greedy import ClassIndex

    state = ClusterState.from_snapshot(Snapshot(nodes=tuple(to_node(n) for n in nodes)))
    scorer = FragmentationScorer(
        _mix_for(settings),
        sorted({n.model for n in nodes if n.gpus}),
        refresh_every=settings.refresh_every,
        refresh_growth=settings.refresh_growth,
    )
    # One index for the whole replay: between refreshes of the mix a class keeps its score,
    # so a cycle re-ranks only the classes the previous one changed.
    index = ClassIndex(state, scorer)

    def place(cycle: int, batch: list[TracePod]) -> list[Outcome]:
        scorer.mix.extend(_task(p) for p in batch)
        if scorer.refresh():
            index.forget_scores()
        domain = {p.name: to_pod(p) for p in batch}
        gangs = [GangRequest(d.gang, d.queue, required=(d,)) for d in domain.values()]
        result = place_gangs(state, gangs, scorer, cycle=cycle, index=index)
        done = {a.pod_uid: a for a in result.assignments}
        return [
            (p, done[p.name].node, done[p.name].gpu_grant) if p.name in done else (p, None, ())
            for p in batch
        ]

    return place


def _cycle_engine(nodes: Sequence[TraceNode], settings: ReplaySettings) -> CycleEngine:
    """Each cycle is the live :func:`scheduler.cycle.run_cycle` (snapshot, fair share, greedy
    and CP-SAT, validation, commit) on the simulator's in-memory backend, with
    ``placement.scoring: fragmentation`` (policy ``frag``) or binpack (policy ``bestfit``).

    A pod left pending is marked failed at once: nothing departs, so free capacity only
    shrinks and it could not fit later either; keeping it would only slow the next cycles.
    """
    import asyncio

    from scheduler.cluster.gang import Gang
    from scheduler.cluster.queue import Queue
    from scheduler.cycle import run_cycle
    from scheduler.simulate.backend import SimulatedCluster
    from scheduler.solver.placement import PlacementSettings

    cluster = SimulatedCluster([to_node(n) for n in nodes], [Queue(TRACE_QUEUE)])
    placement = PlacementSettings(
        scoring="packing" if settings.policy == "bestfit" else "fragmentation"
    )

    def place(cycle: int, batch: list[TracePod]) -> list[Outcome]:
        domain = [to_pod(p, queue=TRACE_QUEUE) for p in batch]
        # Creation time = arrival sequence, so the cycle takes them oldest first, as it
        # would pods created one after another in a real cluster.
        first = cycle * settings.batch
        cluster.add_pods(
            domain,
            [
                Gang(d.namespace, d.name, queue=TRACE_QUEUE, implicit=True, creation_time=first + i)
                for i, d in enumerate(domain)
            ],
        )
        asyncio.run(run_cycle(cluster, placement, cycle))
        out: list[Outcome] = []
        for p, d in zip(batch, domain, strict=True):
            pod = cluster.pods[d.uid].pod
            if pod.node_name is not None:
                out.append((p, pod.node_name, pod.gpu_grant))
                continue
            cluster.fail_pod(d.uid)
            out.append((p, None, ()))
        return out

    return place


def replay(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    settings: ReplaySettings,
    *,
    engine: Engine = "arrays",
    progress: Callable[[float, float], None] | None = None,
) -> ReplayResult:
    """Replay ``pods`` (in arrival order) onto ``nodes``; see the module docstring for the
    engines (``greedy`` supports the ``frag`` policy only, ``cycle`` ``frag`` and ``bestfit``).
    """
    if settings.batch < 1:
        raise ValueError(f"--batch is {settings.batch}; it must be at least 1")
    supported = {"greedy": ("frag",), "cycle": ("frag", "bestfit")}.get(engine)
    if supported is not None and settings.policy not in supported:
        raise ValueError(f"--engine {engine} supports --policy {' or '.join(supported)} only")
    start = time.perf_counter()
    engines = {"arrays": _array_engine, "greedy": _greedy_engine, "cycle": _cycle_engine}
    place = engines[engine](nodes, settings)
    capacity = sum(n.gpus for n in nodes) * GPU_MILLI
    placements: list[TracePlacement] = []
    ratios: dict[int, float | None] = dict.fromkeys(CHECKPOINTS)
    pending: list[str] = []
    dropped: list[str] = []
    arrived = allocated = 0
    cycle = 0
    for cycle, batch in enumerate(_batches(pods, settings.batch)):
        crossed: list[int] = []
        for p in batch:
            arrived += p.gpu_request_milli
            crossed += [
                c
                for c in CHECKPOINTS
                if ratios[c] is None and c not in crossed and arrived * 100 >= c * capacity
            ]
        # Pods left waiting from earlier cycles are not retried: nothing ever departs, so free
        # capacity only shrinks and a pod that did not fit then cannot fit now.
        for p, node, grant in place(cycle, batch):
            if node is None:
                (dropped if settings.drop_unplaced else pending).append(p.name)
                continue
            allocated += p.gpu_request_milli
            placements.append(TracePlacement(p.name, node, grant, cycle))
        for c in crossed:
            ratios[c] = 100 * allocated / capacity if capacity else 0.0
        if progress is not None:
            progress(min(len(pods), (cycle + 1) * settings.batch), len(pods))
    return ReplayResult(
        placements=placements,
        ratios=ratios,
        capacity_milli=capacity,
        arrived_milli=arrived,
        allocated_milli=allocated,
        pods_arrived=len(pods),
        dropped=dropped + pending,
        cycles=cycle + 1 if pods else 0,
        seconds=time.perf_counter() - start,
    )


def auto_engine(batch: int, policy: str) -> Engine:
    """The engine ``--engine auto`` picks: the live cycle for batches (each cycle costs
    tenths of a second on the openb cluster); for one pod per cycle (10k full cycles would
    take most of an hour) the live greedy for ``frag`` and the vectorised replay for the
    baselines (``fgd`` exists only there)."""
    if policy == "fgd" or (batch == 1 and policy != "frag"):
        return "arrays"
    return "cycle" if batch > 1 else "greedy"


def _batches(pods: Sequence[TracePod], size: int) -> Iterator[list[TracePod]]:
    for i in range(0, len(pods), size):
        yield list(pods[i : i + size])


def write_placements(path: str | Path, placements: Sequence[TracePlacement]) -> None:
    """One JSON object per placed pod: ``{"pod", "node", "gpus": {"<index>": milli}, "cycle"}``."""
    with Path(path).open("w") as f:
        for pl in placements:
            gpus = {str(d): m for d, m in pl.gpus}
            f.write(
                json.dumps({"pod": pl.pod, "node": pl.node, "gpus": gpus, "cycle": pl.cycle}) + "\n"
            )


# --- command line (``kai-scheduler simulate --trace openb``; flags: trace.add_trace_arguments)


def settings_from_args(args: argparse.Namespace) -> ReplaySettings:
    """ReplaySettings from parsed flags."""
    return ReplaySettings(
        batch=args.batch, drop_unplaced=bool(args.drop_unplaced), policy=args.policy
    )


def _quiet_logs() -> None:
    """The greedy logs every unplaced gang at debug level; keep stdout for the summary."""
    import logging

    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def run_trace(
    args: argparse.Namespace, progress: Callable[[float, float], None] | None = None
) -> int:
    """Run a trace replay from parsed flags; prints a table (or JSON). Exit code 0/2.
    ``progress(pods done, pods)`` is called after every cycle."""
    try:
        nodes, pods = load_trace_args(args)
    except TraceError as e:
        print(f"kai-scheduler simulate: {e}", file=sys.stderr)
        return 2
    engine = auto_engine(args.batch, args.policy) if args.engine == "auto" else args.engine
    if engine != "arrays":
        _quiet_logs()
    try:
        result = replay(nodes, pods, settings_from_args(args), engine=engine, progress=progress)
    except ValueError as e:
        print(f"kai-scheduler simulate: {e}", file=sys.stderr)
        return 2
    if args.placements:
        try:
            write_placements(args.placements, result.placements)
        except OSError as e:
            print(f"kai-scheduler simulate: --placements {args.placements}: {e}", file=sys.stderr)
            return 2
    summary = result.summary()
    summary.update(
        policy=args.policy,
        engine=engine,
        batch=args.batch,
        drop_unplaced=bool(args.drop_unplaced),
    )
    if getattr(args, "json", False):
        print(json.dumps(summary))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"openb replay ({args.policy}, batch {args.batch}, engine {engine})")
    table.add_column("arrived % of GPU capacity", justify="right")
    table.add_column("GPU allocation ratio %", justify="right")
    for k, v in summary["allocation_ratio_at_arrived"].items():
        table.add_row(k, "-" if v is None else f"{v:.2f}")
    console = Console()
    console.print(table)
    console.print(
        f"pods arrived {summary['pods_arrived']}, placed {summary['pods_placed']}, "
        f"unplaced {summary['pods_unplaced']}; {summary['seconds']} s"
    )
    return 0
