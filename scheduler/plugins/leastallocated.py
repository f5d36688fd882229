"""kube-scheduler's default resource scores for a node without GPUs: NodeResourcesFit with
``LeastAllocated`` and NodeResourcesBalancedAllocation, both over CPU and memory with equal
weights, in the integer steps of kube-scheduler 1.37 (the release the test control plane
runs, ``testenv/versions.env``):

- LeastAllocated: per resource ``(allocatable - requested) * 100 // allocatable`` with the
  pod on the node (0 when over), averaged: emptier nodes score higher, CPU and memory alike.
- BalancedAllocation: the balance of a node is ``(1 - std) * 100`` of its requested
  fractions (capped at 1), for two resources ``1 - |cpu - memory| / 2``; the score is
  ``50 + (50 + balance with the pod - balance without it) // 2``, so a pod that evens a
  node's CPU and memory out scores higher there, and a memory-heavy pod goes where memory
  is plentiful rather than where CPU is.

:class:`~scheduler.plugins.packing.PackingScorer` ranks nodes without GPUs by their sum
under ``cpu_strategy: spread``. Measuring only CPU (as the node cost does) put a pod that
takes a node's last memory on it while a node with room in both stood empty, and a later
pod then found no node where kube-scheduler, which scores both, had left that room
(the differential test against kube-scheduler, ``tests/differential``).
"""

from __future__ import annotations

from scheduler.cluster.resources import CPU, MEMORY
from scheduler.framework.scoring import NodeView, PodDemand

__all__ = ["MAX_SCORE", "RESOURCES", "kube_resource_score", "spread_cost"]

#: The resources both scores read, with kube-scheduler's default weight 1 each.
RESOURCES = (CPU, MEMORY)
#: Highest sum of the two scores (100 each).
MAX_SCORE = 200


def _balance(fractions: list[float]) -> int:
    """``(1 - std) * 100`` of the fractions, truncated as kube-scheduler does."""
    mean = sum(fractions) / len(fractions)
    std = (sum((f - mean) ** 2 for f in fractions) / len(fractions)) ** 0.5
    return int((1 - std) * 100)


def kube_resource_score(node: NodeView, demand: PodDemand) -> int:
    """LeastAllocated plus BalancedAllocation of ``node`` for a pod with ``demand`` (0-200,
    higher is better)."""
    alloc = node.node.allocatable
    least = 0
    counted = 0
    before: list[float] = []
    after: list[float] = []
    for r in RESOURCES:
        total = alloc.get(r, 0)
        if total <= 0:
            continue  # kube-scheduler leaves a resource the node does not have out
        used = total - node.free.get(r, 0)
        requested = used + demand.requests.get(r, 0)
        least += (total - requested) * 100 // total if requested <= total else 0
        counted += 1
        before.append(min(1.0, max(0.0, used / total)))
        after.append(min(1.0, max(0.0, requested / total)))
    if not counted:
        return 0
    balanced = 50 + (50 + _balance(after) - _balance(before)) // 2
    return least // counted + balanced


def spread_cost(node: NodeView, demand: PodDemand) -> float:
    """:func:`kube_resource_score` as a cost in [0, 1] (lower is better, as scorers rank).

    Nodes kube-scheduler scores the same (it picks one of them at random) are told apart by
    their ``NoSchedule``/``NoExecute`` taints, more first: the pod tolerates them (it is
    only asked about nodes it may use), and fewer other pods may use such a node, so the
    untainted one is left for them. The tie-break stays below one score step."""
    hard = sum(1 for t in node.node.taints if t.effect != "PreferNoSchedule")
    tie = 0.5 * hard / (hard + 1)
    return (MAX_SCORE - kube_resource_score(node, demand) - tie) / MAX_SCORE
