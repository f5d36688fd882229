"""Why a pending gang waits: one reason code and a message naming the real cause.

:func:`explain_unplaced` looks at the cluster *after* a cycle's assignments; the codes are
listed in :mod:`scheduler.explain.codes` in the order they are checked.
"""

from scheduler.explain.codes import (
    ALL_CODES,
    CAPACITY_TAKEN,
    EXCEEDS_CLUSTER,
    EXCEEDS_QUEUE_LIMIT,
    EXCEEDS_QUEUE_QUOTA,
    GANG_DOES_NOT_FIT,
    GANG_INCOMPLETE,
    INSUFFICIENT_ON_ONE_NODE,
    NEVER_CODES,
    NO_MATCHING_NODE,
    NODE_TOO_SMALL,
    NON_LEAF_QUEUE,
    NOT_PLACED_THIS_CYCLE,
    OVER_QUOTA,
    QUEUE_INVALID,
    QUEUE_LIMIT,
    QUEUE_MISSING,
    SCHEDULING_GATED,
    UNSUPPORTED_FIELD,
    VOLUME_NOT_BOUND,
    VOLUME_NOT_FOUND,
)
from scheduler.explain.reasons import explain_unplaced

__all__ = [
    "ALL_CODES",
    "CAPACITY_TAKEN",
    "EXCEEDS_CLUSTER",
    "EXCEEDS_QUEUE_LIMIT",
    "EXCEEDS_QUEUE_QUOTA",
    "GANG_DOES_NOT_FIT",
    "GANG_INCOMPLETE",
    "INSUFFICIENT_ON_ONE_NODE",
    "NEVER_CODES",
    "NODE_TOO_SMALL",
    "NON_LEAF_QUEUE",
    "NOT_PLACED_THIS_CYCLE",
    "NO_MATCHING_NODE",
    "OVER_QUOTA",
    "QUEUE_INVALID",
    "QUEUE_LIMIT",
    "QUEUE_MISSING",
    "SCHEDULING_GATED",
    "UNSUPPORTED_FIELD",
    "VOLUME_NOT_BOUND",
    "VOLUME_NOT_FOUND",
    "explain_unplaced",
]
