"""Volcano's Queue and PodGroup (``scheduling.volcano.sh/v1beta1``) as domain types.

Translated here, at the edge, into the same :class:`~scheduler.cluster.queue.Queue` and
:class:`~scheduler.cluster.gang.Gang` as KAI's objects, so nothing past the cache knows which
API a gang came from. docs/api.md ("Volcano") has the user-facing table; in short:

Queue (cluster-scoped):

- ``capability`` -> ``limit`` per resource (a hard cap; inherited down the tree, since the
  limits of every ancestor apply);
- ``deserved`` -> ``quota``; where ``deserved`` does not name a resource, ``guarantee.resource``
  does; neither -> quota 0 (the queue's share then comes from its weight alone, as Volcano's
  ``proportion`` plugin computes it);
- ``weight`` -> ``over_quota_weight`` of every resource (0 or absent -> 1, as Volcano's
  admission webhook defaults it);
- ``reclaimable`` -> :attr:`Queue.reclaimable` (absent -> true, Volcano's default);
- ``parent`` -> ``parent``; absent -> ``root`` (every Volcano queue hangs below ``root``, as in
  Volcano's hierarchical queues); the queue ``root`` itself is a top-level queue;
- ``priority`` p -> priority ``100 + p``: same meaning as KAI's queue priority, and an unset
  Volcano priority (0) equals KAI's default (100), so order among Volcano queues is unchanged.

Only ``nvidia.com/gpu`` (devices, fractions allowed), ``cpu`` and ``memory`` are accounted;
other resource names are accepted and ignored. ``status.state`` ``Closed``/``Closing`` keeps
new PodGroups of the queue from being enqueued (:mod:`scheduler.commit.volcano`).

PodGroup (namespaced): ``minMember`` (0 or absent -> 1), ``queue`` (absent -> ``default``),
``priorityClassName`` (an unknown class is ignored, as Volcano does: the members' priority
applies), preemptible from the annotation, else the label, ``volcano.sh/preemptable`` (read as
Volcano reads it: ``true``/``1``/``t``, anything else is false), else KAI's label
``kai.scheduler/preemptibility``, else **true** (Volcano's default).
``minResources`` is what the enqueue step compares with the queue's capability and the
cluster; ``minTaskMember`` is checked (whole numbers >= 0) and stored but not enforced per
task (the gang is placed as a whole by ``minMember``).

Errors raise :class:`~scheduler.cluster.queuespec.SpecError` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.podspec import (
    PREEMPTIBILITY_LABEL,
    PREEMPTION_DELAY_ANNOTATION,
    parse_timestamp,
)
from scheduler.cluster.quantity import QuantityError, format_milli, parse_quantity
from scheduler.cluster.queue import QUEUE_RESOURCES, UNLIMITED, Queue, QueueResource
from scheduler.cluster.queuespec import SpecError, parse_preemptibility, parse_preemption_delay
from scheduler.cluster.resources import CPU, GPU, MEMORY

__all__ = [
    "DEFAULT_QUEUE",
    "PREEMPTABLE_KEY",
    "ROOT_QUEUE",
    "VOLCANO_API_GROUP",
    "default_queue",
    "is_volcano",
    "k8s_quantity",
    "k8s_resource_list",
    "min_resources",
    "queue_state",
    "resource_name",
    "root_queue",
    "volcano_gang_from_k8s",
    "volcano_queue_from_k8s",
]

VOLCANO_API_GROUP = "scheduling.volcano.sh"
#: Where a PodGroup that names no queue goes, as in Volcano.
DEFAULT_QUEUE = "default"
#: The root of Volcano's queue tree; queues without ``spec.parent`` hang below it.
ROOT_QUEUE = "root"
#: Annotation (first) or label on a PodGroup: ``"true"`` / ``"false"``.
PREEMPTABLE_KEY = "volcano.sh/preemptable"
#: Volcano queue priority p becomes this + p.
QUEUE_PRIORITY_BASE = 100

#: Kubernetes resource name -> queue resource.
_QUEUE_RESOURCE = {GPU: "gpu", CPU: "cpu", MEMORY: "memory"}
_RESOURCE_NAME = {v: k for k, v in _QUEUE_RESOURCE.items()}


def is_volcano(obj: Mapping[str, Any]) -> bool:
    """True for an object of Volcano's ``scheduling.volcano.sh`` API."""
    return str(obj.get("apiVersion") or "").startswith(f"{VOLCANO_API_GROUP}/")


