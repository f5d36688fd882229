"""The ``arrays`` trace-replay engine: a vectorised re-implementation of the ``frag``
policy (and the ``fgd``, ``bestfit`` and ``paper-bestfit`` baselines) over numpy arrays of
free CPU, memory and device thousandths plus cached per-node fragmentation terms, with the
same arithmetic as :class:`~scheduler.plugins.fragmentation.FragmentationScorer`. Seconds
per 10k-pod replay: a cross-check of the live engines in :mod:`scheduler.simulate.replay`,
and the only home of the ``fgd`` and ``paper-bestfit`` baselines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from scheduler.cluster.node import GPU_MILLI
from scheduler.plugins.fragmentation import (
    Candidates,
    DeviceTerms,
    MixArrays,
    TaskType,
    WorkloadMix,
    candidate_fragmentation,
    device_sums,
    fragmentation,
    refresh_due,
)
from scheduler.simulate.trace import TraceNode, TracePod

if TYPE_CHECKING:
    from scheduler.simulate.replay import ReplaySettings

__all__ = ["CycleEngine", "Outcome", "array_engine", "mix_for", "trace_task"]


#: The FGD paper simulator's normalisation of free CPU (milli) and GPU (thousandths) in its
#: BestFit score (the largest node it models: 128 cores, 8 GPUs).
_PAPER_MAX_CPU = 128_000
_PAPER_MAX_GPU = 8 * GPU_MILLI


def trace_task(pod: TracePod) -> TaskType:
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
        #: Random tie-breaks of the ``paper-bestfit`` baseline (made on first use).
        self.rng: np.random.Generator | None = None
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
        if settings.policy == "paper-bestfit":
            return self._paper_bestfit(pod, nodes, settings)
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

    def _paper_bestfit(
        self, pod: TracePod, nodes: np.ndarray, settings: ReplaySettings
    ) -> tuple[int, tuple[tuple[int, int], ...]]:
        """BestFit as the FGD paper's simulator scores it: a node's score is
        ``int(100 * (1 - (cpu_left / 128 cores + gpu_left / 8 GPUs) / 2))`` after the pod,
        from free CPU and the node's total free GPU thousandths only; among the nodes with
        the highest score one is drawn at random (kube-scheduler picks among equal best
        scores at random). A share takes the fitting device with the least room (lowest
        index among equals), whole GPUs the lowest-numbered free devices."""
        gpu_left = self.total[nodes] - pod.gpu_request_milli
        cpu_left = self.cpu[nodes] - pod.cpu_milli
        free = 0.5 * cpu_left / _PAPER_MAX_CPU + 0.5 * gpu_left / _PAPER_MAX_GPU
        score = np.trunc((1.0 - free) * 100).astype(np.int64)
        top = nodes[score == score.max()]
        if self.rng is None:
            self.rng = np.random.default_rng(settings.tie_seed)
        n = int(top[self.rng.integers(len(top))])
        if pod.num_gpu == 0:
            return n, ()
        row = self.gpu[n]
        if pod.fractional:
            fits = np.nonzero(row >= pod.gpu_milli)[0]
            d = int(fits[np.argmin(row[fits])])
            return n, ((d, pod.gpu_milli),)
        devices = np.nonzero(row == GPU_MILLI)[0][: pod.num_gpu]
        return n, tuple((int(d), GPU_MILLI) for d in devices)

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


def mix_for(settings: ReplaySettings) -> WorkloadMix:
    frag = settings.policy == "frag"
    return WorkloadMix(
        weighting="gpu" if frag and settings.gpu_weighted else "count",
        include_cpu_only=settings.cpu_only_in_mix or not frag,
        measure=settings.measure if frag else "single",
        coverage=settings.coverage,
    )


def array_engine(nodes: Sequence[TraceNode], settings: ReplaySettings) -> CycleEngine:
    """The vectorised engine: numpy node arrays, one ``choose`` per pod."""
    cluster = _Cluster(nodes)
    mix = mix_for(settings)
    since_refresh = 0
    seen = 0

    def place(cycle: int, batch: list[TracePod]) -> list[Outcome]:
        nonlocal since_refresh, seen
        mix.extend(trace_task(p) for p in batch)
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
