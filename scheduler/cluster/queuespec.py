"""From Queue and PodGroup objects (KAI's CRDs, API JSON form) to :class:`Queue` and :class:`Gang`.

Queue units follow KAI: GPU in devices (fractions allowed), CPU in millicores, memory in MB
(10^6 bytes). -1 means unlimited. Unlike KAI, an omitted ``limit`` is unlimited (KAI reads it
as zero, which silently blocks the queue). Errors raise :class:`SpecError` naming the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.podspec import parse_timestamp
from scheduler.cluster.quantity import QuantityError, parse_quantity
from scheduler.cluster.queue import QUEUE_RESOURCES, UNLIMITED, Queue, QueueResource

__all__ = ["SpecError", "gang_from_k8s", "parse_duration", "queue_from_k8s"]

#: Multiplier from the CRD's unit to the scheduler's integer unit, per queue resource.
_UNIT = {"gpu": GPU_MILLI, "cpu": 1, "memory": 10**6}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


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
    )


def parse_duration(raw: Any, field: str) -> float:
    """A Go-style duration (``60s``, ``1m30s``, ``500ms``) or a number of seconds."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    text = str(raw).strip()
    total, pos = 0.0, 0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]
        total += float(m.group(1)) * scale
        pos = m.end()
    if pos != len(text) or not text:
        raise SpecError(field, f"{raw!r} is not a duration such as 60s, 5m or 1h30m")
    return total


def gang_from_k8s(
    obj: Mapping[str, Any],
    *,
    default_queue: str,
    priorities: Mapping[str, int],
    default_grace_seconds: float = 60.0,
) -> Gang:
    """Convert a ``scheduling.run.ai/v2alpha2`` PodGroup object.

    ``priorities`` maps PriorityClass names to values; an unknown class is an error.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    min_member = spec.get("minMember", 1)
    if not isinstance(min_member, int) or isinstance(min_member, bool) or min_member < 0:
        raise SpecError("spec.minMember", f"{min_member!r} must be a whole number >= 0")
    preemptibility = spec.get("preemptibility") or ""
    if preemptibility not in ("", "preemptible", "non-preemptible"):
        raise SpecError(
            "spec.preemptibility", f"{preemptibility!r} must be preemptible or non-preemptible"
        )
    pc = spec.get("priorityClassName") or ""
    if pc and pc not in priorities:
        raise SpecError("spec.priorityClassName", f"PriorityClass {pc!r} does not exist")
    priority = priorities.get(pc, 0)
    # KAI's rule: without an explicit choice, work below the build priority (100) is preemptible.
    preemptible = preemptibility == "preemptible" if preemptibility else priority < 100
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
    )
