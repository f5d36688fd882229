"""What the chaos checker reads from API objects, parsed again from scratch.

Quantities, effective pod requests, GPU requests (whole ``nvidia.com/gpu``, ``gpu-fraction``,
``gpu-memory``), the GPU grant annotation and Go durations are parsed here without the
scheduler's code, deliberately: a bug in the scheduler's parsing cannot hide behind the same
bug in the checker.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

__all__ = [
    "DEVICE_MILLI",
    "GPU_RESOURCE",
    "GRANT_ANNOTATION",
    "GpuNeed",
    "PodView",
    "node_allocatable",
    "parse_duration",
    "parse_pod",
    "parse_quantity",
    "pod_requests",
    "show_quantity",
]

GPU_RESOURCE = "nvidia.com/gpu"
GRANT_ANNOTATION = "kai.scheduler/gpu-grant"
GANG_ANNOTATIONS = ("pod-group-name", "scheduling.k8s.io/group-name")
FRACTION_ANNOTATION = "gpu-fraction"
MEMORY_ANNOTATION = "gpu-memory"
DEVICES_ANNOTATION = "gpu-fraction-num-devices"
DEVICE_MILLI = 1000
_TERMINAL = ("Succeeded", "Failed")


_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?$"
)
_SUFFIX: dict[str, Fraction] = {
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


def parse_quantity(raw: Any) -> Fraction:
    """A Kubernetes quantity (``"500m"``, ``"64Gi"``, ``"1e3"``, ``8``) as an exact number."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return Fraction(raw)
    text = str(raw).strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"{raw!r} is not a Kubernetes quantity")
    number, exponent, suffix = match.groups()
    value = Fraction(number)
    if exponent:
        value *= Fraction(10) ** int(exponent[1:])
    if suffix:
        value *= _SUFFIX[suffix]
    return value


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(raw: str) -> float:
    """A Go duration (``"5s"``, ``"1m30s"``, ``"0"``) in seconds; ``"-1"`` is infinity."""
    text = raw.strip()
    if text == "-1":
        return math.inf
    if text == "0":
        return 0.0
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{raw!r} is not a duration such as 30s or 1m")
    return sum(float(n) * _DURATION_UNIT[u] for n, u in parts)


@dataclass(frozen=True)
class GpuNeed:
    """What a pod asks of GPU devices: ``devices`` devices, ``milli`` thousandths on each
    (``None`` when the share depends on the node, as for ``gpu-memory``)."""

    devices: int
    milli: int | None


@dataclass(frozen=True)
class PodView:
    """What the checker reads from a Pod object."""

    uid: str
    namespace: str
    name: str
    node: str | None
    phase: str
    deleting: bool
    scheduler_name: str
    gang: str | None
    requests: Mapping[str, Fraction]
    gpu: GpuNeed | None
    grant: Mapping[int, int] | None
    grant_error: str
    unschedulable_message: str

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        """Not finished: a bound active pod holds its node's resources."""
        return self.phase not in _TERMINAL

    @property
    def holds(self) -> bool:
        """Bound and not finished."""
        return self.node is not None and self.active


def _container_requests(container: Mapping[str, Any]) -> dict[str, Fraction]:
    resources = container.get("resources") or {}
    # A container that sets only a limit is given that limit as its request.
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {k: parse_quantity(v) for k, v in merged.items()}


def _add(total: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for k, v in more.items():
        total[k] = total.get(k, Fraction(0)) + v


def pod_requests(spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """Per resource: the larger of the app containers' sum (plus restartable init sidecars)
    and the largest init container, plus overhead; ``pods`` is 1."""
    apps: dict[str, Fraction] = {}
    for c in spec.get("containers") or []:
        _add(apps, _container_requests(c))
    peak: dict[str, Fraction] = {}
    for c in spec.get("initContainers") or []:
        req = _container_requests(c)
        if c.get("restartPolicy") == "Always":
            _add(apps, req)
        else:
            for k, v in req.items():
                peak[k] = max(peak.get(k, Fraction(0)), v)
    total = {k: max(apps.get(k, Fraction(0)), peak.get(k, Fraction(0))) for k in {*apps, *peak}}
    _add(total, {k: parse_quantity(v) for k, v in (spec.get("overhead") or {}).items()})
    total["pods"] = Fraction(1)
    return total


def _gpu_need(annotations: Mapping[str, str], requests: Mapping[str, Fraction]) -> GpuNeed | None:
    devices = int(annotations.get(DEVICES_ANNOTATION) or 1)
    fraction = annotations.get(FRACTION_ANNOTATION)
    if fraction is not None:
        return GpuNeed(devices, math.ceil(parse_quantity(fraction) * DEVICE_MILLI))
    if annotations.get(MEMORY_ANNOTATION) is not None:
        return GpuNeed(devices, None)
    whole = requests.get(GPU_RESOURCE, Fraction(0))
    return GpuNeed(int(whole), DEVICE_MILLI) if whole else None


def _parse_grant(raw: str | None) -> tuple[dict[int, int] | None, str]:
    if raw is None:
        return None, ""
    try:
        data = json.loads(raw)
        grant = {int(k): int(v) for k, v in data.items()}
    except (ValueError, TypeError, AttributeError) as e:
        return None, f"unreadable grant {raw!r}: {e}"
    return grant, ""


def parse_pod(obj: Mapping[str, Any]) -> PodView:
    """Read a Pod object (API JSON). A spec the checker cannot parse raises ValueError."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations = meta.get("annotations") or {}
    namespace, name = meta.get("namespace") or "", meta.get("name") or ""
    requests = pod_requests(spec)
    group = next((annotations[a] for a in GANG_ANNOTATIONS if annotations.get(a)), None)
    grant, grant_error = _parse_grant(annotations.get(GRANT_ANNOTATION))
    message = ""
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            message = str(c.get("message") or "")
    return PodView(
        uid=meta.get("uid") or f"{namespace}/{name}",
        namespace=namespace,
        name=name,
        node=spec.get("nodeName") or None,
        phase=status.get("phase") or "Pending",
        deleting=bool(meta.get("deletionTimestamp")),
        scheduler_name=spec.get("schedulerName") or "default-scheduler",
        gang=f"{namespace}/{group}" if group else None,
        requests=requests,
        gpu=_gpu_need(annotations, requests),
        grant=grant,
        grant_error=grant_error,
        unschedulable_message=message,
    )


def node_allocatable(obj: Mapping[str, Any]) -> dict[str, Fraction]:
    """A Node's allocatable (its capacity when allocatable is not set), exact."""
    status = obj.get("status") or {}
    raw = status.get("allocatable") or status.get("capacity") or {}
    return {k: parse_quantity(v) for k, v in raw.items()}


def show_quantity(value: Fraction) -> str:
    """A number for evidence: whole as is, else three decimals."""
    return str(value) if value.denominator == 1 else f"{float(value):.3f}"
