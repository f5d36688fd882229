"""The work of a scenario: jobs (pods by template x count) and their PodGroups.

A job becomes API-shaped Pod objects converted by :func:`scheduler.cluster.podspec.pod_from_k8s`
and PodGroups converted by :func:`scheduler.cluster.queuespec.gang_from_k8s`, exactly as the
live cache does, so a scenario means what the same objects would mean in a cluster. Jobs
without a PodGroup get one implicit gang per pod.

Placement rules the scheduler does not evaluate yet (a pod affinity ``namespaceSelector`` by
labels, ...; see :mod:`scheduler.cluster.unsupported`) are kept on the pods: their gangs wait
with reason ``UnsupportedField``, as in a cluster. A template's ``spec.resourceClaims`` become
the job's :class:`ClaimRef` entries: each names a claim of the scenario's ``resourceClaims``
or a ``resourceClaimTemplates`` entry (checked by :mod:`scheduler.simulate.scenario`; the
claims live in :mod:`scheduler.simulate.claims`). Pod affinity,
anti-affinity and spread constraints are honoured as in a cluster. Scheduling gates are
refused (nothing would remove them), and so are volumes backed by PersistentVolumeClaims (a
simulation has no claims or volumes).

A job with ``running`` is already running when the simulation starts: its pods are bound to the
named nodes since ``startTime`` (zero or negative: before the start); their GPU devices are
granted by :func:`scheduler.simulate.running.grant_running` once the nodes are known.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import Pod, PodPhase
from scheduler.cluster.podspec import (
    BUILD_PRIORITY,
    QUEUE_LABEL,
    PodSpecError,
    gang_hints,
    pod_from_k8s,
)
from scheduler.cluster.queuespec import SpecError, gang_from_k8s
from scheduler.cluster.volumeobjects import pod_claims
from scheduler.simulate.checks import check_whole_extended, check_whole_requests
from scheduler.simulate.fields import (
    ScenarioError,
    check_known,
    read_count,
    read_list,
    read_mapping,
    read_name,
    read_seconds,
    read_string_map,
)

__all__ = [
    "DEFAULT_PRIORITY_CLASSES",
    "MAX_PODS_PER_JOB",
    "SCHEDULER_NAME",
    "ClaimRef",
    "JobArrival",
    "PodGroupDef",
    "PriorityClasses",
    "parse_jobs",
    "pod_groups",
    "priority_classes",
]

#: Pods in a scenario are addressed to this scheduler, so the simulator manages them all.
SCHEDULER_NAME = "kai-scheduler"
#: A guard against a typo such as ``count: 1000000`` eating the machine's memory.
MAX_PODS_PER_JOB = 100_000
#: The priority classes KAI installs; a scenario's ``priorityClasses`` adds to or overrides them.
DEFAULT_PRIORITY_CLASSES: dict[str, int] = {
    "train": 50,
    "build-preemptible": 75,
    "build": 100,
    "inference": 125,
}


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """One ``spec.resourceClaims`` entry of a pod template: the pod's name for the claim,
    and the ResourceClaim (or, when ``template``, the ResourceClaimTemplate) it names, in the
    pod's namespace."""

    name: str
    target: str
    template: bool = False


@dataclass(frozen=True)
class JobArrival:
    """The pods of one job, created together at ``at`` simulated seconds."""

    name: str
    at: float
    #: Seconds each pod runs once bound; None means it runs until the simulation ends.
    duration: float | None
    pods: tuple[Pod, ...]
    #: The gang every pod belongs to (an explicit PodGroup or, per pod, an implicit one).
    gangs: tuple[Gang, ...]
    #: Termination grace period of its pods when evicted (None: ``settings``' default).
    grace: float | None = None
    #: True when the job is already running at the start (its pods are bound).
    running: bool = False
    #: The template's ``spec.resourceClaims`` (every pod of the job has the same entries).
    claims: tuple[ClaimRef, ...] = ()


class PriorityClasses(dict[str, int]):
    """PriorityClass name -> value, and the names whose ``preemptionPolicy`` is ``Never``."""

    def __init__(self, values: Mapping[str, int], never: frozenset[str] = frozenset()) -> None:
        super().__init__(values)
        self.never = never


