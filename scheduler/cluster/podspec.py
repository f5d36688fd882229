"""From a Kubernetes Pod object (the API's JSON form) to a :class:`Pod`.

Effective requests follow Kubernetes: per resource, the larger of the sum of app containers
(plus restartable init "sidecar" containers, which keep running) and the largest regular init
container (plus the sidecars started before it), plus pod overhead. A container that sets only
a limit gets that limit as its request, as the API server defaults it. Pod-level
``spec.resources.requests`` (Kubernetes 1.34+) win where set.

Errors raise :class:`PodSpecError` naming the field and the fix, so the caller can put that on
an Event and skip only this pod.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Literal

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import GpuRequest, Pod, PodPhase
from scheduler.cluster.quantity import QuantityError, parse_quantity
from scheduler.cluster.resources import GPU, Resources
from scheduler.cluster.selectors import (
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Toleration,
)

__all__ = [
    "GANG_ANNOTATIONS",
    "GPU_FRACTION_ANNOTATION",
    "GPU_FRACTION_DEVICES_ANNOTATION",
    "GPU_MEMORY_ANNOTATION",
    "QUEUE_LABEL",
    "PodSpecError",
    "effective_requests",
    "parse_timestamp",
    "pod_from_k8s",
]

GPU_FRACTION_ANNOTATION = "gpu-fraction"
GPU_FRACTION_DEVICES_ANNOTATION = "gpu-fraction-num-devices"
GPU_MEMORY_ANNOTATION = "gpu-memory"
#: KAI's own annotation first, then the Volcano / scheduler-plugins convention.
GANG_ANNOTATIONS = ("pod-group-name", "scheduling.k8s.io/group-name")
QUEUE_LABEL = "kai.scheduler/queue"
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


class PodSpecError(ValueError):
    """A pod whose spec or annotations the scheduler cannot act on."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _container_requests(container: Mapping[str, Any], path: str) -> Resources:
    res = container.get("resources") or {}
    merged = dict(res.get("limits") or {})
    merged.update(res.get("requests") or {})
    try:
        return Resources.from_k8s(merged, field=f"{path}.resources")
    except QuantityError as e:
        raise PodSpecError(f"{path}.resources", str(e)) from e


def _max(a: Resources, b: Resources) -> Resources:
    return Resources({k: max(a[k], b[k]) for k in set(a) | set(b)})


def effective_requests(spec: Mapping[str, Any]) -> Resources:
    """The requests Kubernetes accounts for this pod spec (see module docstring)."""
    apps = Resources()
    for i, c in enumerate(spec.get("containers") or []):
        apps = apps + _container_requests(c, f"spec.containers[{i}]")
    sidecars = Resources()
    init_peak = Resources()
    for i, c in enumerate(spec.get("initContainers") or []):
        req = _container_requests(c, f"spec.initContainers[{i}]")
        if c.get("restartPolicy") == "Always":
            sidecars = sidecars + req
            init_peak = _max(init_peak, sidecars)
        else:
            init_peak = _max(init_peak, sidecars + req)
    total = _max(apps + sidecars, init_peak)
    pod_level = (spec.get("resources") or {}).get("requests")
    if pod_level:
        try:
            override = Resources.from_k8s(pod_level, field="spec.resources.requests")
        except QuantityError as e:
            raise PodSpecError("spec.resources.requests", str(e)) from e
        total = Resources({**total.to_dict(), **override.to_dict()})
    try:
        overhead = Resources.from_k8s(spec.get("overhead"), field="spec.overhead")
    except QuantityError as e:
        raise PodSpecError("spec.overhead", str(e)) from e
    return total + overhead


