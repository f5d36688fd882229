"""Independent check of the devices a placement gives to ResourceClaims.

Part of :func:`scheduler.solver.validate.validate`, and like it shares no code with the
engine that chose the devices (:mod:`scheduler.cluster.dra_alloc`, :mod:`.dra_state`): it
reads the snapshot's :class:`~scheduler.cluster.draview.DraView` and checks each answer
against the rules themselves. It does use the same CEL evaluation
(:mod:`scheduler.cluster.dracel`): a second CEL implementation is not ours to write.

Rules: every pending pod with claims is placed with one grant per claim, in order; a claim
allocated before the cycle keeps its allocation and the pod's node reaches it; a claim
allocated this cycle gets one allocation, whoever shares it; each of its devices exists in the
newest generation of its pool, is reachable from every node of a pod that uses it, matches
its class and the request's selectors, serves a request (or alternative) of the claim with
the right count; ``matchAttribute`` holds; no device is held by two claims or by a claim and
an allocation or reservation made before. A pod that asks for an extended resource its node
does not advertise and a DeviceClass serves gets exactly one claim for such resources, whose
requests (of the serving class) give each container at least what it asks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from scheduler.cluster.dra import (
    ClaimAllocation,
    Device,
    DeviceClass,
    DeviceId,
    DeviceRequest,
    RequestAlternative,
    ResourceClaim,
    ResourceSlice,
    current_slices,
)
from scheduler.cluster.dra_extended import classes_by_resource
from scheduler.cluster.dracel import DeviceEnv, compile_selector
from scheduler.cluster.draview import DraView
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod
from scheduler.solver.placement import ClaimGrant, PodAssignment

__all__ = ["dra_violations"]


def _alternatives(claim: ResourceClaim) -> dict[str, RequestAlternative]:
    """Result request name -> the alternative it names (``req`` or ``req/sub``)."""
    return {alt.name: alt for r in claim.requests for alt in r.alternatives}


def _selected(device: Device, driver: str, expressions: Sequence[str]) -> str | None:
    env = DeviceEnv(driver, dict(device.attributes), dict(device.capacity))
    for expression in expressions:
        result = env.evaluate(compile_selector(expression))
        if not result.matched:
            return expression
    return None


class _Devices:
    """The newest slices' devices by id, and the slice each comes from."""

    def __init__(self, slices: Sequence[ResourceSlice]) -> None:
        current, _ = current_slices(slices)
        self.by_id: dict[DeviceId, tuple[Device, ResourceSlice]] = {
            (s.driver, s.pool, d.name): (d, s) for s in current for d in s.devices
        }


def _check_allocation(
    claim: ResourceClaim,
    alloc: ClaimAllocation,
    view: DraView,
    devices: _Devices,
    nodes: Sequence[Node],
) -> list[str]:
    out: list[str] = []
    alternatives = _alternatives(claim)
    served: Counter[str] = Counter()
    for r in alloc.results:
        found = devices.by_id.get(r.device_id)
        where = f"claim {claim.key}: device {'/'.join(r.device_id)}"
        if found is None:
            out.append(f"{where} is not published by any current ResourceSlice")
            continue
        device, slice_ = found
        for node in nodes:
            if not slice_.reaches(node.name, node.label_map):
                out.append(f"{where} is not reachable from node {node.name}")
        alt = alternatives.get(r.request)
        if alt is None:
            out.append(f"{where} serves request {r.request!r}, which the claim does not have")
            continue
        served[r.request] += 1
        cls = view.class_by_name.get(alt.device_class)
        if cls is None:
            out.append(f"{where}: device class {alt.device_class!r} does not exist")
            continue
        failed = _selected(device, slice_.driver, (*cls.selectors, *alt.selectors))
        if failed is not None:
            out.append(f"{where} does not match selector {failed!r}")
        if r.admin_access != alt.admin_access:
            out.append(f"{where}: adminAccess differs from the request's")
    for request in claim.requests:
        used = [a for a in request.alternatives if served[a.name]]
        if len(used) != 1:
            out.append(
                f"claim {claim.key}: request {request.name} is served by {len(used)} "
                "alternatives (one wanted)"
            )
            continue
        alt = used[0]
        if alt.mode == "ExactCount" and served[alt.name] != alt.count:
            out.append(
                f"claim {claim.key}: request {alt.name} got {served[alt.name]} devices, "
                f"{alt.count} wanted"
            )
    for constraint in claim.constraints:
        values = set()
        for r in alloc.results:
            request_name = r.request.split("/", 1)[0]
            if constraint.requests and request_name not in constraint.requests:
                continue
            found = devices.by_id.get(r.device_id)
            if found is not None:
                values.add(repr(found[0].attribute(constraint.attribute, found[1].driver)))
        if len(values) > 1:
            out.append(
                f"claim {claim.key}: matchAttribute {constraint.attribute} has "
                f"{len(values)} values among its devices"
            )
    return out


