"""The cases of ``python -m scheduler.bench podgrouper-diff``
(:mod:`scheduler.bench.podgrouper_diff`): a workload kind and what it says about grouping
(:class:`Case`), the fields a run is compared on (:data:`FIELDS`) and the documented
differences from KAI's pod grouper (:class:`Difference`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BATCH_MIN_MEMBER",
    "CASES",
    "FIELDS",
    "KINDS",
    "PREEMPTIBILITY_LABEL",
    "PRIORITY_LABEL",
    "QUEUE_LABEL",
    "REPLICAS",
    "STS_MIN_MEMBER",
    "TEAM_QUEUE",
    "Case",
    "Difference",
    "case_named",
]

KINDS = (
    "pod",
    "job",
    "cronjob",
    "deployment",
    "replicaset",
    "statefulset",
    "leaderworkerset",
    "volcano",
)
#: What a case's result is compared on (see
#: :func:`~scheduler.bench.podgrouper_results.summarize`).
FIELDS = (
    "grouped",
    "podgroups",
    "name",
    "owner",
    "min_member",
    "queue",
    "priority_class",
    "preemptibility",
)

QUEUE_LABEL = "kai.scheduler/queue"
PRIORITY_LABEL = "priorityClassName"
PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"
BATCH_MIN_MEMBER = "kai.scheduler/batch-min-member"
STS_MIN_MEMBER = "kai.scheduler/min-member"
#: A queue the cases name by label (created by :func:`prepare_plane`; KAI does not check).
TEAM_QUEUE = "pgdiff-team"
#: Pods per workload (a bare pod is one; a LeaderWorkerSet is one group of this size).
REPLICAS = 2


@dataclass(frozen=True)
class Difference:
    """A deliberate, documented difference: the fields (of :data:`FIELDS`) in which the two
    groupers differ for a case, with each one's value, and why (docs/podgrouper.md,
    "Differences from KAI's pod grouper"). Every differing field must be declared, with the
    same value on both sides; a declared field that agrees, or another value, is a failure."""

    ours: Mapping[str, Any]
    kai: Mapping[str, Any]
    reason: str

    def __post_init__(self) -> None:
        if set(self.ours) != set(self.kai) or not self.ours:
            raise ValueError("a Difference declares the same fields for ours and kai")
        unknown = set(self.ours) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}; use {FIELDS}")


@dataclass(frozen=True)
class Case:
    """One workload and what it says about grouping. ``owner_labels`` and
    ``owner_annotations`` go on the top owner (for a CronJob: the CronJob; for a bare pod: the
    pod); ``job_labels``/``job_annotations`` on a CronJob's ``jobTemplate`` (so on its Job);
    ``pod_labels`` and ``pod_priority_class`` on the pod template."""

    name: str
    kind: str
    summary: str
    owner_labels: Mapping[str, str] = field(default_factory=dict)
    owner_annotations: Mapping[str, str] = field(default_factory=dict)
    job_labels: Mapping[str, str] = field(default_factory=dict)
    job_annotations: Mapping[str, str] = field(default_factory=dict)
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    pod_priority_class: str | None = None
    difference: Difference | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"case {self.name}: unknown kind {self.kind!r}; use {KINDS}")

    @property
    def pods(self) -> int:
        """How many pods the workload makes."""
        return 1 if self.kind == "pod" else REPLICAS

    @property
    def workload(self) -> str:
        """The top owner's name (the same in every namespace, so PodGroup names compare)."""
        return {"pod": "solo", "volcano": "vcjob", "leaderworkerset": "lws"}.get(
            self.kind, self.kind
        )


#: The label sets the cases combine.
_QUEUE_AND_CLASS = {QUEUE_LABEL: TEAM_QUEUE, PRIORITY_LABEL: "inference"}
_NON_PREEMPTIBLE = {PREEMPTIBILITY_LABEL: "non-preemptible"}
_PREEMPTIBLE = {PREEMPTIBILITY_LABEL: "preemptible"}

_JOB_REASON = (
    "KAI v0.12.0's batch Job grouper makes one PodGroup per pod (pg-<pod>-<job uid>, minMember "
    "1, each pod its own gang) and reads no min-member annotation; ours makes one PodGroup per "
    "Job (pg-<job>-<job uid>) so that kai.scheduler/batch-min-member can make the Job one gang; "
    "minMember 1 keeps it elastic, each pod still starts on its own"
)


def _job_difference(min_member: int = 1, reason: str = _JOB_REASON) -> Difference:
    ours: dict[str, Any] = {"podgroups": 1, "name": ["pg-<job>-<job uid>"]}
    kai: dict[str, Any] = {"podgroups": REPLICAS, "name": ["pg-<pod>-<job uid>"]}
    if min_member != 1:
        ours["min_member"] = [min_member]
        kai["min_member"] = [1]
    return Difference(ours=ours, kai=kai, reason=reason)


def _volcano_difference(reason: str) -> Difference:
    return Difference(
        ours={
            "grouped": f"0/{REPLICAS}",
            "podgroups": 0,
            "name": [],
            "owner": [],
            "min_member": [],
            "queue": [],
            "priority_class": [],
            "preemptibility": [],
        },
        kai={
            "grouped": f"{REPLICAS}/{REPLICAS}",
            "podgroups": REPLICAS,
            "name": ["pg-<pod>-<pod uid>"],
            "owner": ["Pod"],
            "min_member": [1],
            "queue": ["default-queue"],
            "priority_class": ["train"],
            "preemptibility": [""],
        },
        reason=reason,
    )


