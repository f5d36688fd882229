"""Fragmentation-aware GPU placement (the idea of FGD, Weng et al., USENIX ATC '23).

A node's *fragmentation* with respect to a target workload is the GPU capacity a randomly
drawn task of that workload could not use there, weighted by how popular each task type is:

- a task type that cannot run on the node at all (model not allowed, too little CPU or
  memory, not enough devices with room) finds every free GPU thousandth unusable;
- a type that fits cannot use the free thousandths on devices with less room than it needs
  (for whole-GPU types: every partly used device).

FGD's single-task view misses two ways capacity strands: a node with 8 idle GPUs but CPU for
two more tasks, and a device whose room is not a multiple of the common task sizes (1000
holds two 470 tasks, 60 are lost). The *fill* view counts what copies of each type could
take one after another; the default (``mixed``) averages both views.

A pod goes where its placement raises fragmentation least, plus what it costs the pods
that can only run on that node's GPU model (:func:`model_scarcity`): fragmentation weighs
task types by popularity and does not see that a model's remaining capacity may already be
spoken for by pods pinned to it, plus (weighted by ``price_weight``) the value its devices'
free room can no longer earn at the share prices of the mix's configuration LP
(:mod:`scheduler.plugins.device_prices`): fragmentation sees which sizes fit a device's
room, the prices see which fill it well. The same measure picks the device of a fractional
pod.
This module holds the vectorised arithmetic (numpy over many candidate node states at once)
and :class:`FragmentationScorer`, the per-node scorer the greedy calls.

All arrays use GPU thousandths (``GPU_MILLI`` = one whole device). Devices a node does not
have are written as 0 free: like a fully used device they hold nothing and fit nothing.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from scheduler.cluster.node import GPU_MILLI, GPU_MODEL_LABEL
from scheduler.cluster.pod import Pod
from scheduler.cluster.resources import CPU, MEMORY
from scheduler.cluster.snapshot import Snapshot
from scheduler.framework.scoring import Candidate, NodeView, PodDemand
from scheduler.plugins.device_prices import gap_costs, share_prices
from scheduler.plugins.strand_guard import fitting_share, hold_reason

__all__ = [
    "PRICE_WEIGHT",
    "Candidates",
    "DeviceTerms",
    "FragmentationScorer",
    "MixArrays",
    "TaskType",
    "WorkloadMix",
    "allowed_models",
    "candidate_fragmentation",
    "device_demand",
    "device_sums",
    "fragmentation",
    "free_gpu_by_model",
    "frozen_capacity",
    "model_scarcity",
    "pinned_demand",
    "refresh_due",
    "scorer_for_snapshot",
    "snapshot_mix",
    "task_type",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: Weight of the packing tie-break (free GPU thousandths left) in :meth:`FragmentationScorer.score`.
TIE_SCALE = 1e-10

#: Default weight of the share-price term (:mod:`scheduler.plugins.device_prices`) against
#: the fragmentation measure, both in GPU thousandths. On the openb replay (seed 42, batch
#: 64, 100 % arrived) weights 1, 2, 4, 8, 16, 64 and 1000 gave 96.52, 96.48, 96.60, 96.59,
#: 96.65, 96.61 and 96.61 % against 96.41 without: from about 4 on the prices lead and the
#: fragmentation measure mostly breaks their ties.
PRICE_WEIGHT = 16.0

#: Bytes per MiB (the scorer sees memory in bytes; task types count MiB like the traces).
MIB = 1 << 20

Weighting = Literal["count", "gpu"]
#: ``single``: FGD's measure (can one task of the type still fit; what can it not use);
#: ``fill``: how much of the free GPU copies of the type could take before CPU, memory or
#: device room runs out; ``mixed``: the mean of both (the default: on the openb trace it
#: beats either alone by about 0.4 points of allocation).
Measure = Literal["single", "fill", "mixed"]


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
    inv_cpu: FloatArray  # [T] 1 / CPU request (0 when the type asks none)
    inv_mem: FloatArray  # [T]
    measure: Measure = "mixed"


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
    measure: Measure = "mixed"
    #: Keep the most popular types covering this share of tasks (1 = all).
    coverage: float = 1.0
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
        types = sorted(self.counts, key=lambda t: -self.counts[t])
        if self.coverage < 1 and types:
            # Rare types cost time and barely move the expectation: keep the most popular
            # ones that cover ``coverage`` of all tasks seen.
            total_seen = sum(self.counts.values())
            cum = 0.0
            for i, t in enumerate(types):
                cum += self.counts[t]
                if cum >= self.coverage * total_seen:
                    types = types[: i + 1]
                    break
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
            milli=np.array([t.milli for t in types], dtype=np.int64),
            inv_cpu=np.array([1 / t.cpu_milli if t.cpu_milli else 0.0 for t in types]),
            inv_mem=np.array([1 / t.memory_mib if t.memory_mib else 0.0 for t in types]),
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
    if not mix.weight.any():
        return np.zeros(len(free_total))
    has_model = model >= 0
    # A node without GPUs only ever hosts CPU-only types; its model column is irrelevant.
    if mix.allowed.shape[1]:
        allowed = np.where(has_model[:, None], mix.allowed[:, np.maximum(model, 0)].T, True)
    else:  # no node carries a GPU model label: no type can be excluded by model
        allowed = np.ones((len(free_total), len(mix.weight)), dtype=np.bool_)
    allowed |= mix.gpus[None, :] == 0
    if mix.measure == "single":
        usable = _single_usable(mix, terms, cpu, mem)
    elif mix.measure == "fill":
        usable = _fill_usable(mix, terms, cpu, mem)
    else:
        usable = (_single_usable(mix, terms, cpu, mem) + _fill_usable(mix, terms, cpu, mem)) / 2
    usable = np.where(allowed, usable, 0.0)
    used: FloatArray = usable.astype(np.float64) @ mix.weight
    return free_total.astype(np.float64) - used


def _single_usable(mix: MixArrays, terms: DeviceTerms, cpu: IntArray, mem: IntArray) -> FloatArray:
    """FGD's view: if one task of the type fits, it can use the devices with enough room
    (whole free devices for whole-GPU types); if it does not fit, nothing. [C, T]"""
    fits = terms.counts[:, mix.u_index] >= mix.gpus[None, :]
    fits &= cpu[:, None] >= mix.cpu[None, :]
    fits &= mem[:, None] >= mix.mem[None, :]
    return np.where(fits, terms.sums[:, mix.u_index], 0).astype(np.float64)


def _fill_usable(mix: MixArrays, terms: DeviceTerms, cpu: IntArray, mem: IntArray) -> FloatArray:
    """GPU thousandths that copies of each type could take, one after another: limited by the
    devices' room (a 1000 device holds two 470 tasks: 60 left over) and by CPU and memory
    (8 idle GPUs with CPU for only two tasks strand six). [C, T]"""
    k = mix.gpus[None, :]
    per_task = (k * mix.milli[None, :]).astype(np.float64)
    whole = (terms.counts[:, mix.u_index] // np.maximum(k, 1)) * per_task
    dev = np.where(k > 1, whole, terms.fills[:, mix.u_index])
    # Float reciprocals are much faster than integer division; the small bias keeps exact
    # multiples (cpu == 3 * request) from rounding down. A type asking no CPU (memory) is
    # never limited by it.
    by_cpu = np.where(mix.cpu > 0, np.floor(cpu[:, None] * mix.inv_cpu[None, :] + 1e-9), np.inf)
    by_mem = np.where(mix.mem > 0, np.floor(mem[:, None] * mix.inv_mem[None, :] + 1e-9), np.inf)
    usable: FloatArray = np.minimum(dev, np.minimum(by_cpu, by_mem) * per_task)
    return usable


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


def device_demand(mix: WorkloadMix) -> dict[int, float]:
    """Devices' worth the mix's GPU tasks ask for, per share of one device (whole devices as
    :data:`GPU_MILLI`): a task of k devices counts k times."""
    out: dict[int, float] = {}
    for t, n in mix.counts.items():
        if t.gpus:
            out[t.milli] = out.get(t.milli, 0.0) + n * t.gpus
    return out


def pinned_demand(mix: WorkloadMix) -> dict[tuple[str, ...], float]:
    """GPU thousandths the mix's tasks ask for, per allowed-model set (``()`` = any model)."""
    out: dict[tuple[str, ...], float] = {}
    for t, n in mix.counts.items():
        if t.gpus:
            out[t.models] = out.get(t.models, 0.0) + n * t.gpus * t.milli
    return out


