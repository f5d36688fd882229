"""Checks the API server would make before a scenario's objects ever reached the scheduler.

A simulation should refuse what a cluster refuses, or it answers a question nobody can ask:

- :func:`check_queue_resources`: the Queue CRD's validation rules on ``spec.resources.*``
  (``crds/scheduling.run.ai_queues.yaml``, ``x-kubernetes-validations``), with the CRD's own
  messages (a test keeps them equal), e.g. ``quota: -1`` with ``limit: 4``.
- :func:`check_queue_tree`: a parent that is not defined, a queue that is its own parent, a
  cycle of parents. The live scheduler keeps running and marks those queues invalid; in a
  scenario it is a mistake in the input, so it is an error naming the queue and the fix.
- :func:`check_whole_extended`: extended resources (``nvidia.com/gpu`` and any other
  ``domain/name`` outside ``kubernetes.io``) must be whole numbers; the API server rejects
  ``nvidia.com/gpu: 0.5``, which would otherwise round up to a whole GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.cluster.podspec import GPU_FRACTION_ANNOTATION
from scheduler.cluster.quantity import QuantityError, parse_quantity
from scheduler.cluster.queue import Queue, QueueTree
from scheduler.simulate.fields import ScenarioError

__all__ = [
    "QUEUE_PARENT_MESSAGE",
    "QUEUE_RESOURCE_MESSAGES",
    "check_queue_resources",
    "check_queue_tree",
    "check_whole_extended",
    "check_whole_requests",
    "is_extended_resource",
]

#: The Queue CRD's messages for its per-resource rules, by the field they name.
QUEUE_RESOURCE_MESSAGES = {
    "negative_quota": "quota must be >= 0, or -1 for unlimited",
    "negative_limit": "limit must be >= 0, or -1 for unlimited (an omitted limit is unlimited)",
    "limit_below_quota": (
        "limit is below quota; raise limit to at least the quota, lower the quota, or set "
        "limit to -1 for unlimited"
    ),
    "unlimited_quota": (
        "quota is -1 (unlimited), so limit must be -1 too; set limit to -1 or give a finite quota"
    ),
    "negative_weight": (
        "overQuotaWeight must be >= 0 (0 means the queue never gets resources beyond its quota)"
    ),
}
_UNLIMITED = -1.0
#: The CRD's rule on ``spec.parentQueue``: empty, or a queue name.
_PARENT = re.compile(r"^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
QUEUE_PARENT_MESSAGE = (
    "spec.parentQueue must be a queue name: lower-case letters, digits, '-' and '.', "
    "starting and ending with a letter or digit"
)


def _number(raw: Any) -> float | None:
    """The value of a CRD ``number`` field; None when absent or not a number (the queue
    parser reports those)."""
    if raw is None or isinstance(raw, bool):
        return None
    try:
        return float(parse_quantity(raw))
    except (QuantityError, TypeError, ValueError):
        return None


def check_queue_resources(spec: Mapping[str, Any], path: str) -> None:
    """Apply the CRD's rules to ``spec.parentQueue`` (a queue name) and each
    ``spec.resources.<gpu|cpu|memory>`` of a Queue; ``path`` is the queue's path
    (``queues[2]``)."""
    parent = spec.get("parentQueue")
    if parent is not None and (not isinstance(parent, str) or not _PARENT.match(parent)):
        raise ScenarioError(f"{path}.spec.parentQueue", QUEUE_PARENT_MESSAGE)
    resources = spec.get("resources")
    if not isinstance(resources, Mapping):
        return
    for name, raw in resources.items():
        if not isinstance(raw, Mapping):
            continue
        base = f"{path}.spec.resources.{name}"
        quota, limit = _number(raw.get("quota")), _number(raw.get("limit"))
        weight = _number(raw.get("overQuotaWeight"))
        if quota is not None and quota != _UNLIMITED and quota < 0:
            raise ScenarioError(f"{base}.quota", QUEUE_RESOURCE_MESSAGES["negative_quota"])
        if limit is not None and limit != _UNLIMITED and limit < 0:
            raise ScenarioError(f"{base}.limit", QUEUE_RESOURCE_MESSAGES["negative_limit"])
        if (
            quota is not None
            and limit is not None
            and _UNLIMITED not in (quota, limit)
            and (limit < quota)
        ):
            raise ScenarioError(f"{base}.limit", QUEUE_RESOURCE_MESSAGES["limit_below_quota"])
        if quota == _UNLIMITED and limit is not None and limit != _UNLIMITED:
            raise ScenarioError(f"{base}.limit", QUEUE_RESOURCE_MESSAGES["unlimited_quota"])
        if weight is not None and weight < 0:
            raise ScenarioError(
                f"{base}.overQuotaWeight", QUEUE_RESOURCE_MESSAGES["negative_weight"]
            )


def _cycle_text(tree: QueueTree, name: str) -> str:
    """The parent cycle through ``name``, written from its smallest name (stable between
    runs, unlike the order a graph search happens to find it in)."""
    cycle = [name]
    while True:
        parent = tree.queues[cycle[-1]].parent
        if parent == name or parent not in tree.queues or parent in cycle:
            break
        cycle.append(parent)
    start = cycle.index(min(cycle))
    ordered = cycle[start:] + cycle[:start]
    return " -> ".join([*ordered, ordered[0]])


def check_queue_tree(queues: Sequence[Queue], paths: Sequence[str]) -> None:
    """Raise for the first queue (in file order) whose parent is missing, itself, or part
    of a cycle; ``paths[i]`` is where ``queues[i]`` was read (``queues[2]``)."""
    tree = QueueTree.build(list(queues))
    bad = {f.queue: f for f in tree.findings if f.field == "spec.parentQueue"}
    if not bad:
        return
    names = {q.name for q in queues}
    roots = []
    for queue, path in zip(queues, paths, strict=True):
        if queue.name not in bad:
            continue
        field = f"{path}.spec.parentQueue"
        if queue.parent == queue.name:
            roots.append(
                ScenarioError(
                    field,
                    f"queue {queue.name!r} names itself as its parent; name another queue or "
                    "remove spec.parentQueue for a top-level queue",
                )
            )
        elif queue.parent not in names:
            roots.append(
                ScenarioError(
                    field,
                    f"queue {queue.name!r} names parent {queue.parent!r}, which is not defined; "
                    f"add a queue named {queue.parent!r} or fix spec.parentQueue (remove it "
                    f"for a top-level queue); defined: {', '.join(sorted(names))}",
                )
            )
        elif "cycle" in bad[queue.name].message:
            roots.append(
                ScenarioError(
                    field,
                    f"queue {queue.name!r} is in a cycle of parents "
                    f"({_cycle_text(tree, queue.name)}); make one of them a top-level queue "
                    "by removing its spec.parentQueue",
                )
            )
    if not roots:
        return
    first = roots[0]
    more = f" (and {len(roots) - 1} more queue-tree problem(s))" if len(roots) > 1 else ""
    raise ScenarioError(first.field, first.message + more)


def is_extended_resource(name: str) -> bool:
    """True for an extended resource: a ``domain/name`` outside ``kubernetes.io`` (native
    resources such as cpu, memory, ephemeral-storage, hugepages-* have no domain)."""
    if "/" not in name:
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def _whole(quantities: Any, path: str) -> None:
    if not isinstance(quantities, Mapping):
        return
    for name, raw in quantities.items():
        if not is_extended_resource(str(name)) or isinstance(raw, bool):
            continue
        try:
            value = parse_quantity(raw)
        except (QuantityError, TypeError, ValueError):
            continue  # not a quantity at all: the pod parser names it
        if value != int(value):
            fraction = (
                f"; for part of a GPU request no {name} and annotate the pod "
                f'{GPU_FRACTION_ANNOTATION}: "{float(value):g}"'
                if str(name).endswith("/gpu")
                else ""
            )
            raise ScenarioError(
                f"{path}.{name}",
                f"{raw!r} is not a whole number: the API server rejects non-integer extended "
                f"resources{fraction}",
            )


def check_whole_extended(spec: Mapping[str, Any], path: str) -> None:
    """Check every container's (and init container's) requests and limits, and pod-level
    ``spec.resources``; ``path`` is where ``spec`` was read."""
    for key in ("containers", "initContainers"):
        items = spec.get(key)
        if not isinstance(items, list):
            continue
        for i, container in enumerate(items):
            if not isinstance(container, Mapping):
                continue
            res = container.get("resources")
            if isinstance(res, Mapping):
                for kind in ("requests", "limits"):
                    _whole(res.get(kind), f"{path}.{key}[{i}].resources.{kind}")
    pod_res = spec.get("resources")
    if isinstance(pod_res, Mapping):
        for kind in ("requests", "limits"):
            _whole(pod_res.get(kind), f"{path}.resources.{kind}")


def check_whole_requests(requests: Mapping[str, Any], path: str) -> None:
    """The same check for a flat ``{name: quantity}`` map (a job's ``pods.resources``)."""
    _whole(requests, path)