def resource_name(resource: str) -> str:
    """The Kubernetes resource name of a queue resource (``gpu`` -> ``nvidia.com/gpu``)."""
    return _RESOURCE_NAME.get(resource, resource)


def _resources(raw: Any, field: str) -> dict[str, int]:
    """A Kubernetes resource list as queue amounts (gpu milli, cpu milli, memory bytes);
    names other than ``nvidia.com/gpu``, ``cpu`` and ``memory`` are ignored."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError(field, f"{raw!r} must be a map of resource names to quantities")
    out: dict[str, int] = {}
    for name, value in raw.items():
        resource = _QUEUE_RESOURCE.get(str(name))
        if resource is None:
            continue
        where = f"{field}[{name}]"
        try:
            amount = parse_quantity(value)
        except QuantityError as e:
            raise SpecError(where, f"{value!r} is not a quantity") from e
        if amount < 0:
            raise SpecError(where, f"{value!r} must not be negative")
        scale = 1 if resource == "memory" else GPU_MILLI
        out[resource] = math.ceil(amount * scale)
    return out


def min_resources(obj: Mapping[str, Any]) -> dict[str, int]:
    """A PodGroup's ``spec.minResources`` in queue amounts (keys gpu, cpu, memory present only
    when asked for). Raises :class:`SpecError` for a bad quantity."""
    spec = obj.get("spec") or {}
    return _resources(spec.get("minResources"), "spec.minResources")


def queue_state(obj: Mapping[str, Any] | None) -> str:
    """A Volcano Queue's ``status.state`` (``Open`` when not reported yet)."""
    state = str(((obj or {}).get("status") or {}).get("state") or "")
    return state or "Open"


def _whole(raw: Any, field: str, *, minimum: int = 0) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < minimum:
        raise SpecError(field, f"{raw!r} must be a whole number >= {minimum}")
    return raw


def volcano_queue_from_k8s(obj: Mapping[str, Any]) -> Queue:
    """Convert a ``scheduling.volcano.sh/v1beta1`` Queue (see the module docstring)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = str(meta.get("name") or "")
    capability = _resources(spec.get("capability"), "spec.capability")
    deserved = _resources(spec.get("deserved"), "spec.deserved")
    guarantee_raw = spec.get("guarantee") or {}
    if not isinstance(guarantee_raw, Mapping):
        raise SpecError("spec.guarantee", f"{guarantee_raw!r} must be an object")
    guarantee = _resources(guarantee_raw.get("resource"), "spec.guarantee.resource")
    weight_raw = spec.get("weight")
    weight = 1 if weight_raw in (None, 0) else _whole(weight_raw, "spec.weight", minimum=1)
    resources: list[tuple[str, QueueResource]] = []
    for r in QUEUE_RESOURCES:
        limit = capability.get(r, UNLIMITED)
        quota = deserved.get(r, guarantee.get(r, 0))
        if limit != UNLIMITED:
            quota = min(quota, limit)  # Volcano asks deserved <= capability; never above it
        resources.append((r, QueueResource(quota=quota, over_quota_weight=weight, limit=limit)))
    reclaimable = spec.get("reclaimable")
    if reclaimable is not None and not isinstance(reclaimable, bool):
        raise SpecError("spec.reclaimable", f"{reclaimable!r} must be true or false")
    priority = spec.get("priority") or 0
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise SpecError("spec.priority", f"{priority!r} must be a whole number")
    parent = str(spec.get("parent") or "")
    if name == ROOT_QUEUE:
        parent = ""
    elif not parent:
        parent = ROOT_QUEUE
    return Queue(
        name=name,
        parent=parent,
        priority=QUEUE_PRIORITY_BASE + priority,
        resources=tuple(resources),
        creation_time=parse_timestamp(meta.get("creationTimestamp")),
        reclaimable=True if reclaimable is None else reclaimable,
    )


def root_queue() -> Queue:
    """Volcano's ``root`` queue when no such object exists: open, no quota or limit."""
    return Queue(ROOT_QUEUE, priority=QUEUE_PRIORITY_BASE)


