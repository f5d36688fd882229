"""Binpack and spread: the placement-quality measure and the default node scorers.

Placement quality is a small integer cost per node state (lower is better), chosen
separately for GPU nodes (``gpu_strategy``) and nodes without GPUs (``cpu_strategy``), as KAI
does. The CP-SAT objective sums the change of this cost over nodes; the greedy scorers rank
nodes by the same change, with a sub-unit tie-break towards the tightest (binpack) or
emptiest (spread) node.

binpack (GPU nodes)
    ``4`` if the node is partly used (some device used, some thousandths still free)
    ``+ 2`` per partly used device (fractional fragments)
    so filling a partly used node or device lowers the cost and opening a fresh one raises it.
spread (GPU nodes)
    ``u * u`` where ``u`` is the node's used GPU capacity in eighths: convex, so evening out
    the load lowers the total.
The same two rules apply to CPU (millicores) on nodes without GPUs, except that spread there
reads memory as well: ``(c * c + m * m) // 2`` with ``c`` and ``m`` the used CPU and memory in
eighths. The greedy ranks such nodes as kube-scheduler does (LeastAllocated and
BalancedAllocation over both, :mod:`scheduler.plugins.leastallocated`); a CPU-only cost let
CP-SAT's answer, which wins when its objective is better, fill a small node's memory with a
pod that kube-scheduler puts on a node with room in both, and the next pod found none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Literal

from scheduler.cluster.node import GPU_MILLI, Node
from scheduler.cluster.resources import CPU
from scheduler.framework.scoring import NodeView, PodDemand
from scheduler.plugins.leastallocated import MAX_SCORE, RESOURCES, spread_cost

__all__ = [
    "MAX_NODE_COST",
    "PackingScorer",
    "Strategy",
    "gpu_node_cost",
    "node_cost",
    "node_cost_after",
]

#: Same values as :data:`scheduler.solver.placement.Strategy` (kept here to avoid an import
#: cycle: the solver imports this module).
Strategy = Literal["binpack", "spread"]

#: Upper bound of :func:`node_cost` for any node (used to scale objective weights).
MAX_NODE_COST = 64


def _eighths(used: int, total: int) -> int:
    return (8 * used + total // 2) // total if total > 0 else 0


@lru_cache(maxsize=65536)
def gpu_node_cost(gpu_free: tuple[int, ...], gpu_strategy: Strategy) -> int:
    """:func:`node_cost` of a GPU node: it reads only the devices (cached: the same few
    device states recur on thousands of nodes)."""
    total = GPU_MILLI * len(gpu_free)
    free_milli = sum(gpu_free)
    if min(gpu_free) < 0:  # overcommitted device: count it as full, not below
        free_milli = sum(max(0, f) for f in gpu_free)
    used = total - free_milli
    if gpu_strategy == "spread":
        u = _eighths(used, total)
        return u * u
    partial_devices = sum(1 for f in gpu_free if 0 < f < GPU_MILLI)
    partial_node = 1 if used > 0 and free_milli > 0 else 0
    return 4 * partial_node + 2 * partial_devices


def node_cost(
    node: Node,
    free: Mapping[str, int],
    gpu_free: Sequence[int],
    gpu_strategy: Strategy,
    cpu_strategy: Strategy,
) -> int:
    """Quality cost of a node in the given state (see the module docstring)."""
    if gpu_free:
        return gpu_node_cost(tuple(gpu_free), gpu_strategy)
    alloc = node.allocatable[CPU]
    if cpu_strategy == "spread":
        # convex in both, and lowest when CPU and memory are used alike (stays <= 64)
        squares = 0
        for r in RESOURCES:
            total = node.allocatable.get(r, 0)
            if total > 0:
                u = _eighths(total - max(0, free.get(r, 0)), total)
                squares += u * u
        return squares // len(RESOURCES)
    if alloc <= 0:
        return 0
    used = alloc - max(0, free.get(CPU, 0))
    return 4 if 0 < used < alloc else 0


def node_cost_after(
    view: NodeView,
    demand: PodDemand,
    grant: Sequence[tuple[int, int]],
    gpu_strategy: Strategy,
    cpu_strategy: Strategy,
) -> int:
    """:func:`node_cost` of ``view`` once a pod with ``demand`` took ``grant``."""
    # node_cost reads only CPU and memory of the free resources; copy just those (this runs
    # per class and pod shape in the greedy).
    free = {r: view.free.get(r, 0) - demand.requests.get(r, 0) for r in RESOURCES}
    gpu_free = list(view.gpu_free)
    for index, milli in grant:
        gpu_free[index] -= milli
    return node_cost(view.node, free, gpu_free, gpu_strategy, cpu_strategy)


class PackingScorer:
    """Default :class:`~scheduler.framework.NodeScorer`: change of :func:`node_cost`.

    Ties (equal cost change) go to the node left with the least free capacity (binpack) or
    the most (spread), measured on GPUs for GPU nodes and on CPU otherwise.
    """

    def __init__(self, gpu_strategy: Strategy = "binpack", cpu_strategy: Strategy = "binpack"):
        self.gpu_strategy: Strategy = gpu_strategy
        self.cpu_strategy: Strategy = cpu_strategy

    def score_key(self, node: NodeView) -> object:
        """GPU nodes are scored on devices alone; other nodes on their free CPU (and memory,
        under ``cpu_strategy: spread``)."""
        if node.gpu_free:
            return None
        if self.cpu_strategy == "spread":
            return tuple(node.free.get(r, 0) for r in RESOURCES)
        return node.free.get(CPU, 0)

    def score(self, node: NodeView, demand: PodDemand, grant: Sequence[tuple[int, int]]) -> float:
        """Cost change (integer part) plus a tie-break in [0, 1). Nodes without GPUs under
        ``cpu_strategy: spread`` are ranked as kube-scheduler ranks them
        (:func:`~scheduler.plugins.leastallocated.spread_cost`, in [0, 1])."""
        if not node.gpu_free and self.cpu_strategy == "spread":
            return spread_cost(node, demand)
        before = node_cost(
            node.node, node.free, node.gpu_free, self.gpu_strategy, self.cpu_strategy
        )
        after = node_cost_after(node, demand, grant, self.gpu_strategy, self.cpu_strategy)
        gpus = node.gpu_free
        if gpus:
            free_milli = sum(gpus) if min(gpus) >= 0 else sum(max(0, f) for f in gpus)
            left = (free_milli - sum(m for _, m in grant)) / (GPU_MILLI * len(gpus))
            strategy = self.gpu_strategy
        else:
            alloc = node.node.allocatable[CPU]
            left = (node.free.get(CPU, 0) - demand.requests[CPU]) / alloc if alloc > 0 else 0.0
            strategy = self.cpu_strategy
        left = min(max(left, 0.0), 1.0) * 0.999
        tie = left if strategy == "binpack" else 0.999 - left
        return float(after - before) + tie

    def resource_points(self, node: NodeView, score: float) -> float | None:
        """kube-scheduler's resource score of ``node`` (NodeResourcesFit plus
        NodeResourcesBalancedAllocation, 0-200) recovered from its :meth:`score`, when the
        node is ranked as kube-scheduler ranks it (no GPUs, ``cpu_strategy: spread``); None
        otherwise. The greedy adds preferences to it as kube-scheduler adds its scores."""
        if node.gpu_free or self.cpu_strategy != "spread":
            return None
        return (1.0 - score) * MAX_SCORE
