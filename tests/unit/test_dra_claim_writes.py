"""The pure parts of writing ResourceClaims at commit (scheduler/commit/dra.py): which claims
a gang writes, what a write puts into a claim as read, and the API form of an allocation.
The writes themselves run against a real API server in tests/integration/test_dra_commit.py."""

from __future__ import annotations

from typing import Any

from scheduler.cache.dra_reservations import DraReservations
from scheduler.cluster.dra import ClaimAllocation, DeviceResult
from scheduler.cluster.draspec import resource_claim_from_k8s
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm
from scheduler.commit.dra import (
    FINALIZER,
    RESERVED_FOR_MAX,
    ClaimPlan,
    ClaimWrite,
    NotYet,
    allocation_to_k8s,
    extended_claim_manifest,
    extended_claim_status,
    gang_claims,
    plan_claim_write,
    release_claims,
    reserve_claims,
)
from scheduler.solver.placement import ClaimGrant, GangOutcome, PodAssignment

DRIVER = "gpu.example.com"
ON_N1 = (NodeSelectorTerm((NodeSelectorRequirement("metadata.name", "In", ("n1",)),)),)


def alloc(*devices: str, selector: Any = ON_N1) -> ClaimAllocation:
    return ClaimAllocation(tuple(DeviceResult("gpu", DRIVER, "n1", d) for d in devices), selector)


def claim_obj(name: str = "c", **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": "cu", "resourceVersion": "7"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
        "status": status,
    }


def assignment(name: str, *grants: ClaimGrant) -> PodAssignment:
    return PodAssignment(f"uid-{name}", f"ns/{name}", "ns/g", "n1", claims=grants)


