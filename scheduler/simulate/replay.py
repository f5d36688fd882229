"""Trace replay: pods arrive one batch per cycle onto a fixed cluster, with no departures.

The engine keeps a compact incremental node state (numpy arrays of free CPU, memory and per
device GPU thousandths, plus the per-node fragmentation terms) instead of building a Snapshot
per pod, so a 10k-pod replay runs in seconds. Each cycle takes the pods that arrived (up to
``batch``), orders them biggest first, and places each where the fragmentation-aware score of
:mod:`scheduler.plugins.fragmentation` is lowest. With ``drop_unplaced`` a pod not placed in
the first cycle that sees it is dropped for good (the FGD paper's rule).

The GPU allocation ratio (allocated GPU thousandths as % of the cluster's) is recorded at
the end of the cycle in which the arrived workload (cumulative GPU request of arrived pods,
dropped ones included) first reaches each checkpoint.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from scheduler.cluster.node import GPU_MILLI
from scheduler.plugins.fragmentation import (
    Candidates,
    Measure,
    MixArrays,
    TaskType,
    WorkloadMix,
    candidate_fragmentation,
    device_sums,
    fragmentation,
)
from scheduler.simulate.trace import TraceNode, TracePod

__all__ = [
    "CHECKPOINTS",
    "Policy",
    "ReplayResult",
    "ReplaySettings",
    "TracePlacement",
    "replay",
    "write_placements",
]

#: Arrived workload (% of cluster GPU capacity) at which the allocation ratio is recorded.
CHECKPOINTS = (50, 80, 90, 100, 110, 120, 130)

Policy = Literal["frag", "fgd", "bestfit"]


@dataclass(frozen=True)
class ReplaySettings:
    """How a replay schedules.

    ``policy``: ``frag`` (fragmentation increase, GPU-weighted mix, packing tie-breaks: ours),
    ``fgd`` (fragmentation increase with a task-count mix, as the paper), ``bestfit``
    (least GPU then CPU left on the node).
    """

    batch: int = 1
    drop_unplaced: bool = True
    policy: Policy = "frag"
    #: Rebuild the mix arrays (and every node's cached fragmentation) after this many arrivals.
    refresh_every: int = 64
    #: ``frag`` policy knobs: weigh task types by GPU request (else by count), count CPU-only
    #: types in the mix, break fragmentation ties by packing.
    gpu_weighted: bool = True
    cpu_only_in_mix: bool = True
    pack_ties: bool = True
    measure: Measure = "fill"


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
            if settings.policy == "fgd" or not settings.pack_ties:
                keys = (cand.node, delta)
            else:
                # Equal fragmentation: pack (least GPU left on the node, then the tightest
                # device, then least CPU left), so whole nodes stay free for big pods.
                import os

                q = float(os.environ.get("KQ", "1e-6"))
                lam = float(os.environ.get("KL", "0"))
                d2 = np.round((delta + lam * gpu_after) / q) * q
                order = os.environ.get("KO", "cag")
                m = {"c": cpu_after, "a": cand.after, "g": gpu_after}
                keys = (cand.node, *[m[ch] for ch in order], d2)
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


def _cycle_order(pods: list[TracePod]) -> list[TracePod]:
    """Biggest GPU request first (ties: model-constrained, then more CPU) - first-fit
    decreasing, so small and fractional pods fill what the big ones leave."""
    return sorted(
        pods, key=lambda p: (-p.gpu_request_milli, -p.num_gpu, not p.gpu_spec, -p.cpu_milli)
    )


def replay(
    nodes: Sequence[TraceNode], pods: Sequence[TracePod], settings: ReplaySettings
) -> ReplayResult:
    """Replay ``pods`` (in arrival order) onto ``nodes``; see the module docstring."""
    if settings.batch < 1:
        raise ValueError(f"--batch is {settings.batch}; it must be at least 1")
    start = time.perf_counter()
    cluster = _Cluster(nodes)
    frag = settings.policy == "frag"
    mix = WorkloadMix(
        weighting="gpu" if frag and settings.gpu_weighted else "count",
        include_cpu_only=settings.cpu_only_in_mix or not frag,
        measure=settings.measure if frag else "single",
    )
    capacity = int(cluster.gpu.sum())
    placements: list[TracePlacement] = []
    ratios: dict[int, float | None] = dict.fromkeys(CHECKPOINTS)
    pending: list[str] = []
    dropped: list[str] = []
    arrived = allocated = 0
    since_refresh = settings.refresh_every
    cycle = 0
    for cycle, batch in enumerate(_batches(pods, settings.batch)):
        mix.extend(_task(p) for p in batch)
        since_refresh += len(batch)
        if cluster.mix_arrays is None or since_refresh >= settings.refresh_every:
            cluster.refresh(mix.arrays(cluster.models))
            since_refresh = 0
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
        ks = os.environ.get("KS", "")
        order = (
            batch if ks == "none" else
            sorted(batch, key=lambda p: p.gpu_request_milli) if ks == "asc" else
            sorted(batch, key=lambda p: (-p.num_gpu, p.gpu_milli == 1000, -p.gpu_milli)) if ks == "fracfirst" else
            sorted(batch, key=lambda p: -p.gpu_request_milli) if ks == "gpuonly" else
            _cycle_order(batch))
        for p in order:
            n, grant = cluster.choose(p, settings)
            if n < 0:
                (dropped if settings.drop_unplaced else pending).append(p.name)
                continue
            cluster.apply(n, p, grant)
            allocated += p.gpu_request_milli
            placements.append(TracePlacement(p.name, cluster.names[n], grant, cycle))
        for c in crossed:
            ratios[c] = 100 * allocated / capacity if capacity else 0.0
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