def _extended_violations(
    a: PodAssignment,
    pod: Pod,
    node: Node,
    extra: Sequence[ClaimGrant],
    served: Mapping[str, DeviceClass],
    claims: dict[str, ResourceClaim],
    made: dict[str, tuple[ClaimAllocation, list[Node]]],
) -> list[str]:
    """The claim for the pod's extended resources that ``node`` gives through DRA: there is
    one exactly when some are, it covers each container's requests of them with devices of
    the class that serves the resource, and its allocation joins the others' checks."""
    wanted: dict[tuple[str, str], int] = {}
    for c in pod.extended_containers:
        for r, n in c.requests:
            if n > 0 and r in served and node.allocatable.get(r, 0) <= 0:
                wanted[(c.name, r)] = max(wanted.get((c.name, r), 0), n)
    if not extra:
        if wanted:
            names = sorted({r for _, r in wanted})
            return [f"pod {a.pod_key}: {names} are not on node {node.name} and get no devices"]
        return []
    if len(extra) > 1 or not wanted:
        return [
            f"pod {a.pod_key}: {len(extra)} claims for extended resources, {len(wanted)} wanted"
        ]
    grant = extra[0]
    out: list[str] = []
    sizes = {name: (cls, count) for name, cls, count in grant.requests}
    got: dict[tuple[str, str], int] = {}
    for container, resource, request in grant.mappings:
        if request not in sizes:
            out.append(f"pod {a.pod_key}: mapping names request {request!r} the claim lacks")
            continue
        cls, count = sizes[request]
        if served.get(resource) is None or served[resource].name != cls:
            out.append(f"pod {a.pod_key}: {resource} is served by class {cls}, not its own")
        got[(container, resource)] = got.get((container, resource), 0) + count
    for key, n in wanted.items():
        if got.get(key, 0) < n:
            out.append(
                f"pod {a.pod_key}: container {key[0]} asks {n} {key[1]}, "
                f"its requests give {got.get(key, 0)}"
            )
    if grant.allocation is None:
        return [*out, f"pod {a.pod_key}: the claim for its extended resources has no devices"]
    requests = tuple(
        DeviceRequest(name, (RequestAlternative(name, cls, count=count),))
        for name, cls, count in grant.requests
    )
    ns, name = grant.claim.split("/", 1)
    claims[grant.claim] = ResourceClaim(ns, name, "", requests)
    made[grant.claim] = (grant.allocation, [node])
    return out


def dra_violations(
    view: DraView | None,
    assignments: Sequence[PodAssignment],
    pods: Mapping[str, Pod],
    nodes: Mapping[str, Node],
) -> list[str]:
    """Every device rule ``assignments`` break (empty = ok); see the module docstring."""
    out: list[str] = []
    view = view if view is not None else DraView()
    keys_by_pod = view.claim_keys_by_pod
    claims = dict(view.claim_by_key)  # and the claims for extended resources, as met
    # claim key -> (its allocation this cycle, the nodes of the pods that use it)
    made: dict[str, tuple[ClaimAllocation, list[Node]]] = {}
    served: dict[str, DeviceClass] | None = None
    for a in assignments:
        pod = pods.get(a.pod_uid)
        if pod is None:
            continue
        if pod.node_name is not None:
            if a.claims:
                out.append(f"pod {a.pod_key}: is bound and has claim grants")
            continue
        node = nodes.get(a.node)
        if node is None:
            continue  # the main validator names the unknown node
        own = [g for g in a.claims if not g.extended]
        extra = [g for g in a.claims if g.extended]
        if served is None:
            served = classes_by_resource(view.classes)
        out += _extended_violations(a, pod, node, extra, served, claims, made)
        if pod.resource_claims == 0:
            if own:
                out.append(f"pod {a.pod_key}: has claim grants but uses no ResourceClaims")
            continue
        keys = keys_by_pod.get(pod.uid)
        if keys is None:
            out.append(f"pod {a.pod_key}: placed although its ResourceClaims are not known")
            continue
        if [g.claim for g in own] != list(keys):
            out.append(f"pod {a.pod_key}: claim grants {[g.claim for g in own]} != {keys}")
            continue
        for grant in own:
            claim = claims.get(grant.claim)
            if claim is None:
                out.append(f"pod {a.pod_key}: claim {grant.claim} is not in the snapshot")
                continue
            if grant.allocation is None:
                if claim.allocation is None:
                    out.append(f"pod {a.pod_key}: claim {claim.key} is used without devices")
                    continue
                sel = claim.allocation.node_selector
                labels = {**node.label_map, "metadata.name": node.name}
                if sel is not None and not any(t.matches(labels) for t in sel):
                    out.append(
                        f"pod {a.pod_key}: node {node.name} cannot reach the devices of "
                        f"claim {claim.key}"
                    )
                continue
            if claim.allocation is not None:
                out.append(f"pod {a.pod_key}: claim {claim.key} is allocated already")
                continue
            known = made.get(claim.key)
            if known is None:
                made[claim.key] = (grant.allocation, [node])
            elif known[0] != grant.allocation:
                out.append(f"claim {claim.key}: allocated two different ways this cycle")
            else:
                known[1].append(node)
    if not made:
        return out
    devices = _Devices(view.slices)
    holder: dict[DeviceId, str] = dict.fromkeys(view.busy, "an allocation made before")
    for key, (alloc, used_on) in made.items():
        out += _check_allocation(claims[key], alloc, view, devices, used_on)
        for r in alloc.results:
            if r.admin_access:
                continue
            other = holder.get(r.device_id)
            if other is not None:
                out.append(f"device {'/'.join(r.device_id)}: given to claim {key} and {other}")
            holder[r.device_id] = f"claim {key}"
    return out
