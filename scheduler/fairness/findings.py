"""Pending gangs that must not be scheduled because of their queue, with the fix to apply.

A gang whose queue does not exist, sits in a broken part of the tree (parent cycle, unknown
parent) or has child queues is left pending with a reason; every other queue works normally.
"""

from __future__ import annotations

from scheduler.cluster.queue import QueueTree
from scheduler.cluster.snapshot import Snapshot

__all__ = [
    "NON_LEAF_QUEUE",
    "QUEUE_INVALID",
    "QUEUE_MISSING",
    "gang_findings",
    "queue_problem",
]

QUEUE_MISSING = "QueueMissing"
QUEUE_INVALID = "QueueInvalid"
NON_LEAF_QUEUE = "NonLeafQueue"


def _some_leaf(tree: QueueTree, name: str) -> str:
    """The first leaf below ``name`` in name order (for a concrete suggestion)."""
    current = name
    for _ in range(len(tree.queues)):
        kids = tree.children(current)
        if not kids:
            break
        current = kids[0]
    return current


def queue_problem(tree: QueueTree, queue: str) -> tuple[str, str] | None:
    """Why jobs cannot run in ``queue`` (reason_code, message), or None if they can."""
    if not queue:
        return (
            QUEUE_MISSING,
            "no queue is set; set spec.queue on the PodGroup or label kai.scheduler/queue",
        )
    if queue not in tree:
        return (
            QUEUE_MISSING,
            f"queue {queue} does not exist; create it or set spec.queue / "
            "label kai.scheduler/queue",
        )
    finding = tree.finding_for(queue)
    if finding is not None:
        return (
            QUEUE_INVALID,
            f"queue {queue} is invalid ({finding.field}: {finding.message})",
        )
    if not tree.is_leaf(queue):
        return (
            NON_LEAF_QUEUE,
            f"queue {queue} has child queues; submit jobs to a leaf queue such as "
            f"{_some_leaf(tree, queue)}",
        )
    return None


def gang_findings(snapshot: Snapshot) -> dict[str, tuple[str, str]]:
    """Gang key -> (reason_code, message) for pending gangs whose queue cannot take jobs."""
    tree = snapshot.queue_tree
    pending = {p.gang for p in snapshot.pods if p.pending}
    out: dict[str, tuple[str, str]] = {}
    cache: dict[str, tuple[str, str] | None] = {}
    for gang in snapshot.gangs:
        if gang.key not in pending:
            continue
        if gang.queue not in cache:
            cache[gang.queue] = queue_problem(tree, gang.queue)
        problem = cache[gang.queue]
        if problem is not None:
            out[gang.key] = problem
    return out
