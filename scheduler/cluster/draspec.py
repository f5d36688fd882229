"""From the API's JSON form of ``resource.k8s.io/v1`` objects (DeviceClass, ResourceSlice,
ResourceClaim) to the domain types of :mod:`scheduler.cluster.dra`.

Errors raise :class:`DraSpecError` naming the field and what is wrong, so the caller can put
it on an Event and skip only that object; no other exception leaves the parsers. The
``v1beta1`` shapes that moved in ``v1`` (device fields under ``basic``, request fields
without ``exactly``) are read too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.cluster.dra import (
    AllocationMode,
    ClaimAllocation,
    ConsumerRef,
    Device,
    DeviceClass,
    DeviceConstraint,
    DeviceRequest,
    DeviceResult,
    RequestAlternative,
    ResourceClaim,
    ResourceSlice,
)
from scheduler.cluster.dracel import AttributeValue, Semver, is_semver
from scheduler.cluster.podspec import parse_timestamp
from scheduler.cluster.quantity import QuantityError, parse_quantity
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm

__all__ = [
    "DraSpecError",
    "device_class_from_k8s",
    "node_selector_to_k8s",
    "resource_claim_from_k8s",
    "resource_slice_from_k8s",
]

_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


class DraSpecError(ValueError):
    """A DRA object the scheduler cannot act on; ``field`` is the path of the bad field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# --- parsing helpers ---------------------------------------------------------------------


def _map(raw: Any, path: str) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise DraSpecError(path, f"expected an object, got {type(raw).__name__}")
    return raw


