"""From a Kubernetes Node object (the API's JSON form) to a :class:`Node`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.cluster.node import GPU_MEMORY_LABEL, Node, Taint, TaintEffect
from scheduler.cluster.quantity import QuantityError
from scheduler.cluster.queuespec import SpecError
from scheduler.cluster.resources import Resources

__all__ = ["node_from_k8s"]

_EFFECTS: tuple[TaintEffect, ...] = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _gpu_memory(labels: Mapping[str, str]) -> int | None:
    raw = labels.get(GPU_MEMORY_LABEL)
    try:
        value = int(raw) if raw is not None else None
    except ValueError:
        return None  # a label we cannot read only loses gpu-memory pods, not the node
    return value if value and value > 0 else None


def node_from_k8s(obj: Mapping[str, Any]) -> Node:
    """Convert an API Node; raises :class:`SpecError` when ``status.allocatable`` is unreadable.

    A node is ready when its ``Ready`` condition is ``True``; taints with an unknown effect
    are kept as ``NoSchedule`` (the safe reading).
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    try:
        allocatable = Resources.from_k8s(status.get("allocatable"), field="status.allocatable")
    except QuantityError as e:
        raise SpecError("status.allocatable", str(e)) from e
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    taints = []
    for t in spec.get("taints") or []:
        effect = t.get("effect")
        taints.append(
            Taint(
                str(t.get("key") or ""),
                str(t.get("value") or ""),
                effect if effect in _EFFECTS else "NoSchedule",
            )
        )
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return Node(
        name=str(meta.get("name", "")),
        allocatable=allocatable,
        labels=tuple(sorted(labels.items())),
        taints=tuple(taints),
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
        gpu_memory_mib=_gpu_memory(labels),
    )
