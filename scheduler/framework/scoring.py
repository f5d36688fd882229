"""Node scoring: the extension point the greedy placement uses to rank candidate nodes.

Contract (read before implementing a scorer):

- A scorer sees a node *before* the pod lands (:class:`NodeView`), the pod's demand
  (:class:`PodDemand`) and the device grant the pod would get (device index -> thousandths;
  empty for pods without GPUs). It returns a float; **lower is better**. Scores of different
  nodes for the same pod are compared; the absolute value means nothing.
- The score must depend only on what the view exposes *except the node name*: free
  resources, free thousandths per device, allocatable, labels/taints, device memory. The
  solver groups identical nodes into equivalence classes and scores one representative per
  class, so a scorer that looks at the name (or keeps hidden state) is scored wrongly.
- Feasibility is not the scorer's job: it is only asked about nodes where the pod fits
  (resources, devices, taints, selectors, affinity, node ready and schedulable).
- Scorers are called many thousands of times per cycle: keep them O(devices).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol, runtime_checkable

from scheduler.cluster.node import GPU_MILLI, Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.resources import GPU, PODS, Resources

__all__ = [
    "BatchScorer",
    "Candidate",
    "DevicePicker",
    "HoldsShares",
    "NodeScorer",
    "NodeView",
    "PodDemand",
    "ScoreKey",
    "pod_demand",
]


class NodeView(Protocol):
    """Read-only view of a node's current state during placement."""

    @property
    def node(self) -> Node:
        """The node (allocatable, labels, taints, device memory)."""
        ...

    @property
    def free(self) -> Mapping[str, int]:
        """Allocatable minus what bound and tentatively placed pods use (``pods`` included)."""
        ...

    @property
    def gpu_free(self) -> Sequence[int]:
        """Free thousandths of each GPU device, by device index."""
        ...


@dataclass(frozen=True, slots=True)
class PodDemand:
    """What one pod takes from a node, resolved for that node.

    ``requests`` are node resources (``nvidia.com/gpu`` included for whole-GPU pods, ``pods``
    = 1 when the node limits pod count). ``gpu_count`` devices each lose ``gpu_milli``
    thousandths (1000 for whole devices); ``gpu_count`` is 0 for CPU-only pods.
    """

    requests: Resources
    gpu_count: int = 0
    gpu_milli: int = 0

    @property
    def whole_gpus(self) -> bool:
        """True when the pod takes whole devices (no sharing)."""
        return self.gpu_count > 0 and self.gpu_milli >= 1000


class NodeScorer(Protocol):
    """Ranks feasible nodes for a pod; see the module docstring for the contract."""

    def score(self, node: NodeView, demand: PodDemand, grant: Sequence[tuple[int, int]]) -> float:
        """Cost of placing a pod with ``demand`` on ``node`` taking ``grant``; lower is better."""
        ...


@runtime_checkable
class DevicePicker(Protocol):
    """Optional second role of a scorer: choose the devices a GPU pod takes on a node.

    Return ``gpu_count`` distinct device indices, each with at least ``gpu_milli`` free (for
    whole GPUs: entirely free), or None when the pod does not fit. Must be deterministic and
    must not depend on the node name (same reason as for scoring).
    """

    def pick_devices(self, node: NodeView, demand: PodDemand) -> tuple[int, ...] | None:
        """Device indices for the pod, or None."""
        ...


@runtime_checkable
class ScoreKey(Protocol):
    """Optional: tell the greedy which part of a node's state the score depends on.

    Two nodes with the same static traits, the same free thousandths per device and the same
    ``score_key`` must get the same score for the same pod; the greedy then scores once per
    key instead of once per node class (classes differ in every free resource, which in
    real clusters makes almost every node its own class). Return None to say "nothing
    beyond devices and static traits".
    """

    def score_key(self, node: NodeView) -> object:
        """Hashable summary of what :meth:`NodeScorer.score` reads besides devices."""
        ...


@runtime_checkable
class HoldsShares(Protocol):
    """Optional: a scorer that may keep a pod taking part of one device off a node class
    even though it fits there (see :mod:`scheduler.plugins.strand_guard`). The greedy asks
    before it takes a class whose devices include an idle one; a reason means "not here":
    the search goes on, and a pod held everywhere fails with that reason."""

    def may_hold(self, pod: Pod) -> bool:
        """Whether the rule applies to ``pod`` at all (on, and the pod has not waited its
        longest yet)."""
        ...

    def held(
        self, model: str | None, count: int, milli: int, before: int, room: tuple[int, int]
    ) -> str | None:
        """Why a pod taking ``milli`` thousandths of ``count`` device(s) of GPU model
        ``model``, one of which had ``before`` free, should wait (None: it may go there).
        ``room``: (free, total) GPU thousandths of the model's placeable nodes."""
        ...


#: One candidate for :class:`BatchScorer`: the node, the pod's demand there, its devices.
Candidate = tuple[NodeView, PodDemand, Sequence[tuple[int, int]]]


@runtime_checkable
class BatchScorer(Protocol):
    """Optional: score many candidates of one pod at once (the greedy ranks every node class
    for a shape in one call when it can). Must return exactly
    ``[score(*c) for c in candidates]``; it only saves the per-call cost."""

    def score_many(self, candidates: Sequence[Candidate]) -> list[float]:
        """:meth:`NodeScorer.score` of each candidate, in order."""
        ...


@lru_cache(maxsize=4096)
def _plus_one_pod(requests: Resources) -> Resources:
    # Pods of one shape share equal request lists; building Resources is not cheap.
    return requests + {PODS: 1}


def pod_demand(pod: Pod, node: Node) -> PodDemand | None:
    """What ``pod`` takes from ``node``; None when its GPU share cannot be sized there."""
    requests = pod.requests
    if node.allocatable.get(PODS, 0) > 0:
        requests = _plus_one_pod(requests)
    if pod.gpu is not None:
        milli = pod.gpu.milli_on(node)
        if milli is None:
            return None
        return PodDemand(requests, pod.gpu.count, min(milli, GPU_MILLI))
    whole = pod.requests.get(GPU, 0)
    if whole > 0:
        return PodDemand(requests, whole, GPU_MILLI)
    return PodDemand(requests)