def model_scarcity(
    demand: Mapping[tuple[str, ...], float], free: Mapping[str, int]
) -> dict[str, float]:
    """Per GPU model, the share of its free thousandths that pods able to run only on a
    set of models including it are expected to need (capped at 1).

    ``demand``: GPU thousandths asked per allowed-model set (``()`` = any), read as the
    shape of future demand; ``free``: free thousandths per model. Future GPU demand is taken
    to be at least what is free (the cluster will be asked to fill), so a set ``A`` holding
    share ``d_A`` of the demand expects ``d_A * F`` thousandths, spread over its models in
    proportion to their free capacity: model ``m`` gets ``F * sum_{A ∋ m} d_A / F_A`` per
    free thousandth. At 1 every free thousandth of ``m`` is spoken for: a pod that could go
    elsewhere and takes it there displaces a pinned pod, which has nowhere else to go.
    Unpinned demand raises every model alike and is left out (only differences rank nodes).
    """
    total_demand = sum(demand.values())
    total_free = sum(max(0, f) for f in free.values())
    out = dict.fromkeys(free, 0.0)
    if total_demand <= 0 or total_free <= 0:
        return out
    for models, d in demand.items():
        room = [m for m in models if free.get(m, 0) > 0]
        free_a = sum(free[m] for m in room)
        if not models or free_a <= 0 or free_a >= total_free:
            continue  # any model, or a set covering all free capacity: no model is special
        per = total_free * (d / total_demand) / free_a
        for m in room:
            out[m] += per
    return {m: min(1.0, v) for m, v in out.items()}


