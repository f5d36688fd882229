"""Free capacity after a cycle's assignments, grouped so questions about thousands of nodes
stay cheap.

Nodes are looked at through a pod's *placement rules* (tolerations, nodeSelector, required
affinity): every distinct set of rules is matched against the nodes once, and the matching
schedulable nodes are folded into *shapes* (identical free resources and free GPU devices)
with a count. Fit questions are then answered per shape, not per node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scheduler.cluster.node import GPU_MILLI, Node, Taint
from scheduler.cluster.pod import GpuRequest, Pod
from scheduler.cluster.resources import GPU, PODS
from scheduler.cluster.selectors import (
    NodeSelectorTerm,
    Toleration,
    affinity_matches,
    node_selector_matches,
    tolerates,
)
from scheduler.cluster.snapshot import NodeState, Snapshot, bound_usage

if TYPE_CHECKING:
    # Type only: scheduler.solver imports this package, so a runtime import would be circular.
    from scheduler.solver.placement import PodAssignment

__all__ = ["FreeCapacity", "Matching", "NodeGroup", "Rules", "Shape", "pod_rules", "uses_node_name"]

#: The placement rules of a pod, hashable: (tolerations, nodeSelector, affinity terms).
Rules = tuple[tuple[Toleration, ...], tuple[tuple[str, str], ...], tuple[NodeSelectorTerm, ...]]


def pod_rules(pod: Pod) -> Rules:
    """The pod's placement rules as one hashable value."""
    return (pod.tolerations, pod.node_selector, pod.affinity)


@dataclass(frozen=True, slots=True)
class Shape:
    """Free resources of a node (GPU devices free thousandths, largest first) and the total
    it could ever offer."""

    free: tuple[tuple[str, int], ...]
    gpu_free: tuple[int, ...]
    gpu_memory_mib: int | None
    allocatable: tuple[tuple[str, int], ...]

    def free_of(self, resource: str) -> int:
        """Free amount of one resource."""
        for name, value in self.free:
            if name == resource:
                return value
        return 0

    def allocatable_of(self, resource: str) -> int:
        """Allocatable amount of one resource."""
        for name, value in self.allocatable:
            if name == resource:
                return value
        return 0


@dataclass
class Matching:
    """Nodes that a set of placement rules allows, and why the others are excluded."""

    #: Shapes of matching schedulable nodes, with how many nodes have each.
    shapes: Counter[Shape] = field(default_factory=Counter)
    #: Nodes that satisfy nodeSelector, affinity and taints but are cordoned or NotReady.
    unschedulable: int = 0
    #: How many nodes pass nodeSelector; pass nodeSelector and affinity.
    selector_ok: int = 0
    affinity_ok: int = 0
    #: Taints that turned away nodes passing nodeSelector and affinity (taint -> nodes).
    blocking_taints: Counter[Taint] = field(default_factory=Counter)


def _device_take(
    devices: list[int], grant: tuple[tuple[int, int], ...], count: int, milli: int
) -> None:
    if grant:
        for index, m in grant:
            if 0 <= index < len(devices):
                devices[index] -= m
        return
    for _ in range(count):
        if not devices:
            return
        best = max(range(len(devices)), key=lambda i: devices[i])
        devices[best] -= milli


#: One group of nodes as a caller that already aggregated them sees it: a member node
#: (labels, taints, allocatable, device memory), its free resources and free thousandths per
#: device, how many nodes share exactly that, and whether they take new pods.
NodeGroup = tuple[Node, Iterable[tuple[str, int]], Iterable[int], int, bool]


@dataclass
class _Traits:
    """Nodes with the same labels and taints (and name, when pods select by name)."""

    node: Node
    labels: dict[str, str]
    size: int = 0
    unschedulable: int = 0
    shapes: Counter[Shape] = field(default_factory=Counter)


def uses_node_name(pod: Pod) -> bool:
    """True when the pod's required affinity names nodes (``matchFields metadata.name``)."""
    return any(r.key == "metadata.name" for t in pod.affinity for r in t.requirements)


