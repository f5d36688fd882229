"""What ``kai-scheduler explain`` says about one pod or PodGroup, built from API objects.

Pure code: every function takes the objects as the API returned them (plain dicts) and returns
the frozen dataclasses of :mod:`scheduler.inspect.views`; :mod:`scheduler.inspect.reads` does
the reading and :mod:`scheduler.inspect.render` the printing. Nothing here guesses what the
scheduler thought: the verdict is read back from what it wrote (the pod's ``PodScheduled``
condition, the PodGroup's ``status``, ``nominatedNodeName``, ``DisruptionTarget``, Events, the
Queue's ``status``), so ``explain`` shows what ``kubectl describe`` would, in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scheduler.cluster.podspec import GANG_ANNOTATIONS, QUEUE_LABEL, VOLCANO_QUEUE_ANNOTATION
from scheduler.cluster.queue import QUEUE_RESOURCES
from scheduler.inspect.events import merge_events
from scheduler.inspect.views import (
    DEFAULT_SCHEDULER_NAMES,
    QUEUE_UNITS,
    Condition,
    EventView,
    Explanation,
    GangView,
    Member,
    QueueResource,
    QueueView,
    TakeBack,
)

__all__ = [
    "explain_pod",
    "explain_podgroup",
    "gang_name_of",
    "queue_name_of",
    "queue_view",
]

_FINISHED = ("Succeeded", "Failed")


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(obj.get("metadata") or {})


def _conditions(obj: Mapping[str, Any]) -> list[Condition]:
    out = []
    for c in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type"):
            out.append(
                Condition(
                    str(c["type"]),
                    str(c.get("status", "")),
                    str(c.get("reason") or ""),
                    str(c.get("message") or ""),
                    str(c.get("lastTransitionTime") or c.get("lastProbeTime") or ""),
                )
            )
    return out


def _condition(obj: Mapping[str, Any], kind: str) -> Condition | None:
    return next((c for c in _conditions(obj) if c.type == kind), None)


def gang_name_of(pod: Mapping[str, Any]) -> str:
    """The PodGroup a pod names (KAI's annotation first), or "" for a gang of one."""
    annotations = _meta(pod).get("annotations") or {}
    return next((str(annotations[a]) for a in GANG_ANNOTATIONS if annotations.get(a)), "")


def queue_name_of(
    podgroup: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]], default_queue: str
) -> tuple[str, str]:
    """(queue, where the name came from), by the scheduler's rule (``scheduler.cache.resolve``):
    the PodGroup's ``spec.queue``, else the oldest member's queue label, else the default."""
    if podgroup is not None:
        queue = (podgroup.get("spec") or {}).get("queue")
        if queue:
            return str(queue), "PodGroup spec.queue"
        if "volcano" in str(podgroup.get("apiVersion", "")):
            return "default", "Volcano's default queue"
    ordered = sorted(pods, key=lambda p: str(_meta(p).get("creationTimestamp") or ""))
    for pod in ordered:
        meta = _meta(pod)
        label = (meta.get("labels") or {}).get(QUEUE_LABEL)
        if label:
            return str(label), f"label {QUEUE_LABEL}"
        annotation = (meta.get("annotations") or {}).get(VOLCANO_QUEUE_ANNOTATION)
        if annotation:
            return str(annotation), f"annotation {VOLCANO_QUEUE_ANNOTATION}"
    return default_queue, "the scheduler's default queue"


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _limit(value: Any) -> str:
    return "unlimited" if value is not None and str(value) == "-1" else _text(value)


def _queue_resources(queue: Mapping[str, Any]) -> tuple[QueueResource, ...]:
    spec = (queue.get("spec") or {}).get("resources") or {}
    status = queue.get("status") or {}
    out = []
    for r in QUEUE_RESOURCES:
        s = spec.get(r) or {}
        out.append(
            QueueResource(
                resource=r,
                unit=QUEUE_UNITS[r],
                allocated=_text((status.get("allocated") or {}).get(r)),
                allocated_non_preemptible=_text(
                    (status.get("allocatedNonPreemptible") or {}).get(r)
                ),
                requested=_text((status.get("requested") or {}).get(r)),
                fair_share=_text((status.get("fairShare") or {}).get(r)),
                quota=_limit(s.get("quota")),
                limit=_limit(s.get("limit")),
                over_quota_weight=_text(s.get("overQuotaWeight")),
            )
        )
    return tuple(out)


def queue_view(
    name: str, source: str, queues: Mapping[str, Mapping[str, Any]], *, depth: int = 10
) -> QueueView:
    """The queue ``name`` and its ancestors from ``queues`` (name -> Queue object as read;
    a missing name is a queue that does not exist)."""
    queue = queues.get(name)
    if queue is None:
        return QueueView(name, source, found=False)
    parent = _text((queue.get("spec") or {}).get("parentQueue"))
    parents: list[QueueView] = []
    seen = {name}
    current = parent
    while current and current not in seen and len(parents) < depth:
        seen.add(current)
        up = queues.get(current)
        if up is None:
            parents.append(QueueView(current, "parentQueue", found=False))
            break
        following = _text((up.get("spec") or {}).get("parentQueue"))
        parents.append(
            QueueView(current, "parentQueue", parent=following, resources=_queue_resources(up))
        )
        current = following
    return QueueView(
        name,
        source,
        parent=parent,
        resources=_queue_resources(queue),
        conditions=tuple(_conditions(queue)),
        parents=tuple(parents),
    )


