"""ClusterState: the mutable working copy of what is free on every node, grouped in classes.

Nodes with the same free resources, the same multiset of free device thousandths and the
same static traits (labels, taints, device memory, and the name only when some pod selects
nodes by name) are interchangeable for placement: they form one *equivalence class*. The
greedy scores one representative per class and the CP-SAT model counts pods per class, so
both scale with the number of classes, not nodes. Classes are kept up to date on every
:meth:`ClusterState.apply` / :meth:`ClusterState.release`.

Nodes that are cordoned or NotReady keep their accounting but belong to no class, so nothing
new is placed on them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from scheduler.cluster.node import GPU_MILLI, GPU_MODEL_LABEL, Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.resources import GPU, PODS, Resources
from scheduler.cluster.snapshot import BoundUsage, Snapshot, bound_usage
from scheduler.framework.scoring import PodDemand, pod_demand
from scheduler.plugins.podtopology import PodTopology, attracts
from scheduler.solver.placement import ClaimGrant, PodAssignment

if TYPE_CHECKING:
    from scheduler.solver.dra_state import DraState

__all__ = [
    "ClassKey",
    "ClusterState",
    "NodeSlot",
    "free_slots",
    "pick_devices",
    "pod_demand",
    "selected_label_keys",
    "uses_node_name",
]

#: (static traits id, sorted free resources, sorted free thousandths per device)
ClassKey = tuple[int, tuple[tuple[str, int], ...], tuple[int, ...]]


def selected_label_keys(pods: Iterable[Pod]) -> frozenset[str]:
    """Node label keys that the node selectors and required node affinity of ``pods`` read
    (pods bound now count too: taking back may place them again).

    Runs every cycle over every pod: each pod's keys are computed once
    (:attr:`Pod.node_label_keys`), and pods without node selector or affinity are skipped.
    """
    keys: set[str] = set()
    for p in pods:
        if p.node_selector or p.affinity:
            keys |= p.node_label_keys
    return frozenset(keys)


def uses_node_name(pod: Pod) -> bool:
    """True when the pod's required affinity names nodes (``matchFields metadata.name``)."""
    return any(r.key == "metadata.name" for t in pod.affinity for r in t.requirements)


def pick_devices(
    gpu_free: Sequence[int], count: int, milli: int, *, spread: bool = False
) -> tuple[int, ...] | None:
    """Deterministic device choice: whole GPUs take the lowest free indices; shares take the
    tightest fitting devices (binpack) or the emptiest (spread). None if they do not fit."""
    if count <= 0:
        return ()
    if milli >= GPU_MILLI:
        whole = [i for i, f in enumerate(gpu_free) if f >= GPU_MILLI]
        return tuple(whole[:count]) if len(whole) >= count else None
    cand = [(f, i) for i, f in enumerate(gpu_free) if f >= milli]
    if len(cand) < count:
        return None
    cand.sort(key=(lambda c: (-c[0], c[1])) if spread else None)
    return tuple(sorted(i for _, i in cand[:count]))


def free_slots(nodes: Iterable[Node], usage: BoundUsage) -> list[NodeSlot]:
    """A :class:`NodeSlot` per node with what ``usage`` (:func:`bound_usage`) leaves free:
    allocatable minus the bound pods' requests (``pods`` minus how many they are), and the
    free thousandths of each device. The slots take ``usage``'s device rows as they are."""
    slots = []
    for n in nodes:
        used = usage.used[n.name]
        free = {k: v - used.get(k, 0) for k, v in n.allocatable.items()}
        if PODS in free:
            free[PODS] -= usage.pod_count.get(n.name, 0)
        slots.append(NodeSlot(n, free, usage.gpu_free[n.name], 0))
    return slots


def room_of(
    rooms: Mapping[str | None, Sequence[int]], models: Collection[str] = ()
) -> tuple[int, int]:
    """(free, total) GPU thousandths of the ``models`` (empty: all) in ``rooms``
    (:meth:`ClusterState.gpu_rooms`)."""
    picked = [r for m, r in rooms.items() if not models or m in models]
    return sum(r[0] for r in picked), sum(r[1] for r in picked)


