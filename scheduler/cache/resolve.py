"""Joining pods to their gangs and queues: the step between the store and a Snapshot.

Rules (the contract every stage shares):

- A pod names its gang with the annotation ``pod-group-name`` (KAI) or
  ``scheduling.k8s.io/group-name`` (Volcano); with neither it is an implicit gang of one,
  ``Gang(namespace, <pod name>, min_member=1, implicit=True)``.
- Queue: the PodGroup's ``spec.queue``, else the ``kai.scheduler/queue`` label (of the pod, or
  for a PodGroup of its oldest labelled member), else the configured default queue.
- Priority: the PodGroup's ``priorityClassName`` when set (members take it too), else the
  highest member priority; preemptible unless the PodGroup says otherwise or priority >= 100.
- A pending pod naming a missing or invalid PodGroup is left out (it cannot be scheduled) and
  becomes a :class:`Problem`; a bound one still occupies its node, in a stand-in gang.
- Pods of other schedulers only occupy nodes: they keep no gang (``gang == ""``).

An implicit gang is keyed ``namespace/<pod name>``; when a PodGroup of that name exists in the
namespace, the implicit gang is ``<pod name>~pod`` instead, so the pod never joins a PodGroup
it did not name.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.cache.grants import GpuGrant
from scheduler.cache.problems import Problem
from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import Pod
from scheduler.cluster.queuespec import SpecError, gang_from_k8s
from scheduler.k8s.resources import POD, PODGROUP

__all__ = ["PodRecord", "Resolution", "resolve"]

#: A preemptible gang is one below this priority (KAI's "build" priority).
BUILD_PRIORITY = 100


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What the store keeps of one pod: the parsed pod plus the raw facts resolution needs."""

    uid: str
    namespace: str
    name: str
    #: None when the pod is unbound and its spec unreadable (it only yields a problem).
    pod: Pod | None
    #: PodGroup name from the gang annotation, "" for an implicit gang.
    group: str = ""
    #: The annotation that named the PodGroup (for the problem's field).
    group_annotation: str = ""
    priority_class: str = ""
    #: True when ``spec.priority`` was set (admission resolved the class already).
    has_priority: bool = True
    #: A problem found while parsing (bad annotation, bad quantity).
    problem: Problem | None = None


@dataclass(frozen=True)
class Resolution:
    """Pods (with gang, queue and priority filled in), their gangs, and what is wrong."""

    pods: tuple[Pod, ...]
    gangs: tuple[Gang, ...]
    problems: tuple[Problem, ...]


def _podgroup_problem(raw: Mapping[str, Any], error: SpecError) -> Problem:
    meta = raw.get("metadata") or {}
    return Problem(
        kind=PODGROUP.kind,
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        field=error.field,
        message=error.message,
        uid=meta.get("uid", ""),
        api_version=PODGROUP.api_version,
    )


def _pod_problem(rec: PodRecord, field: str, message: str, reason: str) -> Problem:
    return Problem(
        kind=POD.kind,
        namespace=rec.namespace,
        name=rec.name,
        field=field,
        message=message,
        uid=rec.uid,
        api_version=POD.api_version,
        reason=reason,
    )


def _stand_in(pod: Pod, name: str) -> Gang:
    """A gang of one for a pod without a usable PodGroup (implicit, or bound orphan)."""
    return Gang(
        namespace=pod.namespace,
        name=name,
        min_member=1,
        queue=pod.queue,
        priority=pod.priority,
        preemptible=pod.priority < BUILD_PRIORITY,
        creation_time=pod.creation_time,
        implicit=True,
    )


def _gangs_from_podgroups(
    podgroups: Mapping[str, Mapping[str, Any]],
    members: Mapping[str, list[Pod]],
    default_queue: str,
    priorities: Mapping[str, int],
    problems: list[Problem],
) -> dict[str, Gang]:
    gangs: dict[str, Gang] = {}
    for key, raw in podgroups.items():
        try:
            gang = gang_from_k8s(raw, default_queue=default_queue, priorities=priorities)
        except SpecError as e:
            problems.append(_podgroup_problem(raw, e))
            continue
        spec = raw.get("spec") or {}
        pods = members.get(key, [])
        changes: dict[str, Any] = {}
        if not spec.get("queue"):
            labelled = [p.queue for p in pods if p.queue != default_queue]
            if labelled:
                changes["queue"] = labelled[0]
        if not spec.get("priorityClassName") and pods:
            priority = max(p.priority for p in pods)
            changes["priority"] = priority
            if not spec.get("preemptibility"):
                changes["preemptible"] = priority < BUILD_PRIORITY
        gangs[key] = dataclasses.replace(gang, **changes) if changes else gang
    return gangs


