"""Grouping rules: which PodGroup a pod belongs to, one pure function per workload kind.

A rule takes the pod and its owner chain (:mod:`scheduler.podgrouper.owners`) and returns a
:class:`Grouping`: the PodGroup's name, owner, minMember, queue, priority and preemptibility.
The rule is picked by the top owner's API group and kind; the names and minMember follow
KAI-Scheduler's pod grouper, so the same workload gets the same PodGroup under either:

==================  ============================  ===============  ==========  =========
top owner           PodGroup name                 owner            minMember   class
==================  ============================  ===============  ==========  =========
Pod (bare)          ``pg-<pod>-<pod uid>``        the pod          1           train
batch/v1 Job        ``pg-<job>-<job uid>``        the Job          [1]_        train
batch/v1 CronJob    ``pg-<job>-<job uid>`` [2]_   the Job          [1]_        train
apps/v1 Deployment  ``pg-<pod>-<pod uid>`` [3]_   the pod          1           inference
apps/v1 StatefulSet ``pg-<sts>-<sts uid>``        the StatefulSet  [4]_        train
LeaderWorkerSet     ``pg-<lws>-<uid>-group-<i>``  the LWS          size [5]_   train
anything else       ``pg-<top>-<top uid>``        the top owner    1           train
==================  ============================  ===============  ==========  =========

.. [1] the Job's annotation ``kai.scheduler/batch-min-member``, else 1 (elastic: each pod may
   start on its own).
.. [2] one PodGroup per Job the CronJob creates.
.. [3] one PodGroup per replica: replicas come and go independently (rollouts, scaling).
.. [4] ``kai.scheduler/min-member`` when ``podManagementPolicy: Parallel``, else 1.
.. [5] one PodGroup per LWS group (leader + workers): minMember is the group size
   (``leaderWorkerTemplate.size``); with ``startupPolicy: LeaderReady`` an unscheduled leader
   asks for 1 (it starts alone, its workers follow).

Common to all: queue from the label ``kai.scheduler/queue`` on the workload, else on the pod,
else the default queue; PriorityClass from the label ``priorityClassName`` on the workload,
else on the pod, else the pod's ``spec.priorityClassName``, else the kind's default;
preemptibility from the label ``kai.scheduler/preemptibility`` (workload, then pod). The
workload's labels and annotations are copied onto the PodGroup (as KAI does).

Bad input never stops a pod from being grouped: the rule falls back to the default and
records an :class:`Issue`, which the controller turns into a Warning Event on the workload.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from scheduler.podgrouper.keys import (
    DEFAULT_QUEUE,
    GANG_ANNOTATIONS,
    INFERENCE_PRIORITY_CLASS,
    LWS_GROUP_INDEX_LABEL,
    LWS_SIZE_ANNOTATION,
    LWS_WORKER_INDEX_LABEL,
    MIN_MEMBER_ANNOTATION,
    NOT_COPIED_ANNOTATIONS,
    PODGROUP_NAME_PREFIX,
    PREEMPTIBILITY_LABEL,
    PREEMPTIBILITY_VALUES,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    STATEFULSET_MIN_MEMBER_ANNOTATION,
    TOP_OWNER_ANNOTATION,
    TOPOLOGY_ANNOTATIONS,
    TRAIN_PRIORITY_CLASS,
)
from scheduler.podgrouper.owners import ObjectInfo, OwnerRef

__all__ = [
    "RULES",
    "Grouping",
    "GroupingContext",
    "Issue",
    "group_pod",
    "podgroup_name",
]

#: Longest object name the API accepts (a DNS subdomain).
_MAX_NAME = 253
LWS_GROUP = "leaderworkerset.x-k8s.io"


@dataclass(frozen=True, slots=True)
class Issue:
    """Something wrong with the user's input, told as a Warning Event on the workload."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class GroupingContext:
    """Settings the rules need."""

    #: Queue of a workload whose pods and owners name none.
    default_queue: str = DEFAULT_QUEUE