class NodeSlot:
    """One node's mutable free resources and devices (implements ``NodeView``).

    :attr:`key` is set when a :class:`ClusterState` takes the slot (its static traits id is
    the state's).
    """

    __slots__ = ("free", "gpu_free", "key", "name", "node", "placeable", "static_id")

    def __init__(
        self, node: Node, free: dict[str, int], gpu_free: list[int], static_id: int
    ) -> None:
        self.node = node
        #: The node name (kept: every change of a class's members asks for it).
        self.name: str = node.name
        self.free = free
        self.gpu_free = gpu_free
        self.static_id = static_id
        self.placeable = node.schedulable
        self.key: ClassKey

    def class_key(self) -> ClassKey:
        """The equivalence class this node is in right now."""
        return (self.static_id, tuple(sorted(self.free.items())), tuple(sorted(self.gpu_free)))

    def fits(self, demand: PodDemand) -> bool:
        """Resources fit (devices are checked by :func:`pick_devices`)."""
        free = self.free
        # A loop rather than all() over a generator (half the cost): asked for every pod at
        # every node class.
        for k, v in demand.requests.items():  # noqa: SIM110
            if v > 0 and free.get(k, 0) < v:
                return False
        return True


#: A node's static traits as a class key part: allocatable, labels (those kept), taints, GPU
#: memory and, when nodes are told apart by name, the name. A plain tuple: made and hashed
#: for every node of every state built (a frozen dataclass cost four times as much).
_Static = tuple[Resources, tuple[tuple[str, str], ...], tuple[object, ...], int | None, str]