def test_allocation_round_trips_through_the_parser() -> None:
    admin = ClaimAllocation(
        (
            DeviceResult("gpu", DRIVER, "n1", "gpu-0"),
            DeviceResult("mon", DRIVER, "n1", "gpu-1", True),
        ),
        ON_N1,
    )
    for allocation in (alloc("gpu-0", "gpu-1"), alloc("gpu-3", selector=None), admin):
        obj = claim_obj(allocation=allocation_to_k8s(allocation))
        assert resource_claim_from_k8s(obj).allocation == allocation
    assert allocation_to_k8s(alloc("gpu-0")) == {
        "devices": {
            "results": [{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ]
        },
    }


def test_one_write_per_claim_with_every_member() -> None:
    a = alloc("gpu-0")
    outcome = GangOutcome(
        "ns/g",
        "q",
        True,
        (
            assignment("p0", ClaimGrant("ns/shared", a), ClaimGrant("ns/own")),
            assignment("p1", ClaimGrant("ns/shared")),
        ),
    )
    writes = gang_claims(outcome, {})
    assert writes == [
        ClaimWrite("ns/own", None, (("p0", "uid-p0"),)),
        ClaimWrite("ns/shared", a, (("p0", "uid-p0"), ("p1", "uid-p1"))),
    ]
    clash = GangOutcome(
        "ns/g",
        "q",
        True,
        (
            assignment("p0", ClaimGrant("ns/c", a)),
            assignment("p1", ClaimGrant("ns/c", alloc("gpu-1"))),
        ),
    )
    assert gang_claims(clash, {}) == "ResourceClaim ns/c was given two different allocations"


def test_reserve_claims_holds_the_chosen_devices_once_per_claim() -> None:
    a = alloc("gpu-0")
    outcome = GangOutcome(
        "ns/g",
        "q",
        True,
        (assignment("p0", ClaimGrant("ns/c", a)), assignment("p1", ClaimGrant("ns/c", a))),
    )
    r = DraReservations()
    assert reserve_claims(outcome, r) == []
    assert r.devices() == {(DRIVER, "n1", "gpu-0")}
    other = GangOutcome("ns/h", "q", True, (assignment("p2", ClaimGrant("ns/d", a)),))
    refused = reserve_claims(other, r)
    assert [(x.pod_key, "ResourceClaim ns/c" in why) for x, why in refused] == [("ns/p2", True)]
    release_claims(outcome, r)
    assert r.devices() == frozenset()


def test_plan_allocates_reserves_and_adds_the_finalizer() -> None:
    w = ClaimWrite("ns/c", alloc("gpu-0"), (("p0", "u0"), ("p1", "u1")))
    plan = plan_claim_write(claim_obj(), w)
    assert isinstance(plan, ClaimPlan) and plan.add_finalizer
    assert plan.status == {
        "allocation": allocation_to_k8s(alloc("gpu-0")),
        "reservedFor": [
            {"resource": "pods", "name": "p0", "uid": "u0"},
            {"resource": "pods", "name": "p1", "uid": "u1"},
        ],
    }
    written = claim_obj(**plan.status)
    written["metadata"]["finalizers"] = [FINALIZER]
    parsed = resource_claim_from_k8s(written)
    assert parsed.allocation == alloc("gpu-0")
    assert [c.uid for c in parsed.reserved_for] == ["u0", "u1"]
    # Read again after a lost answer: nothing left to write.
    assert plan_claim_write(written, w) == ClaimPlan(None, False)


def test_plan_for_a_claim_allocated_before_only_adds_consumers() -> None:
    existing = [{"resource": "pods", "name": "old", "uid": "u9"}]
    obj = claim_obj(allocation=allocation_to_k8s(alloc("gpu-5")), reservedFor=existing)
    plan = plan_claim_write(obj, ClaimWrite("ns/c", None, (("p0", "u0"), ("old", "u9"))))
    assert isinstance(plan, ClaimPlan) and not plan.add_finalizer
    assert plan.status is not None
    assert plan.status["allocation"] == allocation_to_k8s(alloc("gpu-5"))
    assert plan.status["reservedFor"] == [
        *existing,
        {"resource": "pods", "name": "p0", "uid": "u0"},
    ]


def test_plan_refuses_what_changed_under_it() -> None:
    taken = claim_obj(allocation=allocation_to_k8s(alloc("gpu-1")))
    assert plan_claim_write(taken, ClaimWrite("ns/c", alloc("gpu-0"), (("p", "u"),))) == (
        "ResourceClaim ns/c was allocated other devices (gpu-1) since the cycle chose devices "
        "for it"
    )
    loose = ClaimWrite("ns/c", None, (("p", "u"),))
    assert plan_claim_write(claim_obj(), loose) == (
        "ResourceClaim ns/c is not allocated (the devices chosen for it were not written)"
    )
    assert plan_claim_write(claim_obj(), loose, in_flight=True) == NotYet(
        "ResourceClaim ns/c is not allocated yet"
    )
    deleting = claim_obj()
    deleting["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    assert plan_claim_write(deleting, loose) == "ResourceClaim ns/c is being deleted"
    full = claim_obj(
        allocation=allocation_to_k8s(alloc("gpu-1")),
        reservedFor=[
            {"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(RESERVED_FOR_MAX)
        ],
    )
    assert plan_claim_write(full, ClaimWrite("ns/c", None, (("x", "ux"),))) == (
        f"ResourceClaim ns/c is reserved for {RESERVED_FOR_MAX} consumers; 1 more would pass the "
        f"limit of {RESERVED_FOR_MAX}"
    )
    bad = claim_obj()
    bad["spec"]["devices"]["requests"] = "nope"
    plan = plan_claim_write(bad, loose)
    assert isinstance(plan, str) and plan.startswith(
        "ResourceClaim ns/c cannot be used: spec.devices"
    )


def test_while_claims_may_not_be_written_gangs_with_claims_are_refused_at_reserve() -> None:
    r = DraReservations()
    token = r.forbid_writes("grant it")
    joining = GangOutcome("ns/g", "q", True, (assignment("p0", ClaimGrant("ns/c")),))
    assert [why for _, why in reserve_claims(joining, r)] == ["grant it"]
    plain = GangOutcome("ns/h", "q", True, (assignment("p1"),))
    assert reserve_claims(plain, r) == []
    r.allow_writes(token)
    assert reserve_claims(joining, r) == []


def test_the_claim_for_extended_resources_is_made_as_kube_scheduler_makes_it() -> None:
    body = extended_claim_manifest("p", "uid-p", [("container-0-request-0", "gpu", 2)])
    assert body["metadata"] == {
        "generateName": "p-extended-resources-",
        "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-p", "controller": True}
        ],
        "finalizers": [FINALIZER],
    }
    parsed = resource_claim_from_k8s({**body, "metadata": {"name": "p-extended-resources-x"}})
    ((request),) = parsed.requests
    assert (request.name, request.alternatives[0].device_class, request.alternatives[0].count) == (
        "container-0-request-0",
        "gpu",
        2,
    )
    assert extended_claim_status("c", [("main", "example.com/gpu", "r")]) == {
        "resourceClaimName": "c",
        "requestMappings": [
            {"containerName": "main", "resourceName": "example.com/gpu", "requestName": "r"}
        ],
    }
    grant = ClaimGrant("ns/<extended-resources:p0>", alloc("gpu-0"), requests=(("r", "gpu", 1),))
    (write,) = gang_claims(GangOutcome("ns/g", "q", True, (assignment("p0", grant),)), {})
    assert write.extended and write.reservation_key == "ns/<extended-resources:p0>"
    write.created = "p0-extended-resources-x"
    assert write.name == write.created
    assert write.reservation_key == "ns/p0-extended-resources-x"