class FreeCapacity:
    """Free resources after ``assignments``, grouped by node traits, and rule matching with a
    cache.

    Matching a set of rules costs one check per group of nodes with equal labels and taints,
    not one per node. Build it from a snapshot (``FreeCapacity(snapshot, assignments)``) or,
    when the caller already grouped nodes (the solver's node classes), with
    :meth:`from_groups` - then nothing is recomputed per node.
    """

    def __init__(
        self,
        snapshot: Snapshot | None = None,
        assignments: Sequence[PodAssignment] = (),
        freed: Collection[str] = (),
    ) -> None:
        """``freed``: uids of running pods whose room ``assignments`` take (evicted or
        terminating: see :attr:`scheduler.solver.placement.Placement.freed`)."""
        self.node_count = 0
        self._traits: dict[tuple[object, ...], _Traits] = {}
        self._cache: dict[Rules, Matching] = {}
        self._alloc: dict[object, tuple[tuple[str, int], ...]] = {}
        if snapshot is None:
            return
        by_name = any(uses_node_name(p) for p in snapshot.pending_pods)
        states = snapshot.node_states()
        by_uid = snapshot.pod_by_uid
        leaving = [by_uid[u] for u in freed if u in by_uid and by_uid[u].node_name in states]
        touched = {a.node for a in assignments if a.node in states}
        touched |= {p.node_name for p in leaving if p.node_name}
        # A node's ``pods`` is a capacity like any other: each bound pod takes one slot (the
        # same accounting as the solver's state, see scheduler.solver.state.free_slots).
        pod_count = bound_usage(snapshot).pod_count
        free: dict[str, dict[str, int]] = {n: _free_of(states[n], pod_count) for n in touched}
        devices: dict[str, list[int]] = {n: list(states[n].gpu_free) for n in touched}
        for p in leaving:
            name = p.node_name or ""
            for r, v in p.requests.items():
                free[name][r] = free[name].get(r, 0) + v
            if PODS in free[name]:
                free[name][PODS] += 1
            for i, milli in p.gpu_grant:
                if 0 <= i < len(devices[name]):
                    devices[name][i] = min(GPU_MILLI, devices[name][i] + milli)
        for a in assignments:
            pod = by_uid.get(a.pod_uid)
            if pod is None or a.node not in free:
                continue
            for r, v in pod.requests.items():
                free[a.node][r] = free[a.node].get(r, 0) - v
            if PODS in free[a.node]:
                free[a.node][PODS] -= 1
            node = snapshot.node_by_name[a.node]
            count = pod.gpu.count if pod.gpu else pod.requests[GPU]
            milli = (pod.gpu.milli_on(node) if pod.gpu else None) or GPU_MILLI
            _device_take(devices[a.node], a.gpu_grant, count, milli)
        for name, st in states.items():
            if name in touched:
                self.add(
                    st.node, free[name].items(), devices[name], 1, st.node.schedulable, by_name
                )
            else:
                self.add(
                    st.node,
                    _free_of(st, pod_count).items(),
                    st.gpu_free,
                    1,
                    st.node.schedulable,
                    by_name,
                )

    @classmethod
    def from_groups(cls, groups: Iterable[NodeGroup], *, by_name: bool = False) -> FreeCapacity:
        """Free capacity from pre-grouped nodes (see :data:`NodeGroup`); ``by_name`` keeps
        nodes apart for rules that select nodes by name."""
        out = cls()
        for node, free, gpu_free, count, schedulable in groups:
            out.add(node, free, gpu_free, count, schedulable, by_name)
        return out

    def add(
        self,
        node: Node,
        free: Iterable[tuple[str, int]],
        gpu_free: Iterable[int],
        count: int,
        schedulable: bool,
        by_name: bool,
    ) -> None:
        """Add ``count`` nodes like ``node`` with the given free state."""
        key = (node.labels, node.taints, node.name if by_name else "")
        traits = self._traits.get(key)
        if traits is None:
            labels = {**node.label_map, "metadata.name": node.name}
            traits = self._traits[key] = _Traits(node, labels)
        traits.size += count
        self.node_count += count
        if not schedulable:
            traits.unschedulable += count
            return
        alloc = self._alloc.get(node.allocatable)
        if alloc is None:
            alloc = tuple(sorted(node.allocatable.items()))
            self._alloc[node.allocatable] = alloc
        shape = Shape(
            free=tuple(sorted(free)),
            gpu_free=tuple(sorted(gpu_free, reverse=True)),
            gpu_memory_mib=node.gpu_memory_mib,
            allocatable=alloc,
        )
        traits.shapes[shape] += count
        self._cache.clear()

    def matching(self, rules: Rules) -> Matching:
        """The nodes ``rules`` allow (cached per distinct rules)."""
        found = self._cache.get(rules)
        if found is None:
            found = self._match(rules)
            self._cache[rules] = found
        return found

    def _match(self, rules: Rules) -> Matching:
        tolerations, selector, terms = rules
        out = Matching()
        for traits in self._traits.values():
            labels = traits.labels
            if selector and not node_selector_matches(selector, labels):
                continue
            out.selector_ok += traits.size
            if terms and not affinity_matches(terms, labels):
                continue
            out.affinity_ok += traits.size
            taints = traits.node.taints
            if not tolerates(tolerations, taints):
                for t in taints:
                    if t.effect != "PreferNoSchedule" and not any(
                        tol.tolerates(t) for tol in tolerations
                    ):
                        out.blocking_taints[t] += traits.size
                continue
            out.unschedulable += traits.unschedulable
            out.shapes.update(traits.shapes)
        return out


