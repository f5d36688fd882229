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
    "DeviceTerms",
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
#: ``single``: FGD's measure (can one task of the type still fit; what can it not use);
#: ``fill``: how much of the free GPU copies of the type could take before CPU, memory or
#: device room runs out.
Measure = Literal["single", "fill"]
import os
_ALPHA = float(os.environ.get("KA", "1"))


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


@dataclass(frozen=True, slots=True)
class DeviceTerms:
    """Per node state and per-device-need threshold u, [N, U] each.

    ``sums``: free thousandths on devices with at least u free; ``counts``: how many such
    devices; ``fills``: thousandths that tasks needing u each could take (sum of
    floor(free / u) * u over devices).
    """

    sums: IntArray
    counts: IntArray
    fills: IntArray


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
    milli: IntArray  # [T]
    u_index: IntArray  # [T]
    thresholds: IntArray  # [U]
    allowed: BoolArray  # [T, M]
    measure: Measure = "fill"


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
    measure: Measure = "fill"
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
                    self.counts[t] * (max(t.gpus * t.milli, 1) ** _ALPHA if self.weighting == "gpu" else 1)
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
            milli=np.array([t.milli for t in types], dtype=np.int64),
            u_index=np.searchsorted(thresholds, needs).astype(np.int64),
            thresholds=thresholds.astype(np.int64),
            allowed=allowed,
            measure=self.measure,
        )


def device_sums(gpu_free: IntArray, thresholds: IntArray) -> DeviceTerms:
    """Per row and threshold u, over devices: see :class:`DeviceTerms`. ``gpu_free`` is [N, D]."""
    g = gpu_free[:, :, None]
    u = thresholds[None, None, :]
    ge = g >= u
    fills = (g // np.maximum(u, 1)) * u
    return DeviceTerms(
        (g * ge).sum(axis=1).astype(np.int64),
        ge.sum(axis=1).astype(np.int64),
        fills.sum(axis=1).astype(np.int64),
    )


def fragmentation(
    mix: MixArrays,
    free_total: IntArray,
    terms: DeviceTerms,
    cpu: IntArray,
    mem: IntArray,
    model: IntArray,
) -> FloatArray:
    """Expected unusable GPU thousandths per row (node state) for a task drawn from ``mix``.

    ``free_total`` [C] free thousandths; ``terms`` [C, U] from :func:`device_sums`;
    ``cpu``/``mem`` [C] free CPU milli / memory MiB; ``model`` [C] model index (-1 = none).
    """
    has_model = model >= 0
    # A node without GPUs only ever hosts CPU-only types; its model column is irrelevant.
    allowed = np.where(has_model[:, None], mix.allowed[:, np.maximum(model, 0)].T, True)
    allowed |= mix.gpus[None, :] == 0
    if mix.measure == "fill":
        usable = _fill_usable(mix, terms, cpu, mem) * allowed
    elif mix.measure == "mixed":
        s = terms.sums[:, mix.u_index]
        fits = terms.counts[:, mix.u_index] >= mix.gpus[None, :]
        fits &= cpu[:, None] >= mix.cpu[None, :]
        fits &= mem[:, None] >= mix.mem[None, :]
        usable = (np.where(fits & allowed, s, 0) + _fill_usable(mix, terms, cpu, mem) * allowed) / 2
    else:
        s = terms.sums[:, mix.u_index]  # [C, T] thousandths a type could use if it fits
        fits = terms.counts[:, mix.u_index] >= mix.gpus[None, :]
        fits &= cpu[:, None] >= mix.cpu[None, :]
        fits &= mem[:, None] >= mix.mem[None, :]
        usable = np.where(fits & allowed, s, 0)
    used: FloatArray = usable.astype(np.float64) @ mix.weight
    return free_total.astype(np.float64) - used


def _fill_usable(mix: MixArrays, terms: DeviceTerms, cpu: IntArray, mem: IntArray) -> IntArray:
    """GPU thousandths that copies of each type could take, one after another: limited by the
    devices' room (a 1000 device holds two 470 tasks: 60 left over) and by CPU and memory
    (8 idle GPUs with CPU for only two tasks strand six). [C, T]"""
    k = mix.gpus[None, :]
    per_task = k * mix.milli[None, :]
    whole = (terms.counts[:, mix.u_index] // np.maximum(k, 1)) * per_task
    dev = np.where(k > 1, whole, terms.fills[:, mix.u_index])
    big = np.iinfo(np.int64).max // 4
    by_cpu = np.where(mix.cpu > 0, cpu[:, None] // np.maximum(mix.cpu, 1), big // 1000)
    by_mem = np.where(mix.mem > 0, mem[:, None] // np.maximum(mix.mem, 1), big // 1000)
    usable: IntArray = np.minimum(dev, np.minimum(by_cpu, by_mem) * per_task)
    return np.where(k > 0, usable, 0)


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
    terms: DeviceTerms,
    cpu_after: IntArray,
    mem_after: IntArray,
    model: IntArray,
) -> FloatArray:
    """Fragmentation of each candidate's node *after* the placement.

    ``free_total``/``terms``/``model`` are per node (indexed by ``cand.node``);
    ``cpu_after``/``mem_after`` per candidate. Only the changed devices are re-counted.
    """
    u = mix.thresholds[None, :]
    u1 = np.maximum(u, 1)
    b = cand.before[:, None]
    a = cand.after[:, None]
    m = cand.mult[:, None]
    after = DeviceTerms(
        terms.sums[cand.node] + m * (a * (a >= u) - b * (b >= u)),
        terms.counts[cand.node] + m * ((a >= u).astype(np.int64) - (b >= u)),
        terms.fills[cand.node] + m * ((a // u1) * u - (b // u1) * u),
    )
    g = free_total[cand.node] - cand.mult * (cand.before - cand.after)
    return fragmentation(mix, g, after, cpu_after, mem_after, model[cand.node])


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
        terms = device_sums(g, mix.thresholds)
        mi = self.models.index(model) if model in self.models else -1
        frag = fragmentation(
            mix,
            g.sum(axis=1),
            terms,
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