def priority_classes(raw: Any) -> PriorityClasses:
    """KAI's default PriorityClasses plus the scenario's ``priorityClasses``: ``name: value``
    or ``name: {value: V, preemptionPolicy: Never}`` (its gangs never evict anyone)."""
    classes = dict(DEFAULT_PRIORITY_CLASSES)
    never: set[str] = set()
    for name, entry in read_mapping(raw, "priorityClasses").items():
        path = f"priorityClasses.{name}"
        value = entry
        if isinstance(entry, Mapping):
            check_known(entry, path, ("value", "preemptionPolicy"))
            value = entry.get("value")
            policy = entry.get("preemptionPolicy", "PreemptLowerPriority")
            if policy not in ("PreemptLowerPriority", "Never"):
                raise ScenarioError(
                    f"{path}.preemptionPolicy",
                    f"{policy!r} must be PreemptLowerPriority or Never",
                )
            if policy == "Never":
                never.add(str(name))
            path = f"{path}.value"
        if not isinstance(value, int) or isinstance(value, bool):
            raise ScenarioError(path, f"{value!r} must be a whole number")
        classes[str(name)] = value
    return PriorityClasses(classes, frozenset(never))


@dataclass(frozen=True)
class PodGroupDef:
    """A PodGroup object from ``podGroups`` (resolved into a Gang once we know its arrival)."""

    obj: Mapping[str, Any]
    path: str


def pod_groups(raw: Any) -> dict[str, PodGroupDef]:
    """The ``podGroups`` section, keyed by ``namespace/name``."""
    groups: dict[str, PodGroupDef] = {}
    for i, entry in enumerate(read_list(raw, "podGroups")):
        path = f"podGroups[{i}]"
        data = dict(read_mapping(entry, path))
        data.pop("apiVersion", None)
        data.pop("kind", None)
        check_known(data, path, ("metadata", "spec"))
        meta = read_mapping(data.get("metadata"), f"{path}.metadata")
        name = read_name(meta.get("name"), f"{path}.metadata.name")
        namespace = meta.get("namespace") or "default"
        key = f"{namespace}/{name}"
        if key in groups:
            raise ScenarioError(f"{path}.metadata.name", f"PodGroup {key} is defined twice")
        read_mapping(data.get("spec"), f"{path}.spec")
        groups[key] = PodGroupDef({**data, "metadata": {**meta, "namespace": namespace}}, path)
    return groups


_JOB_FIELDS = ("name", "namespace", "queue", "at", "duration", "priorityClassName", "podGroup",
               "pods", "running")  # fmt: skip
_RUNNING_FIELDS = ("nodes", "startTime")
_POD_FIELDS = ("count", "template", "resources", "annotations", "nodeSelector", "tolerations")


