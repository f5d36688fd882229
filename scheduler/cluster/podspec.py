"""From a Kubernetes Pod object (the API's JSON form) to a :class:`Pod`.

Effective requests follow Kubernetes: per resource, the larger of the sum of app containers
(plus restartable init "sidecar" containers, which keep running) and the largest regular init
container (plus the sidecars started before it), plus pod overhead. A container that sets only
a limit gets that limit as its request, as the API server defaults it. Pod-level
``spec.resources.requests`` (Kubernetes 1.34+) win where set.

Errors raise :class:`PodSpecError` naming the field and the fix, so the caller can put that on
an Event and skip only this pod. Placement rules the scheduler does not evaluate yet are no
error: they are carried on the pod (:attr:`Pod.unsupported`) so it waits with a reason naming
them, as gated pods carry their gates (:mod:`scheduler.cluster.unsupported`).

Taking back (docs/taking-back.md): ``status.startTime`` (before the kubelet sets it: the bind
time) becomes :attr:`Pod.start_time`;
:func:`gang_hints` reads what a pod says about its gang: ``spec.preemptionPolicy: Never`` (the
gang never evicts anyone) and, for a pod without a PodGroup (an implicit gang), the label
``kai.scheduler/preemptibility`` and the annotation ``kai.scheduler/preemption-delay``.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from scheduler.cluster.hostports import host_port_requests
from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import ContainerExtended, GpuRequest, Pod, PodPhase
from scheduler.cluster.podaffinity import (
    Preferences,
    parse_pod_preferences,
    parse_pod_rules,
    scoring_terms,
)
from scheduler.cluster.quantity import QuantityError, parse_quantity, to_int_units
from scheduler.cluster.resources import GPU, Resources
from scheduler.cluster.selectors import (
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Toleration,
)
from scheduler.cluster.unsupported import scheduling_gates, unsupported_fields

__all__ = [
    "BUILD_PRIORITY",
    "GANG_ANNOTATIONS",
    "GPU_FRACTION_ANNOTATION",
    "GPU_FRACTION_DEVICES_ANNOTATION",
    "GPU_MEMORY_ANNOTATION",
    "PREEMPTIBILITY_LABEL",
    "PREEMPTIBILITY_VALUES",
    "PREEMPTION_DELAY_ANNOTATION",
    "QUEUE_LABEL",
    "VOLCANO_QUEUE_ANNOTATION",
    "GangHints",
    "PodSpecError",
    "duration_seconds",
    "effective_requests",
    "gang_hints",
    "node_selector_terms",
    "parse_timestamp",
    "pod_from_k8s",
]

GPU_FRACTION_ANNOTATION = "gpu-fraction"
GPU_FRACTION_DEVICES_ANNOTATION = "gpu-fraction-num-devices"
GPU_MEMORY_ANNOTATION = "gpu-memory"
#: KAI's own annotation first, then the Volcano / scheduler-plugins convention.
GANG_ANNOTATIONS = ("pod-group-name", "scheduling.k8s.io/group-name")
QUEUE_LABEL = "kai.scheduler/queue"
#: Volcano's pod annotation naming a queue (read after ``kai.scheduler/queue``).
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
#: KAI's rule: without an explicit choice, work below the "build" priority is preemptible.
BUILD_PRIORITY = 100
#: Label (on a PodGroup, or on the pod of an implicit gang) choosing preemptibility.
PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"
PREEMPTIBILITY_VALUES = ("preemptible", "non-preemptible")
#: Annotation (on a PodGroup, or on the pod of an implicit gang): how long the pending gang
#: waits after its creation before it may evict anyone.
PREEMPTION_DELAY_ANNOTATION = "kai.scheduler/preemption-delay"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_DURATION_SCALE = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,  # micro sign
    "\u03bcs": 1e-6,  # Greek small mu, which Go accepts too
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
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


#: Effective requests by the resource-relevant part of a pod spec (see
#: :func:`effective_requests`); bounded, cleared when full.
_REQUESTS_MEMO: dict[tuple[Any, ...], Resources] = {}
_REQUESTS_MEMO_SIZE = 4096


def _quantities(value: Any) -> tuple[tuple[Any, Any], ...] | None:
    return tuple(value.items()) if isinstance(value, dict) else None if value is None else ()


def _requests_key(spec: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What :func:`effective_requests` reads from ``spec``, as a hashable key; None when a
    part is not a plain mapping (then nothing is memoised).

    Pods of one Deployment, Job or gang share the same container resources, so a backlog
    of thousands of pods has a handful of distinct keys: parsing their quantities again for
    each pod was a third of the cost of taking a pod into the cache.
    """
    parts: list[Any] = []
    for field in ("containers", "initContainers"):
        for c in spec.get(field) or ():
            if not isinstance(c, dict):
                return None
            res = c.get("resources") or {}
            if not isinstance(res, dict):
                return None
            parts.append(
                (
                    field,
                    _quantities(res.get("limits")),
                    _quantities(res.get("requests")),
                    c.get("restartPolicy"),
                )
            )
    pod_level = spec.get("resources") or {}
    if not isinstance(pod_level, dict):
        return None
    parts.append(_quantities(pod_level.get("requests")))
    parts.append(_quantities(spec.get("overhead")))
    return tuple(parts)


