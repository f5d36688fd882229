"""The DRA part of a scenario: ``deviceClasses``, ``resourceSlices`` and ``resourceClaims``,
written as the ``resource.k8s.io/v1`` objects a driver and a user would create::

    deviceClasses:
      - metadata: {name: gpu.example.com}
        spec: {selectors: [{cel: {expression: 'device.driver == "gpu.example.com"'}}]}
    resourceSlices:
      - metadata: {name: dgx-0-gpus}
        spec: {driver: gpu.example.com, nodeName: dgx-0, pool: {name: dgx-0},
               devices: [{name: gpu-0, attributes: {model: {string: a100}}}]}
    resourceClaims:
      - metadata: {name: two-gpus, namespace: team-a}
        spec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.example.com,
                                                        count: 2}}]}}
    resourceClaimTemplates:
      - metadata: {name: one-gpu, namespace: team-a}
        spec: {spec: {devices: {requests: [{name: g,
                                            exactly: {deviceClassName: gpu.example.com}}]}}}

Jobs use them as pods do, in their template's ``spec.resourceClaims`` (``resourceClaimName``:
a claim above, shared by every pod naming it; ``resourceClaimTemplateName``: a claim per pod
made from the template). :func:`check_job_claims` checks that what they name exists in the
job's namespace; a job already ``running`` may name only claims whose ``status.allocation``
is given (nothing would have allocated a template's claim before the start).

Checked beyond what the parsers check: names are unique, a slice's ``nodeName`` is a node of
the scenario, every ``deviceClassName`` is a declared class, and every CEL selector compiles.
Errors raise :class:`~scheduler.simulate.fields.ScenarioError` naming the field, e.g.
``resourceClaims[0].spec.devices.requests[0].exactly.deviceClassName``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

from scheduler.cluster.dra import DeviceClass, ResourceClaim, ResourceSlice
from scheduler.cluster.dracel import compile_selector
from scheduler.cluster.draspec import (
    DraSpecError,
    device_class_from_k8s,
    resource_claim_from_k8s,
    resource_slice_from_k8s,
)
from scheduler.cluster.draview import DraView
from scheduler.simulate.fields import ScenarioError, read_list, read_mapping
from scheduler.simulate.workload import JobArrival

__all__ = ["DRA_FIELDS", "check_job_claims", "parse_claim_templates", "parse_dra"]

#: The scenario's top-level fields this module reads.
DRA_FIELDS = ("deviceClasses", "resourceSlices", "resourceClaims", "resourceClaimTemplates")
#: Scenarios declare devices one by one; this guards against a runaway generator.
MAX_DEVICES = 1_000_000

T = TypeVar("T")


def _objects(raw: Any, field: str, parse: Callable[[Mapping[str, Any]], T]) -> list[T]:
    out = []
    for i, entry in enumerate(read_list(raw, field)):
        path = f"{field}[{i}]"
        data = read_mapping(entry, path)
        try:
            out.append(parse(data))
        except DraSpecError as e:
            raise ScenarioError(f"{path}.{e.field}", e.message) from e
    return out


def _unique(names: list[str], field: str, what: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ScenarioError(f"{field}[{i}].metadata.name", f"{what} {name!r} is defined twice")
        seen.add(name)


def _check_selectors(exprs: tuple[str, ...], path: str) -> None:
    for k, expr in enumerate(exprs):
        error = compile_selector(expr).error
        if error is not None:
            raise ScenarioError(f"{path}[{k}].cel.expression", error)


def _check_claim(
    claim: ResourceClaim, raw: Mapping[str, Any], path: str, classes: Collection[str]
) -> None:
    raw_requests = ((raw.get("spec") or {}).get("devices") or {}).get("requests") or []
    for j, request in enumerate(claim.requests):
        rpath = f"{path}.spec.devices.requests[{j}]"
        raw_request = raw_requests[j] if j < len(raw_requests) else {}
        for k, alt in enumerate(request.alternatives):
            if request.first_available:
                apath = f"{rpath}.firstAvailable[{k}]"
            elif isinstance(raw_request, Mapping) and "exactly" in raw_request:
                apath = f"{rpath}.exactly"
            else:  # the v1beta1 shape: fields on the request
                apath = rpath
            if alt.device_class not in classes:
                known = ", ".join(sorted(classes)) or "none"
                raise ScenarioError(
                    f"{apath}.deviceClassName",
                    f"no DeviceClass is named {alt.device_class!r} (declared: {known}); add "
                    "it to deviceClasses",
                )
            _check_selectors(alt.selectors, f"{apath}.selectors")


def parse_dra(root: Mapping[str, Any], node_names: Collection[str]) -> DraView | None:
    """The scenario's DRA objects as a :class:`DraView` (None when it declares none)."""
    if all(root.get(f) is None for f in DRA_FIELDS):
        return None
    classes: list[DeviceClass] = _objects(
        root.get("deviceClasses"), "deviceClasses", device_class_from_k8s
    )
    _unique([c.name for c in classes], "deviceClasses", "DeviceClass")
    for i, cls in enumerate(classes):
        _check_selectors(cls.selectors, f"deviceClasses[{i}].spec.selectors")
    slices: list[ResourceSlice] = _objects(
        root.get("resourceSlices"), "resourceSlices", resource_slice_from_k8s
    )
    _unique([s.name for s in slices], "resourceSlices", "ResourceSlice")
    total = 0
    for i, s in enumerate(slices):
        if s.node_name is not None and s.node_name not in node_names:
            raise ScenarioError(
                f"resourceSlices[{i}].spec.nodeName",
                f"no node is named {s.node_name!r}; a shape with count N makes nodes "
                "NAME-0 ... NAME-(N-1)",
            )
        total += len(s.devices)
        if total > MAX_DEVICES:
            raise ScenarioError(
                f"resourceSlices[{i}].spec.devices", f"at most {MAX_DEVICES} devices in all"
            )
    raw_claims = read_list(root.get("resourceClaims"), "resourceClaims")
    claims: list[ResourceClaim] = _objects(raw_claims, "resourceClaims", resource_claim_from_k8s)
    _unique([c.key for c in claims], "resourceClaims", "ResourceClaim")
    names = {c.name for c in classes}
    for i, (claim, raw) in enumerate(zip(claims, raw_claims, strict=True)):
        _check_claim(claim, raw, f"resourceClaims[{i}]", names)
    return DraView.build(classes, slices, claims)