@dataclass(frozen=True)
class Grouping:
    """The PodGroup one pod belongs to, and what it should say."""

    name: str
    namespace: str
    #: The PodGroup's owner: garbage collection deletes the PodGroup with it.
    owner: OwnerRef
    #: The workload the PodGroup stands for; Events about bad input go to it.
    workload: ObjectInfo
    min_member: int
    queue: str
    #: Where the queue came from (for messages), e.g. ``label kai.scheduler/queue on Job/x``.
    queue_source: str
    #: The PriorityClass a label or the pod spec asks for ("" for none) and where it was read.
    requested_priority_class: str
    requested_from: str
    #: The kind's default PriorityClass (used when none is asked for, or the asked one is
    #: missing).
    default_priority_class: str
    #: ``preemptible``, ``non-preemptible`` or "" (let the priority decide).
    preemptibility: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: ``spec.topologyConstraint`` fields from the workload's topology annotations.
    topology: Mapping[str, str] = field(default_factory=dict)
    #: Name of the rule that decided (for logs).
    rule: str = "default"
    issues: tuple[Issue, ...] = ()


Rule = Callable[[ObjectInfo, Sequence[ObjectInfo], GroupingContext], Grouping]


def podgroup_name(name: str, uid: str, suffix: str = "") -> str:
    """KAI's PodGroup name ``pg-<name>-<uid><suffix>``, the name part shortened when the whole
    would pass the API's 253 characters."""
    tail = f"-{uid}{suffix}"
    room = _MAX_NAME - len(PODGROUP_NAME_PREFIX) - 1 - len(tail)
    short = name[:room].rstrip("-.") if len(name) > room else name
    return f"{PODGROUP_NAME_PREFIX}-{short}{tail}"


def _top_owner_metadata(workload: ObjectInfo) -> str:
    data = {
        "name": workload.name,
        "uid": workload.uid,
        "group": workload.group,
        "version": workload.version,
        "kind": workload.kind,
    }
    return yaml.safe_dump(data, sort_keys=False)


def _first_label(key: str, objects: Sequence[ObjectInfo]) -> tuple[str, str]:
    """(value, "label <key> on Kind/name") of the first object carrying the label."""
    for obj in objects:
        value = obj.labels.get(key)
        if value:
            return value, f"label {key} on {obj.describe()}"
    return "", ""


def _preemptibility(objects: Sequence[ObjectInfo]) -> tuple[str, tuple[Issue, ...]]:
    raw, where = _first_label(PREEMPTIBILITY_LABEL, objects)
    if not raw:
        return "", ()
    value = raw.strip().lower()
    if value in PREEMPTIBILITY_VALUES:
        return value, ()
    issue = Issue(
        "InvalidPreemptibility",
        f"{where} is {raw!r}; use preemptible or non-preemptible. Ignored: the priority decides "
        "(below 100 is preemptible)",
    )
    return "", (issue,)


def _copied_annotations(workload: ObjectInfo) -> dict[str, str]:
    out = {
        k: v
        for k, v in workload.annotations.items()
        if k not in NOT_COPIED_ANNOTATIONS and k not in GANG_ANNOTATIONS
    }
    out[TOP_OWNER_ANNOTATION] = _top_owner_metadata(workload)
    return out


def _base(
    pod: ObjectInfo,
    workload: ObjectInfo,
    ctx: GroupingContext,
    *,
    default_class: str,
    rule: str,
    label_sources: Sequence[ObjectInfo] = (),
) -> Grouping:
    """The fields every rule shares, for a PodGroup named and owned after ``workload`` with
    minMember 1. ``label_sources`` are read for labels after the workload, before the pod."""
    sources = [workload, *label_sources, pod]
    queue, queue_source = _first_label(QUEUE_LABEL, sources)
    requested, requested_from = _first_label(PRIORITY_LABEL, sources)
    spec_class = str(pod.spec.get("priorityClassName") or "")
    if not requested and spec_class:
        requested, requested_from = spec_class, f"spec.priorityClassName of Pod/{pod.name}"
    preemptibility, issues = _preemptibility(sources)
    topology = {
        field_name: workload.annotations[key]
        for key, field_name in TOPOLOGY_ANNOTATIONS.items()
        if workload.annotations.get(key)
    }
    return Grouping(
        name=podgroup_name(workload.name, workload.uid),
        namespace=pod.namespace,
        owner=workload.as_owner(),
        workload=workload,
        min_member=1,
        queue=queue or ctx.default_queue,
        queue_source=queue_source or "the default queue",
        requested_priority_class=requested,
        requested_from=requested_from,
        default_priority_class=default_class,
        preemptibility=preemptibility,
        labels=dict(workload.labels),
        annotations=_copied_annotations(workload),
        topology=topology,
        rule=rule,
        issues=issues,
    )


