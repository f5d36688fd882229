"""Node filters: does this pod fit this node, and if not, why - one small plugin per rule.

The shape follows kube-scheduler's framework: each :class:`Filter` answers for one (pod,
node) pair with None (fits) or a short reason worded as kube-scheduler words it, so a user
who knows ``0/5 nodes are available: 3 Insufficient cpu`` reads ours the same way.
:data:`DEFAULT_FILTERS` is the chain in kube-scheduler's order; :func:`first_failure` runs a
chain and :func:`format_unavailable` words a tally of refusals over every node.

The placement passes (greedy, the CP-SAT patterns, the relaxation bound, the guided pass)
ask the static part of the chain through :func:`node_rules_allow` (cached per node class)
and the dynamic part through :class:`scheduler.plugins.podtopology.PodTopology`, which the
topology filter wraps; explanations run the whole chain. So every stage answers the same
question the same way, and a new node rule is one plugin here. The validator keeps its
own implementation of the topology rules on purpose (:mod:`scheduler.solver.validate_topology`):
an independent check is its point.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.quantity import format_milli
from scheduler.cluster.resources import GPU, PODS
from scheduler.cluster.selectors import affinity_matches, node_selector_matches, tolerates
from scheduler.framework.scoring import NodeView, PodDemand

__all__ = [
    "DEFAULT_FILTERS",
    "NODE_RULES",
    "Filter",
    "FilterInput",
    "first_failure",
    "format_unavailable",
    "node_rules_allow",
]


@dataclass(frozen=True, slots=True)
class FilterInput:
    """What a filter sees: the node's state, the pod's demand there (None when its GPU share
    cannot be sized on that node), and the topology check of the pod (None: unrestricted)."""

    view: NodeView
    demand: PodDemand | None
    topology: Callable[[str], str | None] | None = None


class Filter(Protocol):
    """One placement rule."""

    #: kube-scheduler's plugin name for the same rule (for logs and docs).
    name: str

    def __call__(self, pod: Pod, node: FilterInput) -> str | None:
        """None when ``pod`` may go to the node as far as this rule goes, else the reason."""
        ...


class _Unschedulable:
    name = "NodeUnschedulable"

    def __call__(self, pod: Pod, node: FilterInput) -> str | None:
        n = node.view.node
        if n.unschedulable:
            return "node(s) were unschedulable"
        if not n.ready:
            return "node(s) were not ready"
        return None


class _Taints:
    name = "TaintToleration"

    def __call__(self, pod: Pod, node: FilterInput) -> str | None:
        if tolerates(pod.tolerations, node.view.node.taints):
            return None
        return "node(s) had untolerated taint"


class _NodeAffinity:
    name = "NodeAffinity"

    def __call__(self, pod: Pod, node: FilterInput) -> str | None:
        if not pod.node_selector and not pod.affinity:
            return None  # nothing to match (and no label map to build for it)
        n = node.view.node
        labels = {**n.label_map, "metadata.name": n.name}
        if node_selector_matches(pod.node_selector, labels) and affinity_matches(
            pod.affinity, labels
        ):
            return None
        if pod.volume_affinity:
            return "node(s) didn't match Pod's node affinity/selector or volume node affinity"
        return "node(s) didn't match Pod's node affinity/selector"


class _Resources:
    name = "NodeResourcesFit"

    def __call__(self, pod: Pod, node: FilterInput) -> str | None:
        demand = node.demand
        if demand is None:
            return "node(s) had no GPU memory label large enough for the GPU share"
        free = node.view.free
        for r, v in sorted(demand.requests.items()):
            if v > 0 and free.get(r, 0) < v:
                return "Too many pods" if r == PODS else f"Insufficient {r}"
        return None


class _Devices:
    name = "GPUDevices"

    def __call__(self, pod: Pod, node: FilterInput) -> str | None:
        demand = node.demand
        if demand is None or not demand.gpu_count:
            return None
        milli = min(demand.gpu_milli, 1000)
        if sum(1 for f in node.view.gpu_free if f >= milli) >= demand.gpu_count:
            return None
        if milli >= 1000:
            return f"Insufficient {GPU} (whole free devices)"
        return f"Insufficient GPU share ({format_milli(milli)} of one device)"


class _Topology:
    name = "InterPodAffinity/PodTopologySpread"

    def __call__(self, pod: Pod, node: FilterInput) -> str | None:
        return node.topology(node.view.node.name) if node.topology is not None else None


#: The chain, in kube-scheduler's order.
DEFAULT_FILTERS: tuple[Filter, ...] = (
    _Unschedulable(),
    _Taints(),
    _NodeAffinity(),
    _Resources(),
    _Devices(),
    _Topology(),
)


#: The rules that depend only on the pod and the node's static traits (labels, taints):
#: the placement passes ask them once per node class through :func:`node_rules_allow`.
NODE_RULES: tuple[Filter, ...] = (_Taints(), _NodeAffinity())


@dataclass(frozen=True, slots=True)
class _Static:
    """A node seen only by its traits (for :data:`NODE_RULES`)."""

    node: Node
    free: Mapping[str, int] = field(default_factory=dict)
    gpu_free: Sequence[int] = ()


def node_rules_allow(pod: Pod, node: Node) -> bool:
    """True when :data:`NODE_RULES` (taints, node selector, required node affinity) allow
    ``pod`` on ``node`` - the question every placement stage asks per node class."""
    view = FilterInput(_Static(node), None)
    return all(f(pod, view) is None for f in NODE_RULES)


def first_failure(
    pod: Pod, node: FilterInput, filters: Sequence[Filter] = DEFAULT_FILTERS
) -> str | None:
    """The reason of the first filter that refuses the node, or None when all accept it."""
    for f in filters:
        reason = f(pod, node)
        if reason is not None:
            return reason
    return None


def format_unavailable(total: int, tally: Mapping[str, int]) -> str:
    """``0/5 nodes are available: 3 Insufficient cpu, 2 node(s) had untolerated taint``
    (most frequent reason first, as kube-scheduler writes it)."""
    refused = sorted(tally.items(), key=lambda kv: (-kv[1], kv[0]))
    free = total - sum(tally.values())
    return f"{free}/{total} nodes are available: " + ", ".join(f"{n} {r}" for r, n in refused)