def _free_of(state: NodeState, pod_count: Mapping[str, int]) -> dict[str, int]:
    """A node's free resources, ``pods`` less one slot per bound pod (when it has a
    ``pods`` capacity: a node without one takes any number, as in the solver)."""
    free = dict(state.free.items())
    if PODS in free:
        free[PODS] -= pod_count.get(state.node.name, 0)
    return free


def pod_slots(shape: Shape, *, empty: bool = False) -> int | None:
    """Pods ``shape`` can still take (all it could take if ``empty``); None: no limit."""
    if shape.allocatable_of(PODS) <= 0:
        return None
    return shape.allocatable_of(PODS) if empty else shape.free_of(PODS)


def pod_fits(pod: Pod, shape: Shape, *, empty: bool = False) -> bool:
    """True when ``pod`` fits the free part of ``shape`` (or the whole node if ``empty``)."""
    # Asked for every pod of a gang against every shape (the explainer's packing): written
    # out rather than through Resources/pod_slots, same rules.
    resources = dict(shape.allocatable if empty else shape.free)
    for r, v in pod.requests.items():
        if v > 0 and v > resources.get(r, 0):
            return False
    # A node with a ``pods`` capacity needs a free slot (``resources`` holds what
    # :func:`pod_slots` would read: allocatable if ``empty``, else free).
    if shape.allocatable_of(PODS) > 0 and resources.get(PODS, 0) < 1:
        return False
    if pod.gpu is None:
        return True
    milli = share_milli(pod.gpu, shape.gpu_memory_mib)
    if milli is None:
        return False
    if empty:
        return resources.get(GPU, 0) >= pod.gpu.count
    return sum(1 for f in shape.gpu_free if f >= milli) >= pod.gpu.count


def share_milli(gpu: GpuRequest, gpu_memory_mib: int | None) -> int | None:
    """Thousandths of one device ``gpu`` takes on a node whose devices have
    ``gpu_memory_mib`` (same rule as :meth:`GpuRequest.milli_on`)."""
    if gpu.memory_mib is None:
        return gpu.milli
    if not gpu_memory_mib:
        return None
    milli = -(-gpu.memory_mib * GPU_MILLI // gpu_memory_mib)
    return milli if milli <= GPU_MILLI else None


__all__ += ["pod_fits", "pod_slots", "share_milli"]