def _top(pod: ObjectInfo, chain: Sequence[ObjectInfo]) -> ObjectInfo:
    return chain[-1] if chain else pod


def _parse_min_member(
    raw: str | None, key: str, where: ObjectInfo
) -> tuple[int | None, tuple[Issue, ...]]:
    """A min-member annotation: (value, ()) when valid, (None, ()) when absent, (None, issue)
    when it is not a whole number >= 1."""
    if raw is None:
        return None, ()
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value >= 1:
        return value, ()
    return None, (
        Issue(
            "InvalidMinMember",
            f"annotation {key} on {where.describe()} is {raw!r}; it must be a whole number "
            ">= 1 (how many pods must start together). Using 1 until it is fixed: the pods "
            "start one by one",
        ),
    )


def default_rule(pod: ObjectInfo, chain: Sequence[ObjectInfo], ctx: GroupingContext) -> Grouping:
    """One PodGroup per top owner (a bare pod is its own), minMember 1, class ``train``."""
    return _base(pod, _top(pod, chain), ctx, default_class=TRAIN_PRIORITY_CLASS, rule="default")


def _job_min_member(job: ObjectInfo, grouping: Grouping, rule: str) -> Grouping:
    value, issues = _parse_min_member(
        job.annotations.get(MIN_MEMBER_ANNOTATION), MIN_MEMBER_ANNOTATION, job
    )
    min_member = value or 1
    parallelism = job.spec.get("parallelism")
    if value and isinstance(parallelism, int) and 0 < parallelism < value:
        issues += (
            Issue(
                "MinMemberAboveParallelism",
                f"annotation {MIN_MEMBER_ANNOTATION} on {job.describe()} asks for {value} pods "
                f"to start together, but the Job runs at most {parallelism} at a time "
                "(spec.parallelism): its pods cannot start until one of the two is changed",
            ),
        )
    return _replace(grouping, min_member=min_member, rule=rule, extra_issues=issues)


def job_rule(pod: ObjectInfo, chain: Sequence[ObjectInfo], ctx: GroupingContext) -> Grouping:
    """A batch Job: one PodGroup for the Job, minMember from ``kai.scheduler/batch-min-member``."""
    job = _top(pod, chain)
    grouping = _base(pod, job, ctx, default_class=TRAIN_PRIORITY_CLASS, rule="job")
    return _job_min_member(job, grouping, "job")


def cronjob_rule(pod: ObjectInfo, chain: Sequence[ObjectInfo], ctx: GroupingContext) -> Grouping:
    """A CronJob: one PodGroup per Job it creates (named and owned after the Job); the
    CronJob's own labels count after the Job's."""
    jobs = [o for o in chain if o.group == "batch" and o.kind == "Job"]
    if not jobs:
        return default_rule(pod, chain, ctx)
    job = jobs[0]
    cronjob = _top(pod, chain)
    grouping = _base(
        pod,
        job,
        ctx,
        default_class=TRAIN_PRIORITY_CLASS,
        rule="cronjob",
        label_sources=[cronjob],
    )
    return _job_min_member(job, grouping, "cronjob")


def deployment_rule(pod: ObjectInfo, chain: Sequence[ObjectInfo], ctx: GroupingContext) -> Grouping:
    """A Deployment: one PodGroup per pod (owned by the pod), class ``inference``; labels,
    queue and priority come from the Deployment."""
    deployment = _top(pod, chain)
    grouping = _base(
        pod, deployment, ctx, default_class=INFERENCE_PRIORITY_CLASS, rule="deployment"
    )
    return _replace(grouping, name=podgroup_name(pod.name, pod.uid), owner=pod.as_owner())