def _member(pod: Mapping[str, Any]) -> Member:
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    node = _text((pod.get("spec") or {}).get("nodeName"))
    nominated = _text(status.get("nominatedNodeName"))
    disruption = _condition(pod, "DisruptionTarget")
    if phase in _FINISHED:
        state = "finished"
    elif disruption is not None and disruption.status == "True":
        state = "evicting"
    elif node:
        state = "bound"
    elif nominated:
        state = "held"
    else:
        state = "waiting"
    return Member(str(_meta(pod).get("name", "")), phase, state, node, nominated)


def _gang(
    name: str, podgroup: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]
) -> GangView:
    members = tuple(sorted((_member(p) for p in pods), key=lambda m: m.name))
    nodes: dict[str, int] = {}
    for m in members:
        if m.node and m.state != "finished":
            nodes[m.node] = nodes.get(m.node, 0) + 1
    bound = sum(1 for m in members if m.state == "bound")
    waiting = sum(1 for m in members if m.state in ("waiting", "held"))
    finished = sum(1 for m in members if m.state == "finished")
    if podgroup is None:
        return GangView(name, True, 1, members=members, bound=bound, waiting=waiting,
                        finished=finished, nodes=nodes)  # fmt: skip
    spec = podgroup.get("spec") or {}
    # minMember 0 (or unset) means 1, as the scheduler reads it (docs/api.md).
    min_member = max(int(spec.get("minMember") or 0), 1)
    return GangView(
        name,
        False,
        min_member,
        api_version=str(podgroup.get("apiVersion", "")),
        phase=str((podgroup.get("status") or {}).get("phase") or ""),
        condition=_condition(podgroup, "Unschedulable"),
        members=members,
        bound=bound,
        waiting=waiting,
        finished=finished,
        nodes=nodes,
    )


def _take_back(pods: Sequence[Mapping[str, Any]], queue: Mapping[str, Any] | None) -> TakeBack:
    nominated, disruption = {}, {}
    for pod in pods:
        name = str(_meta(pod).get("name", ""))
        held = (pod.get("status") or {}).get("nominatedNodeName")
        if held and not (pod.get("spec") or {}).get("nodeName"):
            nominated[name] = str(held)
        c = _condition(pod, "DisruptionTarget")
        if c is not None:
            disruption[name] = c
    kept = ("LastEviction", "LastTakeBack")
    queue_conditions = tuple(c for c in _conditions(queue or {}) if c.type in kept)
    return TakeBack(nominated, disruption, queue_conditions)


def _where(nodes: Mapping[str, int]) -> str:
    return ", ".join(f"{n} ({c})" if c > 1 else n for n, c in sorted(nodes.items()))


def _queue_notes(view: QueueView) -> list[str]:
    notes = []
    if not view.found:
        notes.append(
            f"queue {view.name} ({view.source}) does not exist: the gang cannot be scheduled "
            "until it is created (kubectl get queues)"
        )
    elif not any(r.allocated or r.fair_share for r in view.resources):
        notes.append(
            f"queue {view.name} has no status yet: no scheduler has written its usage "
            "(is kai-scheduler running? try kai-scheduler doctor)"
        )
    for c in view.conditions:
        if c.type == "Valid" and c.status == "False":
            notes.append(f"queue {view.name} is invalid: {c.message}")
    notes += [f"parent queue {p.name} does not exist" for p in view.parents if not p.found]
    return notes


