"""Fragmentation-aware GPU placement (the idea of FGD, Weng et al., USENIX ATC '23).

A node's *fragmentation* with respect to a target workload is the GPU capacity a randomly
drawn task of that workload could not use there, weighted by how popular each task type is:

- a task type that cannot run on the node at all (model not allowed, too little CPU or
  memory, not enough devices with room) finds every free GPU thousandth unusable;
- a type that fits cannot use the free thousandths on devices with less room than it needs
  (for whole-GPU types: every partly used device).

A pod goes where its placement raises fragmentation least. The same measure picks the device
of a fractional pod. This module holds the vectorised arithmetic (numpy over many candidate
node states at once) and :class:`FragmentationScorer`, the per-node scorer the greedy calls.

All arrays use GPU thousandths (``GPU_MILLI`` = one whole device). Devices a node does not
have are written as 0 free: like a fully used device they hold nothing and fit nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from scheduler.cluster.node import GPU_MILLI

__all__ = [
    "Candidates",
    "FragmentationScorer",
    "MixArrays",
    "TaskType",
    "WorkloadMix",
    "device_sums",
    "fragmentation",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

Weighting = Literal["count", "gpu"]


@dataclass(frozen=True, slots=True)
class TaskType:
    """The shape of a task as far as fit is concerned.

    ``gpus`` devices with ``milli`` free each (0 GPUs = CPU-only); ``models`` the allowed GPU
    models (empty = any).
    """

    cpu_milli: int
    memory_mib: int
    gpus: int
    milli: int
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class MixArrays:
    """A :class:`WorkloadMix` as arrays over its T types, for one model numbering.

    ``thresholds`` are the distinct per-device needs (0 for CPU-only types); ``u_index[t]``
    points a type at its threshold; ``allowed[t, m]`` says whether type t may use model m.
    """

    weight: FloatArray  # [T], sums to 1
    cpu: IntArray  # [T]
    mem: IntArray  # [T]
    gpus: IntArray  # [T]
    u_index: IntArray  # [T]
    thresholds: IntArray  # [U]
    allowed: BoolArray  # [T, M]


@dataclass
class WorkloadMix:
    """Popularity of task types seen so far: the target workload fragmentation is measured for.

    ``weighting="count"`` weighs each type by how many tasks had it (FGD's choice);
    ``"gpu"`` by the GPU thousandths they asked for, so the measure tracks allocated GPU share.
    CPU-only types count only when ``include_cpu_only`` (they make a node whose CPU runs out
    under idle GPUs look fragmented).
    """

    weighting: Weighting = "count"
    include_cpu_only: bool = True
    counts: dict[TaskType, float] = field(default_factory=dict)
    version: int = 0

    def add(self, task: TaskType, n: float = 1.0) -> None:
        """Record ``n`` more tasks of this type."""
        if task.gpus == 0 and not self.include_cpu_only:
            return
        self.counts[task] = self.counts.get(task, 0.0) + n
        self.version += 1

    def extend(self, tasks: Iterable[TaskType]) -> None:
        """Record one task of each given type."""
        for t in tasks:
            self.add(t)

    def arrays(self, models: Sequence[str]) -> MixArrays:
        """The mix as arrays; ``models[m]`` names model index m of the node arrays."""
        types = list(self.counts)
        if not types:
            # An empty mix measures nothing: every node is unfragmented.
            types = [TaskType(0, 0, 0, 0)]
            raw = np.zeros(1)
        else:
            raw = np.array(
                [
                    self.counts[t] * (max(t.gpus * t.milli, 1) if self.weighting == "gpu" else 1)
                    for t in types
                ],
                dtype=np.float64,
            )
        total = raw.sum()
        weight = raw / total if total > 0 else raw
        needs = np.array([t.milli if t.gpus else 0 for t in types], dtype=np.int64)
        thresholds = np.unique(np.append(needs, GPU_MILLI))
        index = {m: i for i, m in enumerate(models)}
        allowed = np.ones((len(types), len(models)), dtype=np.bool_)
        for ti, t in enumerate(types):
            if t.models:
                allowed[ti, :] = False
                for m in t.models:
                    if m in index:
                        allowed[ti, index[m]] = True
        return MixArrays(
            weight=weight,
            cpu=np.array([t.cpu_milli for t in types], dtype=np.int64),
            mem=np.array([t.memory_mib for t in types], dtype=np.int64),
            gpus=np.array([t.gpus for t in types], dtype=np.int64),
            u_index=np.searchsorted(thresholds, needs).astype(np.int64),
            thresholds=thresholds.astype(np.int64),
            allowed=allowed,
        )


def device_sums(gpu_free: IntArray, thresholds: IntArray) -> tuple[IntArray, IntArray]:
    """Per row and threshold u: free thousandths on devices with >= u free, and their count.

    ``gpu_free`` is [N, D]; both results are [N, U].
    """
    ge = gpu_free[:, :, None] >= thresholds[None, None, :]
    sums = (gpu_free[:, :, None] * ge).sum(axis=1)
    return sums.astype(np.int64), ge.sum(axis=1).astype(np.int64)


def fragmentation(
    mix: MixArrays,
    free_total: IntArray,
    sums: IntArray,
    counts: IntArray,
    cpu: IntArray,
    mem: IntArray,
    model: IntArray,
) -> FloatArray:
    """Expected unusable GPU thousandths per row (node state) for a task drawn from ``mix``.

    ``free_total`` [C] free thousandths; ``sums``/``counts`` [C, U] from :func:`device_sums`;
    ``cpu``/``mem`` [C] free CPU milli / memory MiB; ``model`` [C] model index (-1 = none).
    """
    s = sums[:, mix.u_index]  # [C, T] thousandths a type could use if it fits
    fits = counts[:, mix.u_index] >= mix.gpus[None, :]
    fits &= cpu[:, None] >= mix.cpu[None, :]
    fits &= mem[:, None] >= mix.mem[None, :]
    has_model = model >= 0
    # A node without GPUs only ever hosts CPU-only types; its model column is irrelevant.
    allowed = np.where(has_model[:, None], mix.allowed[:, np.maximum(model, 0)].T, True)
    fits &= allowed | (mix.gpus[None, :] == 0)
    usable: FloatArray = np.where(fits, s, 0).astype(np.float64) @ mix.weight
    return free_total.astype(np.float64) - usable


@dataclass(frozen=True)
class Candidates:
    """Possible placements of one pod: node row, device value taken from, and how many.

    A candidate turns ``mult`` devices with ``before`` free into ``after`` free on node
    ``node``; CPU-only pods have ``mult`` 0.
    """

    node: IntArray
    before: IntArray
    after: IntArray
    mult: IntArray


def candidate_fragmentation(
    mix: MixArrays,
    cand: Candidates,
    free_total: IntArray,
    sums: IntArray,
    counts: IntArray,
    cpu_after: IntArray,
    mem_after: IntArray,
    model: IntArray,
) -> FloatArray:
    """Fragmentation of each candidate's node *after* the placement.

    ``free_total``/``sums``/``counts``/``model`` are per node (indexed by ``cand.node``);
    ``cpu_after``/``mem_after`` per candidate. Only the changed devices are re-counted.
    """
    u = mix.thresholds[None, :]
    b = cand.before[:, None]
    a = cand.after[:, None]
    m = cand.mult[:, None]
    s = sums[cand.node] + m * (a * (a >= u) - b * (b >= u))
    c = counts[cand.node] + m * ((a >= u).astype(np.int64) - (b >= u))
    g = free_total[cand.node] - cand.mult * (cand.before - cand.after)
    return fragmentation(mix, g, s, c, cpu_after, mem_after, model[cand.node])


__all__ += ["candidate_fragmentation"]


class FragmentationScorer:
    """NodeScorer: the fragmentation increase of placing a pod on one node (lower is better).

    For the live greedy, which asks node by node. ``score`` takes the node's free CPU milli,
    memory MiB, per-device free thousandths and GPU model, and the grant being considered
    (device index -> thousandths); it returns how much expected unusable GPU capacity the
    placement adds. The replay engine uses the vectorised functions above instead.
    """

    def __init__(self, mix: WorkloadMix, models: Sequence[str]) -> None:
        self.mix = mix
        self.models = list(models)
        self._arrays: MixArrays | None = None
        self._version = -1

    def _mix(self) -> MixArrays:
        if self._arrays is None or self._version != self.mix.version:
            self._arrays = self.mix.arrays(self.models)
            self._version = self.mix.version
        return self._arrays

    def node_fragmentation(
        self, cpu: int, mem: int, gpu_free: Sequence[int], model: str | None
    ) -> float:
        """Fragmentation of one node state."""
        mix = self._mix()
        g = np.array([list(gpu_free) or [0]], dtype=np.int64)
        sums, counts = device_sums(g, mix.thresholds)
        mi = self.models.index(model) if model in self.models else -1
        frag = fragmentation(
            mix,
            g.sum(axis=1),
            sums,
            counts,
            np.array([cpu]),
            np.array([mem]),
            np.array([mi]),
        )
        return float(frag[0])

    def score(
        self,
        cpu: int,
        mem: int,
        gpu_free: Sequence[int],
        model: str | None,
        cpu_request: int,
        mem_request: int,
        grant: Iterable[tuple[int, int]],
    ) -> float:
        """Fragmentation after minus before placing a pod with ``grant`` on this node."""
        after = list(gpu_free)
        for index, milli in grant:
            after[index] -= milli
        before = self.node_fragmentation(cpu, mem, gpu_free, model)
        return self.node_fragmentation(cpu - cpu_request, mem - mem_request, after, model) - before
