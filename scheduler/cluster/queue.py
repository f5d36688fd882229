"""Queues and the queue tree.

A queue has, per resource (``gpu``, ``cpu``, ``memory``), a ``quota`` it deserves, an
``over_quota_weight`` for sharing what is left, and a ``limit`` it may never pass. Units are the
scheduler's integers: GPU in thousandths of a device, CPU in millicores, memory in bytes.
``UNLIMITED`` (-1) as a limit means no limit; as a quota it means the queue deserves all it asks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import networkx as nx

from scheduler.cluster.pod import Pod, queue_usage_of

__all__ = [
    "QUEUE_RESOURCES",
    "UNLIMITED",
    "Queue",
    "QueueFinding",
    "QueueResource",
    "QueueTree",
    "pod_queue_usage",
    "pod_usage_triple",
]

UNLIMITED = -1
#: The resources queues account for, in the order used everywhere (gpu first: it is scarcest).
QUEUE_RESOURCES: tuple[str, ...] = ("gpu", "cpu", "memory")


@dataclass(frozen=True, slots=True)
class QueueResource:
    """Quota, over-quota weight and limit of one resource of a queue."""

    quota: int = 0
    over_quota_weight: int = 1
    limit: int = UNLIMITED

    @property
    def limited(self) -> bool:
        """True when a limit applies."""
        return self.limit != UNLIMITED


@dataclass(frozen=True, slots=True)
class Queue:
    """A queue of the tree. ``parent`` is empty for a root."""

    name: str
    parent: str = ""
    priority: int = 100
    resources: tuple[tuple[str, QueueResource], ...] = ()
    display_name: str = ""
    creation_time: float = 0.0
    #: Seconds a gang of this queue must have run before another gang of the same queue
    #: may preempt it (``spec.preemptMinRuntime``); None inherits from the parent.
    preempt_min_runtime: float | None = None
    #: Seconds a gang of this queue must have run before another queue may reclaim it
    #: (``spec.reclaimMinRuntime``); None inherits from the parent.
    reclaim_min_runtime: float | None = None
    #: False: no other queue may reclaim from this queue or anything below it (Volcano's
    #: ``spec.reclaimable``; KAI queues are always reclaimable). Preemption inside the queue
    #: and consolidation are not affected.
    reclaimable: bool = True

    def resource(self, name: str) -> QueueResource:
        """The settings of one resource (defaults when not given)."""
        return dict(self.resources).get(name, QueueResource())


@dataclass(frozen=True, slots=True)
class QueueFinding:
    """Something wrong with a queue that keeps its gangs from being scheduled."""

    queue: str
    field: str
    message: str


def pod_queue_usage(pod: Pod) -> dict[str, int]:
    """What a pod counts against its queue, in queue units (gpu milli, cpu milli, bytes)."""
    gpu, cpu, memory = pod_usage_triple(pod)
    return {"gpu": gpu, "cpu": cpu, "memory": memory}


def pod_usage_triple(pod: Pod) -> tuple[int, int, int]:
    """:func:`pod_queue_usage` as (gpu, cpu, memory), the order of ``QUEUE_RESOURCES``.

    A :class:`Pod` computes it when it is made (it is immutable); loops over every pod use
    this form: a dict per pod, built and read back, was most of their cost.
    """
    known: tuple[int, int, int] | None = getattr(pod, "_queue_usage", None)
    return known if known is not None else queue_usage_of(pod)


@dataclass(frozen=True)
class QueueTree:
    """The queue hierarchy as a networkx DiGraph (edges parent -> child).

    Queues in a parent cycle, with an unknown parent, or below such a queue are *broken*: they
    get a finding and their gangs are not scheduled; the rest of the tree works normally.
    """

    queues: Mapping[str, Queue]
    graph: nx.DiGraph = field(repr=False)
    findings: tuple[QueueFinding, ...] = ()

    @classmethod
    def build(cls, queues: tuple[Queue, ...] | list[Queue]) -> QueueTree:
        """Build the tree and its findings from a flat list of queues."""
        by_name: dict[str, Queue] = {}
        findings: list[QueueFinding] = []
        for q in queues:
            if q.name in by_name:
                findings.append(QueueFinding(q.name, "metadata.name", "duplicate queue name"))
            by_name[q.name] = q
        graph: nx.DiGraph = nx.DiGraph()
        graph.add_nodes_from(by_name)
        bad: dict[str, QueueFinding] = {}
        for q in by_name.values():
            if not q.parent:
                continue
            if q.parent == q.name:
                bad[q.name] = QueueFinding(
                    q.name, "spec.parentQueue", f"queue {q.name} names itself as parent"
                )
            elif q.parent not in by_name:
                bad[q.name] = QueueFinding(
                    q.name,
                    "spec.parentQueue",
                    f"parent queue {q.parent} does not exist; create it or fix spec.parentQueue",
                )
            else:
                graph.add_edge(q.parent, q.name)
        # simple_cycles' start node and order follow set iteration (PYTHONHASHSEED): each cycle
        # starts at its smallest name and cycles come sorted, so the message is the same every run.
        cycles = sorted(_from_smallest(c) for c in nx.simple_cycles(graph))
        for cycle in cycles:
            path = " -> ".join([*cycle, cycle[0]])
            for name in cycle:
                bad.setdefault(
                    name,
                    QueueFinding(name, "spec.parentQueue", f"queue parents form a cycle: {path}"),
                )
        # Everything below a broken queue is broken too: its shares cannot be computed.
        for name in sorted(bad):
            for child in sorted(nx.descendants(graph, name)):
                bad.setdefault(
                    child,
                    QueueFinding(child, "spec.parentQueue", f"ancestor queue {name} is invalid"),
                )
        findings.extend(bad[n] for n in sorted(bad))
        return cls(queues=by_name, graph=graph, findings=tuple(findings))

    @property
    def broken(self) -> frozenset[str]:
        """Names of queues that have a finding."""
        return frozenset(f.queue for f in self.findings)

    def __contains__(self, name: object) -> bool:
        return name in self.queues

    def __iter__(self) -> Iterator[Queue]:
        return iter(self.queues.values())

    def children(self, name: str) -> list[str]:
        """Direct children, sorted by name for determinism."""
        return sorted(self.graph.successors(name))

    def is_leaf(self, name: str) -> bool:
        """True when the queue has no children (only leaves hold jobs)."""
        return bool(self.graph.out_degree(name) == 0)

    def roots(self) -> list[str]:
        """Healthy queues without a parent."""
        return sorted(
            n for n in self.graph.nodes if self.graph.in_degree(n) == 0 and n not in self.broken
        )

    def ancestors(self, name: str) -> list[str]:
        """The queue itself then each parent up to the root."""
        # Asked per gang and per charge, many times a cycle; the tree never changes: the
        # chains are kept (in the instance dict; a frozen dataclass), each caller gets a list.
        known: dict[str, tuple[str, ...]] = self.__dict__.setdefault("_ancestors", {})
        chain = known.get(name)
        if chain is None:
            chain = known[name] = tuple(self._walk_up(name))
        return list(chain)

    def _walk_up(self, name: str) -> list[str]:
        chain = [name]
        seen = {name}
        while True:
            parents = list(self.graph.predecessors(chain[-1]))
            if not parents or parents[0] in seen:
                return chain
            chain.append(parents[0])
            seen.add(parents[0])

    def min_runtime(self, name: str, kind: str) -> float:
        """``preempt`` or ``reclaim`` min runtime of a queue, inherited down the tree (0 when
        no queue on the way to the root sets it)."""
        attr = f"{kind}_min_runtime"
        for q in self.ancestors(name) if name in self.queues else ():
            value = getattr(self.queues[q], attr)
            if value is not None:
                return float(value)
        return 0.0

    def finding_for(self, name: str) -> QueueFinding | None:
        """The finding that makes ``name`` unusable, if any."""
        for f in self.findings:
            if f.queue == name:
                return f
        return None


def _from_smallest(cycle: list[str]) -> list[str]:
    """The cycle rotated to start at its smallest name (same cycle, same order of edges)."""
    i = cycle.index(min(cycle))
    return cycle[i:] + cycle[:i]