def explain_pod(
    pod: Mapping[str, Any],
    *,
    podgroup: Mapping[str, Any] | None,
    members: Sequence[Mapping[str, Any]],
    queues: Mapping[str, Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    scheduler_names: Sequence[str] = DEFAULT_SCHEDULER_NAMES,
    default_queue: str = "default-queue",
    event_limit: int = 10,
) -> Explanation:
    """The explanation of one pod. ``members``: the pods of its gang (with itself);
    ``podgroup``: the PodGroup it names (None if it names none or that one is missing);
    ``queues``: the Queue objects read (its queue and ancestors); ``events``: about it."""
    meta = _meta(pod)
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    scheduler = str((pod.get("spec") or {}).get("schedulerName") or "default-scheduler")
    me = _member(pod)
    group = gang_name_of(pod)
    gang_pods = list(members) or [pod]
    gang = _gang(group or name, podgroup, gang_pods)
    notes: list[str] = []
    if group and podgroup is None:
        notes.append(
            f"the pod names PodGroup {group} (annotation), which does not exist: it waits "
            "until that PodGroup is created (or remove the annotation)"
        )
    merged = merge_events(events, event_limit)
    base = Explanation("Pod", namespace, name, "", "", scheduler_name=scheduler, events=merged)
    if scheduler not in scheduler_names:
        served = ", ".join(scheduler_names)
        where = f"bound to {me.node}" if me.node else "not bound"
        summary = (
            f"uses schedulerName {scheduler}, not {served}: this scheduler does not place it "
            f"(it only counts the pod's requests on its node); {where}"
        )
        return dataclasses.replace(base, verdict="not-ours", summary=summary, ours=False)
    queue_name, source = queue_name_of(podgroup, gang_pods, default_queue)
    queue = queue_view(queue_name, source, queues)
    notes += _queue_notes(queue)
    scheduled = _condition(pod, "PodScheduled")
    group_condition = gang.condition
    verdict, summary, reason, message, since = _pod_verdict(
        me, pod, scheduled, group_condition, merged
    )
    return dataclasses.replace(
        base,
        verdict=verdict,
        summary=summary,
        reason=reason,
        message=message,
        since=since,
        gang=gang,
        queue=queue,
        take_back=_take_back([pod], queues.get(queue_name)),
        notes=tuple(notes),
    )


def _pod_verdict(
    me: Member,
    pod: Mapping[str, Any],
    scheduled: Condition | None,
    group_condition: Condition | None,
    events: Sequence[EventView],
) -> tuple[str, str, str, str, str]:
    """(verdict, summary, reason, message, since) of one pod of ours."""
    if me.state == "finished":
        return "finished", f"{me.phase} (ran on {me.node or 'no node'})", "", "", ""
    if me.state == "evicting":
        c = _condition(pod, "DisruptionTarget")
        assert c is not None
        return "evicting", f"being evicted from {me.node or 'its node'}: {c.message}", c.reason, \
            c.message, c.since  # fmt: skip
    if me.state == "bound":
        assigned = next((e for e in events if e.reason == "Scheduled"), None)
        message = assigned.message if assigned else ""
        since = scheduled.since if scheduled and scheduled.status == "True" else ""
        return "placed", f"bound to node {me.node}", "Scheduled", message, since
    if me.state == "held":
        why = group_condition.message if group_condition else ""
        summary = f"node {me.nominated_node} is held for it while pods evicted for it terminate"
        return "held", summary, "WaitingForEvictions", why, ""
    if scheduled is not None and scheduled.status == "False":
        summary = scheduled.message
        return "waiting", summary, scheduled.reason, scheduled.message, scheduled.since
    failed = next((e for e in events if e.reason == "FailedScheduling"), None)
    if failed is not None:
        return "waiting", failed.message, failed.reason, failed.message, ""
    summary = (
        "no decision written yet: the pod is new, or no kai-scheduler is running "
        "(check with kai-scheduler doctor)"
    )
    return "undecided", summary, "", "", ""


def explain_podgroup(
    podgroup: Mapping[str, Any],
    *,
    members: Sequence[Mapping[str, Any]],
    queues: Mapping[str, Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
    default_queue: str = "default-queue",
    event_limit: int = 10,
) -> Explanation:
    """The explanation of one PodGroup; ``events``: about it and its member pods."""
    meta = _meta(podgroup)
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    gang = _gang(name, podgroup, members)
    queue_name, source = queue_name_of(podgroup, members, default_queue)
    queue = queue_view(queue_name, source, queues)
    notes = _queue_notes(queue)
    if not members:
        notes.append("no pod names this PodGroup yet (annotation pod-group-name)")
    c = gang.condition
    placed = f"{gang.bound}/{gang.min_member} pods bound"
    where = f" on {_where(gang.nodes)}" if gang.nodes else ""
    reason, message, since = (c.reason, c.message, c.since) if c else ("", "", "")
    if gang.phase in _FINISHED or (members and gang.finished == len(members)):
        verdict, summary = "finished", f"{gang.phase or 'finished'}: {message}".rstrip(": ")
    elif c is not None and c.reason == "WaitingForEvictions":
        verdict, summary = "held", f"nodes are held for it: {c.message}"
    elif gang.bound >= gang.min_member and gang.bound:
        verdict, summary = "placed", f"{placed}{where}"
    elif c is not None and (
        c.status == "True" or gang.phase == "Unschedulable" or c.reason == "SchedulingGated"
    ):
        verdict, summary = "waiting", c.message
    elif gang.phase:
        verdict, summary = "pending", f"{gang.phase}: {placed}{where}"
    else:
        verdict = "undecided"
        summary = (
            "no status written yet: the PodGroup is new, or no kai-scheduler is running "
            "(check with kai-scheduler doctor)"
        )
    return Explanation(
        "PodGroup",
        namespace,
        name,
        verdict,
        summary,
        reason=reason,
        message=message,
        since=since,
        gang=gang,
        queue=queue,
        events=merge_events(events, event_limit),
        take_back=_take_back(members, queues.get(queue_name)),
        notes=tuple(notes),
    )