class ClusterState:
    """Free resources per node, grouped into equivalence classes (see module docstring).

    Build one with :meth:`from_snapshot`; then :meth:`apply` and :meth:`release` pods. The
    simulator keeps one across many tiny cycles instead of building snapshots.
    """

    def __init__(
        self,
        nodes: Sequence[NodeSlot],
        *,
        by_name: bool = False,
        label_keys: Collection[str] | None = None,
    ) -> None:
        self.nodes: dict[str, NodeSlot] = {s.name: s for s in nodes}
        self.by_name = by_name
        #: Node labels that tell classes apart: None for all; else only these (and the GPU
        #: model, which scorers read). Real nodes carry unique labels (hostname); keeping
        #: only the keys some pod selects on lets identical nodes share a class.
        self.label_keys = None if label_keys is None else frozenset(label_keys) | {GPU_MODEL_LABEL}
        #: class key -> member node names (insertion-ordered, so choices are deterministic)
        self.classes: dict[ClassKey, dict[str, None]] = {}
        #: static id -> a node with those traits (for taint/selector checks)
        self.static_nodes: list[Node] = []
        self._static_ids: dict[_Static, int] = {}
        #: pods this state knows: pending pods of the snapshot and everything applied
        self.pods: dict[str, Pod] = {}
        #: pod uid -> where it sits, for pods applied to this state
        self.placed: dict[str, PodAssignment] = {}
        #: pods bound in the snapshot the state was built from (releasable too)
        self.bound: dict[str, Pod] = {}
        self._listeners: list[Callable[[ClassKey], None]] = []
        self._demands: dict[tuple[str, int], PodDemand | None] = {}
        self._topology: PodTopology | None = None
        self._unplaceable: list[NodeSlot] | None = None
        #: located pods (bound or placed) with required anti-affinity: they may refuse
        #: nodes to pods without rules of their own
        self.anti_owners = 0
        #: located pods with affinity terms that score other pods (kube-scheduler's
        #: InterPodAffinity score; :meth:`PodTopology.preference`)
        self.attractors = 0
        #: Devices of ResourceClaims (:mod:`scheduler.solver.dra_state`); None when no pod
        #: of the cycle uses claims.
        self.dra: DraState | None = None
        #: GPU model -> [free, total] thousandths of placeable nodes (built on first use,
        #: then kept up to date by :meth:`apply` and :meth:`release`)
        self._gpu_room: dict[str | None, list[int]] | None = None
        for slot in nodes:
            slot.static_id = self._static_id(slot.node)
            slot.key = slot.class_key()
            self._join(slot)

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def from_snapshot(
        cls,
        snapshot: Snapshot,
        *,
        by_name: bool | None = None,
        label_keys: Collection[str] | None = None,
    ) -> ClusterState:
        """Free resources after the snapshot's bound pods; pending pods become known pods.

        ``by_name`` keeps every node in its own class; by default it is on only when some
        pending pod selects nodes by name. ``label_keys``: see :attr:`label_keys`
        (:func:`selected_label_keys` gives the keys a snapshot's pods select on).
        """
        usage = bound_usage(snapshot)
        bound = usage.bound
        slots = free_slots(snapshot.nodes, usage)
        pending = snapshot.pending_pods
        if by_name is None:
            by_name = any(uses_node_name(p) for p in pending)
        state = cls(slots, by_name=by_name, label_keys=label_keys)
        for p in pending:
            state.pods[p.uid] = p
        state.bound = {p.uid: p for p in bound}
        if snapshot.dra is not None or any(p.resource_claims for p in pending):
            from scheduler.solver.dra_state import DraState

            state.dra = DraState(snapshot.dra)
        state.anti_owners = sum(1 for p in bound if p.pod_anti_affinity)
        state.attractors = sum(1 for p in bound if attracts(p))
        return state

    # --- where pods run, for pod (anti-)affinity and spread ---------------------------------

    def needs_topology(self, pod: Pod) -> bool:
        """True when where pods run may restrict ``pod`` (its own rules, or running pods'
        anti-affinity)."""
        return pod.topology_rules or self.anti_owners > 0

    def needs_devices(self, pod: Pod) -> bool:
        """True when devices decide where ``pod`` may go: it is unbound and uses
        ResourceClaims, or asks for an extended resource a DeviceClass serves."""
        if pod.node_name is not None:
            return False
        if pod.resource_claims > 0:
            return True
        return bool(pod.extended_containers) and self.dra is not None and self.dra.serves(pod)

    def devices_check(self, pod: Pod) -> Callable[[str], str | None]:
        """A node check: None when the pod's claims can be allocated on the named node now
        (:meth:`scheduler.solver.dra_state.DraState.check`)."""
        dra = self._dra_state()
        return dra.check(pod, lambda name: self.nodes[name].node)

    def claim_grants(self, pod: Pod, node: str) -> tuple[ClaimGrant, ...] | None:
        """What the pod's claims get on ``node`` now (empty for a pod without claims);
        None when they cannot be allocated there."""
        if not self.needs_devices(pod):
            return ()
        found = self._dra_state().grants(pod, self.nodes[node].node)
        return None if isinstance(found, str) else found

    def _dra_state(self) -> DraState:
        if self.dra is None:
            from scheduler.solver.dra_state import DraState

            self.dra = DraState(None)
        return self.dra

    def topology(self) -> PodTopology:
        """Pods per topology domain, following this state from now on (built on first use)."""
        if self._topology is None:
            located = [(p, p.node_name or "") for p in self.bound.values()]
            located += [(self.pods[uid], a.node) for uid, a in self.placed.items()]
            self._topology = PodTopology({n: s.node for n, s in self.nodes.items()}, located)
        return self._topology

    def split_by_name(self) -> None:
        """Give every node its own static traits (needed once a pod selects nodes by name)."""
        if self.by_name:
            return
        self.by_name = True
        self.classes = {}
        self.static_nodes = []
        self._static_ids = {}
        self._demands = {}
        for slot in self.nodes.values():
            slot.static_id = self._static_id(slot.node)
            slot.key = slot.class_key()
            self._join(slot)

    def _static_id(self, node: Node) -> int:
        labels = node.labels
        if self.label_keys is not None:
            labels = tuple(kv for kv in labels if kv[0] in self.label_keys)
        key: _Static = (
            node.allocatable,
            labels,
            tuple(node.taints),
            node.gpu_memory_mib,
            node.name if self.by_name else "",
        )
        sid = self._static_ids.get(key)
        if sid is None:
            sid = len(self.static_nodes)
            self._static_ids[key] = sid
            self.static_nodes.append(node)
        return sid

    # --- classes --------------------------------------------------------------------------

    def _join(self, slot: NodeSlot) -> None:
        if not slot.placeable:
            return
        members = self.classes.get(slot.key)
        if members is None:
            members = self.classes[slot.key] = {}
        members[slot.name] = None
        if len(members) == 1:
            for listener in self._listeners:
                listener(slot.key)

    def _leave(self, slot: NodeSlot) -> None:
        members = self.classes.get(slot.key)
        if members is None:
            return
        members.pop(slot.name, None)
        if not members:
            del self.classes[slot.key]

    def subscribe(self, listener: Callable[[ClassKey], None]) -> Callable[[], None]:
        """Call ``listener(key)`` whenever a class gains its first member; returns an undo.

        The undo lets go of the listener once it ran: a subscriber that listens with a method
        of its own and keeps the undo is then in no reference cycle (which kept it, and this
        state, for the cyclic collector)."""
        self._listeners.append(listener)
        held = [listener]

        def undo() -> None:
            if held:
                self._listeners.remove(held.pop())

        return undo

    def gpu_room(self, models: Collection[str] = ()) -> tuple[int, int]:
        """(free, total) GPU thousandths on the placeable nodes of the GPU ``models`` (empty:
        every GPU node)."""
        return room_of(self.gpu_rooms(), models)

    def gpu_rooms(self) -> Mapping[str | None, Sequence[int]]:
        """GPU model -> [free, total] thousandths of its placeable nodes (live: copy it to
        keep it)."""
        if self._gpu_room is None:
            room: dict[str | None, list[int]] = {}
            for s in self.nodes.values():
                if s.placeable and s.gpu_free:
                    r = room.setdefault(s.node.gpu_model, [0, 0])
                    r[0] += sum(s.gpu_free)
                    r[1] += GPU_MILLI * len(s.gpu_free)
            self._gpu_room = room
        return self._gpu_room

    def _room_changed(self, slot: NodeSlot, delta: int) -> None:
        if self._gpu_room is not None and delta and slot.placeable:
            self._gpu_room[slot.node.gpu_model][0] += delta

    def class_members(self, key: ClassKey) -> Iterator[str]:
        """Names of the nodes in a class (empty if the class is empty)."""
        return iter(self.classes.get(key, {}))

    def unplaceable(self) -> list[NodeSlot]:
        """Nodes in no class (cordoned or NotReady): they never change during a cycle."""
        if self._unplaceable is None:
            self._unplaceable = [s for s in self.nodes.values() if not s.placeable]
        return self._unplaceable

    def representative(self, key: ClassKey) -> NodeSlot | None:
        """Some node of the class, or None when the class is empty."""
        members = self.classes.get(key)
        return self.nodes[next(iter(members))] if members else None

    # --- changes --------------------------------------------------------------------------

    def demand(self, pod: Pod, node: str) -> PodDemand | None:
        """:func:`pod_demand` of ``pod`` on the named node."""
        return self.demand_on(pod, self.nodes[node])

    def demand_on(self, pod: Pod, slot: NodeSlot) -> PodDemand | None:
        """:func:`pod_demand`, cached per (pod, static traits): it depends on nothing else."""
        key = (pod.uid, slot.static_id)
        try:
            return self._demands[key]
        except KeyError:
            d = pod_demand(pod, slot.node)
            if d is not None and pod.extended_containers and self.dra is not None:
                d = self._without_backed(pod, slot.node, d)
            self._demands[key] = d
            return d

    def _without_backed(self, pod: Pod, node: Node, demand: PodDemand) -> PodDemand:
        """``demand`` without the extended resources ``node`` gives through DRA (its
        claims take them; :mod:`scheduler.cluster.dra_extended`)."""
        assert self.dra is not None
        backed = self.dra.backed(pod, node)
        if not backed:
            return demand
        requests = Resources({k: v for k, v in demand.requests.items() if k not in backed})
        if GPU in backed:
            return PodDemand(requests)
        return PodDemand(requests, demand.gpu_count, demand.gpu_milli)

    def apply(
        self, assignment: PodAssignment, pod: Pod | None = None, demand: PodDemand | None = None
    ) -> None:
        """Take the pod's resources and device grant on its node.

        ``pod`` may be omitted for pods the state already knows. ``demand``: what the pod
        takes from that node (:meth:`demand_on`), when the caller has it. Raises ValueError
        (naming the pod and node) when the node is unknown or the pod does not fit.
        """
        pod = pod or self.pods.get(assignment.pod_uid)
        if pod is None:
            raise ValueError(f"pod {assignment.pod_key}: unknown to this ClusterState; pass it")
        slot = self.nodes.get(assignment.node)
        if slot is None:
            raise ValueError(f"pod {assignment.pod_key}: node {assignment.node} is unknown")
        if assignment.pod_uid in self.placed or assignment.pod_uid in self.bound:
            raise ValueError(f"pod {assignment.pod_key} is already placed")
        if demand is None:
            demand = self.demand_on(pod, slot)
        if demand is None or not slot.fits(demand):
            raise ValueError(f"pod {assignment.pod_key} does not fit on node {slot.name}")
        for index, milli in assignment.gpu_grant:
            if not 0 <= index < len(slot.gpu_free) or slot.gpu_free[index] < milli:
                raise ValueError(
                    f"pod {assignment.pod_key}: device {index} of node {slot.name} "
                    f"has no {milli} thousandths free"
                )
        if self.needs_devices(pod):
            # Every stage that places a pod with claims must say which devices it gets
            # (only the greedy does; the others keep such gangs as it placed them).
            self._dra_state().take(pod, slot.node, assignment.claims)
        classes = self.classes
        members = classes.get(slot.key)  # _leave, written out (every placement comes here)
        if members is not None:
            members.pop(slot.name, None)
            if not members:
                del classes[slot.key]
        free = slot.free
        for k, v in demand.requests.items():
            free[k] = free.get(k, 0) - v
        for index, milli in assignment.gpu_grant:
            slot.gpu_free[index] -= milli
        self._room_changed(slot, -sum(milli for _, milli in assignment.gpu_grant))
        slot.key = slot.class_key()
        self._join(slot)
        self.pods[pod.uid] = pod
        self.placed[pod.uid] = assignment
        if pod.pod_anti_affinity:
            self.anti_owners += 1
        if attracts(pod):
            self.attractors += 1
        if self._topology is not None:
            self._topology.add(pod, slot.name)

    def release(self, pod_uid: str) -> PodAssignment:
        """Give back what a placed pod holds; returns its assignment. KeyError if not placed.

        Works for pods applied to this state and for pods bound in the snapshot.
        """
        if pod_uid in self.bound:
            pod = self.bound.pop(pod_uid)
            assignment = PodAssignment(
                pod.uid, pod.key, pod.gang, pod.node_name or "", pod.gpu_grant
            )
        else:
            assignment = self.placed.pop(pod_uid)
            pod = self.pods[pod_uid]
            if assignment.claims and self.dra is not None:
                self.dra.give_back(pod, assignment.claims)
        slot = self.nodes[assignment.node]
        demand = self.demand_on(pod, slot)
        requests: Mapping[str, int] = demand.requests if demand else pod.requests
        classes = self.classes
        members = classes.get(slot.key)  # _leave, written out (as in apply)
        if members is not None:
            members.pop(slot.name, None)
            if not members:
                del classes[slot.key]
        free = slot.free
        for k, v in requests.items():
            free[k] = free.get(k, 0) + v
        grant = assignment.gpu_grant
        if not grant and demand is not None and demand.gpu_count:
            # Bound without a recorded grant: give back the most used devices.
            order = sorted(range(len(slot.gpu_free)), key=lambda i: slot.gpu_free[i])
            grant = tuple((i, demand.gpu_milli) for i in order[: demand.gpu_count])
        before = sum(slot.gpu_free)
        for index, milli in grant:
            if 0 <= index < len(slot.gpu_free):
                slot.gpu_free[index] = min(GPU_MILLI, slot.gpu_free[index] + milli)
        self._room_changed(slot, sum(slot.gpu_free) - before)
        slot.key = slot.class_key()
        self._join(slot)
        if pod.pod_anti_affinity:
            self.anti_owners -= 1
        if attracts(pod):
            self.attractors -= 1
        if self._topology is not None:
            self._topology.remove(pod.uid)
        return assignment

    def restore_bound(self, pod: Pod) -> None:
        """Undo :meth:`release` of a pod bound in the snapshot (its node and grant as bound)."""
        self.apply(
            PodAssignment(pod.uid, pod.key, pod.gang, pod.node_name or "", pod.gpu_grant), pod
        )
        del self.placed[pod.uid]
        self.bound[pod.uid] = pod

    def grant_for(
        self, pod: Pod, node: str, *, spread: bool = False
    ) -> tuple[tuple[int, int], ...] | None:
        """The device grant the default packer gives ``pod`` on ``node``; None if it does not
        fit there (resources or devices; taints and selectors are not checked here)."""
        slot = self.nodes[node]
        demand = self.demand_on(pod, slot)
        if demand is None or not slot.fits(demand):
            return None
        devices = pick_devices(slot.gpu_free, demand.gpu_count, demand.gpu_milli, spread=spread)
        if devices is None:
            return None
        return tuple((i, demand.gpu_milli) for i in devices)

    def free_of(self, node: str) -> Resources:
        """Free resources of a node (a copy)."""
        return Resources(self.nodes[node].free)
