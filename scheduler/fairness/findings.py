"""Pending gangs that must not be scheduled because of their queue or their pods, with the fix.

A gang whose queue does not exist, sits in a broken part of the tree (parent cycle, unknown
parent) or has child queues is left pending with a reason; every other queue works normally.
So is a gang with a pod that uses a placement rule the scheduler does not evaluate yet
(``UnsupportedField``, :mod:`scheduler.cluster.unsupported`), a gang with a pod that waits for
its PersistentVolumeClaims (:attr:`Pod.blocked`: ``VolumeNotFound``, ``VolumeNotBound``, or
``UnsupportedField``; :mod:`scheduler.cluster.volumes`), and a gang that cannot be placed
because some of its pods are gated (``SchedulingGated``: fewer ungated pods wait than the gang
needs placed together). Checked in that order; the first that applies is the finding.
"""

from __future__ import annotations

from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import QueueTree
from scheduler.cluster.snapshot import Snapshot
from scheduler.cluster.unsupported import (
    gated_message,
    podgroup_unsupported_message,
    unsupported_message,
)
from scheduler.cluster.volumeobjects import VOLUME_NOT_BOUND, VOLUME_NOT_FOUND
from scheduler.fairness.usage import gang_need

__all__ = [
    "NON_LEAF_QUEUE",
    "QUEUE_INVALID",
    "QUEUE_MISSING",
    "SCHEDULING_GATED",
    "UNSUPPORTED_FIELD",
    "VOLUME_NOT_BOUND",
    "VOLUME_NOT_FOUND",
    "gang_findings",
    "gang_pods_problem",
    "queue_problem",
]

QUEUE_MISSING = "QueueMissing"
QUEUE_INVALID = "QueueInvalid"
NON_LEAF_QUEUE = "NonLeafQueue"
#: A pod of the gang uses a placement rule that is not supported yet.
UNSUPPORTED_FIELD = "UnsupportedField"
#: Too few of the gang's pods are free of scheduling gates to place the gang.
SCHEDULING_GATED = "SchedulingGated"


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


def gang_pods_problem(snapshot: Snapshot, gang: Gang, waiting: list[Pod]) -> tuple[str, str] | None:
    """Why ``gang`` must not be scheduled because of its ``waiting`` pods (pending ones with
    unsupported fields or blocked by their volumes, gated ones), or None."""
    unsupported = sorted((p for p in waiting if p.unsupported), key=lambda p: p.key)
    if unsupported:
        first = unsupported[0]
        message = unsupported_message(first.key, first.unsupported)
        return (UNSUPPORTED_FIELD, message + _more(len(unsupported) - 1, gang))
    blocked = sorted((p for p in waiting if p.blocked and p.pending), key=lambda p: p.key)
    if blocked:
        first = blocked[0]
        assert first.blocked is not None
        code, message = first.blocked
        return (code, f"pod {first.key}: {message}{_more(len(blocked) - 1, gang)}")
    gated = sorted((p for p in waiting if p.gated), key=lambda p: p.key)
    if not gated:
        return None
    need = gang_need(snapshot, gang)
    ready = sum(1 for p in snapshot.pods_by_gang.get(gang.key, ()) if p.pending)
    if ready >= need:
        return None  # enough ungated pods: the gated ones are extras for now
    message = gated_message([(p.key, p.scheduling_gates) for p in gated])
    if not gang.implicit:
        message += (
            f" (gang {gang.key} needs {need} pods placed together; {ready} can be scheduled now)"
        )
    return (SCHEDULING_GATED, message)


def _more(others: int, gang: Gang) -> str:
    """What a finding adds when more pods of the gang wait for the same kind of reason."""
    if not others:
        return ""
    return f"; {others} more pod{'s' if others > 1 else ''} of gang {gang.key} too"


def gang_findings(snapshot: Snapshot) -> dict[str, tuple[str, str]]:
    """Gang key -> (reason_code, message) for pending gangs whose queue cannot take jobs, and
    for gangs that wait because of their pods (:func:`gang_pods_problem`; also when every
    pod of the gang is gated, so none is pending)."""
    tree = snapshot.queue_tree
    pending: set[str] = set()
    waiting: dict[str, list[Pod]] = {}
    for p in snapshot.pods:
        if p.pending:
            pending.add(p.gang)
            if p.unsupported or p.blocked:
                waiting.setdefault(p.gang, []).append(p)
        elif p.gated:
            waiting.setdefault(p.gang, []).append(p)
    out: dict[str, tuple[str, str]] = {}
    cache: dict[str, tuple[str, str] | None] = {}
    for gang in snapshot.gangs:
        key = gang.key
        if key in pending:
            if gang.queue not in cache:
                cache[gang.queue] = queue_problem(tree, gang.queue)
            problem = cache[gang.queue]
            if problem is not None:
                out[key] = problem
                continue
            if gang.unsupported:
                out[key] = (UNSUPPORTED_FIELD, podgroup_unsupported_message(key, gang.unsupported))
                continue
        pods = waiting.get(key)
        if pods:
            found = gang_pods_problem(snapshot, gang, pods)
            if found is not None:
                out[key] = found
    return out
