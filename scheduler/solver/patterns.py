"""Node patterns: which multisets of pod shapes fit one node of a class, and how well.

The CP-SAT model does not decide pod by pod. For each node class it counts how many nodes
take each *pattern* (a multiset of pod shapes). A pattern is feasible when the canonical
packer (:func:`pack`) fits it on the class's free state; the same packer later turns each
chosen pattern into concrete device grants on a concrete node, so what the model counts can
always be realised.

Enumeration is capped per class. The patterns the greedy pass used are always added, so the
greedy answer is a complete, feasible hint of the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.selectors import node_accepts
from scheduler.plugins.packing import Strategy, node_cost
from scheduler.solver.greedy import pod_size
from scheduler.solver.state import ClassKey, pick_devices, pod_demand

__all__ = ["ClassInfo", "Pattern", "PatternSet", "enumerate_patterns", "pack"]

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


def pack(
    node: Node,
    free: dict[str, int],
    gpu_free: list[int],
    pods: Sequence[Pod],
    *,
    spread: bool = False,
) -> list[tuple[tuple[int, int], ...]] | None:
    """Canonical packing of ``pods`` (largest first) on a node state, changed in place.

    Returns the device grant of each pod in the order of ``sorted(pods, key=pod_size,
    reverse=True)``, or None when they do not all fit.
    """
    grants: list[tuple[tuple[int, int], ...]] = []
    for pod in sorted(pods, key=pod_size, reverse=True):
        demand = pod_demand(pod, node)
        if demand is None:
            return None
        if any(free.get(k, 0) < v for k, v in demand.requests.items() if v > 0):
            return None
        devices = pick_devices(gpu_free, demand.gpu_count, demand.gpu_milli, spread=spread)
        if devices is None:
            return None
        for k, v in demand.requests.items():
            free[k] = free.get(k, 0) - v
        for i in devices:
            gpu_free[i] -= demand.gpu_milli
        grants.append(tuple((i, demand.gpu_milli) for i in devices))
    return grants


@dataclass
class PatternSet:
    """Feasible patterns of one class with their quality change (after minus before)."""

    patterns: list[Pattern]
    delta: list[int]


def _quality_delta(
    info: ClassInfo, pods: Sequence[Pod], gpu: Strategy, cpu: Strategy, spread: bool
) -> int | None:
    free, gpu_free = info.free, info.gpu_free
    before = node_cost(info.node, free, gpu_free, gpu, cpu)
    if pack(info.node, free, gpu_free, pods, spread=spread) is None:
        return None
    return node_cost(info.node, free, gpu_free, gpu, cpu) - before


def enumerate_patterns(
    info: ClassInfo,
    shapes: Sequence[Pod],
    demand: Sequence[int],
    required: Sequence[Pattern],
    *,
    gpu: Strategy,
    cpu: Strategy,
    cap: int,
) -> PatternSet:
    """Patterns for ``info``: the ``required`` ones (greedy's), then one-shape fills, then
    two-shape mixes, up to ``cap`` in total. ``shapes[i]`` is a pod of shape i and
    ``demand[i]`` how many pods of that shape the cycle asks for (a pattern never uses more).
    """
    spread = gpu == "spread"
    out = PatternSet([], [])
    seen: set[Pattern] = set()

    def add(pattern: Pattern) -> bool:
        if pattern in seen or not pattern:
            return pattern in seen
        pods = [shapes[s] for s, n in pattern for _ in range(n)]
        delta = _quality_delta(info, pods, gpu, cpu, spread)
        if delta is None:
            return False
        seen.add(pattern)
        out.patterns.append(pattern)
        out.delta.append(delta)
        return True

    for pattern in required:
        add(pattern)
    fits = [
        s
        for s, pod in enumerate(shapes)
        if demand[s] > 0
        and node_accepts(info.node, pod.tolerations, pod.node_selector, pod.affinity)
        and add(((s, 1),))
    ]
    # Bigger pods first: they are the ones that need whole nodes.
    fits.sort(key=lambda s: pod_size(shapes[s]), reverse=True)
    most: dict[int, int] = {}
    for s in fits:
        k = 1
        while k < demand[s] and len(out.patterns) < cap and add(((s, k + 1),)):
            k += 1
        most[s] = k
    for i, a in enumerate(fits):
        for b in fits[i + 1 :]:
            if len(out.patterns) >= cap:
                return out
            # a few mixes: n of a, then as many b as fit
            for na in sorted({1, max(1, most[a] // 2), max(1, most[a] - 1)}):
                nb = 0
                while nb < demand[b] and add(tuple(sorted(((a, na), (b, nb + 1))))):
                    nb += 1
                if len(out.patterns) >= cap:
                    return out
    return out