def statefulset_rule(
    pod: ObjectInfo, chain: Sequence[ObjectInfo], ctx: GroupingContext
) -> Grouping:
    """A StatefulSet: one PodGroup; ``kai.scheduler/min-member`` sets minMember, only with
    ``podManagementPolicy: Parallel`` (OrderedReady creates pods one at a time, so a gang of
    several could never start)."""
    sts = _top(pod, chain)
    grouping = _base(pod, sts, ctx, default_class=TRAIN_PRIORITY_CLASS, rule="statefulset")
    raw = sts.annotations.get(STATEFULSET_MIN_MEMBER_ANNOTATION)
    if raw is None:
        return grouping
    policy = str(sts.spec.get("podManagementPolicy") or "")
    if policy != "Parallel":
        issue = Issue(
            "MinMemberNeedsParallel",
            f"annotation {STATEFULSET_MIN_MEMBER_ANNOTATION} on {sts.describe()} needs "
            f"podManagementPolicy: Parallel (it is {policy or 'OrderedReady, the default'}, "
            "which creates pods one at a time, so they could never start together); using 1",
        )
        return _replace(grouping, extra_issues=(issue,))
    value, issues = _parse_min_member(raw, STATEFULSET_MIN_MEMBER_ANNOTATION, sts)
    return _replace(grouping, min_member=value or 1, extra_issues=issues)


def _int_or_none(raw: object) -> int | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            return None
    return None


def lws_rule(pod: ObjectInfo, chain: Sequence[ObjectInfo], ctx: GroupingContext) -> Grouping:
    """A LeaderWorkerSet: one PodGroup per group (leader + workers, told apart by the pod
    label ``leaderworkerset.sigs.k8s.io/group-index``), minMember the group size."""
    lws = _top(pod, chain)
    grouping = _base(pod, lws, ctx, default_class=TRAIN_PRIORITY_CLASS, rule="leaderworkerset")
    issues: tuple[Issue, ...] = ()
    template = lws.spec.get("leaderWorkerTemplate")
    size = _int_or_none(template.get("size", 1) if isinstance(template, Mapping) else 1)
    if size is None or size < 1:
        issues += (
            Issue(
                "InvalidGroupSize",
                f"spec.leaderWorkerTemplate.size of {lws.describe()} is not a whole number "
                ">= 1; using 1",
            ),
        )
        size = 1
    policy = str(lws.spec.get("startupPolicy") or "LeaderCreated")
    if policy not in ("LeaderCreated", "LeaderReady"):
        issues += (
            Issue(
                "UnknownStartupPolicy",
                f"spec.startupPolicy of {lws.describe()} is {policy!r}; expected LeaderCreated "
                "or LeaderReady. Treated as LeaderCreated (the whole group starts together)",
            ),
        )
        policy = "LeaderCreated"
    min_member = size
    if policy == "LeaderReady":
        from_pod = _int_or_none(pod.annotations.get(LWS_SIZE_ANNOTATION))
        if from_pod is not None and from_pod >= 1:
            min_member = from_pod
        is_leader = pod.labels.get(LWS_WORKER_INDEX_LABEL) == "0"
        if is_leader and not pod.spec.get("nodeName"):
            # The leader starts alone; its workers are created once it is ready.
            min_member = 1
    name = grouping.name
    index = _int_or_none(pod.labels.get(LWS_GROUP_INDEX_LABEL))
    if index is not None:
        name = podgroup_name(lws.name, lws.uid, f"-group-{index}")
    return _replace(grouping, name=name, min_member=min_member, extra_issues=issues)


def _replace(
    grouping: Grouping, *, extra_issues: tuple[Issue, ...] = (), **changes: Any
) -> Grouping:
    if extra_issues:
        changes["issues"] = grouping.issues + extra_issues
    return replace(grouping, **changes)


#: The rule for each top-owner (API group, kind); any other kind gets :func:`default_rule`.
RULES: dict[tuple[str, str], Rule] = {
    ("batch", "Job"): job_rule,
    ("batch", "CronJob"): cronjob_rule,
    ("apps", "Deployment"): deployment_rule,
    ("apps", "StatefulSet"): statefulset_rule,
    (LWS_GROUP, "LeaderWorkerSet"): lws_rule,
}


def group_pod(
    pod: ObjectInfo, chain: Sequence[ObjectInfo], ctx: GroupingContext | None = None
) -> Grouping:
    """The PodGroup of ``pod`` given its owner chain (direct owner first, top owner last)."""
    top = _top(pod, chain)
    rule = RULES.get((top.group, top.kind), default_rule)
    return rule(pod, chain, ctx or GroupingContext())
