"""Choosing devices for ResourceClaims on one node: scenario table of the DRA features, and a
property: never the same device twice, every chosen device passes its selectors."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cluster.dra import (
    ClaimAllocation,
    Device,
    DeviceClass,
    DeviceConstraint,
    DeviceId,
    DeviceRequest,
    DeviceResult,
    RequestAlternative,
    ResourceClaim,
    ResourceSlice,
)
from scheduler.cluster.dra_alloc import (
    AllocationFailure,
    DeviceCatalog,
    allocate_claim,
    allocate_pod_claims,
    allocated_devices,
    node_name_selector,
)
from scheduler.cluster.dracel import DeviceEnv, compile_selector
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm

DRIVER = "gpu.example.com"
GPU_CLASS = DeviceClass(DRIVER, (f'device.driver == "{DRIVER}"',))
NIC_CLASS = DeviceClass("nic.example.com", ('device.driver == "nic.example.com"',))
CLASSES = {c.name: c for c in (GPU_CLASS, NIC_CLASS)}


def gpu(i: int, model: str = "a100", numa: int = 0, memory_gi: int = 80) -> Device:
    return Device(
        f"gpu-{i}",
        (("index", i), ("model", model), ("numa", numa)),
        (("memory", Fraction(memory_gi * 2**30)),),
    )


def node_slice(
    node: str, devices: list[Device], generation: int = 1, count: int = 1
) -> ResourceSlice:
    return ResourceSlice(
        f"{node}-{DRIVER}", DRIVER, node, generation, count, node_name=node, devices=tuple(devices)
    )


def claim(
    *requests: DeviceRequest, constraints: tuple[DeviceConstraint, ...] = ()
) -> ResourceClaim:
    return ResourceClaim("ns", "c", "u", tuple(requests), constraints)


def exactly(
    name: str,
    count: int = 1,
    selectors: tuple[str, ...] = (),
    cls: str = DRIVER,
    mode: str = "ExactCount",
    admin: bool = False,
) -> DeviceRequest:
    alt = RequestAlternative(
        name, cls, selectors, "All" if mode == "All" else "ExactCount", count, admin
    )
    return DeviceRequest(name, (alt,))


def ids(result: ClaimAllocation | AllocationFailure) -> list[str]:
    assert isinstance(result, ClaimAllocation), result
    return [r.device for r in result.results]


def eight(node: str = "n1") -> ResourceSlice:
    return node_slice(node, [gpu(i, numa=i // 4) for i in range(8)])


def test_count_takes_that_many_and_pins_the_node() -> None:
    cat = DeviceCatalog([eight()], CLASSES)
    result = allocate_claim(cat, claim(exactly("gpu", 2)), "n1", {}, set())
    assert ids(result) == ["gpu-0", "gpu-1"]
    assert isinstance(result, ClaimAllocation)
    assert result.node_selector == node_name_selector("n1")
    assert result.results[0] == DeviceResult("gpu", DRIVER, "n1", "gpu-0")


def test_failure_reason_names_request_class_counts_and_node() -> None:
    cat = DeviceCatalog([node_slice("n1", [gpu(0, "h100"), gpu(1)])], CLASSES)
    req = exactly("gpu", 2, ('device.attributes["gpu.example.com"].model == "h100"',))
    result = allocate_claim(cat, claim(req), "n1", {}, set())
    assert isinstance(result, AllocationFailure)
    assert "request gpu: 2 devices of class gpu.example.com wanted, 1 matches on node n1" in (
        result.reason
    )
    # Another node does not reach n1's devices.
    assert isinstance(
        allocate_claim(cat, claim(exactly("gpu")), "n2", {}, set()), AllocationFailure
    )


def test_busy_devices_are_skipped_and_counted() -> None:
    cat = DeviceCatalog([eight()], CLASSES)
    busy = {(DRIVER, "n1", f"gpu-{i}") for i in range(7)}
    assert ids(allocate_claim(cat, claim(exactly("gpu")), "n1", {}, busy)) == ["gpu-7"]
    result = allocate_claim(cat, claim(exactly("gpu", 2)), "n1", {}, busy)
    assert isinstance(result, AllocationFailure)
    assert "1 matches on node n1 (7 more in use)" in result.reason


def test_class_and_request_selectors_both_apply() -> None:
    nic = ResourceSlice("nics", "nic.example.com", "n1", node_name="n1", devices=(Device("eth0"),))
    devices = [gpu(0, memory_gi=40), gpu(1, memory_gi=80), gpu(2, "h100", memory_gi=80)]
    cat = DeviceCatalog([node_slice("n1", devices), nic], CLASSES)
    req = exactly(
        "gpu",
        2,
        ('device.capacity["gpu.example.com"].memory.compareTo(quantity("64Gi")) >= 0',),
    )
    assert ids(allocate_claim(cat, claim(req), "n1", {}, set())) == ["gpu-1", "gpu-2"]
    assert ids(
        allocate_claim(cat, claim(exactly("nic", cls="nic.example.com")), "n1", {}, set())
    ) == ["eth0"]


def test_allocation_mode_all() -> None:
    cat = DeviceCatalog([eight()], CLASSES)
    req = exactly("gpus", mode="All", selectors=('device.attributes["gpu.example.com"].numa == 1',))
    assert ids(allocate_claim(cat, claim(req), "n1", {}, set())) == [
        f"gpu-{i}" for i in range(4, 8)
    ]
    busy = {(DRIVER, "n1", "gpu-5")}
    result = allocate_claim(cat, claim(req), "n1", {}, busy)
    assert isinstance(result, AllocationFailure) and "in use" in result.reason
    # A pool that is still being published cannot promise "all".
    partial = DeviceCatalog([node_slice("n1", [gpu(0)], count=2)], CLASSES)
    result = allocate_claim(partial, claim(exactly("gpus", mode="All")), "n1", {}, set())
    assert isinstance(result, AllocationFailure) and "incomplete" in result.reason


def test_match_attribute_keeps_requests_on_one_numa_node() -> None:
    # numa 0 has 4 devices, numa 1 has 4; two are busy on numa 0.
    cat = DeviceCatalog([eight()], CLASSES)
    busy = {(DRIVER, "n1", "gpu-0"), (DRIVER, "n1", "gpu-1")}
    c = claim(
        exactly("a", 2),
        exactly("b", 2),
        constraints=(DeviceConstraint("gpu.example.com/numa"),),
    )
    result = allocate_claim(cat, c, "n1", {}, busy)
    assert ids(result) == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    c3 = claim(exactly("a", 3), exactly("b", 2), constraints=c.constraints)
    result = allocate_claim(cat, c3, "n1", {}, busy)
    assert isinstance(result, AllocationFailure)


def test_backtracking_and_scarce_devices_left_for_later_requests() -> None:
    # numa 0: five a100; numa 1: one a100 and three h100. "a" (any GPU) must share numa with
    # "b" (three h100): only numa 1 works, and "a" must not take an h100 there.
    devices = [gpu(i, "a100", 0) for i in range(5)]
    devices += [gpu(5, "h100", 1), gpu(6, "h100", 1), gpu(7, "h100", 1), gpu(8, "a100", 1)]
    cat = DeviceCatalog([node_slice("n1", devices)], CLASSES)
    c = claim(
        exactly("a", 1),
        exactly("b", 3, ('device.attributes["gpu.example.com"].model == "h100"',)),
        constraints=(DeviceConstraint("gpu.example.com/numa"),),
    )
    assert ids(allocate_claim(cat, c, "n1", {}, set())) == ["gpu-8", "gpu-5", "gpu-6", "gpu-7"]


def test_first_available_uses_the_first_alternative_that_fits() -> None:
    cat = DeviceCatalog([eight()], CLASSES)
    big = RequestAlternative(
        "gpu/big", DRIVER, ('device.attributes["gpu.example.com"].model == "h100"',)
    )
    small = RequestAlternative("gpu/small", DRIVER, (), "ExactCount", 2)
    c = claim(DeviceRequest("gpu", (big, small), first_available=True))
    result = allocate_claim(cat, c, "n1", {}, set())
    assert isinstance(result, ClaimAllocation)
    assert [r.request for r in result.results] == ["gpu/small", "gpu/small"]
    h100 = DeviceCatalog([node_slice("n1", [gpu(0, "h100"), gpu(1)])], CLASSES)
    result = allocate_claim(h100, c, "n1", {}, set())
    assert isinstance(result, ClaimAllocation)
    assert [(r.request, r.device) for r in result.results] == [("gpu/big", "gpu-0")]


def test_admin_access_may_use_busy_devices_and_holds_nothing() -> None:
    cat = DeviceCatalog([node_slice("n1", [gpu(0)])], CLASSES)
    busy = {(DRIVER, "n1", "gpu-0")}
    result = allocate_claim(cat, claim(exactly("mon", admin=True)), "n1", {}, busy)
    assert isinstance(result, ClaimAllocation) and result.results[0].admin_access
    held = ResourceClaim("ns", "m", allocation=result)
    assert allocated_devices([held]) == set()


def test_missing_class_and_bad_selector_are_reasons() -> None:
    cat = DeviceCatalog([eight()], CLASSES)
    result = allocate_claim(cat, claim(exactly("x", cls="fpga.example.com")), "n1", {}, set())
    assert isinstance(result, AllocationFailure)
    assert "device class 'fpga.example.com' does not exist" in result.reason
    result = allocate_claim(
        cat, claim(exactly("x", selectors=("device.driver ==",))), "n1", {}, set()
    )
    assert (
        isinstance(result, AllocationFailure)
        and "selector: invalid CEL expression" in result.reason
    )


def test_network_attached_pools() -> None:
    rack = (NodeSelectorTerm((NodeSelectorRequirement("rack", "In", ("r1",)),)),)
    shared = ResourceSlice("fabric", DRIVER, "fabric", node_selector=rack, devices=(gpu(0), gpu(1)))
    anywhere = ResourceSlice("cloud", DRIVER, "cloud", all_nodes=True, devices=(gpu(9),))
    cat = DeviceCatalog([shared], CLASSES)
    result = allocate_claim(cat, claim(exactly("g", 2)), "n7", {"rack": "r1"}, set())
    assert isinstance(result, ClaimAllocation) and result.node_selector == rack
    assert isinstance(
        allocate_claim(cat, claim(exactly("g")), "n7", {"rack": "r2"}, set()), AllocationFailure
    )
    cat = DeviceCatalog([anywhere], CLASSES)
    result = allocate_claim(cat, claim(exactly("g")), "n7", {}, set())
    assert isinstance(result, ClaimAllocation) and result.node_selector is None


def test_old_generation_is_ignored() -> None:
    old = node_slice("n1", [gpu(0), gpu(1)], generation=1)
    new = node_slice("n1", [gpu(2)], generation=2)
    cat = DeviceCatalog([old, new], CLASSES)
    assert ids(allocate_claim(cat, claim(exactly("g")), "n1", {}, set())) == ["gpu-2"]


def test_pod_claims_never_share_a_device() -> None:
    cat = DeviceCatalog([eight()], CLASSES)
    a = ResourceClaim("ns", "a", requests=(exactly("g", 4),))
    b = ResourceClaim("ns", "b", requests=(exactly("g", 4),))
    result = allocate_pod_claims(cat, [a, b], "n1", {}, set())
    assert isinstance(result, tuple)
    chosen = [r.device for alloc in result for r in alloc.results]
    assert sorted(chosen) == [f"gpu-{i}" for i in range(8)]
    c = ResourceClaim("ns", "c", requests=(exactly("g"),))
    failed = allocate_pod_claims(cat, [a, b, c], "n1", {}, set())
    assert isinstance(failed, AllocationFailure) and "claim ns/c" in failed.reason


def test_pod_claims_keep_an_existing_allocation() -> None:
    cat = DeviceCatalog([eight("n1"), eight("n2")], CLASSES)
    held = ClaimAllocation((DeviceResult("g", DRIVER, "n1", "gpu-0"),), node_name_selector("n1"))
    shared = ResourceClaim("ns", "shared", requests=(exactly("g"),), allocation=held)
    result = allocate_pod_claims(cat, [shared], "n1", {}, {(DRIVER, "n1", "gpu-0")})
    assert result == (held,)
    result = allocate_pod_claims(cat, [shared], "n2", {}, set())
    assert isinstance(result, AllocationFailure)


# --- property -----------------------------------------------------------------------------

_MODELS = ("a100", "h100", "l4")
_SELECTORS = (
    'device.attributes["gpu.example.com"].model == "a100"',
    'device.attributes["gpu.example.com"].model != "l4"',
    'device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0',
    'device.attributes["gpu.example.com"].index % 2 == 0',
    'device.attributes["gpu.example.com"].missing == 1',
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[ResourceSlice], list[ResourceClaim], set[DeviceId]]:
    n_dev = draw(st.integers(1, 10))
    devices = [
        gpu(
            i,
            draw(st.sampled_from(_MODELS)),
            draw(st.integers(0, 1)),
            draw(st.sampled_from((24, 40, 80))),
        )
        for i in range(n_dev)
    ]
    slices = [node_slice("n1", devices)]
    busy = {(DRIVER, "n1", d.name) for d in devices if draw(st.booleans()) and draw(st.booleans())}
    claims = []
    for c in range(draw(st.integers(1, 3))):
        requests = []
        for r in range(draw(st.integers(1, 3))):
            n_alts = draw(st.integers(1, 2))
            alts = tuple(
                RequestAlternative(
                    f"r{r}/{k}" if n_alts > 1 else f"r{r}",
                    DRIVER,
                    tuple(draw(st.lists(st.sampled_from(_SELECTORS), max_size=2))),
                    draw(st.sampled_from(("ExactCount", "ExactCount", "All"))),
                    draw(st.integers(1, 3)),
                    draw(st.booleans()) and draw(st.booleans()),
                )
                for k in range(n_alts)
            )
            requests.append(DeviceRequest(f"r{r}", alts, first_available=len(alts) > 1))
        constraints = (DeviceConstraint("gpu.example.com/numa"),) if draw(st.booleans()) else ()
        claims.append(
            ResourceClaim("ns", f"c{c}", requests=tuple(requests), constraints=constraints)
        )
    return slices, claims, busy


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_property_no_device_twice_and_every_device_matches(
    scenario: tuple[list[ResourceSlice], list[ResourceClaim], set[DeviceId]],
) -> None:
    slices, claims, busy = scenario
    cat = DeviceCatalog(slices, CLASSES)
    result = allocate_pod_claims(cat, claims, "n1", {}, busy)
    if isinstance(result, AllocationFailure):
        assert result.reason
        return
    by_name = {d.name: d for s in slices for d in s.devices}
    held: list[str] = []
    for c, alloc in zip(claims, result, strict=True):
        alts = {a.name: a for r in c.requests for a in r.alternatives}
        in_claim = [r.device for r in alloc.results]
        assert len(in_claim) == len(set(in_claim))  # never twice within a claim
        for r in alloc.results:
            alt = alts[r.request]
            device = by_name[r.device]
            env = DeviceEnv(DRIVER, dict(device.attributes), dict(device.capacity))
            for expr in (*CLASSES[alt.device_class].selectors, *alt.selectors):
                assert env.evaluate(compile_selector(expr)).matched, (expr, device)
            if not alt.admin_access:
                assert r.device_id not in busy
                held.append(r.device)
        for req in c.requests:
            got = [r for r in alloc.results if r.request.split("/")[0] == req.name]
            alt = alts[got[0].request]
            if alt.mode == "ExactCount":
                assert len(got) == alt.count
        if c.constraints:
            numas = {dict(by_name[r.device].attributes)["numa"] for r in alloc.results}
            assert len(numas) == 1
    assert len(held) == len(set(held))  # never twice across the pod's claims


def test_backtracking_is_bounded() -> None:
    # 8 requests, each with its own constraint (8 attribute groups apiece), and a last
    # request that nothing satisfies: without a budget the search tries 8**8 combinations.
    devices = [Device(f"d{i}", (("numa", i % 8), ("model", "a100"))) for i in range(64)]
    cat = DeviceCatalog([node_slice("n1", devices)], CLASSES)
    reqs = [DeviceRequest(f"r{k}", (RequestAlternative(f"r{k}", DRIVER),)) for k in range(8)]
    reqs.append(exactly("never", selectors=('device.attributes["gpu.example.com"].model == "x"',)))
    c = claim(
        *reqs,
        constraints=tuple(DeviceConstraint("gpu.example.com/numa", (f"r{k}",)) for k in range(8)),
    )
    result = allocate_claim(cat, c, "n1", {}, set())
    assert isinstance(result, AllocationFailure) and "gave up after" in result.reason
