"""The DRA part of a snapshot: derived views, and an exact JSON round trip (device
attributes of every kind, quantities as exact fractions, node selectors, allocations)."""

from __future__ import annotations

import json
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cache.dra import DEVICE_CLASS, RESOURCE_CLAIM, RESOURCE_SLICE, DraIndex
from scheduler.cluster.codec import decode, encode
from scheduler.cluster.dra import (
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
from scheduler.cluster.dra_alloc import AllocationFailure, allocate_pod_claims
from scheduler.cluster.dracel import Semver
from scheduler.cluster.draview import DraView
from scheduler.cluster.node import Node
from scheduler.cluster.resources import Resources
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm
from scheduler.cluster.snapshot import Snapshot

DRIVER = "gpu.example.com"
SELECTOR = (NodeSelectorTerm((NodeSelectorRequirement("rack", "In", ("r1",)),)),)


def full_view() -> DraView:
    gpu = Device(
        "gpu-0",
        (("index", 0), ("model", "a100"), ("nvlink", True), ("driverVersion", Semver("1.2.3"))),
        (("memory", Fraction(80 * 2**30)), ("share", Fraction(3, 2))),
        allow_multiple_allocations=True,
    )
    local = ResourceSlice("n1-gpus", DRIVER, "n1", 2, 1, node_name="n1", devices=(gpu,))
    shared = ResourceSlice(
        "rack-nics", "nic.example.com", "rack", 1, 2, node_selector=SELECTOR, devices=()
    )
    everywhere = ResourceSlice("net", "net.example.com", "net", all_nodes=True)
    allocated = ResourceClaim(
        "ns",
        "held",
        "u1",
        (
            DeviceRequest(
                "g",
                (
                    RequestAlternative("g/big", "gpu", ('device.attributes["x"].y',), count=2),
                    RequestAlternative("g/all", "gpu", mode="All", count=0, admin_access=True),
                ),
                first_available=True,
            ),
        ),
        (DeviceConstraint(f"{DRIVER}/model", ("g",)),),
        ClaimAllocation((DeviceResult("g/big", DRIVER, "n1", "gpu-0"),), SELECTOR),
        (ConsumerRef("pods", "p0", "uid-p0"),),
    )
    pending = ResourceClaim(
        "ns", "want", "u2", (DeviceRequest("g", (RequestAlternative("g", "gpu"),)),)
    )
    return DraView.build(
        [DeviceClass("gpu", (f'device.driver == "{DRIVER}"',), "example.com/gpu")],
        [local, shared, everywhere],
        [pending, allocated],
        {"p1": ("ns/want",), "p0": ("ns/held",)},
        {("nic.example.com", "rack", "nic-3")},
    )


def test_view_round_trips_through_the_snapshot() -> None:
    view = full_view()
    snap = Snapshot(nodes=(Node("n1", Resources({"cpu": 1000})),), dra=view)
    text = snap.to_json()
    back = Snapshot.from_json(text)
    assert back == snap
    assert back.dra == view
    assert back.to_json() == text
    data = json.loads(text)
    # Exact quantities and the kind of each attribute survive.
    assert data["dra"]["slices"][0]["devices"][0]["capacity"][1] == ["share", "3/2"]
    assert back.dra is not None
    device = back.dra.slices[0].devices[0]
    assert device.attributes == view.slices[0].devices[0].attributes
    assert isinstance(dict(device.attributes)["driverVersion"], Semver)
    assert dict(device.attributes)["nvlink"] is True
    assert dict(device.attributes)["index"] == 0 and dict(device.attributes)["index"] is not False


def test_snapshot_without_devices_is_unchanged() -> None:
    assert "dra" not in Snapshot().to_dict()
    assert "dra" not in Snapshot(dra=DraView()).to_dict()
    assert Snapshot.from_dict(Snapshot().to_dict()).dra is None


def test_view_answers_claims_and_busy_devices() -> None:
    view = full_view()
    assert [c.key for c in view.claims_of("p1")] == ["ns/want"]
    assert view.claims_of("nobody") == ()
    assert view.busy == {(DRIVER, "n1", "gpu-0"), ("nic.example.com", "rack", "nic-3")}
    assert view.class_by_name["gpu"].extended_resource_name == "example.com/gpu"
    assert DraView().empty and not view.empty


def test_fraction_codec() -> None:
    assert encode(Fraction(5, 4)) == "5/4"
    assert decode(Fraction, "5/4") == Fraction(5, 4)
    assert decode(Fraction, "16") == 16
    for bad in (1.5, None, "x"):
        try:
            decode(Fraction, bad)
        except (TypeError, ValueError):
            continue
        raise AssertionError(f"{bad!r} decoded")


values = st.one_of(
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.text(max_size=5),
    st.builds(Semver, st.sampled_from(["1.0.0", "2.3.4-rc.1"])),
)
devices = st.builds(
    Device,
    st.text("abc", min_size=1, max_size=3),
    st.lists(st.tuples(st.text("xyz", min_size=1, max_size=2), values), max_size=3).map(tuple),
    st.lists(
        st.tuples(st.just("memory"), st.fractions(min_value=0, max_denominator=1000)), max_size=1
    ).map(tuple),
    st.booleans(),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(devices, max_size=4))
def test_device_round_trip_is_exact(devs: list[Device]) -> None:
    view = DraView.build(
        slices=[ResourceSlice("s", DRIVER, "p", node_name="n", devices=tuple(devs))]
    )
    text = json.dumps(encode(view), sort_keys=True)
    back = decode(DraView, json.loads(text))
    assert back == view
    for a, b in zip(back.slices[0].devices, view.slices[0].devices, strict=True):
        # bool and int compare equal in Python: the kinds must survive too.
        assert [type(v) for _, v in a.attributes] == [type(v) for _, v in b.attributes]


def test_index_view_holds_what_pending_pods_need() -> None:
    idx = DraIndex()
    idx.upsert(
        DEVICE_CLASS,
        "gpu",
        {"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": "true"}}]}},
    )
    idx.upsert(
        RESOURCE_SLICE,
        "n1",
        {
            "metadata": {"name": "n1"},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": "n1"},
                "nodeName": "n1",
                "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}],
            },
        },
    )
    request = {"name": "g", "exactly": {"deviceClassName": "gpu"}}
    for name in ("mine", "unrelated", "held"):
        claim = {
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [request]}},
        }
        if name == "held":
            result = {"request": "g", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}
            claim["status"] = {"allocation": {"devices": {"results": [result]}}}
        idx.upsert(RESOURCE_CLAIM, f"ns/{name}", claim)
    pod = {
        "metadata": {"namespace": "ns", "uid": "p1"},
        "spec": {"resourceClaims": [{"name": "a", "resourceClaimName": "mine"}]},
    }
    idx.pod_changed("p1", pod)
    view = idx.view(["p1", "not-tracked"], reserved=[(DRIVER, "n1", "gpu-9")])
    assert [c.key for c in view.claims] == ["ns/held", "ns/mine"]
    assert view.pod_claims == (("p1", ("ns/mine",)),)
    assert view.busy == {(DRIVER, "n1", "gpu-0"), (DRIVER, "n1", "gpu-9")}
    # The view is enough to allocate: the held device is avoided.
    got = allocate_pod_claims(view.catalog(idx.matcher), view.claims_of("p1"), "n1", {}, view.busy)
    assert not isinstance(got, AllocationFailure)
    assert got[0].results[0].device == "gpu-1"
