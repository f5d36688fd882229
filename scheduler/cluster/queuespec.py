"""From Queue and PodGroup objects (KAI's CRDs, API JSON form) to :class:`Queue` and :class:`Gang`.

Queue units follow KAI: GPU in devices (fractions allowed), CPU in millicores, memory in MB
(10^6 bytes). -1 means unlimited. Unlike KAI, an omitted ``limit`` is unlimited (KAI reads it
as zero, which silently blocks the queue). Errors raise :class:`SpecError` naming the field.

Taking back (docs/taking-back.md): a Queue's ``spec.preemptMinRuntime`` and
``spec.reclaimMinRuntime``; a PodGroup's ``spec.preemptionDelay`` (else the annotation
``kai.scheduler/preemption-delay``) and ``spec.preemptibility`` (else the label
``kai.scheduler/preemptibility``, else priority below 100 is preemptible). Every value that is
present is checked, also one that a higher-precedence source overrides.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.podspec import (
    BUILD_PRIORITY,
    PREEMPTIBILITY_LABEL,
    PREEMPTIBILITY_VALUES,
    PREEMPTION_DELAY_ANNOTATION,
    duration_seconds,
    parse_timestamp,
)
from scheduler.cluster.quantity import QuantityError, parse_quantity
from scheduler.cluster.queue import QUEUE_RESOURCES, UNLIMITED, Queue, QueueResource

__all__ = [
    "BUILD_PRIORITY",
    "PREEMPTIBILITY_LABEL",
    "PREEMPTIBILITY_VALUES",
    "PREEMPTION_DELAY_ANNOTATION",
    "SpecError",
    "gang_from_k8s",
    "parse_duration",
    "parse_preemptibility",
    "parse_preemption_delay",
    "preemptibility_of",
    "queue_from_k8s",
]

#: Multiplier from the CRD's unit to the scheduler's integer unit, per queue resource.
_UNIT = {"gpu": GPU_MILLI, "cpu": 1, "memory": 10**6}


class SpecError(ValueError):
    """A Queue or PodGroup field the scheduler cannot act on."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _amount(raw: Any, resource: str, field: str) -> int:
    try:
        value = parse_quantity(raw)
    except QuantityError as e:
        raise SpecError(field, f"{raw!r} is not a number") from e
    if value == UNLIMITED:
        return UNLIMITED
    if value < 0:
        raise SpecError(field, f"{raw!r} is negative; use -1 for unlimited or a value >= 0")
    return math.ceil(value * _UNIT[resource])