_VOLCANO_REASON = (
    "a Volcano Job's pods name their Volcano PodGroup (scheduling.k8s.io/group-name, minMember "
    "= the Job's minAvailable), which our scheduler reads, so ours leaves them alone; KAI "
    "v0.12.0 has no Volcano plugin and may not read batch.volcano.sh Jobs (its ClusterRole), so "
    "it stops at the pod: one PodGroup per pod, minMember 1, the default queue and class "
    "whatever the Volcano Job's labels say, which would break the Volcano gang"
)


def _kinds_cases(kind: str, *, default_class: str) -> list[Case]:
    """The three label cases of one kind: none; queue + class labels on the owner (over a
    pod spec class); preemptibility label on the owner and a pod spec class."""
    spec_class = "build" if default_class == "train" else "train"
    label_class = "inference" if default_class == "train" else "build"
    preempt = _NON_PREEMPTIBLE if default_class == "train" else _PREEMPTIBLE
    job = kind == "job"
    return [
        Case(
            f"{kind}",
            kind,
            f"a {kind} with no labels: the default queue and class ({default_class})",
            difference=_job_difference() if job else None,
        ),
        Case(
            f"{kind}-queue-class",
            kind,
            f"queue and priorityClassName ({label_class}) labels on the {kind}; the pod spec "
            f"names {spec_class}: the label wins",
            owner_labels={QUEUE_LABEL: TEAM_QUEUE, PRIORITY_LABEL: label_class},
            pod_priority_class=spec_class,
            difference=_job_difference() if job else None,
        ),
        Case(
            f"{kind}-preempt-podclass",
            kind,
            f"{preempt[PREEMPTIBILITY_LABEL]} label on the {kind}; the pod spec names {spec_class}",
            owner_labels=dict(preempt),
            pod_priority_class=spec_class,
            difference=_job_difference() if job else None,
        ),
    ]


CASES: tuple[Case, ...] = (
    *_kinds_cases("pod", default_class="train"),
    *_kinds_cases("job", default_class="train"),
    Case(
        "job-pod-labels",
        "job",
        "queue, priorityClassName and preemptibility labels on the pod template only",
        pod_labels={QUEUE_LABEL: TEAM_QUEUE, PRIORITY_LABEL: "build", **_PREEMPTIBLE},
        difference=_job_difference(),
    ),
    Case(
        "job-min-member",
        "job",
        f"annotation {BATCH_MIN_MEMBER}: {REPLICAS} on the Job",
        owner_annotations={BATCH_MIN_MEMBER: str(REPLICAS)},
        difference=_job_difference(REPLICAS),
    ),
    Case("cronjob", "cronjob", "a CronJob's Job (kubectl create job --from), no labels"),
    Case(
        "cronjob-labels",
        "cronjob",
        "queue, priorityClassName and preemptibility labels on the CronJob itself",
        owner_labels={**_QUEUE_AND_CLASS, **_NON_PREEMPTIBLE},
        difference=Difference(
            ours={
                "queue": [TEAM_QUEUE],
                "priority_class": ["inference"],
                "preemptibility": ["non-preemptible"],
            },
            kai={"queue": ["default-queue"], "priority_class": ["train"], "preemptibility": [""]},
            reason="KAI v0.12.0's CronJob grouper reads only the Job the CronJob made (whose "
            "labels come from jobTemplate), not the CronJob; ours reads the CronJob's "
            "kai.scheduler/queue, priorityClassName and preemptibility labels after the Job's, "
            "as for any other workload",
        ),
    ),
    Case(
        "cronjob-template",
        "cronjob",
        f"labels and {BATCH_MIN_MEMBER}: {REPLICAS} on the jobTemplate; the pod spec names build",
        job_labels={**_QUEUE_AND_CLASS, **_NON_PREEMPTIBLE},
        job_annotations={BATCH_MIN_MEMBER: str(REPLICAS)},
        pod_priority_class="build",
        difference=Difference(
            ours={"min_member": [REPLICAS]},
            kai={"min_member": [1]},
            reason=f"ours reads {BATCH_MIN_MEMBER} on a CronJob's Job as on any Job; KAI v0.12.0 "
            "reads no min-member annotation (minMember 1)",
        ),
    ),
    *_kinds_cases("deployment", default_class="inference"),
    *_kinds_cases("replicaset", default_class="train"),
    *_kinds_cases("statefulset", default_class="train"),
    Case(
        "statefulset-min-member",
        "statefulset",
        f"annotation {STS_MIN_MEMBER}: {REPLICAS} on a StatefulSet with podManagementPolicy "
        "Parallel",
        owner_annotations={STS_MIN_MEMBER: str(REPLICAS)},
        difference=Difference(
            ours={"min_member": [REPLICAS]},
            kai={"min_member": [1]},
            reason=f"ours reads {STS_MIN_MEMBER} on a StatefulSet with podManagementPolicy "
            "Parallel (its pods then start together); KAI v0.12.0 groups a StatefulSet with "
            "its default rule (minMember 1) and reads no min-member annotation",
        ),
    ),
    *_kinds_cases("leaderworkerset", default_class="train"),
    Case(
        "volcano",
        "volcano",
        "a Volcano Job (minAvailable 2): its pods carry scheduling.k8s.io/group-name",
        difference=_volcano_difference(_VOLCANO_REASON),
    ),
    Case(
        "volcano-labels",
        "volcano",
        "a Volcano Job with queue, priorityClassName and preemptibility labels",
        owner_labels={**_QUEUE_AND_CLASS, **_NON_PREEMPTIBLE},
        difference=_volcano_difference(_VOLCANO_REASON),
    ),
)


def case_named(name: str) -> Case:
    """The case called ``name``."""
    for c in CASES:
        if c.name == name:
            return c
    raise KeyError(f"no case {name!r}; known: {', '.join(c.name for c in CASES)}")
