"""Admission order of pending gangs, the way KAI walks its queues.

Queues are compared by :func:`queue_sort_key` (lower first): queues below their fair share
first, then the lower dominant-resource share (DRF, relative to fair share), then higher queue
priority, then the older queue, then the name. The walk is hierarchical: pick the best root,
then its best child, down to a leaf; take that leaf's best gang (higher priority, then older,
then by key); charge the gang's ask to the leaf and all its ancestors as tentatively admitted;
repeat. So a queue that just received work yields to its siblings as it passes its fair share.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.cluster.gang import Gang
from scheduler.cluster.queue import QUEUE_RESOURCES
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness.share import FairShareReport, QueueStatus
from scheduler.fairness.usage import add_usage, gang_need, gang_request, pending_pods

__all__ = ["gang_sort_key", "pending_gangs_in_order", "queue_sort_key"]

QueueKey = tuple[int, float, int, float, str]


def queue_sort_key(status: QueueStatus, extra: Mapping[str, int] | None = None) -> QueueKey:
    """Sort key of a queue (lower goes first), with ``extra`` usage tentatively admitted."""
    return (
        0 if status.below_fair_share(extra) else 1,
        status.dominant_share(extra),
        -status.priority,
        status.creation_time,
        status.name,
    )


def gang_sort_key(gang: Gang) -> tuple[int, float, str]:
    """Within a queue: higher priority first, then older, then by key."""
    return (-gang.priority, gang.creation_time, gang.key)


def pending_gangs_in_order(snapshot: Snapshot, report: FairShareReport) -> list[str]:
    """Keys of the pending gangs that may be scheduled, in admission order.

    Gangs listed in ``report.gang_findings`` are left out (they must not be scheduled).
    """
    tree = snapshot.queue_tree
    by_leaf: dict[str, list[Gang]] = {}
    asks: dict[str, dict[str, int]] = {}
    for gang in snapshot.gangs:
        if gang.key in report.gang_findings or gang.queue not in tree:
            continue
        pods = pending_pods(snapshot, gang)
        if not pods:
            continue
        need = gang_need(snapshot, gang)
        asks[gang.key] = gang_request(pods[:need] if need > 0 else pods)
        by_leaf.setdefault(gang.queue, []).append(gang)
    for gangs in by_leaf.values():
        # Reversed so the best gang is popped from the end in O(1).
        gangs.sort(key=gang_sort_key, reverse=True)

    remaining: dict[str, int] = {}
    for leaf, gangs in by_leaf.items():
        for q in tree.ancestors(leaf):
            remaining[q] = remaining.get(q, 0) + len(gangs)
    extra: dict[str, dict[str, int]] = {q: dict.fromkeys(QUEUE_RESOURCES, 0) for q in remaining}

    def status(name: str) -> QueueStatus:
        return report.queues.get(name) or QueueStatus(name=name)

    keys: dict[str, QueueKey] = {q: queue_sort_key(status(q), extra[q]) for q in remaining}
    order: list[str] = []
    candidates = [r for r in tree.roots() if remaining.get(r)]
    while candidates:
        current = min(candidates, key=keys.__getitem__)
        while True:
            kids = [k for k in tree.children(current) if remaining.get(k)]
            if not kids:
                break
            current = min(kids, key=keys.__getitem__)
        gang = by_leaf[current].pop()
        order.append(gang.key)
        for q in tree.ancestors(current):
            remaining[q] -= 1
            add_usage(extra[q], asks[gang.key])
            keys[q] = queue_sort_key(status(q), extra[q])
        candidates = [r for r in candidates if remaining[r]]
    return order
