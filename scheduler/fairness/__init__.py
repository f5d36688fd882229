"""Fair share of the queue tree and the admission order of pending gangs (pure).

- :func:`compute_fair_shares` - per queue and resource: fair share, allocated, requested,
  plus the queue findings and the pending gangs that must not be scheduled (with reasons)
- :func:`queue_sort_key` - KAI's queue order (below fair share, DRF, priority, age)
- :func:`pending_gangs_in_order` - gang keys in the order they should be admitted
- :func:`queue_admission_problem` - queue limit / non-preemptible quota check for one gang
"""

from scheduler.fairness.admission import (
    OVER_QUOTA,
    QUEUE_LIMIT,
    format_queue_amount,
    queue_admission_problem,
)
from scheduler.fairness.findings import (
    NON_LEAF_QUEUE,
    QUEUE_INVALID,
    QUEUE_MISSING,
    gang_findings,
    queue_problem,
)
from scheduler.fairness.ordering import gang_sort_key, pending_gangs_in_order, queue_sort_key
from scheduler.fairness.share import (
    FairShareReport,
    QueueStatus,
    cluster_capacity,
    compute_fair_shares,
    water_fill,
)
from scheduler.fairness.usage import (
    QueueUsage,
    gang_need,
    gang_request,
    pending_pods,
    pod_queue,
    queue_usage,
)

__all__ = [
    "NON_LEAF_QUEUE",
    "OVER_QUOTA",
    "QUEUE_INVALID",
    "QUEUE_LIMIT",
    "QUEUE_MISSING",
    "FairShareReport",
    "QueueStatus",
    "QueueUsage",
    "cluster_capacity",
    "compute_fair_shares",
    "format_queue_amount",
    "gang_findings",
    "gang_need",
    "gang_request",
    "gang_sort_key",
    "pending_gangs_in_order",
    "pending_pods",
    "pod_queue",
    "queue_admission_problem",
    "queue_problem",
    "queue_sort_key",
    "queue_usage",
    "water_fill",
]
