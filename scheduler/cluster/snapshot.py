"""The immutable per-cycle view of the cluster, and what is free on each node.

A :class:`Snapshot` holds only source facts (nodes, pods, gangs, queues, the time); usage and
free capacity are derived by :meth:`Snapshot.node_states`, so a saved snapshot cannot disagree
with itself. ``to_json``/``from_json`` round-trip exactly, for replaying a cycle offline.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

from scheduler.cluster.codec import decode, encode
from scheduler.cluster.disruption import DisruptionBudget
from scheduler.cluster.gang import Gang
from scheduler.cluster.node import GPU_MILLI, Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import Queue, QueueTree
from scheduler.cluster.resources import GPU, Resources

if TYPE_CHECKING:  # the DRA types pull in the CEL library; imported when a view is decoded
    from scheduler.cluster.draview import DraView

__all__ = ["BoundUsage", "NodeState", "Snapshot", "bound_usage"]

SNAPSHOT_VERSION = 1


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node with what its bound pods already use.

    ``gpu_free`` lists the free thousandths of each device, by device index.
    """

    node: Node
    used: Resources
    gpu_free: tuple[int, ...]

    @property
    def free(self) -> Resources:
        """Allocatable minus used (may be negative if the node is overcommitted)."""
        return self.node.allocatable - self.used

    @property
    def whole_free_gpus(self) -> int:
        """Devices nobody uses at all."""
        return sum(1 for f in self.gpu_free if f >= GPU_MILLI)