def effective_requests(spec: Mapping[str, Any]) -> Resources:
    """The requests Kubernetes accounts for this pod spec (see module docstring)."""
    key = _requests_key(spec)
    try:
        known = _REQUESTS_MEMO.get(key) if key is not None else None
    except TypeError:  # an unhashable quantity (a list where a string belongs)
        key = known = None
    if known is not None:
        return known
    found = _effective_requests(spec)  # raises for unreadable input: never memoised
    if key is not None:
        if len(_REQUESTS_MEMO) >= _REQUESTS_MEMO_SIZE:
            _REQUESTS_MEMO.clear()
        _REQUESTS_MEMO[key] = found
    return found


def _effective_requests(spec: Mapping[str, Any]) -> Resources:
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
        if value is None or not 0 < value < 1:
            # A whole device is not shared: nvidia.com/gpu says so, and needs no reservation.
            raise PodSpecError(
                field,
                f"{fraction!r} must be a number greater than 0 and below 1, e.g. 0.5 "
                f"(for whole GPUs request {GPU} in the container's resources instead)",
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


def node_selector_terms(raw: Any, path: str) -> tuple[NodeSelectorTerm, ...]:
    """The ``nodeSelectorTerms`` list ``raw`` (of a pod's required node affinity, or a
    PersistentVolume's) as terms; ``path`` names the list in errors. ``matchFields`` on a key
    other than ``metadata.name`` is skipped: callers report it (the rule is not evaluated)."""
    terms = []
    for i, term in enumerate(raw if isinstance(raw, list) else []):
        term = term if isinstance(term, Mapping) else {}
        reqs = []
        for j, e in enumerate(term.get("matchExpressions") or []):
            op = e.get("operator")
            if op not in _OPERATORS:
                raise PodSpecError(
                    f"{path}[{i}].matchExpressions[{j}].operator",
                    f"{op!r} is not one of {', '.join(_OPERATORS)}",
                )
            reqs.append(NodeSelectorRequirement(e.get("key", ""), op, tuple(e.get("values") or ())))
        # matchFields only supports metadata.name; model it as a label the node always has.
        # Another key is listed by unsupported_fields (the pod waits, named), not matched.
        for j, e in enumerate(term.get("matchFields") or []):
            if e.get("key") != "metadata.name":
                continue
            op = e.get("operator", "In")
            if op not in _OPERATORS:
                raise PodSpecError(
                    f"{path}[{i}].matchFields[{j}].operator",
                    f"{op!r} is not one of {', '.join(_OPERATORS)}",
                )
            reqs.append(NodeSelectorRequirement("metadata.name", op, tuple(e.get("values") or ())))
        terms.append(NodeSelectorTerm(tuple(reqs)))
    return tuple(terms)


def _affinity(spec: Mapping[str, Any]) -> tuple[NodeSelectorTerm, ...]:
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return node_selector_terms(
        required.get("nodeSelectorTerms"),
        "spec.affinity.nodeAffinity.required.nodeSelectorTerms",
    )


def _preferences(spec: Any, namespace: str, labels: Mapping[str, str]) -> Preferences | None:
    """Preferences of a pending pod (never raises: an unreadable preference is left out)."""
    spec = spec if isinstance(spec, Mapping) else {}
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    nodes: list[tuple[int, NodeSelectorTerm]] = []
    preferred = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")
    for raw in preferred if isinstance(preferred, list) else []:
        raw = raw if isinstance(raw, Mapping) else {}
        weight = raw.get("weight")
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            continue
        try:
            terms = node_selector_terms([raw.get("preference")], "preference")
        except PodSpecError:
            continue
        if terms and terms[0].requirements:
            nodes.append((weight, terms[0]))
    return parse_pod_preferences(spec, namespace, labels, tuple(nodes))


def parse_timestamp(value: str | None) -> float:
    """RFC 3339 timestamp from the API to epoch seconds (0 when absent)."""
    if not value:
        return 0.0
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _timestamp(value: Any) -> float:
    """An RFC 3339 timestamp; 0 when absent or unreadable."""
    if not isinstance(value, str):
        return 0.0
    try:
        return parse_timestamp(value)
    except ValueError:
        return 0.0


def _start_time(status: Mapping[str, Any]) -> float:
    """``status.startTime``; before the kubelet sets it, the bind time (when the API server
    set ``PodScheduled=True``); 0 when neither is known (the creation time then stands in)."""
    started = _timestamp(status.get("startTime"))
    if started:
        return started
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") == "True":
            return _timestamp(c.get("lastTransitionTime"))
    return 0.0


def duration_seconds(raw: Any) -> float | None:
    """A Go duration (``60s``, ``1h30m``, ``500ms``, ``0``) or a number, in seconds; None when
    ``raw`` is neither. Negative strings are not durations here."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    text = str(raw).strip()
    if text == "0":  # Go's only duration without a unit
        return 0.0
    total, pos = 0.0, 0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_SCALE[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        return None
    return total


@dataclass(frozen=True, slots=True)
class GangHints:
    """What one pod says about its gang's part in taking back (see the module docstring).

    ``preemptibility`` and ``preemption_delay`` are read only from a pod without a PodGroup
    (its PodGroup decides otherwise); "" / None when the pod does not say.
    """

    #: False when ``spec.preemptionPolicy`` is ``Never`` (admission copies it from the
    #: PriorityClass): a gang may evict others only if every member may.
    may_preempt: bool = True
    preemptibility: str = ""
    preemption_delay: float | None = None


_NO_HINTS = GangHints()


def _hint_preemptibility(labels: Mapping[str, Any]) -> str:
    raw = labels.get(PREEMPTIBILITY_LABEL)
    if raw is None or raw == "":
        return ""
    if raw not in PREEMPTIBILITY_VALUES:
        raise PodSpecError(
            f"metadata.labels[{PREEMPTIBILITY_LABEL}]",
            f"{raw!r} must be preemptible or non-preemptible; correct it, or remove the label "
            f"to let the priority decide (below {BUILD_PRIORITY} is preemptible)",
        )
    return str(raw)


def _hint_delay(annotations: Mapping[str, Any]) -> float | None:
    raw = annotations.get(PREEMPTION_DELAY_ANNOTATION)
    if raw is None or raw == "":
        return None
    seconds = duration_seconds(raw)
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        raise PodSpecError(
            f"metadata.annotations[{PREEMPTION_DELAY_ANNOTATION}]",
            f"{raw!r} is not a duration; set a duration such as 30s, 5m or 1h30m (how long the "
            "pending pod waits before it may evict anyone)",
        )
    return seconds


def gang_hints(obj: Mapping[str, Any], *, strict: bool = True) -> GangHints:
    """What the pod ``obj`` says about its gang (see :class:`GangHints`).

    An invalid label or annotation raises :class:`PodSpecError` naming it, unless not
    ``strict``: then the invalid value is ignored. Pods that name a PodGroup are not checked
    for them (their PodGroup's own label and annotation apply).
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    may_preempt = spec.get("preemptionPolicy") != "Never"
    annotations = meta.get("annotations") or {}
    if any(annotations.get(a) for a in GANG_ANNOTATIONS):
        return GangHints(may_preempt) if not may_preempt else _NO_HINTS
    labels = meta.get("labels") or {}
    try:
        preemptibility = _hint_preemptibility(labels)
    except PodSpecError:
        if strict:
            raise
        preemptibility = ""
    try:
        delay = _hint_delay(annotations)
    except PodSpecError:
        if strict:
            raise
        delay = None
    hints = GangHints(may_preempt, preemptibility, delay)
    return _NO_HINTS if hints == _NO_HINTS else hints


def is_extended_resource(name: str) -> bool:
    """A resource name a DeviceClass may serve (:mod:`scheduler.cluster.dra_extended`): an
    extended resource (qualified, outside kubernetes.io) or a class's implicit name."""
    if name.startswith("deviceclass.resource.kubernetes.io/"):
        return True
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def extended_containers(spec: Mapping[str, Any]) -> tuple[ContainerExtended, ...]:
    """The containers (init containers first) that request extended resources, with all
    their requested names (see :class:`ContainerExtended`); empty when none does. Quantities
    that are not whole numbers count as 0 (the API server refuses them for extended
    resources)."""
    out: list[ContainerExtended] = []
    inits = spec.get("initContainers") or []
    all_containers = [*(inits if isinstance(inits, list) else [])]
    n_init = len(all_containers)
    regular = spec.get("containers") or []
    all_containers += regular if isinstance(regular, list) else []
    for i, c in enumerate(all_containers):
        if not isinstance(c, Mapping):
            continue
        res = c.get("resources") or {}
        merged = dict(res.get("limits") or {}) if isinstance(res, Mapping) else {}
        if isinstance(res, Mapping) and isinstance(res.get("requests"), Mapping):
            merged.update(res["requests"])
        if not any(is_extended_resource(str(k)) for k in merged):
            continue
        counts: list[tuple[str, int]] = []
        for k, raw in sorted(merged.items()):
            try:
                value = to_int_units(raw) if is_extended_resource(str(k)) else 0
            except QuantityError:
                value = 0
            counts.append((str(k), value))
        short_lived = i < n_init and c.get("restartPolicy") != "Always"  # not a sidecar
        out.append(ContainerExtended(i, str(c.get("name") or ""), short_lived, tuple(counts)))
    return tuple(out)


def _claim_count(spec: Mapping[str, Any]) -> int:
    """How many ``spec.resourceClaims`` entries the pod has (a malformed list counts as one,
    so the pod still waits for the cache's verdict on it instead of being placed)."""
    claims = spec.get("resourceClaims")
    if isinstance(claims, list):
        return len(claims)
    return 1 if claims else 0


def pod_from_k8s(
    obj: Mapping[str, Any],
    *,
    scheduler_name: str | Collection[str],
    default_queue: str,
    strict: bool = False,
    gpu_grant: tuple[tuple[int, int], ...] = (),
) -> Pod:
    """Convert an API Pod object; raises :class:`PodSpecError` for input we cannot act on.

    A bound pod with an unreadable spec is still returned (with no requests) unless
    ``strict``, as it occupies its node whatever we can read; ``gpu_grant`` is the device
    grant the caller read from the pod's annotation.

    The pod is ``managed`` when its ``spec.schedulerName`` is ``scheduler_name`` (or one of
    them, when several are given).

    ``gang`` is ``namespace/podgroup`` when the pod names a PodGroup, else ``namespace/pod``
    (an implicit gang of one). ``queue`` is the label ``kai.scheduler/queue``, else Volcano's
    annotation ``scheduling.volcano.sh/queue-name``, else the default; a PodGroup's
    ``spec.queue`` overrides it later, when gangs are resolved. A managed pod
    without a PodGroup is checked with :func:`gang_hints` (same rule for bound pods as above).
    ``start_time`` is ``status.startTime``, else the bind time (``PodScheduled=True``'s
    ``lastTransitionTime``), else 0. A managed pod without a node also carries its
    ``scheduling_gates`` and the placement rules it uses that are not supported yet
    (``unsupported``, see :mod:`scheduler.cluster.unsupported`); a pod with ``spec.nodeName``
    set (by us or by its author) is bound: it holds its node and is never placed again. A
    pending pod of another scheduler with ``status.nominatedNodeName`` holds that node
    (``nominated``), as kube-scheduler counts the pods it preempted for.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    namespace, name = meta.get("namespace", ""), meta.get("name", "")
    node_name = spec.get("nodeName") or None
    names = (scheduler_name,) if isinstance(scheduler_name, str) else scheduler_name
    managed = spec.get("schedulerName") in names
    try:
        requests = effective_requests(spec)
        ports = host_port_requests(spec)
        if ports:
            requests = requests + ports
        gpu = _gpu_request(annotations, requests)
        tolerations = _tolerations(spec)
        affinity = _affinity(spec)
    except PodSpecError:
        if strict or not node_name:
            raise
        # A bound pod still occupies its node even if we cannot read its spec.
        requests, gpu, tolerations, affinity = Resources(), None, (), ()
    group = next((annotations[a] for a in GANG_ANNOTATIONS if annotations.get(a)), None)
    if group is None and managed and (strict or not node_name):
        gang_hints(obj)  # the label and annotation of an implicit gang must be readable
    waits = managed and not node_name
    gates = scheduling_gates(spec) if waits else ()
    pod_labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}
    rules = parse_pod_rules(spec, namespace, pod_labels, cautious=not waits)
    preferences = _preferences(spec, namespace, pod_labels) if waits else None
    # A bound pod's terms still score the pods that come after it (kube-scheduler's
    # InterPodAffinity score); its node preferences are not needed.
    scoring = scoring_terms(
        rules.affinity,
        preferences if waits else parse_pod_preferences(spec, namespace, pod_labels),
    )
    unsupported = unsupported_fields(spec, namespace, pod_labels) if waits else ()
    phase_raw = status.get("phase") or "Pending"
    try:
        phase = PodPhase(phase_raw)
    except ValueError:
        phase = PodPhase.UNKNOWN
    nominated = False
    if not managed and not node_name and status.get("nominatedNodeName"):
        # Another scheduler (kube-scheduler, after preempting for it) holds this node for
        # the pod: count it there as kube-scheduler does, so we do not take the room.
        node_name, nominated = str(status["nominatedNodeName"]), True
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
        queue=labels.get(QUEUE_LABEL) or annotations.get(VOLCANO_QUEUE_ANNOTATION) or default_queue,
        phase=phase,
        node_name=node_name,
        gpu_grant=gpu_grant,
        creation_time=parse_timestamp(meta.get("creationTimestamp")),
        managed=managed,
        deleting=bool(meta.get("deletionTimestamp")),
        start_time=_start_time(status),
        scheduling_gates=gates,
        unsupported=unsupported,
        nominated=nominated,
        labels=tuple(sorted(pod_labels.items())),
        pod_affinity=rules.affinity if waits else (),
        pod_anti_affinity=rules.anti_affinity,
        spread=rules.spread if waits else (),
        preferences=preferences,
        scoring_affinity=scoring,
        resource_claims=_claim_count(spec),
        extended_containers=extended_containers(spec) if waits else (),
    )
