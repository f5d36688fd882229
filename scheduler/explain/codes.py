"""Reason codes of an unplaced gang (the ``reason_code`` of a GangOutcome).

``ExceedsQueueLimit``, ``ExceedsQueueQuota``, ``NodeTooSmall`` and ``ExceedsCluster`` mean the
gang can *never* be placed as the cluster and queues stand (:data:`NEVER_CODES`): something
must change (nodes, queue settings, the gang). Every other code may clear up by itself.

The queue codes and the pod codes found before solving (``UnsupportedField``,
``VolumeNotFound``, ``VolumeNotBound``, ``SchedulingGated``) come from
:mod:`scheduler.fairness`, and the ResourceClaim codes (``ResourceClaimNotReady``, and
``DevicesUnavailable`` from the solver's greedy pass) from :mod:`scheduler.cluster.dracodes`,
and ``HeldToAvoidStranding`` (``placement.holdStrandingShares``) from
:mod:`scheduler.plugins.strand_guard`; they are repeated here so one import gives the whole
list.
"""

from __future__ import annotations

from scheduler.cluster.dracodes import CLAIM_NOT_READY, DEVICES_UNAVAILABLE
from scheduler.fairness.admission import OVER_QUOTA, QUEUE_LIMIT
from scheduler.fairness.findings import (
    NON_LEAF_QUEUE,
    QUEUE_INVALID,
    QUEUE_MISSING,
    SCHEDULING_GATED,
    UNSUPPORTED_FIELD,
    VOLUME_NOT_BOUND,
    VOLUME_NOT_FOUND,
)
from scheduler.plugins.strand_guard import HELD_CODE as HELD_TO_AVOID_STRANDING

__all__ = [
    "ALL_CODES",
    "CAPACITY_TAKEN",
    "CLAIM_NOT_READY",
    "DEVICES_UNAVAILABLE",
    "EXCEEDS_CLUSTER",
    "EXCEEDS_QUEUE_LIMIT",
    "EXCEEDS_QUEUE_QUOTA",
    "GANG_DOES_NOT_FIT",
    "GANG_INCOMPLETE",
    "HELD_TO_AVOID_STRANDING",
    "INSUFFICIENT_ON_ONE_NODE",
    "NEVER_CODES",
    "NODE_TOO_SMALL",
    "NON_LEAF_QUEUE",
    "NOT_PLACED_THIS_CYCLE",
    "NO_MATCHING_NODE",
    "OVER_QUOTA",
    "POD_AFFINITY",
    "POD_ANTI_AFFINITY",
    "QUEUE_INVALID",
    "QUEUE_LIMIT",
    "QUEUE_MISSING",
    "SCHEDULING_GATED",
    "TOPOLOGY_SPREAD",
    "UNSUPPORTED_FIELD",
    "VOLUME_NOT_BOUND",
    "VOLUME_NOT_FOUND",
]

#: Fewer pods exist than the gang must place together.
GANG_INCOMPLETE = "GangIncomplete"
#: The gang alone asks more than its queue's (or an ancestor's) limit: it can never be admitted.
EXCEEDS_QUEUE_LIMIT = "ExceedsQueueLimit"
#: Non-preemptible, the gang alone asks more than a quota on its queue's path: never admitted.
EXCEEDS_QUEUE_QUOTA = "ExceedsQueueQuota"
#: Even with nothing else running, the nodes its pods may use cannot hold the gang (pod slots,
#: GPUs, cpu, memory in total, or node by node).
EXCEEDS_CLUSTER = "ExceedsCluster"
#: No node accepts a pod (nodeSelector, affinity, taints, cordoned / NotReady).
NO_MATCHING_NODE = "NoMatchingNode"
#: No matching node could hold a pod even if it were empty.
NODE_TOO_SMALL = "NodeTooSmall"
#: No matching node has enough free for a pod right now.
INSUFFICIENT_ON_ONE_NODE = "InsufficientOnOneNode"
#: The gang's pods do not fit the free capacity of matching nodes together.
GANG_DOES_NOT_FIT = "GangDoesNotFit"
#: It would have fit before this cycle's placements took the capacity.
CAPACITY_TAKEN = "CapacityTakenThisCycle"
#: Pod affinity: no node with a matching pod in its domain (``podAffinity`` required).
POD_AFFINITY = "PodAffinity"
#: Pod anti-affinity, the pod's own or that of running pods, refuses every node that fits.
POD_ANTI_AFFINITY = "PodAntiAffinity"
#: A DoNotSchedule topology spread constraint refuses every node that fits.
TOPOLOGY_SPREAD = "TopologySpread"
#: It fits what is free now; it was not reached this cycle.
NOT_PLACED_THIS_CYCLE = "NotPlacedThisCycle"

ALL_CODES: tuple[str, ...] = (
    QUEUE_MISSING,
    QUEUE_INVALID,
    NON_LEAF_QUEUE,
    UNSUPPORTED_FIELD,
    VOLUME_NOT_FOUND,
    VOLUME_NOT_BOUND,
    CLAIM_NOT_READY,
    SCHEDULING_GATED,
    GANG_INCOMPLETE,
    EXCEEDS_QUEUE_LIMIT,
    EXCEEDS_QUEUE_QUOTA,
    NODE_TOO_SMALL,
    EXCEEDS_CLUSTER,
    QUEUE_LIMIT,
    OVER_QUOTA,
    NO_MATCHING_NODE,
    INSUFFICIENT_ON_ONE_NODE,
    GANG_DOES_NOT_FIT,
    POD_AFFINITY,
    POD_ANTI_AFFINITY,
    TOPOLOGY_SPREAD,
    DEVICES_UNAVAILABLE,
    HELD_TO_AVOID_STRANDING,
    CAPACITY_TAKEN,
    NOT_PLACED_THIS_CYCLE,
)

#: Codes that mean "can never be placed until nodes, queue settings or the gang change".
NEVER_CODES: frozenset[str] = frozenset(
    {EXCEEDS_QUEUE_LIMIT, EXCEEDS_QUEUE_QUOTA, NODE_TOO_SMALL, EXCEEDS_CLUSTER}
)