def queue_from_k8s(obj: Mapping[str, Any]) -> Queue:
    """Convert a ``scheduling.run.ai/v2`` Queue object."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    resources: list[tuple[str, QueueResource]] = []
    given = spec.get("resources") or {}
    if not isinstance(given, Mapping):
        raise SpecError("spec.resources", "must be an object with gpu, cpu and memory entries")
    for name in QUEUE_RESOURCES:
        raw = given.get(name)
        if raw is None:
            continue
        base = f"spec.resources.{name}"
        if not isinstance(raw, Mapping):
            raise SpecError(base, f"{raw!r} must be an object with quota, limit, overQuotaWeight")
        quota = _amount(raw.get("quota", 0), name, f"{base}.quota")
        limit = _amount(raw.get("limit", UNLIMITED), name, f"{base}.limit")
        weight_raw = raw.get("overQuotaWeight", 1)
        try:
            weight = parse_quantity(weight_raw)
        except QuantityError as e:
            raise SpecError(f"{base}.overQuotaWeight", f"{weight_raw!r} is not a number") from e
        if weight < 0:
            raise SpecError(f"{base}.overQuotaWeight", "must be 0 or more")
        if limit != UNLIMITED and quota != UNLIMITED and limit < quota:
            raise SpecError(
                f"{base}.limit",
                f"limit {raw.get('limit')} is below quota "
                f"{raw.get('quota')}; raise the limit or lower the quota",
            )
        resources.append((name, QueueResource(quota, math.ceil(weight), limit)))
    priority = spec.get("priority", 100)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise SpecError("spec.priority", f"{priority!r} must be a whole number")
    return Queue(
        name=meta.get("name", ""),
        parent=spec.get("parentQueue") or "",
        priority=priority,
        resources=tuple(resources),
        display_name=spec.get("displayName") or "",
        creation_time=parse_timestamp(meta.get("creationTimestamp")),
        preempt_min_runtime=_min_runtime(spec, "preemptMinRuntime"),
        reclaim_min_runtime=_min_runtime(spec, "reclaimMinRuntime"),
    )


def _min_runtime(spec: Mapping[str, Any], key: str) -> float | None:
    """``spec.<key>`` in seconds; None when absent (the parent queue's value applies)."""
    raw = spec.get(key)
    if raw is None or raw == "":
        return None
    return _seconds(
        raw,
        f"spec.{key}",
        "set a duration such as 30s, 5m or 1h30m, or remove the field to inherit the "
        "parent queue's",
    )


def _seconds(raw: Any, field: str, fix: str) -> float:
    """A non-negative, finite duration in seconds; :class:`SpecError` with ``fix`` otherwise."""
    try:
        seconds = parse_duration(raw, field)
    except SpecError as e:
        raise SpecError(field, f"{raw!r} is not a duration; {fix}") from e
    if not math.isfinite(seconds) or seconds < 0:
        raise SpecError(field, f"{raw!r} must not be negative; {fix}")
    return seconds


def parse_duration(raw: Any, field: str) -> float:
    """A Go-style duration (``60s``, ``1m30s``, ``500ms``, ``0``) or a number of seconds."""
    seconds = duration_seconds(raw)
    if seconds is None:
        raise SpecError(field, f"{raw!r} is not a duration such as 60s, 5m or 1h30m")
    return seconds


def parse_preemptibility(raw: Any, field: str) -> str:
    """A preemptibility value (``preemptible`` / ``non-preemptible``); "" when not given."""
    if raw is None or raw == "":
        return ""
    if raw not in PREEMPTIBILITY_VALUES:
        raise SpecError(
            field,
            f"{raw!r} must be preemptible or non-preemptible; correct it, or remove it to let "
            f"the priority decide (below {BUILD_PRIORITY} is preemptible)",
        )
    return str(raw)


def parse_preemption_delay(raw: Any, field: str) -> float | None:
    """A preemption delay in seconds; None when not given."""
    if raw is None or raw == "":
        return None
    return _seconds(
        raw,
        field,
        "set a duration such as 30s, 5m or 1h30m (how long a pending gang waits "
        "before it may evict anyone)",
    )


def _label_field(key: str) -> str:
    return f"metadata.labels[{key}]"


def _annotation_field(key: str) -> str:
    return f"metadata.annotations[{key}]"


def preemptibility_of(obj: Mapping[str, Any]) -> str:
    """The explicit preemptibility of a PodGroup: ``spec.preemptibility``, else the label
    ``kai.scheduler/preemptibility``; "" when neither says (the priority decides). Raises
    :class:`SpecError` for an invalid value of either."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    from_spec = parse_preemptibility(spec.get("preemptibility"), "spec.preemptibility")
    from_label = parse_preemptibility(
        (meta.get("labels") or {}).get(PREEMPTIBILITY_LABEL), _label_field(PREEMPTIBILITY_LABEL)
    )
    return from_spec or from_label


def _preemption_delay_of(obj: Mapping[str, Any]) -> float:
    """``spec.preemptionDelay``, else the annotation ``kai.scheduler/preemption-delay``, else 0."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    from_spec = parse_preemption_delay(spec.get("preemptionDelay"), "spec.preemptionDelay")
    from_annotation = parse_preemption_delay(
        (meta.get("annotations") or {}).get(PREEMPTION_DELAY_ANNOTATION),
        _annotation_field(PREEMPTION_DELAY_ANNOTATION),
    )
    if from_spec is not None:
        return from_spec
    return from_annotation or 0.0


def gang_from_k8s(
    obj: Mapping[str, Any],
    *,
    default_queue: str,
    priorities: Mapping[str, int],
    default_grace_seconds: float = 60.0,
) -> Gang:
    """Convert a ``scheduling.run.ai/v2alpha2`` PodGroup object.

    ``priorities`` maps PriorityClass names to values; an unknown class is an error.
    ``may_preempt`` is left True: it comes from the member pods (see :mod:`scheduler.cache`).
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    min_member = spec.get("minMember", 1)
    if not isinstance(min_member, int) or isinstance(min_member, bool) or min_member < 0:
        raise SpecError("spec.minMember", f"{min_member!r} must be a whole number >= 0")
    preemptibility = preemptibility_of(obj)
    pc = spec.get("priorityClassName") or ""
    if pc and pc not in priorities:
        raise SpecError("spec.priorityClassName", f"PriorityClass {pc!r} does not exist")
    priority = priorities.get(pc, 0)
    preemptible = preemptibility == "preemptible" if preemptibility else priority < BUILD_PRIORITY
    grace_raw = spec.get("stalenessGracePeriod")
    grace = (
        default_grace_seconds
        if grace_raw in (None, "")
        else parse_duration(grace_raw, "spec.stalenessGracePeriod")
    )
    return Gang(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        min_member=max(min_member, 1),
        queue=spec.get("queue") or default_queue,
        priority=priority,
        preemptible=preemptible,
        creation_time=parse_timestamp(meta.get("creationTimestamp")),
        staleness_grace_seconds=grace,
        preemption_delay_seconds=_preemption_delay_of(obj),
        unsupported=_unsupported_podgroup_fields(spec),
    )


def _unsupported_podgroup_fields(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """PodGroup fields that restrict placement and are not implemented yet. Preferences
    (``topologyConstraint.preferredTopologyLevel``) are not among them."""
    out: list[str] = []
    topology = spec.get("topologyConstraint")
    if isinstance(topology, Mapping) and topology.get("requiredTopologyLevel"):
        out.append("spec.topologyConstraint.requiredTopologyLevel")
    if spec.get("subGroups"):
        out.append("spec.subGroups")
    return tuple(out)
