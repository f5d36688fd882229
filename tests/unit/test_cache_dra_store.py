"""The store feeds its DRA index from watch events: the snapshot carries the devices and the
claims of pending pods, a pod whose claim cannot be used waits naming it (and is placed once
the claim appears), a malformed DRA object is a problem naming its field, and the GPU-class
devices of claims count toward the pod's queue."""

from __future__ import annotations

from typing import Any

from scheduler.cache.store import Cache
from scheduler.cluster.dracodes import CLAIM_NOT_READY
from scheduler.cluster.queue import pod_queue_usage
from tests.unit.test_cache_dra import claim_obj, slice_obj
from tests.unit.test_cache_store import SCHED, node, pod

DRIVER = "gpu.example.com"


def gpu_class() -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu.example.com", "resourceVersion": "1"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def claim_for(name: str, count: int = 1) -> dict[str, Any]:
    obj = claim_obj(name)
    obj["spec"] = {
        "devices": {
            "requests": [
                {"name": "g", "exactly": {"deviceClassName": "gpu.example.com", "count": count}}
            ]
        }
    }
    return obj


def claim_pod(name: str, claim: str) -> dict[str, Any]:
    obj = pod(name)
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    return obj


def cache_with_devices() -> Cache:
    cache = Cache(SCHED)
    cache.apply("Node", "ADDED", node("n1", gpus=0))
    cache.apply("DeviceClass", "ADDED", gpu_class())
    cache.apply("ResourceSlice", "ADDED", slice_obj("n1", n=4))
    return cache


def test_pod_waits_for_its_claim_then_is_in_the_snapshot_with_it() -> None:
    cache = cache_with_devices()
    cache.apply("Pod", "ADDED", claim_pod("p", "two"))
    snap = cache.snapshot()
    (p,) = [x for x in snap.pods if x.name == "p"]
    assert p.blocked is not None
    assert p.blocked[0] == CLAIM_NOT_READY
    assert "ResourceClaim ns/two" in p.blocked[1] and "does not exist" in p.blocked[1]
    cache.apply("ResourceClaim", "ADDED", claim_for("two", count=2))
    snap = cache.snapshot()
    (p,) = [x for x in snap.pods if x.name == "p"]
    assert p.blocked is None and p.resource_claims == 1
    assert snap.dra is not None
    assert snap.dra.claim_keys_by_pod[p.uid] == ("ns/two",)
    assert p.claim_gpus == 2 and pod_queue_usage(p)["gpu"] == 2000
    assert len(snap.dra.slices) == 1


def test_claim_deleted_makes_the_pod_wait_again() -> None:
    cache = cache_with_devices()
    cache.apply("ResourceClaim", "ADDED", claim_for("one"))
    cache.apply("Pod", "ADDED", claim_pod("p", "one"))
    assert next(x for x in cache.snapshot().pods if x.name == "p").blocked is None
    cache.apply("ResourceClaim", "DELETED", claim_for("one"))
    blocked = next(x for x in cache.snapshot().pods if x.name == "p").blocked
    assert blocked is not None and "does not exist" in blocked[1]


def test_malformed_claim_is_a_problem_naming_the_field() -> None:
    cache = cache_with_devices()
    bad = claim_for("bad")
    bad["spec"]["devices"]["requests"][0]["exactly"]["count"] = "lots"
    cache.apply("ResourceClaim", "ADDED", bad)
    cache.apply("Pod", "ADDED", claim_pod("p", "bad"))
    problems = [x for x in cache.problems() if x.kind == "ResourceClaim"]
    assert len(problems) == 1 and "count" in problems[0].field
    assert problems[0].api_version == "resource.k8s.io/v1"
    blocked = next(x for x in cache.snapshot().pods if x.name == "p").blocked
    assert blocked is not None and "cannot be used" in blocked[1]
    cache.apply(
        "ResourceClaim",
        "MODIFIED",
        {**claim_for("bad"), "metadata": {**claim_for("bad")["metadata"], "resourceVersion": "2"}},
    )
    assert not [x for x in cache.problems() if x.kind == "ResourceClaim"]


def test_dra_api_absent_makes_only_claim_pods_wait() -> None:
    cache = cache_with_devices()
    cache.apply("Pod", "ADDED", pod("plain"))
    cache.apply("Pod", "ADDED", claim_pod("p", "one"))
    cache.set_absent("ResourceClaim", True)
    pods = {x.name: x for x in cache.snapshot().pods}
    assert pods["plain"].blocked is None
    blocked = pods["p"].blocked
    assert blocked is not None and "cannot be read" in blocked[1]


def test_cluster_without_claims_has_no_dra_part() -> None:
    cache = Cache(SCHED)
    cache.apply("Node", "ADDED", node("n1"))
    cache.apply("Pod", "ADDED", pod("plain"))
    assert cache.snapshot().dra is None