@dataclass(frozen=True)
class Snapshot:
    """Everything one scheduling cycle decides on."""

    nodes: tuple[Node, ...] = ()
    pods: tuple[Pod, ...] = ()
    gangs: tuple[Gang, ...] = ()
    queues: tuple[Queue, ...] = ()
    #: Wall-clock (or simulated) seconds at which the snapshot was taken.
    now: float = 0.0
    #: PodDisruptionBudgets that cover pods of this snapshot (evictions must honour them).
    budgets: tuple[DisruptionBudget, ...] = ()
    #: Gangs that consolidation moved and that are restarting elsewhere: they are placed
    #: before any other pending work, so the room their move was planned into is theirs
    #: (consolidation promises that nobody loses their place; see docs/taking-back.md).
    restoring: frozenset[str] = frozenset()
    #: Devices and claims (:mod:`scheduler.cluster.draview`); None when there are none.
    dra: DraView | None = None
    version: int = field(default=SNAPSHOT_VERSION)

    # --- derived views (cached; the snapshot is immutable) -------------------------------

    @cached_property
    def queue_tree(self) -> QueueTree:
        """The queue hierarchy with its findings."""
        return QueueTree.build(self.queues)

    @cached_property
    def node_by_name(self) -> dict[str, Node]:
        """Nodes keyed by name."""
        return {n.name: n for n in self.nodes}

    @cached_property
    def pod_by_uid(self) -> dict[str, Pod]:
        """Pods by uid (shared: read it, do not change it)."""
        return {p.uid: p for p in self.pods}

    @cached_property
    def gang_by_key(self) -> dict[str, Gang]:
        """Gangs keyed by ``namespace/name``."""
        return {g.key: g for g in self.gangs}

    @cached_property
    def pods_by_gang(self) -> dict[str, list[Pod]]:
        """Pods keyed by their gang key (pods without a gang are left out)."""
        out: dict[str, list[Pod]] = defaultdict(list)
        for p in self.pods:
            if p.gang:
                out[p.gang].append(p)
        return dict(out)

    @cached_property
    def pending_pods(self) -> tuple[Pod, ...]:
        """The pods still waiting for a node (:attr:`Pod.pending`), in snapshot order: most
        pods of a busy cluster run, and several passes of a cycle want only these."""
        return tuple(p for p in self.pods if p.pending)

    @cached_property
    def pending_by_gang(self) -> dict[str, tuple[Pod, ...]]:
        """Each gang's pods still waiting for a node (:attr:`Pod.pending`), oldest first
        (then by name); gangs with none are absent. Most gangs of a busy cluster are running
        ones, so the passes over pending work start here rather than at :attr:`gangs`."""
        out: dict[str, list[Pod]] = {}
        for p in self.pending_pods:
            if p.gang:
                out.setdefault(p.gang, []).append(p)
        return {
            k: tuple(sorted(v, key=lambda p: (p.creation_time, p.name))) for k, v in out.items()
        }

    def node_states(self) -> dict[str, NodeState]:
        """Per-node usage, computed once per snapshot (a fresh dict each call)."""
        return dict(self._node_states)

    @cached_property
    def _bound_usage(self) -> BoundUsage:
        """Every node's :func:`bound_usage`, shared by its callers (read it through that)."""
        return _bound_usage_of(self)

    @cached_property
    def _node_states(self) -> dict[str, NodeState]:
        """Per node: resources used by active bound pods and free thousandths per GPU device
        (see :func:`bound_usage`)."""
        usage = bound_usage(self)
        return {
            n.name: NodeState(n, Resources(usage.used[n.name]), tuple(usage.gpu_free[n.name]))
            for n in self.nodes
        }

    # --- JSON ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        out = {
            "version": self.version,
            "now": self.now,
            "nodes": encode(self.nodes),
            "pods": encode(self.pods),
            "gangs": encode(self.gangs),
            "queues": encode(self.queues),
            "budgets": encode(self.budgets),
            "restoring": sorted(self.restoring),
        }
        if self.dra is not None and not self.dra.empty:
            out["dra"] = encode(self.dra)  # absent otherwise: older readers see no change
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        """Inverse of :meth:`to_dict`."""
        if data.get("version", SNAPSHOT_VERSION) != SNAPSHOT_VERSION:
            raise ValueError(f"snapshot version {data.get('version')} is not supported")
        dra = None
        if data.get("dra") is not None:
            from scheduler.cluster.draview import DraView

            dra = decode(DraView, data["dra"])
        return cls(
            nodes=decode(tuple[Node, ...], data.get("nodes", [])),
            pods=decode(tuple[Pod, ...], data.get("pods", [])),
            gangs=decode(tuple[Gang, ...], data.get("gangs", [])),
            queues=decode(tuple[Queue, ...], data.get("queues", [])),
            budgets=decode(tuple[DisruptionBudget, ...], data.get("budgets", [])),
            restoring=frozenset(str(k) for k in data.get("restoring", [])),
            dra=dra,
            now=float(data.get("now", 0.0)),
        )

    def to_json(self) -> str:
        """Serialise to a JSON string."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        """Parse :meth:`to_json` output."""
        return cls.from_dict(json.loads(text))


class BoundUsage(NamedTuple):
    """Per node: requests of its active bound pods (plain dicts: this runs every cycle over
    every pod), free thousandths per GPU device, and how many such pods it holds; and those
    pods."""

    used: dict[str, dict[str, int]]
    gpu_free: dict[str, list[int]]
    pod_count: dict[str, int]
    bound: list[Pod]


def bound_usage(
    snapshot: Snapshot, names: Iterable[str] | None = None, *, pods: bool = True
) -> BoundUsage:
    """What the active bound pods of ``snapshot`` hold, for the nodes ``names`` (default:
    all). The one accounting the snapshot, the solver's state and the validator share.

    Computed once per snapshot (a cycle asks several times); each call gets its own copies
    of the rows, which callers may change. ``pods=False``: without the list of those pods
    (empty; picking them for some nodes walks every bound pod of the cluster).
    """
    full = snapshot._bound_usage
    wanted = full.used if names is None else names
    used = {n: dict(full.used[n]) for n in wanted}
    gpu_free = {n: list(full.gpu_free[n]) for n in used}
    pod_count = {n: full.pod_count[n] for n in used}
    if not pods:
        bound: list[Pod] = []
    elif names is None:
        bound = list(full.bound)
    else:
        bound = [p for p in full.bound if p.node_name in used]
    return BoundUsage(used, gpu_free, pod_count, bound)


def _bound_usage_of(snapshot: Snapshot) -> BoundUsage:
    """:func:`bound_usage` of every node, computed.

    Pods bound to a node that is not in the snapshot are ignored (they hold nothing the
    scheduler can give away). A GPU pod bound without a recorded device grant (e.g. placed by
    another scheduler) takes the freest devices, so device accounting stays conservative.
    """
    nodes = snapshot.node_by_name
    used: dict[str, dict[str, int]] = {n: {} for n in nodes}
    gpu_free = {n: [GPU_MILLI] * nodes[n].gpu_count for n in used}
    pod_count: dict[str, int] = dict.fromkeys(used, 0)
    ungranted: list[Pod] = []
    bound: list[Pod] = []
    for p in snapshot.pods:
        name = p.node_name
        if name is None or name not in used or not p.active:
            continue
        bound.append(p)
        pod_count[name] += 1
        row = used[name]
        for r, v in p.requests.items():
            row[r] = row.get(r, 0) + v
        if p.gpu_grant:
            devices = gpu_free[name]
            for index, milli in p.gpu_grant:
                if 0 <= index < len(devices):
                    devices[index] -= milli
        elif p.requests[GPU] or p.gpu is not None:
            ungranted.append(p)
    for p in ungranted:
        name = p.node_name or ""
        devices = gpu_free[name]
        count = p.requests[GPU] or (p.gpu.count if p.gpu else 0)
        share = None if p.requests[GPU] or p.gpu is None else p.gpu.milli_on(nodes[name])
        for _ in range(count):
            best = max(range(len(devices)), key=lambda i: devices[i], default=None)
            if best is None:
                break
            devices[best] -= share or GPU_MILLI
    return BoundUsage(used, gpu_free, pod_count, bound)
