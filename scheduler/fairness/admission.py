"""Queue rules a gang must pass before it may take resources: limits and, for
non-preemptible work, quota. Shared by the solver (to decide) and the explainer (to say why).

Checks use what each queue holds (``report``) plus what was charged to it earlier in the same
cycle (``charged``) plus the gang's own ask, for the gang's queue and every ancestor.
The quota rule applies only to resources the queue sets explicitly (an omitted resource has
no quota to respect) and to queues whose quota is not -1.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.cluster.quantity import format_milli
from scheduler.cluster.queue import QUEUE_RESOURCES, UNLIMITED, QueueTree
from scheduler.fairness.share import FairShareReport

__all__ = [
    "OVER_QUOTA",
    "QUEUE_LIMIT",
    "format_queue_amount",
    "queue_admission_problem",
]

QUEUE_LIMIT = "QueueLimit"
OVER_QUOTA = "OverQuota"


def format_queue_amount(resource: str, value: int) -> str:
    """A queue amount in the units of the Queue CRD: GPUs, CPU cores, memory in MB."""
    if resource == "memory":
        return f"{format_milli(value // 1000)}MB"
    return format_milli(value)


def queue_admission_problem(
    tree: QueueTree,
    report: FairShareReport,
    queue: str,
    ask: Mapping[str, int],
    *,
    preemptible: bool,
    charged: Mapping[str, Mapping[str, int]] | None = None,
    charged_pinned: Mapping[str, Mapping[str, int]] | None = None,
) -> tuple[str, str] | None:
    """(reason_code, message) when ``ask`` may not be admitted to ``queue``, else None.

    ``charged`` maps queue name -> usage already admitted this cycle (leaf and ancestors);
    ``charged_pinned`` the part of it that is non-preemptible.
    """
    chain = tree.ancestors(queue) if queue in tree else [queue]
    for name in chain:
        status = report.queues.get(name)
        if status is None:
            continue
        extra = (charged or {}).get(name, {})
        for r in QUEUE_RESOURCES:
            need = ask.get(r, 0)
            limit = status.limit.get(r, UNLIMITED)
            if need <= 0 or limit == UNLIMITED:
                continue
            used = status.allocated.get(r, 0) + extra.get(r, 0)
            if used + need > limit:
                state = "is at" if used >= limit else "would pass"
                return (
                    QUEUE_LIMIT,
                    f"queue {name} {state} its {r} limit ({format_queue_amount(r, used)}/"
                    f"{format_queue_amount(r, limit)}); the gang needs "
                    f"{format_queue_amount(r, need)} more",
                )
    if preemptible or queue not in tree:
        return None
    # Non-preemptible work must fit the quota of its queue and of every ancestor, counting
    # only non-preemptible usage there (preemptible work in the way can be taken back).
    for name in chain:
        status = report.queues.get(name)
        if status is None or name not in tree:
            continue
        extra = (charged_pinned or {}).get(name, {})
        for r, settings in tree.queues[name].resources:
            need = ask.get(r, 0)
            if need <= 0 or settings.quota == UNLIMITED:
                continue
            used = status.allocated_non_preemptible.get(r, 0) + extra.get(r, 0)
            if used + need > settings.quota:
                return (
                    OVER_QUOTA,
                    f"queue {name}: non-preemptible work may only use quota ({r} "
                    f"{format_queue_amount(r, used)}/{format_queue_amount(r, settings.quota)} "
                    f"held by non-preemptible work); the gang needs "
                    f"{format_queue_amount(r, need)} more",
                )
    return None
