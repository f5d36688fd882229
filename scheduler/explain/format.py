"""Amounts, taints and rules rendered the way a user writes them in a manifest."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.cluster.hostports import host_port_name
from scheduler.cluster.node import Taint
from scheduler.cluster.quantity import format_milli
from scheduler.cluster.resources import CPU, EPHEMERAL_STORAGE, GPU, MEMORY
from scheduler.cluster.selectors import NodeSelectorTerm

__all__ = [
    "format_amount",
    "format_bytes",
    "format_gpus",
    "format_selector",
    "format_taint",
    "format_terms",
]

_GIB = 2**30
_MIB = 2**20


def format_bytes(value: int) -> str:
    """Bytes in GiB (or MiB below 1 GiB), at most one decimal: ``16GiB``, ``512MiB``."""
    if abs(value) >= _GIB:
        return f"{round(value / _GIB, 1):g}GiB"
    if abs(value) >= _MIB:
        return f"{round(value / _MIB, 1):g}MiB"
    return f"{value}B"


def format_gpus(devices: int) -> str:
    """``1 GPU`` / ``4 GPUs``."""
    return f"{devices} GPU" if devices == 1 else f"{devices} GPUs"


def format_amount(resource: str, value: int) -> str:
    """A pod-level amount in node units: ``4 GPUs``, ``16 cpu``, ``64GiB memory``."""
    if resource == GPU:
        return format_gpus(value)
    if resource == CPU:
        return f"{format_milli(value)} cpu"
    if resource in (MEMORY, EPHEMERAL_STORAGE):
        return f"{format_bytes(value)} {resource}"
    port = host_port_name(resource)
    if port is not None:
        return f"host port {port}" if value == 1 else f"{value} of host port {port}"
    return f"{value} {resource}"


def format_taint(taint: Taint) -> str:
    """``key=value:Effect`` (``key:Effect`` without a value), as ``kubectl taint`` takes it."""
    head = f"{taint.key}={taint.value}" if taint.value else taint.key
    return f"{head}:{taint.effect}"


def format_selector(selector: Iterable[tuple[str, str]]) -> str:
    """``a=b, c=d``."""
    return ", ".join(f"{k}={v}" for k, v in selector)


def format_terms(terms: Iterable[NodeSelectorTerm]) -> str:
    """Required affinity terms: requirements joined by ``and``, terms by ``or``."""
    rendered = []
    for term in terms:
        parts = []
        for r in term.requirements:
            values = f" {','.join(r.values)}" if r.values else ""
            parts.append(f"{r.key} {r.operator}{values}")
        rendered.append(" and ".join(parts) or "(empty term)")
    return " or ".join(rendered)