def _gpu_request(annotations: Mapping[str, str], requests: Resources) -> GpuRequest | None:
    fraction = annotations.get(GPU_FRACTION_ANNOTATION)
    memory = annotations.get(GPU_MEMORY_ANNOTATION)
    devices_raw = annotations.get(GPU_FRACTION_DEVICES_ANNOTATION)
    if fraction is None and memory is None:
        if devices_raw is not None:
            raise PodSpecError(
                f"metadata.annotations[{GPU_FRACTION_DEVICES_ANNOTATION}]",
                "only applies together with gpu-fraction or gpu-memory; add one or remove it",
            )
        return GpuRequest(requests[GPU], GPU_MILLI) if requests[GPU] else None
    key = GPU_FRACTION_ANNOTATION if fraction is not None else GPU_MEMORY_ANNOTATION
    field = f"metadata.annotations[{key}]"
    if requests[GPU]:
        raise PodSpecError(
            field, f"set either {GPU} in resources or a GPU share annotation, not both"
        )
    if fraction is not None and memory is not None:
        raise PodSpecError(field, "set gpu-fraction or gpu-memory, not both")
    count = 1
    if devices_raw is not None:
        try:
            count = int(devices_raw)
        except ValueError:
            count = 0
        if count < 1:
            raise PodSpecError(
                f"metadata.annotations[{GPU_FRACTION_DEVICES_ANNOTATION}]",
                f"{devices_raw!r} is not a positive whole number of devices",
            )
    if fraction is not None:
        try:
            value = parse_quantity(fraction)
        except QuantityError:
            value = None
        if value is None or not 0 < value <= 1:
            raise PodSpecError(
                field, f"{fraction!r} must be a number greater than 0 and at most 1, e.g. 0.5"
            )
        milli = -(-value.numerator * GPU_MILLI // value.denominator)
        return GpuRequest(count, milli)
    assert memory is not None
    try:
        mib = parse_quantity(memory)
        # A bare number is MiB (KAI's convention); a suffixed quantity ("20Gi") is bytes.
        if memory.strip()[-1:].isalpha():
            mib = mib / 2**20
    except QuantityError:
        mib = None
    if mib is None or mib <= 0:
        raise PodSpecError(field, f"{memory!r} must be a positive amount of GPU memory in MiB")
    return GpuRequest(count, GPU_MILLI, memory_mib=int(-(-mib // 1)))


def _tolerations(spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    out = []
    for i, t in enumerate(spec.get("tolerations") or []):
        op = t.get("operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise PodSpecError(f"spec.tolerations[{i}].operator", f"{op!r} is not Equal or Exists")
        operator: Literal["Equal", "Exists"] = "Exists" if op == "Exists" else "Equal"
        out.append(
            Toleration(t.get("key") or "", operator, t.get("value") or "", t.get("effect") or "")
        )
    return tuple(out)


def _affinity(spec: Mapping[str, Any]) -> tuple[NodeSelectorTerm, ...]:
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = []
    for i, term in enumerate(required.get("nodeSelectorTerms") or []):
        reqs = []
        for j, e in enumerate(term.get("matchExpressions") or []):
            op = e.get("operator")
            if op not in _OPERATORS:
                raise PodSpecError(
                    f"spec.affinity.nodeAffinity.required.nodeSelectorTerms[{i}]"
                    f".matchExpressions[{j}].operator",
                    f"{op!r} is not one of {', '.join(_OPERATORS)}",
                )
            reqs.append(NodeSelectorRequirement(e.get("key", ""), op, tuple(e.get("values") or ())))
        # matchFields only supports metadata.name; model it as a label the node always has.
        for e in term.get("matchFields") or []:
            reqs.append(
                NodeSelectorRequirement(
                    "metadata.name", e.get("operator", "In"), tuple(e.get("values") or ())
                )
            )
        terms.append(NodeSelectorTerm(tuple(reqs)))
    return tuple(terms)


def parse_timestamp(value: str | None) -> float:
    """RFC 3339 timestamp from the API to epoch seconds (0 when absent)."""
    if not value:
        return 0.0
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def pod_from_k8s(
    obj: Mapping[str, Any],
    *,
    scheduler_name: str,
    default_queue: str,
    strict: bool = False,
    gpu_grant: tuple[tuple[int, int], ...] = (),
) -> Pod:
    """Convert an API Pod object; raises :class:`PodSpecError` for input we cannot act on.

    A bound pod with an unreadable spec is still returned (with no requests) unless
    ``strict``, as it occupies its node whatever we can read; ``gpu_grant`` is the device
    grant the caller read from the pod's annotation.

    ``gang`` is ``namespace/podgroup`` when the pod names a PodGroup, else ``namespace/pod``
    (an implicit gang of one). ``queue`` is the label ``kai.scheduler/queue`` or the default;
    a PodGroup's ``spec.queue`` overrides it later, when gangs are resolved.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    namespace, name = meta.get("namespace", ""), meta.get("name", "")
    node_name = spec.get("nodeName") or None
    managed = spec.get("schedulerName") == scheduler_name
    try:
        requests = effective_requests(spec)
        gpu = _gpu_request(annotations, requests)
        tolerations = _tolerations(spec)
        affinity = _affinity(spec)
    except PodSpecError:
        if strict or not node_name:
            raise
        # A bound pod still occupies its node even if we cannot read its spec.
        requests, gpu, tolerations, affinity = Resources(), None, (), ()
    group = next((annotations[a] for a in GANG_ANNOTATIONS if annotations.get(a)), None)
    phase_raw = status.get("phase") or "Pending"
    try:
        phase = PodPhase(phase_raw)
    except ValueError:
        phase = PodPhase.UNKNOWN
    return Pod(
        uid=meta.get("uid", f"{namespace}/{name}"),
        namespace=namespace,
        name=name,
        requests=requests,
        gpu=gpu,
        priority=int(spec.get("priority") or 0),
        node_selector=tuple(sorted((spec.get("nodeSelector") or {}).items())),
        affinity=affinity,
        tolerations=tolerations,
        gang=f"{namespace}/{group or name}",
        queue=labels.get(QUEUE_LABEL) or default_queue,
        phase=phase,
        node_name=node_name,
        gpu_grant=gpu_grant,
        creation_time=parse_timestamp(meta.get("creationTimestamp")),
        managed=managed,
        deleting=bool(meta.get("deletionTimestamp")),
    )
