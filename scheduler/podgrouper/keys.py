"""The labels, annotations and names the pod grouper reads and writes.

Most are KAI-Scheduler's own keys, so a workload written for KAI's pod grouper is grouped the
same way here. Read from the workload (its top owner) or the pod:

- ``kai.scheduler/queue`` (label): the PodGroup's queue.
- ``priorityClassName`` (label), else the pod's ``spec.priorityClassName``: its PriorityClass.
- ``kai.scheduler/preemptibility`` (label): ``preemptible`` or ``non-preemptible``.
- ``kai.scheduler/batch-min-member`` (annotation on a batch Job): minMember.
- ``kai.scheduler/min-member`` (annotation on a StatefulSet with ``podManagementPolicy:
  Parallel``): minMember.
- ``kai.scheduler/skip-podgrouper: "true"`` (annotation or label, on the pod or any owner):
  leave the pod alone.

Written: the annotation ``pod-group-name`` on the pod, and on the PodGroup the annotation
``kai.scheduler/top-owner-metadata`` (which workload it stands for).
"""

from __future__ import annotations

from scheduler.cluster.podspec import (
    GANG_ANNOTATIONS,
    PREEMPTIBILITY_LABEL,
    PREEMPTIBILITY_VALUES,
    QUEUE_LABEL,
)

__all__ = [
    "BUILD_PRIORITY_CLASS",
    "DEFAULT_QUEUE",
    "GANG_ANNOTATIONS",
    "INFERENCE_PRIORITY_CLASS",
    "LWS_GROUP_INDEX_LABEL",
    "LWS_NAME_LABEL",
    "LWS_SIZE_ANNOTATION",
    "LWS_WORKER_INDEX_LABEL",
    "MIN_MEMBER_ANNOTATION",
    "NOT_COPIED_ANNOTATIONS",
    "PODGROUP_NAME_PREFIX",
    "POD_GROUP_ANNOTATION",
    "PREEMPTIBILITY_LABEL",
    "PREEMPTIBILITY_VALUES",
    "PRIORITY_LABEL",
    "QUEUE_LABEL",
    "SKIP_KEY",
    "STATEFULSET_MIN_MEMBER_ANNOTATION",
    "TOPOLOGY_ANNOTATIONS",
    "TOP_OWNER_ANNOTATION",
    "TRAIN_PRIORITY_CLASS",
    "VOLCANO_GROUP_ANNOTATION",
]

#: The pod annotation naming the pod's PodGroup (what the scheduler reads).
POD_GROUP_ANNOTATION = GANG_ANNOTATIONS[0]
#: Volcano's: such a pod already belongs to a Volcano PodGroup, so it is never regrouped.
VOLCANO_GROUP_ANNOTATION = GANG_ANNOTATIONS[1]
#: PodGroups the grouper makes are called ``pg-<name>-<uid>`` (KAI's names).
PODGROUP_NAME_PREFIX = "pg"
#: A label on the workload or pod naming the PriorityClass (KAI's key; no prefix).
PRIORITY_LABEL = "priorityClassName"
#: Annotation on a batch Job (or the Job of a CronJob): minMember of its PodGroup.
MIN_MEMBER_ANNOTATION = "kai.scheduler/batch-min-member"
#: Annotation on a StatefulSet (``podManagementPolicy: Parallel`` only): minMember.
STATEFULSET_MIN_MEMBER_ANNOTATION = "kai.scheduler/min-member"
#: ``"true"`` on the pod or any owner: the grouper leaves the pod alone.
SKIP_KEY = "kai.scheduler/skip-podgrouper"
#: On the PodGroup: name, uid, group, version and kind of the workload it stands for.
TOP_OWNER_ANNOTATION = "kai.scheduler/top-owner-metadata"
#: Topology annotations of the workload copied into ``spec.topologyConstraint``.
TOPOLOGY_ANNOTATIONS = {
    "kai.scheduler/topology": "topology",
    "kai.scheduler/topology-required-placement": "requiredTopologyLevel",
    "kai.scheduler/topology-preferred-placement": "preferredTopologyLevel",
}
#: The workload's annotations are copied onto its PodGroup, except these (large, and
#: meaningless on another object).
NOT_COPIED_ANNOTATIONS = frozenset(
    {"kubectl.kubernetes.io/last-applied-configuration", "deployment.kubernetes.io/revision"}
)

#: KAI's default PriorityClass per kind: Deployments serve (``inference``), the rest train.
TRAIN_PRIORITY_CLASS = "train"
INFERENCE_PRIORITY_CLASS = "inference"
BUILD_PRIORITY_CLASS = "build"
#: The queue of a workload that names none (KAI writes it into the PodGroup explicitly).
DEFAULT_QUEUE = "default-queue"

# LeaderWorkerSet (sigs.k8s.io/lws): the labels and annotation its controller puts on pods.
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