def _list(raw: Any, path: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise DraSpecError(path, f"expected a list, got {type(raw).__name__}")
    return raw


def _str(raw: Any, path: str, *, required: bool = True) -> str:
    if raw is None or raw == "":
        if required:
            raise DraSpecError(path, "is required")
        return ""
    if not isinstance(raw, str):
        raise DraSpecError(path, f"expected a string, got {type(raw).__name__}")
    return raw


def _int(raw: Any, path: str, default: int) -> int:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise DraSpecError(path, f"expected an integer, got {raw!r}")
    return raw


def _bool(raw: Any, path: str) -> bool:
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise DraSpecError(path, f"expected true or false, got {raw!r}")
    return raw


def _selectors(raw: Any, path: str) -> tuple[str, ...]:
    out = []
    for i, sel in enumerate(_list(raw, path)):
        cel = _map(_map(sel, f"{path}[{i}]").get("cel"), f"{path}[{i}].cel")
        if not cel:
            raise DraSpecError(f"{path}[{i}].cel", "is required (the only kind of selector)")
        out.append(_str(cel.get("expression"), f"{path}[{i}].cel.expression"))
    return tuple(out)


def _node_selector(raw: Any, path: str) -> tuple[NodeSelectorTerm, ...]:
    terms = []
    raw_terms = _list(_map(raw, path).get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms")
    for i, term in enumerate(raw_terms):
        tpath = f"{path}.nodeSelectorTerms[{i}]"
        term = _map(term, tpath)
        reqs = []
        for kind in ("matchExpressions", "matchFields"):
            for j, e in enumerate(_list(term.get(kind), f"{tpath}.{kind}")):
                epath = f"{tpath}.{kind}[{j}]"
                e = _map(e, epath)
                op = e.get("operator")
                if op not in _OPERATORS:
                    raise DraSpecError(f"{epath}.operator", f"{op!r} is not one of {_OPERATORS}")
                key = _str(e.get("key"), f"{epath}.key")
                if kind == "matchFields" and key != "metadata.name":
                    raise DraSpecError(f"{epath}.key", "matchFields supports only metadata.name")
                values = tuple(
                    _str(v, f"{epath}.values[{k}]")
                    for k, v in enumerate(_list(e.get("values"), f"{epath}.values"))
                )
                reqs.append(NodeSelectorRequirement(key, op, values))
        terms.append(NodeSelectorTerm(tuple(reqs)))
    if not terms:
        raise DraSpecError(f"{path}.nodeSelectorTerms", "needs at least one term")
    return tuple(terms)


def node_selector_to_k8s(terms: tuple[NodeSelectorTerm, ...]) -> dict[str, Any]:
    """The API form of ``terms`` (``metadata.name`` goes to ``matchFields``)."""
    out = []
    for term in terms:
        exprs: list[dict[str, Any]] = []
        fields: list[dict[str, Any]] = []
        for r in term.requirements:
            entry: dict[str, Any] = {"key": r.key, "operator": r.operator}
            if r.values:
                entry["values"] = list(r.values)
            (fields if r.key == "metadata.name" else exprs).append(entry)
        item: dict[str, Any] = {}
        if exprs:
            item["matchExpressions"] = exprs
        if fields:
            item["matchFields"] = fields
        out.append(item)
    return {"nodeSelectorTerms": out}


# --- DeviceClass ------------------------------------------------------------------------


def device_class_from_k8s(obj: Mapping[str, Any]) -> DeviceClass:
    """Convert an API DeviceClass; raises :class:`DraSpecError`."""
    obj = _map(obj, "DeviceClass")
    meta = _map(obj.get("metadata"), "metadata")
    name = _str(meta.get("name"), "metadata.name")
    spec = _map(obj.get("spec"), "spec")
    ext = _str(spec.get("extendedResourceName"), "spec.extendedResourceName", required=False)
    created = meta.get("creationTimestamp")
    return DeviceClass(
        name,
        _selectors(spec.get("selectors"), "spec.selectors"),
        ext or None,
        parse_timestamp(created) if isinstance(created, str) else 0.0,
    )


# --- ResourceSlice ------------------------------------------------------------------------

_ATTRIBUTE_KINDS = ("int", "bool", "string", "version")


def _attribute(raw: Any, path: str) -> AttributeValue:
    raw = _map(raw, path)
    kinds = [k for k in _ATTRIBUTE_KINDS if raw.get(k) is not None]
    if len(kinds) != 1:
        raise DraSpecError(path, "needs exactly one of int, bool, string, version")
    kind = kinds[0]
    value = raw[kind]
    if kind == "int":
        return _int(value, f"{path}.int", 0)
    if kind == "bool":
        return _bool(value, f"{path}.bool")
    text = _str(value, f"{path}.{kind}", required=False)
    if kind == "version":
        if not is_semver(text):
            raise DraSpecError(f"{path}.version", f"{text!r} is not a semantic version")
        return Semver(text)
    return text


def _device(raw: Any, path: str) -> Device:
    raw = _map(raw, path)
    body = _map(raw.get("basic"), f"{path}.basic") or raw  # v1beta1 nested the fields
    name = _str(raw.get("name"), f"{path}.name")
    attrs = tuple(
        sorted(
            (str(k), _attribute(v, f"{path}.attributes[{k}]"))
            for k, v in _map(body.get("attributes"), f"{path}.attributes").items()
        )
    )
    caps = []
    for k, v in _map(body.get("capacity"), f"{path}.capacity").items():
        cpath = f"{path}.capacity[{k}].value"
        value = _map(v, f"{path}.capacity[{k}]").get("value")
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise DraSpecError(cpath, f"expected a quantity, got {value!r}")
        try:
            caps.append((str(k), parse_quantity(value)))
        except QuantityError as e:
            raise DraSpecError(cpath, str(e)) from e
    allow = _bool(body.get("allowMultipleAllocations"), f"{path}.allowMultipleAllocations")
    left_out = ""
    if body.get("taints"):
        left_out = f"{path}.taints: device taints are not supported yet"
    elif body.get("consumesCounters"):
        left_out = f"{path}.consumesCounters: shared counters are not supported yet"
    return Device(name, attrs, tuple(sorted(caps)), allow, left_out)


def resource_slice_from_k8s(obj: Mapping[str, Any]) -> ResourceSlice:
    """Convert an API ResourceSlice; raises :class:`DraSpecError`. A slice must say which
    nodes reach it: ``nodeName``, ``nodeSelector`` or ``allNodes`` (``perDeviceNodeSelection``
    is not supported and reported)."""
    obj = _map(obj, "ResourceSlice")
    name = _str(_map(obj.get("metadata"), "metadata").get("name"), "metadata.name")
    spec = _map(obj.get("spec"), "spec")
    pool = _map(spec.get("pool"), "spec.pool")
    node_name = _str(spec.get("nodeName"), "spec.nodeName", required=False) or None
    selector = (
        _node_selector(spec["nodeSelector"], "spec.nodeSelector")
        if spec.get("nodeSelector") is not None
        else None
    )
    all_nodes = _bool(spec.get("allNodes"), "spec.allNodes")
    if _bool(spec.get("perDeviceNodeSelection"), "spec.perDeviceNodeSelection"):
        raise DraSpecError("spec.perDeviceNodeSelection", "is not supported by this scheduler")
    if sum((node_name is not None, selector is not None, all_nodes)) != 1:
        raise DraSpecError("spec", "needs exactly one of nodeName, nodeSelector, allNodes")
    devices = tuple(
        _device(d, f"spec.devices[{i}]")
        for i, d in enumerate(_list(spec.get("devices"), "spec.devices"))
    )
    seen: set[str] = set()
    for i, d in enumerate(devices):
        if d.name in seen:
            raise DraSpecError(f"spec.devices[{i}].name", f"{d.name!r} appears twice")
        seen.add(d.name)
    count = _int(pool.get("resourceSliceCount"), "spec.pool.resourceSliceCount", 1)
    if count < 1:
        raise DraSpecError("spec.pool.resourceSliceCount", "must be at least 1")
    return ResourceSlice(
        name=name,
        driver=_str(spec.get("driver"), "spec.driver"),
        pool=_str(pool.get("name"), "spec.pool.name"),
        generation=_int(pool.get("generation"), "spec.pool.generation", 0),
        slice_count=count,
        node_name=node_name,
        node_selector=selector,
        all_nodes=all_nodes,
        devices=devices,
    )


# --- ResourceClaim ------------------------------------------------------------------------


def _alternative(raw: Mapping[str, Any], path: str, name: str) -> RequestAlternative:
    raw_mode = raw.get("allocationMode") or "ExactCount"
    if raw_mode not in ("ExactCount", "All"):
        raise DraSpecError(f"{path}.allocationMode", f"{raw_mode!r} is not ExactCount or All")
    mode: AllocationMode = "All" if raw_mode == "All" else "ExactCount"
    count = _int(raw.get("count"), f"{path}.count", 1)
    if mode == "ExactCount" and count < 1:
        raise DraSpecError(f"{path}.count", "must be at least 1")
    return RequestAlternative(
        name=name,
        device_class=_str(raw.get("deviceClassName"), f"{path}.deviceClassName"),
        selectors=_selectors(raw.get("selectors"), f"{path}.selectors"),
        mode=mode,
        count=count if mode == "ExactCount" else 0,
        admin_access=_bool(raw.get("adminAccess"), f"{path}.adminAccess"),
    )


def _request(raw: Any, path: str) -> DeviceRequest:
    raw = _map(raw, path)
    name = _str(raw.get("name"), f"{path}.name")
    exactly = raw.get("exactly")
    first = _list(raw.get("firstAvailable"), f"{path}.firstAvailable")
    if exactly is not None and first:
        raise DraSpecError(path, "sets both exactly and firstAvailable; keep one")
    if exactly is not None:
        alt = _alternative(_map(exactly, f"{path}.exactly"), f"{path}.exactly", name)
        return DeviceRequest(name, (alt,))
    if first:
        alts = []
        for i, sub in enumerate(first):
            spath = f"{path}.firstAvailable[{i}]"
            sub = _map(sub, spath)
            sub_name = _str(sub.get("name"), f"{spath}.name")
            alts.append(_alternative(sub, spath, f"{name}/{sub_name}"))
        return DeviceRequest(name, tuple(alts), first_available=True)
    if raw.get("deviceClassName") is not None:  # v1beta1 put the fields on the request
        return DeviceRequest(name, (_alternative(raw, path, name),))
    raise DraSpecError(path, "needs exactly or firstAvailable")


def _allocation(raw: Any, path: str) -> ClaimAllocation | None:
    if raw is None:
        return None
    raw = _map(raw, path)
    results = []
    devices = _map(raw.get("devices"), f"{path}.devices")
    for i, r in enumerate(_list(devices.get("results"), f"{path}.devices.results")):
        rpath = f"{path}.devices.results[{i}]"
        r = _map(r, rpath)
        results.append(
            DeviceResult(
                request=_str(r.get("request"), f"{rpath}.request"),
                driver=_str(r.get("driver"), f"{rpath}.driver"),
                pool=_str(r.get("pool"), f"{rpath}.pool"),
                device=_str(r.get("device"), f"{rpath}.device"),
                admin_access=_bool(r.get("adminAccess"), f"{rpath}.adminAccess"),
            )
        )
    selector = (
        _node_selector(raw["nodeSelector"], f"{path}.nodeSelector")
        if raw.get("nodeSelector") is not None
        else None
    )
    return ClaimAllocation(tuple(results), selector)


def resource_claim_from_k8s(obj: Mapping[str, Any]) -> ResourceClaim:
    """Convert an API ResourceClaim; raises :class:`DraSpecError`."""
    obj = _map(obj, "ResourceClaim")
    meta = _map(obj.get("metadata"), "metadata")
    spec = _map(obj.get("spec"), "spec")
    status = _map(obj.get("status"), "status")
    devices = _map(spec.get("devices"), "spec.devices")
    requests = tuple(
        _request(r, f"spec.devices.requests[{i}]")
        for i, r in enumerate(_list(devices.get("requests"), "spec.devices.requests"))
    )
    names = {r.name for r in requests} | {a.name for r in requests for a in r.alternatives}
    if len({r.name for r in requests}) != len(requests):
        raise DraSpecError("spec.devices.requests", "request names must be unique")
    constraints = []
    for i, c in enumerate(_list(devices.get("constraints"), "spec.devices.constraints")):
        cpath = f"spec.devices.constraints[{i}]"
        c = _map(c, cpath)
        if c.get("distinctAttribute") is not None:
            # Placement would break the constraint if it were ignored: the claim waits.
            raise DraSpecError(f"{cpath}.distinctAttribute", "is not supported yet")
        attribute = _str(c.get("matchAttribute"), f"{cpath}.matchAttribute")
        if "/" not in attribute:
            raise DraSpecError(f"{cpath}.matchAttribute", "must be qualified: domain/name")
        refs = tuple(
            _str(n, f"{cpath}.requests[{j}]")
            for j, n in enumerate(_list(c.get("requests"), f"{cpath}.requests"))
        )
        for j, wanted in enumerate(refs):
            if wanted not in names:
                raise DraSpecError(f"{cpath}.requests[{j}]", f"no request is named {wanted!r}")
        constraints.append(DeviceConstraint(attribute, refs))
    reserved = []
    for i, raw_ref in enumerate(_list(status.get("reservedFor"), "status.reservedFor")):
        rpath = f"status.reservedFor[{i}]"
        ref = _map(raw_ref, rpath)
        reserved.append(
            ConsumerRef(
                resource=_str(ref.get("resource"), f"{rpath}.resource"),
                name=_str(ref.get("name"), f"{rpath}.name"),
                uid=_str(ref.get("uid"), f"{rpath}.uid"),
                api_group=_str(ref.get("apiGroup"), f"{rpath}.apiGroup", required=False),
            )
        )
    return ResourceClaim(
        namespace=_str(meta.get("namespace"), "metadata.namespace", required=False) or "default",
        name=_str(meta.get("name"), "metadata.name"),
        uid=_str(meta.get("uid"), "metadata.uid", required=False),
        requests=requests,
        constraints=tuple(constraints),
        allocation=_allocation(status.get("allocation"), "status.allocation"),
        reserved_for=tuple(reserved),
    )
