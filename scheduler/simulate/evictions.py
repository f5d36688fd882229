"""What was taken back during a run: evictions grouped per gang, totals by action and queue.

Read by the report (tables, JSON) and the plots; counts come from the
:class:`~scheduler.simulate.records.EvictionRecord` list the backend keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scheduler.cluster.node import GPU_MILLI
from scheduler.simulate.ordering import natural_key
from scheduler.simulate.records import EvictionRecord
from scheduler.solver.placement import EvictAction

if TYPE_CHECKING:
    from scheduler.simulate.engine import SimulationResult

__all__ = [
    "EVICT_ACTIONS",
    "EvictionEvent",
    "eviction_events",
    "eviction_totals",
    "group_evictions",
]

#: Every eviction action, in the order the tables show them.
EVICT_ACTIONS: tuple[EvictAction, ...] = ("reclaim", "preempt", "consolidate", "shrink")


@dataclass(frozen=True)
class EvictionEvent:
    """Pods of one gang evicted together (same time, action, beneficiary and message)."""

    time: float
    gang: str
    queue: str
    action: EvictAction
    #: The pending gang the pods made room for.
    for_gang: str
    message: str
    pods: int
    #: GPU thousandths the evicted pods held.
    gpu: int

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (GPUs in devices)."""
        return {
            "time": self.time,
            "gang": self.gang,
            "queue": self.queue,
            "action": self.action,
            "for_gang": self.for_gang,
            "message": self.message,
            "pods": self.pods,
            "gpus": self.gpu / GPU_MILLI,
        }


def group_evictions(records: list[EvictionRecord]) -> list[EvictionEvent]:
    """Pods of one gang evicted at one time for one reason, as one event (first seen first)."""
    grouped: dict[tuple[float, str, str, str, str, str], list[EvictionRecord]] = {}
    for r in records:
        e = r.eviction
        grouped.setdefault((r.time, e.gang, e.queue, e.action, e.for_gang, e.message), []).append(r)
    return [
        EvictionEvent(
            time=members[0].time,
            gang=members[0].eviction.gang,
            queue=members[0].eviction.queue,
            action=members[0].eviction.action,
            for_gang=members[0].eviction.for_gang,
            message=members[0].eviction.message,
            pods=len(members),
            gpu=sum(m.gpu for m in members),
        )
        for members in grouped.values()
    ]


def eviction_events(result: SimulationResult) -> list[EvictionEvent]:
    """Every eviction of the run, pods of one gang at one time grouped, in time order."""
    return sorted(
        group_evictions(result.cluster.evictions),
        key=lambda e: (e.time, natural_key(e.gang), e.action, natural_key(e.for_gang), e.message),
    )


def eviction_totals(result: SimulationResult) -> dict[str, Any]:
    """Evicted pods and GPUs (devices) by action, and by victim queue and action; ``events``
    counts gang evictions (pods of one gang at one time)."""
    by_action: dict[str, dict[str, float]] = {
        a: {"events": 0, "pods": 0, "gpus": 0.0} for a in EVICT_ACTIONS
    }
    by_queue: dict[str, dict[str, dict[str, float]]] = {}
    for event in eviction_events(result):
        for row in (
            by_action.setdefault(event.action, {"events": 0, "pods": 0, "gpus": 0.0}),
            by_queue.setdefault(event.queue, {}).setdefault(
                event.action, {"events": 0, "pods": 0, "gpus": 0.0}
            ),
        ):
            row["events"] += 1
            row["pods"] += event.pods
            row["gpus"] += event.gpu / GPU_MILLI
    total = {
        "events": sum(v["events"] for v in by_action.values()),
        "pods": sum(v["pods"] for v in by_action.values()),
        "gpus": sum(v["gpus"] for v in by_action.values()),
    }
    return {
        "total": total,
        "by_action": by_action,
        "by_queue": {q: by_queue[q] for q in sorted(by_queue, key=natural_key)},
    }