def free_gpu_by_model(nodes: Iterable[tuple[str | None, Sequence[int]]]) -> dict[str, int]:
    """Free GPU thousandths per model from (model, free thousandths per device) rows."""
    out: dict[str, int] = {}
    for model, gpu_free in nodes:
        if model:
            out[model] = out.get(model, 0) + sum(max(0, f) for f in gpu_free)
    return out


def refresh_due(new: int, before: int, every: int, growth: float) -> bool:
    """Whether a mix that had ``before`` tasks at its last rebuild and ``new`` more since
    should be rebuilt: after ``every`` more, or ``growth`` x ``before`` more if that is more
    (the mix settles as tasks accumulate)."""
    return new > 0 and new >= max(every, growth * before)


class FragmentationScorer:
    """NodeScorer + DevicePicker for the live greedy: fragmentation increase, lower is better.

    Implements :class:`scheduler.framework.NodeScorer` (``score``) and
    :class:`scheduler.framework.DevicePicker` (``pick_devices``: the device choice of a
    fractional pod is fragmentation-aware too). The target workload is ``mix``, read when
    the scorer is first used; pods observed later (:meth:`observe`, or ``mix.add``) count
    from the next :meth:`refresh`, which belongs *between* cycles (the greedy caches scores
    per node class). The score reads only free CPU,
    memory, per-device thousandths and the GPU model label, as the contract requires.

    ``capacity`` (free GPU thousandths per model, read at every rebuild) turns on the
    model-scarcity term: each thousandth a pod takes on a model costs
    ``scarcity_weight * model_scarcity(...)[model]`` more (see :func:`model_scarcity`).

    ``price_weight`` (0: off) adds to each node state's measure, per device, that weight
    times what the device's free room can no longer earn at the mix's share prices
    (:func:`scheduler.plugins.device_prices.gap_costs`; prices from the mix at every
    rebuild).
    """

    def __init__(
        self,
        mix: WorkloadMix | None = None,
        models: Sequence[str] = (),
        *,
        refresh_every: int = 64,
        refresh_growth: float = 0.0,
        capacity: Callable[[], Mapping[str, int]] | None = None,
        scarcity_weight: float = 1.0,
        price_weight: float = PRICE_WEIGHT,
    ) -> None:
        self.mix = mix if mix is not None else WorkloadMix()
        self.capacity = capacity
        self.scarcity_weight = scarcity_weight
        #: model -> extra cost per thousandth taken there (from the last rebuild)
        self.scarcity: dict[str, float] = {}
        self.models: list[str] = list(models)
        #: :meth:`refresh` rebuilds the mix arrays only after max(refresh_every,
        #: refresh_growth x pods seen) more observed pods: the mix drifts slowly, and a fixed
        #: mix lets node states be scored once (see ``_memo``).
        self.refresh_every = max(1, refresh_every)
        self.refresh_growth = max(0.0, refresh_growth)
        self._arrays: MixArrays | None = None
        self._version = -1
        #: (cpu, memory MiB, devices, model) -> fragmentation under the current arrays. Nodes
        #: in equal states are common (one per shape when the cluster is empty), so most
        #: scores reuse an entry.
        self._memo: dict[tuple[int, int, tuple[int, ...], str | None], float] = {}
        #: Entries kept before the memo starts over (about 500 bytes each).
        self.memo_limit = 500_000
        #: Bumped whenever scores change (a rebuilt mix): cached rankings must be dropped.
        self.generation = 0
        #: Hold a share back rather than strand an idle device (:mod:`.strand_guard`).
        self.hold_stranding = False
        #: Pods created at or before this time have been held long enough (see
        #: :meth:`limit_holds`); -inf: no limit.
        self.hold_created_after = -math.inf
        self.hold_max_wait = 0.0
        #: (arrays generation, model, remainder) -> :func:`fitting_share`
        self._fits: dict[tuple[int, str | None, int], float] = {}
        #: Weight of the value a node state can no longer earn at the mix's share prices
        #: (:mod:`scheduler.plugins.device_prices`; 0: off).
        self.price_weight = max(0.0, price_weight)
        #: Per free thousandths of a device, ``price_weight`` x what the room can no longer
        #: earn (from the last rebuild; None: no prices).
        self._gap_costs: FloatArray | None = None

    def observe(self, demand: PodDemand, models: Sequence[str] = ()) -> None:
        """Count one more pod of this shape in the target workload."""
        self.mix.add(_task_of(demand, models))

    def _mix(self, model: str | None) -> MixArrays:
        if model and model not in self.models:
            self.models.append(model)
            self._arrays = None
        if self._arrays is None:
            self._rebuild()
        assert self._arrays is not None
        return self._arrays

    def _rebuild(self) -> None:
        self._arrays = self.mix.arrays(self.models)
        self._version = self.mix.version
        self._memo.clear()
        self._gap_costs = None
        if self.price_weight:
            prices = share_prices(device_demand(self.mix))
            if prices:
                self._gap_costs = self.price_weight * gap_costs(prices)
        if self.capacity is not None and self.scarcity_weight:
            # Only between cycles, like the mix: scores stay fixed inside a placement pass.
            self.scarcity = model_scarcity(pinned_demand(self.mix), self.capacity())
        self.generation += 1

    def refresh(self) -> bool:
        """Take in the pods observed since the last rebuild if enough have arrived (see
        ``refresh_every``); True when scores changed. Call between cycles: a scorer whose
        scores change inside a placement pass would rank nodes against two different mixes.
        """
        if self._arrays is None:
            return False  # built on first use, from the whole mix
        if refresh_due(
            self.mix.version - self._version, self._version, self.refresh_every, self.refresh_growth
        ):
            self._rebuild()
            return True
        return False

    def retarget(self, mix: WorkloadMix, capacity: Callable[[], Mapping[str, int]] | None) -> None:
        """Take ``mix`` and ``capacity`` as the next cycle's while keeping the fragmentation
        measure and every node state it has measured (for a mix close to the one the measure
        was built from: :class:`~scheduler.plugins.scorer_memory.ScorerMemory`). The
        model-scarcity term is recomputed now: it reads what is free this cycle."""
        self.mix = mix
        self.capacity = capacity
        self._version = mix.version
        if self._arrays is not None:
            self.scarcity = {}
            if capacity is not None and self.scarcity_weight:
                self.scarcity = model_scarcity(pinned_demand(mix), capacity())

    def limit_holds(self, now: float, max_wait: float) -> None:
        """Hold no pod created more than ``max_wait`` seconds before ``now`` (0: no limit)."""
        self.hold_max_wait = max(0.0, max_wait)
        self.hold_created_after = now - max_wait if max_wait > 0 else -math.inf

    def may_hold(self, pod: Pod) -> bool:
        """Whether the guard applies to ``pod``: on, and the pod is younger than the limit
        (a pod whose creation time is unknown counts as old: it is never held)."""
        return self.hold_stranding and pod.creation_time > self.hold_created_after

    def held(
        self, model: str | None, count: int, milli: int, before: int, room: tuple[int, int]
    ) -> str | None:
        """Why a pod taking ``milli`` of ``count`` device(s) of ``model``, one of which had
        ``before`` free, should wait rather than strand the device's rest (None: place it;
        always None unless :attr:`hold_stranding`). ``room``: (free, total) GPU thousandths
        of the model's placeable nodes. See :mod:`scheduler.plugins.strand_guard`."""
        if not self.hold_stranding or count != 1 or before != GPU_MILLI or milli >= GPU_MILLI:
            return None
        key = (self.generation, model, GPU_MILLI - milli)
        fit = self._fits.get(key)
        if fit is None:
            mix = self._mix(model)
            index = self.models.index(model) if model in self.models else -1
            if len(self._fits) > 10_000:
                self._fits.clear()
            fit = self._fits[key] = fitting_share(mix, index, GPU_MILLI - milli)
        reason = hold_reason(count, milli, before, fit, room, model)
        if reason is None or not self.hold_max_wait:
            return reason
        return (
            f"{reason}; it is placed anyway {self.hold_max_wait:g}s after it was created "
            "(placement.holdStrandingMaxWait)"
        )

    def node_fragmentation(
        self, cpu: int, mem_mib: int, gpu_free: Sequence[int], model: str | None
    ) -> float:
        """Fragmentation of one node state (free CPU milli, memory MiB, devices, model), with
        the share-price term when ``price_weight`` is set."""
        key = (cpu, mem_mib, tuple(gpu_free), model)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        return self.node_fragmentations([(cpu, mem_mib, key[2])], model)[0]

    def node_fragmentations(
        self, rows: Sequence[tuple[int, int, tuple[int, ...]]], model: str | None
    ) -> list[float]:
        """:meth:`node_fragmentation` of many states of one node (free CPU milli, memory
        MiB, free thousandths per device, all with the same device count): the states not
        measured before are measured together, in one vectorised pass."""
        mix = self._mix(model)
        out: list[float | None] = [self._memo.get((c, m, g, model)) for c, m, g in rows]
        missing = [i for i, v in enumerate(out) if v is None]
        if missing:
            g = np.array([[max(0, f) for f in rows[i][2]] or [0] for i in missing], dtype=np.int64)
            values = fragmentation(
                mix,
                g.sum(axis=1),
                device_sums(g, mix.thresholds),
                np.array([rows[i][0] for i in missing], dtype=np.int64),
                np.array([rows[i][1] for i in missing], dtype=np.int64),
                np.full(len(missing), self.models.index(model) if model in self.models else -1),
            )
            if self._gap_costs is not None:
                values = values + self._gap_costs[np.minimum(g, GPU_MILLI)].sum(axis=1)
            if len(self._memo) > self.memo_limit:
                self._memo.clear()
            for i, v in zip(missing, values.tolist(), strict=True):
                c, m, devices = rows[i]
                self._memo[(c, m, devices, model)] = out[i] = v
        return [v for v in out if v is not None]

    def score(self, node: NodeView, demand: PodDemand, grant: Sequence[tuple[int, int]]) -> float:
        """Fragmentation after minus before placing ``demand`` with ``grant`` on ``node``.

        Equal increases (rounded to 1e-6) are broken towards packing: the node with the
        least free GPU afterwards wins (a term below 1e-6 for up to 9 devices; ties are
        common and measured worth about 0.6 points of allocation on the openb trace).
        With ``capacity`` set, the thousandths taken cost the model's scarcity on top.
        """
        return self.score_many([(node, demand, grant)])[0]

    def score_many(self, candidates: Sequence[Candidate]) -> list[float]:
        """:meth:`score` of each candidate; the node states not measured before are measured
        together, one vectorised pass per GPU model and device count."""
        rows: dict[tuple[str | None, int], list[tuple[int, int, tuple[int, ...]]]] = {}
        where: list[tuple[tuple[str | None, int], int, list[int], int]] = []
        for node, demand, grant in candidates:
            model = node.node.gpu_model
            cpu = node.free.get(CPU, 0)
            mem = node.free.get(MEMORY, 0) // MIB
            after = list(node.gpu_free)
            for index, milli in grant:
                after[index] -= milli
            bucket = rows.setdefault((model, len(after)), [])
            where.append(((model, len(after)), len(bucket), after, sum(m for _, m in grant)))
            bucket.append((cpu, mem, tuple(node.gpu_free)))
            bucket.append(
                (
                    cpu - demand.requests.get(CPU, 0),
                    mem - demand.requests.get(MEMORY, 0) // MIB,
                    tuple(after),
                )
            )
        measured = {g: self.node_fragmentations(r, g[0]) for g, r in rows.items()}
        out = []
        for group, i, after, taken in where:
            values = measured[group]
            delta = values[i + 1] - values[i]
            model = group[0]
            if self.scarcity and model:
                delta += self.scarcity_weight * self.scarcity.get(model, 0.0) * taken
            out.append(round(delta, 6) + TIE_SCALE * sum(max(0, f) for f in after))
        return out

    def pick_devices(self, node: NodeView, demand: PodDemand) -> tuple[int, ...] | None:
        """Whole GPUs: the lowest free devices. Shares: device by device, the one whose use
        raises fragmentation least (ties: the tightest fit, then the lowest index); a pod
        asking a share of several devices takes them one after another that way."""
        free = list(node.gpu_free)
        k, milli = demand.gpu_count, demand.gpu_milli
        if k == 0:
            return ()
        if demand.whole_gpus:
            whole = [i for i, f in enumerate(free) if f >= GPU_MILLI]
            return tuple(whole[:k]) if len(whole) >= k else None
        if sum(1 for f in free if f >= milli) < k:
            return None
        model = node.node.gpu_model
        cpu = node.free.get(CPU, 0) - demand.requests.get(CPU, 0)
        mem = (node.free.get(MEMORY, 0) - demand.requests.get(MEMORY, 0)) // MIB
        state, taken = list(free), []
        for _ in range(k):
            # Devices with equal room are interchangeable: score each value once (the
            # lowest index of each). Ties: the tightest fit, then the lowest index.
            options = {
                f: i for i, f in reversed(list(enumerate(state))) if f >= milli and i not in taken
            }
            scored = []
            for value, index in options.items():
                trial = list(state)
                trial[index] -= milli
                scored.append((self.node_fragmentation(cpu, mem, trial, model), value, index))
            index = min(scored)[2]
            taken.append(index)
            state[index] -= milli
        return tuple(sorted(taken))


