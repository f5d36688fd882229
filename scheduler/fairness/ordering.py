"""Admission order of pending gangs, the way KAI walks its queues.

Queues are compared by :func:`queue_sort_key` (lower first): queues below their fair share
first, then the lower dominant-resource share (DRF, relative to fair share) with the queue's
next gang added, then higher queue
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

_INF = float("inf")


def queue_sort_key(
    status: QueueStatus,
    extra: Mapping[str, int] | None = None,
    ask: Mapping[str, int] | None = None,
) -> QueueKey:
    """Sort key of a queue (lower goes first), with ``extra`` usage tentatively admitted.

    ``ask`` is what the queue's next gang would add: a queue counts as below its fair share
    only if it stays within it after that gang, so a queue with no GPU share does not jump
    ahead for GPU work just because its CPU share is unused.
    """
    # What QueueStatus.within_fair_share / below_fair_share and dominant_share say of the
    # queue's usage with ``extra`` and ``ask`` added, in one pass (asked for every queue on
    # the path of every gang admitted in the walk below: thousands of times a cycle).
    allocated, fair_share = status.allocated, status.fair_share
    within, under = True, False
    worst = 0.0
    for r in QUEUE_RESOURCES:
        used = allocated.get(r, 0)
        if extra:
            used += extra.get(r, 0)
        if ask:
            used += ask.get(r, 0)
        fair = fair_share.get(r, 0)
        if used > fair:
            within = False
        elif used < fair:
            under = True
        if used > 0 and worst != _INF:
            worst = _INF if fair <= 0 else max(worst, used / fair)
    # With the next gang's ask: within the share is enough; without one, strictly under it
    # in some resource too.
    below = within if ask else within and under
    return (
        0 if below else 1,
        # Shares compared with the next gang added, as KAI does: a queue whose next gang is
        # large yields to one whose next gang keeps it lower.
        worst,
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
    waiting = snapshot.pending_by_gang
    for gang in snapshot.gangs:
        if gang.key not in waiting or gang.key in report.gang_findings or gang.queue not in tree:
            continue
        pods = pending_pods(snapshot, gang)
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

    # A queue's entry (its sort key and the gang it would admit next) depends only on its
    # own subtree: cache it and drop only the entries on the path of the admitted gang.
    entries: dict[str, tuple[QueueKey, str, str]] = {}
    children = {q: tree.children(q) for q in remaining}
    chains = {leaf: tree.ancestors(leaf) for leaf in by_leaf}

    def entry(q: str) -> tuple[QueueKey, str, str]:
        found = entries.get(q)
        if found is None:
            kids = [k for k in children[q] if remaining.get(k)]
            head = best(kids)[2] if kids else by_leaf[q][-1].key
            found = entries[q] = (queue_sort_key(status(q), extra[q], asks[head]), q, head)
        return found

    def best(queues: list[str]) -> tuple[QueueKey, str, str]:
        """The best of ``queues`` with its key and the gang it would admit next."""
        return min(entry(q) for q in queues)

    order: list[str] = []
    candidates = [r for r in tree.roots() if remaining.get(r)]
    while candidates:
        _, _, head = best(candidates)
        gang = snapshot.gang_by_key[head]
        assert by_leaf[gang.queue][-1].key == head
        by_leaf[gang.queue].pop()
        order.append(head)
        for q in chains[gang.queue]:
            remaining[q] -= 1
            add_usage(extra[q], asks[head])
            entries.pop(q, None)
        candidates = [r for r in candidates if remaining[r]]
    return order
