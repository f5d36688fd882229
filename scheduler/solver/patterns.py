"""Node patterns: which multisets of pod shapes fit one node of a class, and how well.

The CP-SAT model does not decide pod by pod. For each node class it counts how many nodes
take each *pattern* (a multiset of pod shapes). A pattern is feasible when the canonical
packer fits it on the class's free state - pods in canonical order (largest first, then by
shape id), each taking devices with :func:`~scheduler.solver.state.pick_devices`. The same
packer (:func:`pack`) later turns each chosen pattern into device grants on a concrete node,
so what the model counts can be realised.

Enumeration is capped per class: one-shape patterns for a few counts (1, 2, 4, the most
that fit), then two-shape mixes that fill the node. The patterns the greedy pass used are
always added, so the greedy answer is a complete, feasible hint. A shape whose pods keep
one per node (required anti-affinity on the hostname among themselves,
:attr:`~scheduler.cluster.pod.Pod.one_per_node`) appears at most once in a pattern: that is
how the model expresses "a gang of 8 with such a rule needs 8 distinct nodes".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod
from scheduler.framework.filters import node_rules_allow
from scheduler.plugins.packing import Strategy
from scheduler.solver.greedy import pod_size
from scheduler.solver.quality import NodeQuality
from scheduler.solver.state import ClassKey, pick_devices, pod_demand

__all__ = [
    "ClassInfo",
    "Demand",
    "Pattern",
    "PatternSet",
    "canonical",
    "demand_of",
    "enumerate_patterns",
    "pack",
]

#: A pattern: sorted (shape id, count) pairs.
Pattern = tuple[tuple[int, int], ...]


@dataclass
class ClassInfo:
    """A node class at the start of the cycle: its free state, traits and member nodes."""

    key: ClassKey
    node: Node  # a member (traits and allocatable are the same for all members)
    members: list[str]

    @property
    def free(self) -> dict[str, int]:
        """Free resources of every member."""
        return dict(self.key[1])

    @property
    def gpu_free(self) -> list[int]:
        """Free thousandths per device (sorted; device identity does not matter here)."""
        return list(self.key[2])


def canonical(pods: Sequence[Pod]) -> list[Pod]:
    """Pods in the order the packer places them: largest first (stable for equal sizes)."""
    return sorted(pods, key=pod_size, reverse=True)


#: (requests items, device count, thousandths per device)
Demand = tuple[tuple[tuple[str, int], ...], int, int]


def _take(
    free: dict[str, int], gpu_free: list[int], d: Demand, spread: bool
) -> tuple[int, ...] | None:
    requests, count, milli = d
    for k, v in requests:
        if v > 0 and free.get(k, 0) < v:
            return None
    devices = pick_devices(gpu_free, count, milli, spread=spread)
    if devices is None:
        return None
    for k, v in requests:
        free[k] = free.get(k, 0) - v
    for i in devices:
        gpu_free[i] -= milli
    return devices


def demand_of(pod: Pod, node: Node) -> Demand | None:
    """The pod's demand on ``node`` as plain data; None when it cannot be sized there."""
    d = pod_demand(pod, node)
    if d is None:
        return None
    return (tuple(d.requests.items()), d.gpu_count, d.gpu_milli)


def pack(
    node: Node,
    free: dict[str, int],
    gpu_free: list[int],
    pods: Sequence[Pod],
    *,
    spread: bool = False,
) -> list[tuple[tuple[int, int], ...]] | None:
    """Pack ``pods`` in the given order on a node state (changed in place).

    Returns each pod's device grant, or None when they do not all fit. Callers pass pods in
    :func:`canonical` order.
    """
    grants: list[tuple[tuple[int, int], ...]] = []
    for pod in pods:
        d = demand_of(pod, node)
        if d is None:
            return None
        devices = _take(free, gpu_free, d, spread)
        if devices is None:
            return None
        grants.append(tuple((i, d[2]) for i in devices))
    return grants


@dataclass
class PatternSet:
    """Feasible patterns of one class with their quality change (after minus before)."""

    patterns: list[Pattern] = field(default_factory=list)
    delta: list[int] = field(default_factory=list)
    #: While enumerating: the state each pattern leaves (free resources, devices).
    states: list[tuple[dict[str, int], list[int]]] = field(default_factory=list)


