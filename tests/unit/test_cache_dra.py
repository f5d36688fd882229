"""The cache's DRA index: parsed objects by key (parsed again only when changed), parse
problems naming the field, which claims a pod uses (direct and from templates) or why it
waits, the devices in use, and selector results kept across cycles."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.cache.dra import (
    DEVICE_CLASS,
    RESOURCE_CLAIM,
    RESOURCE_SLICE,
    ClaimsReady,
    ClaimsWait,
    DraIndex,
    DraProblem,
    pod_claim_refs,
)
from scheduler.cluster.dra_alloc import AllocationFailure, allocate_pod_claims

DRIVER = "gpu.example.com"


def device_class(name: str = "gpu", rv: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": rv},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def slice_obj(node: str, n: int = 2, rv: str = "1", generation: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-gpus", "resourceVersion": rv},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(n)
            ],
        },
    }


def claim_obj(
    name: str,
    rv: str = "1",
    allocated: list[str] | None = None,
    owner: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"u-{name}"}
    meta["resourceVersion"] = rv
    if owner:
        meta["ownerReferences"] = [{"kind": "Pod", "name": "p", "uid": owner}]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    obj: dict[str, Any] = {
        "metadata": meta,
        "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu"}}]}},
    }
    if allocated:
        results = [{"request": "g", "driver": DRIVER, "pool": "n1", "device": d} for d in allocated]
        obj["status"] = {"allocation": {"devices": {"results": results}}}
    return obj


def pod(
    uid: str = "p1",
    entries: Any = None,
    statuses: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": uid},
        "spec": {"containers": [{"name": "c"}]},
    }
    if entries is not None:
        obj["spec"]["resourceClaims"] = entries
    if statuses is not None:
        obj["status"] = {"resourceClaimStatuses": statuses}
    return obj


def index_with(*claims: dict[str, Any]) -> DraIndex:
    idx = DraIndex()
    idx.upsert(DEVICE_CLASS, "gpu", device_class())
    idx.upsert(RESOURCE_SLICE, "n1-gpus", slice_obj("n1"))
    for c in claims:
        idx.upsert(RESOURCE_CLAIM, f"ns/{c['metadata']['name']}", c)
    return idx


# --- objects ---------------------------------------------------------------------------


def test_objects_are_parsed_once_per_resource_version() -> None:
    idx = DraIndex()
    assert idx.upsert(RESOURCE_SLICE, "n1-gpus", slice_obj("n1"))
    first = idx.slices["n1-gpus"]
    # Same resourceVersion: not parsed again (the very same object is kept), no change.
    assert not idx.upsert(RESOURCE_SLICE, "n1-gpus", slice_obj("n1"))
    assert idx.slices["n1-gpus"] is first
    # New resourceVersion with the same content: parsed, but nothing changed.
    assert not idx.upsert(RESOURCE_SLICE, "n1-gpus", slice_obj("n1", rv="2"))
    assert idx.upsert(RESOURCE_SLICE, "n1-gpus", slice_obj("n1", n=3, rv="3"))
    assert len(idx.slices["n1-gpus"].devices) == 3
    assert idx.delete(RESOURCE_SLICE, "n1-gpus")
    assert not idx.delete(RESOURCE_SLICE, "n1-gpus")
    assert idx.slices == {}


def test_object_without_resource_version_compares_content() -> None:
    idx = DraIndex()
    obj = device_class()
    del obj["metadata"]["resourceVersion"]
    assert idx.upsert(DEVICE_CLASS, "gpu", obj)
    assert not idx.upsert(DEVICE_CLASS, "gpu", device_class() | {"metadata": {"name": "gpu"}})
    changed = device_class()
    del changed["metadata"]["resourceVersion"]
    changed["spec"]["extendedResourceName"] = "example.com/gpu"
    assert idx.upsert(DEVICE_CLASS, "gpu", changed)
    assert idx.classes["gpu"].extended_resource_name == "example.com/gpu"


def test_parse_problem_names_the_field_and_is_reported_once() -> None:
    seen: list[DraProblem] = []
    idx = DraIndex(on_problem=seen.append)
    idx.upsert(RESOURCE_SLICE, "n1-gpus", slice_obj("n1"))
    bad = slice_obj("n1", rv="2")
    bad["spec"]["devices"][1]["attributes"]["index"] = {"int": 1, "string": "x"}
    assert idx.upsert(RESOURCE_SLICE, "n1-gpus", bad)
    problem = idx.problems[(RESOURCE_SLICE, "n1-gpus")]
    assert problem.field == "spec.devices[1].attributes[index]"
    assert "exactly one of" in problem.message
    assert "n1-gpus" not in idx.slices  # the old version is not used either
    bad_again = slice_obj("n1", rv="3")
    bad_again["spec"]["devices"][1]["attributes"]["index"] = {"int": 1, "string": "x"}
    idx.upsert(RESOURCE_SLICE, "n1-gpus", bad_again)
    assert seen == [problem]
    assert idx.upsert(RESOURCE_SLICE, "n1-gpus", slice_obj("n1", rv="4"))
    assert idx.problems == {}
    assert "n1-gpus" in idx.slices


def test_junk_objects_never_raise() -> None:
    idx = DraIndex()
    for kind in (DEVICE_CLASS, RESOURCE_SLICE, RESOURCE_CLAIM):
        for junk in ({}, {"metadata": 3}, {"metadata": {"name": "x"}, "spec": []}):
            idx.upsert(kind, "x", junk)
            assert (kind, "x") in idx.problems
        assert idx.delete(kind, "x")
    assert idx.problems == {}


def test_devices_in_use_follow_claims() -> None:
    idx = index_with(claim_obj("a", allocated=["gpu-0"]), claim_obj("b"))
    assert idx.devices_in_use() == {(DRIVER, "n1", "gpu-0")}
    idx.upsert(RESOURCE_CLAIM, "ns/b", claim_obj("b", rv="2", allocated=["gpu-1"]))
    assert idx.devices_in_use() == {(DRIVER, "n1", "gpu-0"), (DRIVER, "n1", "gpu-1")}
    idx.delete(RESOURCE_CLAIM, "ns/a")
    assert idx.devices_in_use() == {(DRIVER, "n1", "gpu-1")}


def test_catalog_is_kept_until_slices_or_classes_change_and_matcher_forgets() -> None:
    idx = index_with()
    catalog = idx.catalog()
    assert idx.catalog() is catalog
    idx.upsert(RESOURCE_CLAIM, "ns/x", claim_obj("x"))
    claims = (idx.claims["ns/x"],)
    assert idx.catalog() is catalog  # claims do not touch the catalog
    result = allocate_pod_claims(catalog, claims, "n1", {}, idx.devices_in_use())
    assert not isinstance(result, AllocationFailure) and len(result) == 1
    assert len(idx.matcher._entries) == 2  # selector results for both devices
    idx.upsert(RESOURCE_SLICE, "n2-gpus", slice_obj("n2"))
    assert idx.catalog() is not catalog
    allocate_pod_claims(idx.catalog(), claims, "n2", {}, frozenset())
    assert len(idx.matcher._entries) == 4
    # A deleted slice's devices are forgotten; the others keep their results.
    idx.delete(RESOURCE_SLICE, "n2-gpus")
    assert set(idx.matcher._entries) == {(DRIVER, "n1", "gpu-0"), (DRIVER, "n1", "gpu-1")}
    # Republished without a device: that device is forgotten too.
    idx.upsert(RESOURCE_SLICE, "n1-gpus", slice_obj("n1", n=1, rv="2"))
    assert set(idx.matcher._entries) == {(DRIVER, "n1", "gpu-0")}
    idx.upsert(DEVICE_CLASS, "gpu", device_class(rv="2") | {"spec": {}})
    assert idx.catalog().classes["gpu"].selectors == ()


def test_current_slices_keep_newest_generation() -> None:
    idx = DraIndex()
    idx.upsert(RESOURCE_SLICE, "old", slice_obj("n1", generation=1) | {"metadata": {"name": "old"}})
    idx.upsert(RESOURCE_SLICE, "new", slice_obj("n1", generation=2) | {"metadata": {"name": "new"}})
    assert [s.name for s in idx.current_slices()] == ["new"]


# --- pods ------------------------------------------------------------------------------


def test_pod_without_claims_is_ready_with_none() -> None:
    assert DraIndex().verdict(pod()) == ClaimsReady()
    assert pod_claim_refs(pod()) == []


def test_direct_claim_and_template_claim_from_status() -> None:
    idx = index_with(claim_obj("shared"), claim_obj("p-gpu-abc", owner="p1"))
    p = pod(
        entries=[
            {"name": "s", "resourceClaimName": "shared"},
            {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
        ],
        statuses=[{"name": "gpu", "resourceClaimName": "p-gpu-abc"}],
    )
    verdict = idx.verdict(p)
    assert isinstance(verdict, ClaimsReady)
    assert verdict.keys == ("ns/shared", "ns/p-gpu-abc")


def test_template_status_without_a_name_needs_no_claim() -> None:
    p = pod(
        entries=[{"name": "gpu", "resourceClaimTemplateName": "t"}],
        statuses=[{"name": "gpu"}],
    )
    assert index_with().verdict(p) == ClaimsReady()


@pytest.mark.parametrize(
    ("entries", "statuses", "words", "field"),
    [
        (
            [{"name": "gpu", "resourceClaimTemplateName": "t"}],
            None,
            "not created yet",
            "spec.resourceClaims[0]",
        ),
        (
            [{"name": "gpu", "resourceClaimTemplateName": "t"}],
            [{"name": "other", "resourceClaimName": "x"}],
            "not created yet",
            "spec.resourceClaims[0]",
        ),
        (
            [{"name": "a", "resourceClaimName": "ok"}, {"name": "b", "resourceClaimName": "gone"}],
            None,
            "ResourceClaim ns/gone (spec.resourceClaims[1]) does not exist",
            "spec.resourceClaims[1]",
        ),
        ([{"name": "a"}], None, "exactly one of", "spec.resourceClaims[0]"),
        (
            [{"name": "a", "resourceClaimName": "x", "resourceClaimTemplateName": "t"}],
            None,
            "exactly one of",
            "spec.resourceClaims[0]",
        ),
        ([{"resourceClaimName": "x"}], None, "name is required", "spec.resourceClaims[0].name"),
        (["junk"], None, "name is required", "spec.resourceClaims[0].name"),
        ({"a": 1}, None, "must be a list", "spec.resourceClaims"),
        (
            [{"name": "a", "resourceClaimName": "bad"}],
            None,
            "cannot be used: spec.devices.requests[0].exactly.count: must be at least 1",
            "spec.resourceClaims[0]",
        ),
        (
            [{"name": "a", "resourceClaimName": "dying"}],
            None,
            "is being deleted",
            "spec.resourceClaims[0]",
        ),
        (
            [{"name": "gpu", "resourceClaimTemplateName": "t"}],
            [{"name": "gpu", "resourceClaimName": "theirs"}],
            "made for another pod",
            "spec.resourceClaims[0]",
        ),
    ],
)
def test_pod_waits_naming_why(entries: Any, statuses: Any, words: str, field: str) -> None:
    bad = claim_obj("bad")
    bad["spec"]["devices"]["requests"][0]["exactly"]["count"] = 0
    idx = index_with(
        claim_obj("ok"),
        bad,
        claim_obj("dying", deleting=True),
        claim_obj("theirs", owner="someone-else"),
    )
    verdict = idx.verdict(pod(entries=entries, statuses=statuses))
    assert isinstance(verdict, ClaimsWait), verdict
    assert words in verdict.reason
    assert verdict.field == field


def test_absent_api_makes_claim_pods_wait_but_not_others() -> None:
    idx = index_with(claim_obj("ok"))
    assert idx.set_absent({RESOURCE_SLICE})
    assert not idx.set_absent({RESOURCE_SLICE})
    verdict = idx.verdict(pod(entries=[{"name": "a", "resourceClaimName": "ok"}]))
    assert isinstance(verdict, ClaimsWait)
    assert "ResourceSlice" in verdict.reason and "get/list/watch" in verdict.reason
    assert idx.verdict(pod()) == ClaimsReady()


def test_tracked_pods_are_judged_again_on_claim_events() -> None:
    idx = index_with()
    uses = pod(entries=[{"name": "a", "resourceClaimName": "c"}])
    assert idx.pod_changed("p1", uses)
    assert isinstance(idx.verdicts["p1"], ClaimsWait)
    assert idx.claim_keys("p1") == ()
    # Another claim does not concern the pod; its own claim does.
    assert idx.upsert(RESOURCE_CLAIM, "ns/other", claim_obj("other"))  # a new object
    assert isinstance(idx.verdicts["p1"], ClaimsWait)
    assert idx.upsert(RESOURCE_CLAIM, "ns/c", claim_obj("c"))
    assert idx.claim_keys("p1") == ("ns/c",)
    # An allocation written by the scheduler changes the verdict (the claim it carries).
    assert idx.upsert(RESOURCE_CLAIM, "ns/c", claim_obj("c", rv="2", allocated=["gpu-0"]))
    verdict = idx.verdicts["p1"]
    assert isinstance(verdict, ClaimsReady) and verdict.claims[0].allocation is not None
    assert idx.delete(RESOURCE_CLAIM, "ns/c")
    assert isinstance(idx.verdicts["p1"], ClaimsWait)
    assert idx.set_absent({RESOURCE_CLAIM})
    absent = idx.verdicts["p1"]
    assert isinstance(absent, ClaimsWait) and "cannot be read" in absent.reason
    # Bound (or no claims any more): not tracked; its claims' events concern nobody.
    assert idx.pod_removed("p1")
    assert idx.verdicts == {}
    idx.upsert(RESOURCE_CLAIM, "ns/c", claim_obj("c", rv="3"))
    assert idx.verdicts == {}
    assert not idx.pod_changed("p2", pod(uid="p2"))
    assert "p2" not in idx.verdicts
