"""The PodGroup the grouper wants, and how far an existing one is from it. Pure functions.

Who owns which field of a PodGroup the grouper made:

- **The grouper** owns the spec fields it sets - ``minMember``, ``priorityClassName``,
  ``preemptibility`` and ``topologyConstraint`` (when the workload asks for one) - and the
  labels and annotations it copies from the workload (only those keys). They follow the
  workload: a change made to the PodGroup directly is set back, with a Warning Event on the
  PodGroup saying where to make it instead (the workload's labels and annotations).
- **Users** own everything else: ``queue`` once the PodGroup exists (as in KAI, an admin may
  move a PodGroup to another queue; the label only chooses the first one), and every field
  the grouper does not set (``markUnschedulable``, ``stalenessGracePeriod``,
  ``preemptionDelay``, ``subGroups``, ...), and labels or annotations it did not copy.

An update is a JSON merge patch of exactly the owned fields that differ, so it never
overwrites what it does not own and needs no resourceVersion.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.k8s.resources import PODGROUP
from scheduler.podgrouper.groupers import Grouping, Issue

__all__ = [
    "OWNED_SPEC_FIELDS",
    "Drift",
    "choose_priority_class",
    "desired_podgroup",
    "spec_drift",
    "update_patch",
]

#: Spec fields the grouper owns whenever it sets them (see the module docstring).
OWNED_SPEC_FIELDS = ("minMember", "priorityClassName", "preemptibility", "topologyConstraint")


def choose_priority_class(
    grouping: Grouping, exists: Callable[[str], bool | None]
) -> tuple[str, tuple[Issue, ...]]:
    """The PriorityClass to write ("" for none) and what to tell the user.

    ``exists(name)`` says whether a PriorityClass exists: True, False, or None when unknown
    (it could not be read; the name is then trusted). As KAI does, a class that is asked for
    but missing falls back to the kind's default. Unlike KAI, a missing default is left out
    rather than written: the scheduler rejects a PodGroup naming a missing class, while
    without one it takes the pods' own priority.
    """
    issues: tuple[Issue, ...] = ()
    requested = grouping.requested_priority_class
    default = grouping.default_priority_class
    if requested:
        if exists(requested) is not False:
            return requested, ()
        fallback = (
            f"using the default {default!r}"
            if exists(default) is not False
            else (
                f"the default {default!r} does not exist either, so the pods' own priority counts"
            )
        )
        issues = (
            Issue(
                "PriorityClassNotFound",
                f"PriorityClass {requested!r} ({grouping.requested_from}) does not exist; "
                f"{fallback}. Create the PriorityClass or correct the name",
            ),
        )
    if default and exists(default) is not False:
        return default, issues
    return "", issues


def desired_podgroup(grouping: Grouping, priority_class: str) -> dict[str, Any]:
    """The whole PodGroup object to create for ``grouping``."""
    spec: dict[str, Any] = {"minMember": grouping.min_member, "queue": grouping.queue}
    if priority_class:
        spec["priorityClassName"] = priority_class
    if grouping.preemptibility:
        spec["preemptibility"] = grouping.preemptibility
    if grouping.topology:
        spec["topologyConstraint"] = dict(grouping.topology)
    return {
        "apiVersion": PODGROUP.api_version,
        "kind": PODGROUP.kind,
        "metadata": {
            "name": grouping.name,
            "namespace": grouping.namespace,
            "labels": dict(grouping.labels),
            "annotations": dict(grouping.annotations),
            "ownerReferences": [grouping.owner.to_k8s()],
        },
        "spec": spec,
    }


@dataclass(frozen=True, slots=True)
class Drift:
    """One owned field whose value on the cluster differs from the grouper's."""

    field: str
    current: Any
    desired: Any

    def describe(self) -> str:
        """``spec.minMember is 5 (the workload says 3)``."""
        return f"{self.field} is {self.current!r} (the workload says {self.desired!r})"


def spec_drift(current: Mapping[str, Any], desired: Mapping[str, Any]) -> tuple[Drift, ...]:
    """Owned spec fields of ``current`` (a PodGroup on the cluster) that differ from
    ``desired`` (from :func:`desired_podgroup`). Fields the grouper does not set are never
    drift, nor is ``queue``."""
    have = current.get("spec") or {}
    want = desired.get("spec") or {}
    return tuple(
        Drift(f"spec.{name}", have.get(name), want[name])
        for name in OWNED_SPEC_FIELDS
        if name in want and have.get(name) != want[name]
    )


def _map_patch(current: Mapping[str, Any] | None, desired: Mapping[str, str]) -> dict[str, str]:
    have = current or {}
    return {k: v for k, v in desired.items() if have.get(k) != v}


def update_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch bringing ``current``'s owned fields to ``desired``, or None when they
    already agree."""
    patch: dict[str, Any] = {}
    spec = {d.field.removeprefix("spec."): d.desired for d in spec_drift(current, desired)}
    if spec:
        patch["spec"] = spec
    meta_now = current.get("metadata") or {}
    meta_want = desired.get("metadata") or {}
    metadata: dict[str, Any] = {}
    for key in ("labels", "annotations"):
        changed = _map_patch(meta_now.get(key), meta_want.get(key) or {})
        if changed:
            metadata[key] = changed
    if metadata:
        patch["metadata"] = metadata
    return patch or None
