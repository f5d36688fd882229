"""The explanation ``kai-scheduler explain`` prints: frozen dataclasses, no behaviour.

Verdicts (:attr:`Explanation.verdict`):

- ``placed``: bound to a node (a PodGroup: at least ``minMember`` members bound);
- ``waiting``: the last cycle could not place it; ``message`` is the scheduler's reason;
- ``held``: nodes are held for it while pods evicted for it terminate;
- ``evicting``: the scheduler is taking its resources back (``DisruptionTarget``);
- ``finished``: every pod ran to completion or failed;
- ``pending``: a PodGroup partly placed, still below ``minMember``;
- ``undecided``: nothing written yet (a new object, or no scheduler running);
- ``not-ours``: the pod names another ``schedulerName``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_SCHEDULER_NAMES",
    "QUEUE_UNITS",
    "Condition",
    "EventView",
    "Explanation",
    "GangView",
    "Member",
    "QueueResource",
    "QueueView",
    "TakeBack",
]

DEFAULT_SCHEDULER_NAMES: tuple[str, ...] = ("kai-scheduler",)
#: The Queue CRD's units per resource (docs/api.md).
QUEUE_UNITS: dict[str, str] = {"gpu": "devices", "cpu": "millicores", "memory": "MB"}


@dataclass(frozen=True)
class Condition:
    """One status condition as written (pod, PodGroup or Queue)."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    since: str = ""


@dataclass(frozen=True)
class Member:
    """One pod of a gang and where it is."""

    name: str
    phase: str
    #: ``bound``, ``waiting``, ``held``, ``evicting`` or ``finished``.
    state: str
    node: str = ""
    nominated_node: str = ""


@dataclass(frozen=True)
class GangView:
    """The gang a pod belongs to (a PodGroup, or the pod alone)."""

    name: str
    #: True for a pod without a PodGroup: a gang of one.
    implicit: bool
    min_member: int
    api_version: str = ""
    phase: str = ""
    condition: Condition | None = None
    members: tuple[Member, ...] = ()
    bound: int = 0
    waiting: int = 0
    finished: int = 0
    #: Node -> how many members are bound there.
    nodes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueResource:
    """One resource of a queue: its spec and what the scheduler wrote to its status."""

    resource: str
    unit: str
    allocated: str = ""
    allocated_non_preemptible: str = ""
    requested: str = ""
    fair_share: str = ""
    quota: str = ""
    limit: str = ""
    over_quota_weight: str = ""


@dataclass(frozen=True)
class QueueView:
    """A queue's fair share and usage as the scheduler last wrote them."""

    name: str
    #: Where the name came from: ``spec.queue``, the ``kai.scheduler/queue`` label, ...
    source: str
    found: bool = True
    parent: str = ""
    resources: tuple[QueueResource, ...] = ()
    conditions: tuple[Condition, ...] = ()
    #: The ancestors, nearest first (their resources, no further parents).
    parents: tuple[QueueView, ...] = ()


@dataclass(frozen=True)
class EventView:
    """Events of the same type, reason and message, merged (newest time, summed counts)."""

    type: str
    reason: str
    message: str
    last_seen: str
    count: int
    objects: tuple[str, ...]
    source: str = ""


@dataclass(frozen=True)
class TakeBack:
    """Anything of reclaim/preemption in flight: held nodes, victims, the queue's last ones."""

    #: Pod -> node held for it (``status.nominatedNodeName``).
    nominated: dict[str, str] = field(default_factory=dict)
    #: Pod -> its ``DisruptionTarget`` condition.
    disruption: dict[str, Condition] = field(default_factory=dict)
    #: The queue's ``LastEviction`` / ``LastTakeBack`` conditions.
    queue: tuple[Condition, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.nominated or self.disruption or self.queue)


@dataclass(frozen=True)
class Explanation:
    """Everything ``explain`` prints about one object."""

    kind: str
    namespace: str
    name: str
    verdict: str
    summary: str
    ours: bool = True
    scheduler_name: str = ""
    reason: str = ""
    message: str = ""
    since: str = ""
    gang: GangView | None = None
    queue: QueueView | None = None
    events: tuple[EventView, ...] = ()
    take_back: TakeBack = field(default_factory=TakeBack)
    notes: tuple[str, ...] = ()
