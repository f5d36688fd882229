"""Pods with ResourceClaims in the solver (:mod:`scheduler.solver.dra_state`): devices are
part of the placement, a gang is placed whole or not at all, no device goes to two claims,
a claim shared by pods sends them where its devices are, claim GPUs count toward the queue,
and the validator refuses any answer that breaks a device rule."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from scheduler.bench.synthetic import make_gang, make_node, make_pod
from scheduler.cache.dra_usage import with_claim_gpus
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
from scheduler.cluster.dracodes import DEVICES_UNAVAILABLE
from scheduler.cluster.draview import DraView
from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import Queue, QueueResource, pod_queue_usage
from scheduler.cluster.resources import Resources
from scheduler.cluster.snapshot import Snapshot
from scheduler.solver import PlacementSettings, solve
from scheduler.solver.placement import ClaimGrant, PodAssignment
from scheduler.solver.state import ClusterState
from scheduler.solver.validate import validate

DRIVER = "gpu.example.com"
CLASS = DeviceClass("gpu.example.com", (f'device.driver == "{DRIVER}"',))
QUEUES = (Queue("root"), Queue("team", "root"))


def gpu_slice(node: str, count: int = 8, model: str = "a100") -> ResourceSlice:
    devices = tuple(
        Device(f"gpu-{i}", (("model", model), ("index", i), ("numa", i // 4))) for i in range(count)
    )
    return ResourceSlice(f"{node}-gpus", DRIVER, node, node_name=node, devices=devices)


def claim(
    name: str,
    count: int = 1,
    selectors: tuple[str, ...] = (),
    constraints: tuple[DeviceConstraint, ...] = (),
    allocation: ClaimAllocation | None = None,
    reserved: tuple[ConsumerRef, ...] = (),
) -> ResourceClaim:
    alt = RequestAlternative("gpu", CLASS.name, selectors, count=count)
    return ResourceClaim(
        "default",
        name,
        f"uid-{name}",
        (DeviceRequest("gpu", (alt,)),),
        constraints,
        allocation,
        reserved,
    )


def nodes(count: int, cpu: float = 64) -> tuple[Node, ...]:
    return tuple(make_node(f"n{i}", gpus=0, cpu=cpu, memory_gib=256) for i in range(count))


def with_claims(pods: Sequence[Pod], names: Sequence[Sequence[str]]) -> list[Pod]:
    return [
        dataclasses.replace(p, resource_claims=len(n)) for p, n in zip(pods, names, strict=True)
    ]


def snap(
    node_list: Sequence[Node],
    members: Sequence[tuple[Gang, Sequence[Pod], Sequence[Sequence[str]]]],
    slices: Sequence[ResourceSlice],
    claims: Sequence[ResourceClaim],
    *,
    running: Sequence[Pod] = (),
    queues: tuple[Queue, ...] = QUEUES,
) -> Snapshot:
    pods: list[Pod] = list(running)
    pod_claims: dict[str, tuple[str, ...]] = {}
    gangs = []
    for gang, gang_pods, names in members:
        gangs.append(gang)
        for p, n in zip(with_claims(gang_pods, names), names, strict=True):
            pods.append(p)
            pod_claims[p.uid] = tuple(f"default/{c}" for c in n)
    view = DraView.build([CLASS], list(slices), list(claims), pod_claims)
    return Snapshot(tuple(node_list), tuple(pods), tuple(gangs), queues, dra=view)


def devices_of(assignments: Sequence[PodAssignment]) -> list[tuple[str, str, str]]:
    """Every device allocated by the assignments, once per claim."""
    seen: dict[str, ClaimAllocation] = {}
    for a in assignments:
        for g in a.claims:
            if g.allocation is not None:
                seen.setdefault(g.claim, g.allocation)
    return [r.device_id for alloc in seen.values() for r in alloc.results]


def solved(s: Snapshot) -> tuple[list[PodAssignment], dict[str, str]]:
    placement = solve(s, PlacementSettings(take_back=False))
    assert placement.violations == ()
    reasons = {k: o.reason for k, o in placement.outcomes.items() if not o.placed}
    return list(placement.assignments), reasons


def test_pods_get_devices_on_the_node_they_go_to_and_never_share_one() -> None:
    gang, pods = make_gang("job", 3, queue="team", cpu=1)
    names = [[f"c{i}"] for i in range(3)]
    s = snap(
        nodes(2),
        [(gang, pods, names)],
        [gpu_slice("n0", 4), gpu_slice("n1", 4)],
        [claim(f"c{i}", count=2) for i in range(3)],
    )
    assignments, reasons = solved(s)
    assert len(assignments) == 3 and not reasons
    devices = devices_of(assignments)
    assert len(devices) == 6 and len(set(devices)) == 6
    for a in assignments:
        (grant,) = a.claims
        assert grant.allocation is not None
        assert {r.pool for r in grant.allocation.results} == {a.node}


def test_gang_whose_claims_do_not_all_fit_binds_nothing() -> None:
    # 4 pods x 2 claims of 1 GPU each = 8 devices; only 6 match (model a100).
    gang, pods = make_gang("job", 4, queue="team", cpu=1)
    names = [[f"c{i}a", f"c{i}b"] for i in range(4)]
    sel = ('device.attributes["gpu.example.com"].model == "a100"',)
    s = snap(
        nodes(2),
        [(gang, pods, names)],
        [gpu_slice("n0", 3), gpu_slice("n1", 3), gpu_slice("n9", 8, model="t4")],
        [claim(n, selectors=sel) for pair in names for n in pair],
    )
    placement = solve(s, PlacementSettings(take_back=False))
    assert placement.assignments == ()
    outcome = placement.outcomes[gang.key]
    assert outcome.reason_code == DEVICES_UNAVAILABLE
    assert "cannot allocate all claims" in outcome.reason
    # The detail of a refusal: which request and what is missing, or the free count.
    assert "wanted" in outcome.reason or "free device" in outcome.reason


def test_devices_held_by_allocated_claims_are_not_given_again() -> None:
    held = ClaimAllocation(
        tuple(DeviceResult("gpu", DRIVER, "n0", f"gpu-{i}") for i in range(3)),
    )
    gang, pods = make_gang("job", 1, queue="team", cpu=1)
    s = snap(
        nodes(1),
        [(gang, pods, [["want"]])],
        [gpu_slice("n0", 4)],
        [claim("old", count=3, allocation=held), claim("want", count=2)],
    )
    assignments, reasons = solved(s)
    assert assignments == [] and gang.key in reasons
    s2 = snap(
        nodes(1),
        [(gang, pods, [["want"]])],
        [gpu_slice("n0", 4)],
        [claim("old", count=3, allocation=held), claim("want", count=1)],
    )
    assignments, _ = solved(s2)
    assert devices_of(assignments) == [(DRIVER, "n0", "gpu-3")]


def test_shared_claim_sends_its_pods_where_its_devices_are() -> None:
    gang, pods = make_gang("job", 2, queue="team", cpu=40)  # one pod per node (64 cpu)
    other, opods = make_gang("other", 1, queue="team", cpu=40)
    s = snap(
        nodes(3),
        [(gang, pods, [["shared"], ["shared"]]), (other, opods, [["shared"]])],
        [gpu_slice("n0"), gpu_slice("n1"), gpu_slice("n2")],
        [claim("shared", count=1)],
    )
    assignments, reasons = solved(s)
    # The devices of a node-local claim are on one node: only one pod fits there, so the
    # gang of two cannot be placed, and the single pod is.
    assert [a.gang for a in assignments] == [other.key]
    assert gang.key in reasons
    (grant,) = assignments[0].claims
    assert grant.allocation is not None


def test_claim_allocated_before_the_cycle_gets_a_grant_without_allocation() -> None:
    held = ClaimAllocation((DeviceResult("gpu", DRIVER, "n1", "gpu-0"),))
    runner = make_pod("runner", queue="team", cpu=1, node="n1")
    gang, pods = make_gang("job", 1, queue="team", cpu=1)
    s = snap(
        nodes(3),
        [(gang, pods, [["shared"]])],
        [gpu_slice("n0"), gpu_slice("n1"), gpu_slice("n2")],
        [claim("shared", allocation=held, reserved=(ConsumerRef("pods", "runner", runner.uid),))],
        running=[runner],
    )
    assignments, _ = solved(s)
    (a,) = assignments
    assert a.node == "n1"
    assert a.claims == (ClaimGrant("default/shared", None),)


def test_match_attribute_keeps_devices_on_one_numa_node() -> None:
    gang, pods = make_gang("job", 1, queue="team", cpu=1)
    numa = (DeviceConstraint(f"{DRIVER}/numa"),)
    busy = ClaimAllocation(
        tuple(DeviceResult("gpu", DRIVER, "n0", f"gpu-{i}") for i in (0, 1, 4, 5)),
    )
    s = snap(
        nodes(1),
        [(gang, pods, [["four"]])],
        [gpu_slice("n0")],
        [claim("busy", count=4, allocation=busy), claim("four", count=3, constraints=numa)],
    )
    assignments, _ = solved(s)
    assert assignments == []  # 2 free on each NUMA node: 3 on one is impossible
    s2 = dataclasses.replace(
        s,
        dra=DraView.build(
            [CLASS],
            [gpu_slice("n0")],
            [claim("busy", count=4, allocation=busy), claim("four", count=2, constraints=numa)],
            {pods[0].uid: ("default/four",)},
        ),
    )
    assignments, _ = solved(s2)
    ids = {d[2] for d in devices_of(assignments)}
    assert ids in ({"gpu-2", "gpu-3"}, {"gpu-6", "gpu-7"})


def test_pod_whose_claims_the_cycle_does_not_know_is_not_placed() -> None:
    gang, pods = make_gang("job", 1, queue="team", cpu=1)
    pod = dataclasses.replace(pods[0], resource_claims=1)
    s = Snapshot(nodes(1), (pod,), (gang,), QUEUES)
    assignments, reasons = solved(s)
    assert assignments == []
    assert "not known" in reasons[gang.key]


def test_state_refuses_a_placement_without_devices_or_with_a_taken_device() -> None:
    gang, pods = make_gang("job", 2, queue="team", cpu=1)
    s = snap(
        nodes(1),
        [(gang, pods, [["a"], ["b"]])],
        [gpu_slice("n0", 2)],
        [claim("a"), claim("b")],
    )
    state = ClusterState.from_snapshot(s)
    p0, p1 = (state.pods[p.uid] for p in pods)
    with pytest.raises(ValueError, match="not all allocated"):
        state.apply(PodAssignment(p0.uid, p0.key, gang.key, "n0"))
    grants = state.claim_grants(p0, "n0")
    assert grants is not None
    state.apply(PodAssignment(p0.uid, p0.key, gang.key, "n0", (), grants))
    same = (ClaimGrant("default/b", grants[0].allocation),)
    with pytest.raises(ValueError, match="in use"):
        state.apply(PodAssignment(p1.uid, p1.key, gang.key, "n0", (), same))
    state.release(p0.uid)  # gives the device back
    state.apply(PodAssignment(p1.uid, p1.key, gang.key, "n0", (), same))


def test_validator_refuses_device_violations() -> None:
    gang, pods = make_gang("job", 2, queue="team", cpu=1)
    s = snap(
        nodes(2),
        [(gang, pods, [["a"], ["b"]])],
        [gpu_slice("n0", 2), gpu_slice("n1", 2, model="t4")],
        [claim("a"), claim("b", selectors=('device.attributes["gpu.example.com"].model == "t4"',))],
    )
    p0, p1 = with_claims(pods, [["a"], ["b"]])

    def grant(claim_name: str, node: str, device: str) -> tuple[ClaimGrant, ...]:
        alloc = ClaimAllocation((DeviceResult("gpu", DRIVER, node, device),))
        return (ClaimGrant(f"default/{claim_name}", alloc),)

    ok = [
        PodAssignment(p0.uid, p0.key, gang.key, "n0", (), grant("a", "n0", "gpu-0")),
        PodAssignment(p1.uid, p1.key, gang.key, "n1", (), grant("b", "n1", "gpu-0")),
    ]
    assert validate(s, ok) == []
    cases = {
        "no devices": [ok[0], dataclasses.replace(ok[1], claims=())],
        "twice": [
            ok[0],
            PodAssignment(p1.uid, p1.key, gang.key, "n0", (), grant("b", "n0", "gpu-0")),
        ],
        "unreachable": [
            ok[0],
            PodAssignment(p1.uid, p1.key, gang.key, "n0", (), grant("b", "n1", "gpu-1")),
        ],
        "selector": [
            ok[0],
            PodAssignment(p1.uid, p1.key, gang.key, "n0", (), grant("b", "n0", "gpu-1")),
        ],
        "missing device": [
            PodAssignment(p0.uid, p0.key, gang.key, "n0", (), grant("a", "n0", "gpu-7")),
            ok[1],
        ],
    }
    for name, assignments in cases.items():
        assert validate(s, assignments), name


def test_claim_gpus_count_toward_the_queue() -> None:
    gang, pods = make_gang("job", 1, queue="team", cpu=1)
    quota = Queue("team", "root", resources=(("gpu", QueueResource(0, 1, 1000)),))
    s = snap(
        nodes(1),
        [(gang, pods, [["two"]])],
        [gpu_slice("n0")],
        [claim("two", count=2)],
        queues=(Queue("root"), quota),
    )
    counted = dataclasses.replace(s, pods=with_claim_gpus(s.pods, s.dra or DraView()))
    pod = counted.pods[0]
    assert pod.claim_gpus == 2
    assert pod_queue_usage(pod)["gpu"] == 2000
    assignments, reasons = solved(counted)
    assert assignments == [] and gang.key in reasons  # 2 GPUs over a limit of 1


# --- extended resources backed by DRA ------------------------------------------------------

EXT = "example.com/gpu"
EXT_CLASS = DeviceClass(CLASS.name, CLASS.selectors, EXT)


def ext_pod(name: str, counts: dict[str, int], *, init: dict[str, int] | None = None) -> Pod:
    from scheduler.cluster.podspec import extended_containers

    spec: dict[str, object] = {
        "containers": [
            {"name": f"c{i}", "resources": {"requests": {EXT: str(n)}, "limits": {EXT: str(n)}}}
            for i, n in enumerate(counts.values())
        ]
    }
    if init:
        spec["initContainers"] = [
            {"name": f"i{i}", "resources": {"requests": {EXT: str(n)}}}
            for i, n in enumerate(init.values())
        ]
    total = max(sum(counts.values()), max((init or {0: 0}).values()))
    pod = make_pod(name, queue="team", cpu=1)
    return dataclasses.replace(
        pod,
        requests=pod.requests + Resources({EXT: total}),
        extended_containers=extended_containers(spec),
    )


def ext_snap(
    pods: Sequence[Pod], node_list: Sequence[Node], slices: Sequence[ResourceSlice]
) -> Snapshot:
    gangs = tuple(Gang("default", p.name, 1, "team") for p in pods)
    view = DraView.build([EXT_CLASS], list(slices))
    return Snapshot(tuple(node_list), tuple(pods), gangs, QUEUES, dra=view)


def test_extended_resource_is_served_by_devices_where_no_node_advertises_it() -> None:
    pods = [ext_pod("a", {"c0": 2, "c1": 1}), ext_pod("b", {"c0": 3})]
    s = ext_snap(pods, nodes(2), [gpu_slice("n0", 4), gpu_slice("n1", 4)])
    assignments, reasons = solved(s)
    assert len(assignments) == 2 and not reasons
    for a in assignments:
        (grant,) = a.claims
        assert grant.extended and grant.allocation is not None
        assert {r.pool for r in grant.allocation.results} == {a.node}
    by_pod = {a.pod_key: a.claims[0] for a in assignments}
    a_grant = by_pod["default/a"]
    assert a_grant.requests == (
        ("container-0-request-0", CLASS.name, 2),
        ("container-1-request-0", CLASS.name, 1),
    )
    assert a_grant.mappings == (
        ("c0", EXT, "container-0-request-0"),
        ("c1", EXT, "container-1-request-0"),
    )
    devices = devices_of(assignments)
    assert len(devices) == 6 and len(set(devices)) == 6
    # A third pod asking 3 more does not fit: 8 devices, 6 taken, 2 per node left at most.
    s3 = ext_snap(
        [*pods, ext_pod("c", {"c0": 3})], nodes(2), [gpu_slice("n0", 4), gpu_slice("n1", 4)]
    )
    assignments, reasons = solved(s3)
    assert len(assignments) == 2 and "default/c" in reasons


def test_node_that_advertises_the_resource_uses_its_device_plugin() -> None:
    plugin = make_node("dp", gpus=0, cpu=64, memory_gib=256)
    plugin = dataclasses.replace(plugin, allocatable=plugin.allocatable + Resources({EXT: 4}))
    pod = ext_pod("a", {"c0": 2})
    s = ext_snap([pod], [plugin], [])
    assignments, _ = solved(s)
    (a,) = assignments
    assert a.node == "dp" and a.claims == ()


def test_init_container_reuses_the_requests_of_the_containers_after_it() -> None:
    pod = ext_pod("a", {"c0": 2}, init={"i0": 1})
    s = ext_snap([pod], nodes(1), [gpu_slice("n0", 4)])
    (a,), _ = solved(s)
    (grant,) = a.claims
    # i0 (index 0) runs before c0 (index 1): it uses c0's request, no request of its own.
    assert grant.requests == (("container-1-request-0", CLASS.name, 2),)
    assert set(grant.mappings) == {
        ("c0", EXT, "container-1-request-0"),
        ("i0", EXT, "container-1-request-0"),
    }
    big = ext_pod("b", {"c0": 1}, init={"i0": 3})
    (b,), _ = solved(ext_snap([big], nodes(1), [gpu_slice("n0", 4)]))
    (grant,) = b.claims
    assert sorted(grant.requests) == [
        ("container-0-request-0", CLASS.name, 2),
        ("container-1-request-0", CLASS.name, 1),
    ]


def test_validator_refuses_an_extended_pod_without_its_devices() -> None:
    pod = ext_pod("a", {"c0": 2})
    s = ext_snap([pod], nodes(1), [gpu_slice("n0", 4)])
    (a,), _ = solved(s)
    assert validate(s, [a]) == []
    assert validate(s, [dataclasses.replace(a, claims=())])
    short = dataclasses.replace(a.claims[0], requests=(("container-0-request-0", CLASS.name, 1),))
    assert validate(s, [dataclasses.replace(a, claims=(short,))])


def test_newer_class_serves_a_shared_extended_name() -> None:
    from scheduler.cluster.dra_extended import classes_by_resource

    old = DeviceClass("old", (), EXT, created=10.0)
    new = DeviceClass("new", (), EXT, created=20.0)
    twin = DeviceClass("aaa", (), EXT, created=20.0)
    assert classes_by_resource([old, new])[EXT].name == "new"
    assert classes_by_resource([new, old])[EXT].name == "new"
    assert classes_by_resource([new, twin])[EXT].name == "aaa"  # same age: lower name
    assert classes_by_resource([old])["deviceclass.resource.kubernetes.io/old"].name == "old"


def test_devices_with_taints_or_shared_counters_are_never_allocated() -> None:
    from scheduler.cluster.draspec import resource_slice_from_k8s

    published = resource_slice_from_k8s(
        {
            "metadata": {"name": "n0-gpus"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "n0",
                "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "gpu-0", "taints": [{"key": "broken", "effect": "NoSchedule"}]},
                    {"name": "gpu-1", "consumesCounters": [{"counterSet": "mem", "counters": {}}]},
                    {"name": "gpu-2"},
                ],
            },
        }
    )
    assert [d.left_out != "" for d in published.devices] == [True, True, False]
    gang, pods = make_gang("job", 1, queue="team", cpu=1)
    s = snap(nodes(1), [(gang, pods, [["two"]])], [published], [claim("two", count=2)])
    placement = solve(s, PlacementSettings(take_back=False))
    assert placement.assignments == ()
    assert "device taints are not supported yet" in placement.outcomes[gang.key].reason
    s1 = snap(nodes(1), [(gang, pods, [["one"]])], [published], [claim("one")])
    assignments, _ = solved(s1)
    assert devices_of(assignments) == [(DRIVER, "n0", "gpu-2")]


def test_which_bound_pods_hold_claimed_devices() -> None:
    """Consolidation never moves a pod holding devices through claims: its own claims, or
    the claim made for an extended resource its node does not advertise. Without any DRA
    object in the cluster no extended resource is served by DRA, so such a pod holds none
    (a shortcut the take-back stage takes for every running pod of a cycle)."""
    from scheduler.solver.takeback import holds_claimed_devices

    node = make_node("n0", gpus=0)
    own = dataclasses.replace(make_pod("own", node="n0"), resource_claims=1)
    plain = make_pod("plain", node="n0")
    extended = dataclasses.replace(
        plain, uid="uid-ext", name="ext", requests=plain.requests + Resources({"example.com/x": 1})
    )
    without_dra = Snapshot(nodes=(node,), pods=(own, plain, extended))
    with_dra = dataclasses.replace(without_dra, dra=DraView.build(classes=[CLASS]))
    assert holds_claimed_devices(without_dra, own) and holds_claimed_devices(with_dra, own)
    assert not holds_claimed_devices(without_dra, plain)
    assert not holds_claimed_devices(with_dra, plain)
    assert holds_claimed_devices(with_dra, extended)
    assert not holds_claimed_devices(without_dra, extended)