def enumerate_patterns(
    info: ClassInfo,
    shapes: Sequence[Pod],
    demand: Sequence[int],
    required: Sequence[Pattern],
    *,
    gpu: Strategy,
    quality: NodeQuality | None,
    cap: int,
    sized: dict[tuple[int, object], Demand | None] | None = None,
) -> PatternSet:
    """Patterns for ``info`` (see the module docstring), at most ``cap`` plus ``required``.

    ``shapes[i]`` is a pod of shape i (shape ids follow canonical order: a lower id is never
    smaller) and ``demand[i]`` how many pods of that shape the cycle asks for. Each
    pattern's ``delta`` is the change of ``quality``'s cost from the class's state to the
    state the pattern leaves (0 without a measure).

    ``sized``: a cache the caller keeps over one model's classes (same ``shapes``): shape
    and static traits -> the shape's demand there, None when the node rules refuse it. The
    rules and the demand read only a node's static traits, which the first part of a class
    key names, and a model has far more classes than kinds of node.
    """
    out = _enumerate(info, shapes, demand, required, gpu == "spread", cap, sized)
    if quality is None:
        out.delta = [0] * len(out.patterns)
    else:
        before, *after = quality.costs(info.node, [(info.free, info.gpu_free), *out.states])
        out.delta = [a - before for a in after]
    out.states = []
    return out


def _enumerate(
    info: ClassInfo,
    shapes: Sequence[Pod],
    demand: Sequence[int],
    required: Sequence[Pattern],
    spread: bool,
    cap: int,
    sized: dict[tuple[int, object], Demand | None] | None = None,
) -> PatternSet:
    """The patterns of :func:`enumerate_patterns` with the states they leave."""
    node = info.node
    base_free, base_gpu = info.free, info.gpu_free
    out = PatternSet()
    seen: set[Pattern] = set()

    def record(pattern: Pattern, free: dict[str, int], gpu_free: list[int]) -> None:
        if pattern not in seen:
            seen.add(pattern)
            out.patterns.append(pattern)
            out.states.append((free, gpu_free))

    demands: dict[int, Demand] = {}
    sizes = {} if sized is None else sized
    static = info.key[0]
    for s, pod in enumerate(shapes):
        if demand[s] <= 0:
            continue
        if (s, static) in sizes:
            d = sizes[(s, static)]
        else:
            d = sizes[(s, static)] = demand_of(pod, node) if node_rules_allow(pod, node) else None
        if d is not None:
            demands[s] = d

    for pattern in required:
        free, gpu_free = dict(base_free), list(base_gpu)
        ok = all(
            s in demands and _take(free, gpu_free, demands[s], spread) is not None
            for s, k in pattern
            for _ in range(k)
        )
        if ok:
            record(pattern, free, gpu_free)

    # one shape: counts 1, 2, 4, ..., and the most that fit (one of a one-per-node shape)
    most: dict[int, int] = {}
    for s, d in demands.items():
        free, gpu_free = dict(base_free), list(base_gpu)
        k = 0
        states: list[tuple[dict[str, int], list[int]]] = []
        limit = 1 if shapes[s].one_per_node else demand[s]
        while k < limit and _take(free, gpu_free, d, spread) is not None:
            k += 1
            states.append((dict(free), list(gpu_free)))
        if not k:
            continue
        most[s] = k
        for n in sorted({1, 2, 4, k - 1, k} & set(range(1, k + 1))):
            if len(out.patterns) >= cap:
                break
            record(((s, n),), *states[n - 1])
    # two shapes: n of the larger, then fill with the smaller
    fits = sorted(most)
    for i, a in enumerate(fits):
        for b in fits[i + 1 :]:
            for na in sorted({1, most[a] // 2} - {0}):
                if len(out.patterns) >= cap:
                    return out
                free, gpu_free = dict(base_free), list(base_gpu)
                for _ in range(na):
                    _take(free, gpu_free, demands[a], spread)
                nb = 0
                limit = 1 if shapes[b].one_per_node else demand[b]
                while nb < limit and _take(free, gpu_free, demands[b], spread) is not None:
                    nb += 1
                if nb:
                    record(((a, na), (b, nb)), free, gpu_free)
    return out