def default_queue() -> Queue:
    """Volcano's ``default`` queue when no such object exists, as Volcano's scheduler creates
    it: weight 1, reclaimable, below ``root``."""
    return Queue(DEFAULT_QUEUE, parent=ROOT_QUEUE, priority=QUEUE_PRIORITY_BASE)


def _preemptable(obj: Mapping[str, Any]) -> bool:
    """``volcano.sh/preemptable`` (annotation, then label), else KAI's preemptibility label,
    else true (Volcano's default)."""
    meta = obj.get("metadata") or {}
    for values in (meta.get("annotations") or {}, meta.get("labels") or {}):
        raw = values.get(PREEMPTABLE_KEY)
        if raw is None:
            continue
        # As Volcano parses it: Go's ParseBool, and anything unreadable counts as false.
        return str(raw).strip().lower() in ("true", "1", "t")
    kai = parse_preemptibility(
        (meta.get("labels") or {}).get(PREEMPTIBILITY_LABEL),
        f"metadata.labels[{PREEMPTIBILITY_LABEL}]",
    )
    return kai != "non-preemptible"


def volcano_gang_from_k8s(
    obj: Mapping[str, Any],
    *,
    priorities: Mapping[str, int],
    default_grace_seconds: float = 60.0,
) -> Gang:
    """Convert a ``scheduling.volcano.sh/v1beta1`` PodGroup (see the module docstring).

    ``priority`` is the PriorityClass's value when the class exists, else 0 (the resolver then
    takes the members' highest priority, as for KAI PodGroups without a class).
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    min_member = spec.get("minMember", 1)
    min_member = 1 if min_member is None else _whole(min_member, "spec.minMember")
    tasks = spec.get("minTaskMember") or {}
    if not isinstance(tasks, Mapping):
        raise SpecError("spec.minTaskMember", f"{tasks!r} must be a map of task names to counts")
    for task, count in tasks.items():
        _whole(count, f"spec.minTaskMember[{task}]")
    min_resources(obj)  # a bad quantity makes the PodGroup invalid, with the field named
    queue = spec.get("queue") or DEFAULT_QUEUE
    if not isinstance(queue, str):
        raise SpecError("spec.queue", f"{queue!r} must be a queue name")
    pc = spec.get("priorityClassName") or ""
    annotations = meta.get("annotations") or {}
    delay = parse_preemption_delay(
        annotations.get(PREEMPTION_DELAY_ANNOTATION),
        f"metadata.annotations[{PREEMPTION_DELAY_ANNOTATION}]",
    )
    return Gang(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        min_member=max(min_member, 1),
        queue=queue,
        priority=priorities.get(pc, 0),
        preemptible=_preemptable(obj),
        creation_time=parse_timestamp(meta.get("creationTimestamp")),
        staleness_grace_seconds=default_grace_seconds,
        preemption_delay_seconds=delay or 0.0,
    )


def _quantity(resource: str, amount: int) -> str:
    """A queue amount as a Kubernetes quantity (``2``, ``500m``, ``8Gi``/bytes)."""
    if resource == "memory":
        for suffix, size in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if amount and amount % size == 0:
                return f"{amount // size}{suffix}"
        return str(amount)
    if amount % GPU_MILLI == 0:
        return str(amount // GPU_MILLI)
    if resource == "cpu":
        return f"{amount}m"
    return format_milli(amount)


def k8s_quantity(resource: str, amount: int) -> str:
    """A queue amount in the units of a Kubernetes resource list, for messages and status."""
    return _quantity(resource, amount)


def k8s_resource_list(amounts: Mapping[str, int]) -> dict[str, str]:
    """Queue amounts as a Kubernetes resource list (``cpu``, ``memory``, ``nvidia.com/gpu``)."""
    return {resource_name(r): _quantity(r, amounts.get(r, 0)) for r in QUEUE_RESOURCES}