def resolve(
    records: Iterable[PodRecord],
    podgroups: Mapping[str, Mapping[str, Any]],
    *,
    default_queue: str,
    priorities: Mapping[str, int],
    overlay: Mapping[str, tuple[str, GpuGrant]] | None = None,
    podgroup_api: bool = True,
) -> Resolution:
    """Pods, gangs and problems from the store's contents.

    ``podgroups`` maps ``namespace/name`` to the raw PodGroup; ``overlay`` maps pod uid to the
    (node, device grant) of pods assumed bound but not yet seen bound, and of bound pods whose
    grant annotation has not arrived yet. ``podgroup_api`` False means the PodGroup CRD is not
    installed, which the reason of a pod naming a PodGroup then says.
    """
    overlay = overlay or {}
    problems: list[Problem] = []
    ready: list[tuple[PodRecord, Pod]] = []
    for rec in records:
        if rec.problem is not None:
            problems.append(rec.problem)
        pod = rec.pod
        if pod is None or (not pod.managed and not (pod.bound and pod.active)):
            # Unreadable and unbound, or another scheduler's pending or finished pod:
            # it holds nothing and is not ours to place.
            continue
        if not pod.active and not rec.group:
            # A finished pod of ours outside a PodGroup matters to nobody; a finished gang
            # member stays, inactive, so its gang's progress and status count it.
            continue
        changes: dict[str, Any] = {}
        if not rec.has_priority and rec.priority_class in priorities:
            changes["priority"] = priorities[rec.priority_class]
        extra = overlay.get(rec.uid)
        if extra is not None and (pod.node_name is None or pod.node_name == extra[0]):
            if pod.node_name is None:
                changes["node_name"] = extra[0]
            if not pod.gpu_grant:
                changes["gpu_grant"] = extra[1]
        if not pod.managed:
            changes["gang"] = ""
        ready.append((rec, dataclasses.replace(pod, **changes) if changes else pod))

    members: dict[str, list[Pod]] = defaultdict(list)
    for rec, pod in sorted(ready, key=lambda rp: (rp[1].creation_time, rp[1].key)):
        if rec.group and pod.managed:
            members[f"{rec.namespace}/{rec.group}"].append(pod)
    gangs = _gangs_from_podgroups(podgroups, members, default_queue, priorities, problems)

    pods: list[Pod] = []
    extra_gangs: dict[str, Gang] = {}
    for rec, pod in ready:
        if not pod.managed:
            pods.append(pod)
            continue
        if not rec.group:
            name = rec.name
            if pod.gang in podgroups:
                # A PodGroup shares this pod's name; the pod did not ask to join it. "~" cannot
                # appear in a Kubernetes name, so the implicit gang's key stays unique.
                name = f"{rec.name}~pod"
                pod = dataclasses.replace(pod, gang=f"{rec.namespace}/{name}")
            extra_gangs.setdefault(pod.gang, _stand_in(pod, name))
            pods.append(pod)
            continue
        key = f"{rec.namespace}/{rec.group}"
        gang = gangs.get(key)
        if gang is None:
            if key in podgroups:
                message = (
                    f"PodGroup {key} is invalid (see its events); fix the PodGroup so this "
                    "pod can be scheduled"
                )
                reason = "PodGroupInvalid"
            elif not podgroup_api:
                message = (
                    f"this pod names PodGroup {rec.group!r}, but the PodGroup CRD "
                    f"({PODGROUP.plural}.{PODGROUP.group}) is not installed; install it "
                    "(kubectl apply -f crds/) or remove the annotation"
                )
                reason = "PodGroupNotFound"
            else:
                message = (
                    f"PodGroup {rec.group!r} does not exist in namespace {rec.namespace}; "
                    "create it or correct the annotation"
                )
                reason = "PodGroupNotFound"
            if pod.bound:
                # Still holds its node (e.g. its PodGroup was deleted while it runs).
                extra_gangs.setdefault(key, _stand_in(pod, rec.group))
                pods.append(pod)
            else:
                problems.append(
                    _pod_problem(rec, f"metadata.annotations[{rec.group_annotation}]", message,
                                 reason)
                )  # fmt: skip
            continue
        changes = {}
        if pod.queue != gang.queue:
            changes["queue"] = gang.queue
        if (podgroups[key].get("spec") or {}).get("priorityClassName") and (
            pod.priority != gang.priority
        ):
            changes["priority"] = gang.priority
        pods.append(dataclasses.replace(pod, **changes) if changes else pod)

    for key, gang in extra_gangs.items():
        gangs.setdefault(key, gang)
    pods.sort(key=lambda p: (p.namespace, p.name))
    return Resolution(
        pods=tuple(pods),
        gangs=tuple(sorted(gangs.values(), key=lambda g: g.key)),
        problems=tuple(problems),
    )