def _task_of(demand: PodDemand, models: Sequence[str]) -> TaskType:
    return TaskType(
        demand.requests.get(CPU, 0),
        demand.requests.get(MEMORY, 0) // MIB,
        demand.gpu_count,
        demand.gpu_milli if demand.gpu_count else 0,
        tuple(sorted(models)),
    )


def allowed_models(pod: Pod) -> tuple[str, ...]:
    """GPU models a pod is pinned to by nodeSelector or required affinity (empty = any).

    Only the common ``In`` form on the model label counts; anything more complex is
    treated as "any model", which at worst makes the measure a little less precise.
    """
    for key, value in pod.node_selector:
        if key == GPU_MODEL_LABEL:
            return (value,)
    models: set[str] = set()
    for term in pod.affinity:
        reqs = [r for r in term.requirements if r.key == GPU_MODEL_LABEL and r.operator == "In"]
        if not reqs:
            return ()  # one term without a model pin allows every model
        models.update(reqs[0].values)
    return tuple(sorted(models))


def task_type(pod: Pod) -> TaskType:
    """The fit-relevant shape of a domain pod. A pod asking by GPU memory enters as CPU and
    memory only: its thousandths depend on the node it lands on. Kept on the pod object
    (read for every live pod each cycle)."""
    known = getattr(pod, "_task_type", None)
    if isinstance(known, TaskType):
        return known
    made = _task_type(pod)
    object.__setattr__(pod, "_task_type", made)
    return made