def _template(pods: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The pod template, with the shorthands folded into it."""
    template = dict(read_mapping(pods.get("template"), f"{path}.template"))
    meta = dict(read_mapping(template.get("metadata"), f"{path}.template.metadata"))
    spec = dict(read_mapping(template.get("spec"), f"{path}.template.spec"))
    if pods.get("resources") is not None:
        if spec.get("containers"):
            raise ScenarioError(
                f"{path}.resources", "set resources or template.spec.containers, not both"
            )
        requests = read_mapping(pods["resources"], f"{path}.resources")
        check_whole_requests(requests, f"{path}.resources")
        spec["containers"] = [{"name": "main", "resources": {"requests": dict(requests)}}]
    if pods.get("annotations") is not None:
        meta["annotations"] = {
            **read_string_map(meta.get("annotations"), f"{path}.template.metadata.annotations"),
            **read_string_map(pods["annotations"], f"{path}.annotations"),
        }
    if pods.get("nodeSelector") is not None:
        spec["nodeSelector"] = read_string_map(pods["nodeSelector"], f"{path}.nodeSelector")
    if pods.get("tolerations") is not None:
        spec["tolerations"] = read_list(pods["tolerations"], f"{path}.tolerations")
    if spec.get("schedulingGates"):
        raise ScenarioError(
            f"{path}.template.spec.schedulingGates",
            "nothing removes scheduling gates in a simulation, so these pods would never be "
            "scheduled; remove spec.schedulingGates",
        )
    if pod_claims(spec, "pod"):
        raise ScenarioError(
            f"{path}.template.spec.volumes",
            "a simulation has no PersistentVolumeClaims or volumes, so these pods would never "
            "be scheduled; remove the persistentVolumeClaim and ephemeral volumes",
        )
    check_whole_extended(spec, f"{path}.template.spec")
    if not spec.get("containers"):
        raise ScenarioError(
            f"{path}.template.spec.containers",
            "a pod needs at least one container; or give pods.resources, "
            "e.g. {nvidia.com/gpu: 1, cpu: 4}",
        )
    return {"metadata": meta, "spec": spec}


def _claim_refs(spec: Mapping[str, Any], path: str) -> tuple[ClaimRef, ...]:
    """The template's ``spec.resourceClaims`` entries, each naming exactly one of a claim
    and a claim template, names unique."""
    out: list[ClaimRef] = []
    for i, raw in enumerate(read_list(spec.get("resourceClaims"), path)):
        entry = read_mapping(raw, f"{path}[{i}]")
        check_known(
            entry, f"{path}[{i}]", ("name", "resourceClaimName", "resourceClaimTemplateName")
        )
        name = read_name(entry.get("name"), f"{path}[{i}].name")
        if any(r.name == name for r in out):
            raise ScenarioError(f"{path}[{i}].name", f"{name!r} is used twice")
        claim, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        if (claim is None) == (template is None):
            raise ScenarioError(
                f"{path}[{i}]",
                "give exactly one of resourceClaimName (a claim under resourceClaims) and "
                "resourceClaimTemplateName (a template under resourceClaimTemplates)",
            )
        if claim is not None:
            out.append(ClaimRef(name, read_name(claim, f"{path}[{i}].resourceClaimName")))
        else:
            target = read_name(template, f"{path}[{i}].resourceClaimTemplateName")
            out.append(ClaimRef(name, target, template=True))
    return tuple(out)


def _start_time(raw: Any, path: str) -> float:
    """``startTime``: when already running pods started, 0 or before (``-30m``, ``-1800``)."""
    text = str(raw).strip() if isinstance(raw, str) else raw
    if isinstance(text, str) and text.startswith("-"):
        return -read_seconds(text[1:], path)
    if isinstance(text, int | float) and not isinstance(text, bool) and text < 0:
        return -read_seconds(-text, path)
    if read_seconds(text, path) != 0:
        raise ScenarioError(
            path, f"{raw!r} is after the start; use 0s or a time before it such as -30m"
        )
    return 0.0


def _running(raw: Any, path: str, count: int) -> tuple[tuple[str, ...], float]:
    """``running: {nodes, startTime}``: the node of each pod and when they started."""
    data = read_mapping(raw, path)
    check_known(data, path, _RUNNING_FIELDS)
    nodes_raw = data.get("nodes")
    if isinstance(nodes_raw, str):
        nodes = (read_name(nodes_raw, f"{path}.nodes"),) * count
    else:
        items = read_list(nodes_raw, f"{path}.nodes")
        nodes = tuple(read_name(n, f"{path}.nodes[{k}]") for k, n in enumerate(items))
        if len(nodes) != count:
            raise ScenarioError(
                f"{path}.nodes",
                f"name one node per pod ({count}), or one node name for all of them",
            )
    return nodes, _start_time(data.get("startTime", 0), f"{path}.startTime")


def _grace(spec: Mapping[str, Any], path: str) -> float | None:
    """The template's ``terminationGracePeriodSeconds`` (None when not given)."""
    raw = spec.get("terminationGracePeriodSeconds")
    if raw is None:
        return None
    if not isinstance(raw, int | float) or isinstance(raw, bool) or raw < 0:
        raise ScenarioError(path, f"{raw!r} must be a number of seconds >= 0")
    return float(raw)


def _job(
    entry: Any,
    path: str,
    queue_names: set[str],
    groups: dict[str, PodGroupDef],
    priorities: PriorityClasses,
) -> tuple[JobArrival, str | None]:
    """One job; also returns the key of a shared PodGroup it uses (to check consistency)."""
    data = read_mapping(entry, path)
    check_known(data, path, _JOB_FIELDS)
    name = read_name(data.get("name"), f"{path}.name")
    namespace = read_name(data.get("namespace", "default"), f"{path}.namespace")
    at = read_seconds(data.get("at", 0), f"{path}.at")
    duration = (
        None if data.get("duration") is None else read_seconds(data["duration"], f"{path}.duration")
    )
    pods_raw = read_mapping(data.get("pods"), f"{path}.pods")
    if not pods_raw:
        raise ScenarioError(f"{path}.pods", "required: give count and template (or resources)")
    check_known(pods_raw, f"{path}.pods", _POD_FIELDS)
    count = read_count(pods_raw.get("count", 1), f"{path}.pods.count")
    if count > MAX_PODS_PER_JOB:
        raise ScenarioError(f"{path}.pods.count", f"at most {MAX_PODS_PER_JOB} pods per job")
    template = _template(pods_raw, f"{path}.pods")
    grace = _grace(template["spec"], f"{path}.pods.template.spec.terminationGracePeriodSeconds")
    claims = _claim_refs(template["spec"], f"{path}.pods.template.spec.resourceClaims")
    running: tuple[tuple[str, ...], float] | None = None
    if data.get("running") is not None:
        running = _running(data["running"], f"{path}.running", count)
        if at:
            raise ScenarioError(
                f"{path}.at", "a running job exists from the start; drop at (or running)"
            )
        if duration is not None and running[1] + duration <= 0:
            raise ScenarioError(
                f"{path}.duration",
                "the job would have finished before the start; lengthen it or move startTime",
            )
    pc = data.get("priorityClassName") or ""
    if not isinstance(pc, str):
        raise ScenarioError(f"{path}.priorityClassName", "must be the name of a PriorityClass")
    if pc and pc not in priorities:
        raise ScenarioError(
            f"{path}.priorityClassName",
            f"PriorityClass {pc!r} is not defined; add it under priorityClasses "
            f"or use one of {', '.join(sorted(priorities))}",
        )
    job_queue = None if data.get("queue") is None else read_name(data["queue"], f"{path}.queue")

    # The gang: a shared PodGroup by name, an inline PodGroup spec, or none (implicit gangs).
    group_raw = data.get("podGroup")
    shared_key: str | None = None
    gang: Gang | None = None
    if isinstance(group_raw, str):
        shared_key = group_raw if "/" in group_raw else f"{namespace}/{group_raw}"
        if shared_key not in groups:
            raise ScenarioError(
                f"{path}.podGroup",
                f"PodGroup {shared_key} is not defined under podGroups "
                f"(or give an inline spec such as {{minMember: {count}}})",
            )
        gdef = groups[shared_key]
        gang = _gang(gdef.obj, gdef.path, job_queue, priorities, at)
    elif group_raw is not None:
        spec = dict(read_mapping(group_raw, f"{path}.podGroup"))
        spec.setdefault("minMember", count)
        if pc:
            spec.setdefault("priorityClassName", pc)
        obj = {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
        gang = _gang(obj, f"{path}.podGroup", job_queue, priorities, at, inline=True)
    if gang is not None and job_queue and gang.queue and gang.queue != job_queue:
        # The scheduler takes the PodGroup's queue and ignores the pods'; a difference is
        # a mistake that would silently move the job to another queue.
        where = f"PodGroup {shared_key}" if shared_key else f"{path}.podGroup.queue"
        raise ScenarioError(
            f"{path}.queue",
            f"{job_queue!r} differs from the queue {gang.queue!r} of its PodGroup ({where}); "
            "pods go to their PodGroup's queue, so drop queue here or make the two equal",
        )
    queue = (gang.queue if gang else None) or job_queue
    if not queue:
        raise ScenarioError(f"{path}.queue", "required (the queue this job's pods go to)")
    if not isinstance(queue, str) or queue not in queue_names:
        field_path = f"{path}.queue" if job_queue else f"{path}.podGroup.queue"
        raise ScenarioError(
            field_path,
            f"queue {queue!r} is not defined under queues; known: {', '.join(sorted(queue_names))}",
        )

    pods: list[Pod] = []
    gangs: list[Gang] = [gang] if gang else []
    for k in range(count):
        pod_name = name if count == 1 else f"{name}-{k}"
        meta = dict(template["metadata"])
        labels = {**read_string_map(meta.get("labels"), f"{path}.pods.template.metadata.labels")}
        labels[QUEUE_LABEL] = queue
        annotations = read_string_map(
            meta.get("annotations"), f"{path}.pods.template.metadata.annotations"
        )
        if gang is not None:
            annotations["pod-group-name"] = gang.name
        spec = {**template["spec"], "schedulerName": SCHEDULER_NAME}
        if pc:
            spec["priority"] = priorities[pc]
            spec["priorityClassName"] = pc
            if pc in priorities.never:  # admission copies it from the PriorityClass
                spec["preemptionPolicy"] = "Never"
        obj = {
            "metadata": {
                **meta,
                "name": pod_name,
                "namespace": namespace,
                "uid": f"{namespace}/{pod_name}",
                "labels": labels,
                "annotations": annotations,
            },
            "spec": spec,
        }
        try:
            pod = pod_from_k8s(obj, scheduler_name=SCHEDULER_NAME, default_queue=queue)
            hints = gang_hints(obj)
        except PodSpecError as e:
            raise ScenarioError(f"{path}.pods.template.{e.field}", e.message) from e
        except (TypeError, AttributeError, ValueError) as e:
            raise ScenarioError(f"{path}.pods.template", f"not a valid pod template: {e}") from e
        pod = replace(pod, queue=queue, creation_time=at)
        if running is not None:
            started = running[1]
            pod = replace(
                pod,
                node_name=running[0][k],
                phase=PodPhase.RUNNING,
                start_time=started,
                creation_time=started,
            )
        if gang is None:
            # A pod without a PodGroup speaks for its gang of one (label, annotation).
            implicit = Gang(
                namespace=namespace,
                name=pod_name,
                min_member=1,
                queue=queue,
                priority=pod.priority,
                preemptible=hints.preemptibility == "preemptible"
                if hints.preemptibility
                else pod.priority < BUILD_PRIORITY,
                creation_time=pod.creation_time,
                implicit=True,
                preemption_delay_seconds=hints.preemption_delay or 0.0,
                may_preempt=hints.may_preempt,
            )
            gangs.append(implicit)
            pod = replace(pod, gang=implicit.key)
        else:
            if not hints.may_preempt:  # a gang may take back only if every pod may
                gang = replace(gang, may_preempt=False)
                gangs = [gang]
            pod = replace(pod, gang=gang.key)
        pods.append(pod)
    if running is not None and gang is not None:
        gangs = [replace(gang, creation_time=min(gang.creation_time, running[1]))]
    job = JobArrival(
        name, at, duration, tuple(pods), tuple(gangs), grace, running is not None, claims
    )
    return job, shared_key


def _gang(
    obj: Mapping[str, Any],
    path: str,
    job_queue: Any,
    priorities: PriorityClasses,
    at: float,
    *,
    inline: bool = False,
) -> Gang:
    """``inline``: ``obj`` was built from a job's ``podGroup`` spec, so errors name that."""
    try:
        gang = gang_from_k8s(obj, default_queue=job_queue or "", priorities=priorities)
    except SpecError as e:
        field_name = e.field.removeprefix("spec.") if inline else e.field
        raise ScenarioError(f"{path}.{field_name}", e.message) from e
    except (TypeError, AttributeError) as e:
        raise ScenarioError(path, f"not a valid PodGroup: {e}") from e
    if not isinstance(gang.queue, str):
        raise ScenarioError(f"{path}.{'' if inline else 'spec.'}queue", "must be a queue name")
    pc = (obj.get("spec") or {}).get("priorityClassName") or ""
    if pc in priorities.never:
        gang = replace(gang, may_preempt=False)
    return replace(gang, creation_time=at)


def parse_jobs(
    raw: Any,
    queue_names: set[str],
    groups: dict[str, PodGroupDef],
    priorities: PriorityClasses,
) -> tuple[JobArrival, ...]:
    """The ``jobs`` section; pod and job names must be unique per namespace."""
    jobs: list[JobArrival] = []
    shared_keys: list[str | None] = []
    pod_keys: set[str] = set()
    job_names: set[tuple[str, str]] = set()
    for i, entry in enumerate(read_list(raw, "jobs")):
        path = f"jobs[{i}]"
        job, shared_key = _job(entry, path, queue_names, groups, priorities)
        ns = job.pods[0].namespace
        if (ns, job.name) in job_names:
            raise ScenarioError(f"{path}.name", f"job {ns}/{job.name} is defined twice")
        job_names.add((ns, job.name))
        for pod in job.pods:
            if pod.key in pod_keys:
                raise ScenarioError(
                    f"{path}.name", f"pod {pod.key} clashes with a pod of another job; rename"
                )
            pod_keys.add(pod.key)
        jobs.append(job)
        shared_keys.append(shared_key)
    # Jobs sharing a PodGroup share one gang: it exists from the earliest job's arrival (or
    # the start of a job already running).
    first: dict[str, float] = {}
    queues: dict[str, tuple[str, str]] = {}
    for i, (job, key) in enumerate(zip(jobs, shared_keys, strict=True)):
        if key:
            # A PodGroup without spec.queue takes each job's queue: they must agree.
            queue = job.gangs[0].queue
            seen = queues.setdefault(key, (queue, job.name))
            if seen[0] != queue:
                raise ScenarioError(
                    f"jobs[{i}].queue",
                    f"job {job.name} puts PodGroup {key} in queue {queue!r} but job {seen[1]} "
                    f"puts it in {seen[0]!r}; a PodGroup has one queue: set its spec.queue",
                )
            created = min(g.creation_time for g in job.gangs)
            first[key] = min(first.get(key, created), created)
    return tuple(
        replace(job, gangs=tuple(replace(g, creation_time=first[key]) for g in job.gangs))
        if key
        else job
        for job, key in zip(jobs, shared_keys, strict=True)
    )