def _template_claim(obj: Mapping[str, Any]) -> ResourceClaim:
    """A ResourceClaimTemplate as the claim it makes, named like the template."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise DraSpecError("spec", "expected an object with the claim's spec under spec.spec")
    inner = {"metadata": obj.get("metadata"), "spec": spec.get("spec")}
    try:
        return resource_claim_from_k8s(inner)
    except DraSpecError as e:
        # The claim's fields sit under spec.spec in a template.
        where = f"spec.{e.field}" if e.field.startswith("spec") else e.field
        raise DraSpecError(where, e.message) from e


def parse_claim_templates(root: Mapping[str, Any], view: DraView | None) -> list[ResourceClaim]:
    """The scenario's ``resourceClaimTemplates`` as claims named like the templates."""
    raw = read_list(root.get("resourceClaimTemplates"), "resourceClaimTemplates")
    templates = _objects(raw, "resourceClaimTemplates", _template_claim)
    _unique([t.key for t in templates], "resourceClaimTemplates", "ResourceClaimTemplate")
    names = {c.name for c in view.classes} if view is not None else set()
    for i, (template, obj) in enumerate(zip(templates, raw, strict=True)):
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        inner = {"spec": spec.get("spec")} if isinstance(spec, Mapping) else {}
        _check_claim(template, inner, f"resourceClaimTemplates[{i}].spec", names)
    return templates


def check_job_claims(
    jobs: Sequence[JobArrival], view: DraView | None, templates: Sequence[ResourceClaim]
) -> None:
    """Every claim and template a job's pods name exists in the job's namespace; a running
    job names only allocated claims."""
    claims = {c.key: c for c in view.claims} if view is not None else {}
    template_keys = {t.key for t in templates}
    for i, job in enumerate(jobs):
        if not job.claims:
            continue
        namespace = job.pods[0].namespace
        for k, ref in enumerate(job.claims):
            path = f"jobs[{i}].pods.template.spec.resourceClaims[{k}]"
            key = f"{namespace}/{ref.target}"
            if ref.template:
                if key not in template_keys:
                    raise ScenarioError(
                        f"{path}.resourceClaimTemplateName",
                        f"no ResourceClaimTemplate {key}; add it to resourceClaimTemplates",
                    )
                if job.running:
                    raise ScenarioError(
                        f"{path}.resourceClaimTemplateName",
                        "a job running from the start cannot use a claim template (its claims "
                        "would not be allocated); name an allocated claim of resourceClaims",
                    )
                continue
            claim = claims.get(key)
            if claim is None:
                raise ScenarioError(
                    f"{path}.resourceClaimName",
                    f"no ResourceClaim {key}; add it to resourceClaims",
                )
            if job.running and claim.allocation is None:
                raise ScenarioError(
                    f"{path}.resourceClaimName",
                    f"ResourceClaim {key} is used by a job running from the start, so give "
                    "its status.allocation (the devices it holds)",
                )