def _task_type(pod: Pod) -> TaskType:
    gpu = pod.gpu
    count = gpu.count if gpu is not None and gpu.memory_mib is None else 0
    return TaskType(
        pod.requests.get(CPU, 0),
        pod.requests.get(MEMORY, 0) // MIB,
        count,
        gpu.milli if gpu is not None and count else 0,
        allowed_models(pod) if count else (),
    )


def snapshot_mix(snapshot: Snapshot) -> tuple[WorkloadMix, list[str]]:
    """The task types of every live pod in ``snapshot`` (running and pending: the cluster's
    own mix is the best guess of what arrives next) and the GPU models of its nodes."""
    mix = WorkloadMix()
    for task, n in Counter(task_type(p) for p in snapshot.pods if p.active).items():
        mix.add(task, n)
    return mix, sorted({m for n in snapshot.nodes if (m := n.gpu_model)})


def frozen_capacity(free: Mapping[str, int] | None) -> Callable[[], Mapping[str, int]] | None:
    """A scorer's ``capacity`` reading a copy of ``free`` (None: no model-scarcity term)."""
    if free is None:
        return None
    frozen = dict(free)
    return lambda: frozen


def scorer_for_snapshot(
    snapshot: Snapshot,
    free: Mapping[str, int] | None = None,
    price_weight: float = PRICE_WEIGHT,
) -> FragmentationScorer:
    """A scorer whose target workload is :func:`snapshot_mix`. ``free`` (GPU thousandths
    free per model before the cycle) turns on the model-scarcity term."""
    mix, models = snapshot_mix(snapshot)
    return FragmentationScorer(
        mix, models, capacity=frozen_capacity(free), price_weight=price_weight
    )
