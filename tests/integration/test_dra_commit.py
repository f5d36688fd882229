"""Writing ResourceClaims at commit (scheduler/commit/dra.py), against a real API server and
the real ResourceClaim controller of kube-controller-manager.

Each test makes claims and pods in its own namespace, hands :func:`commit_gang` a placement
as the solver would (:class:`ClaimGrant` per claim), and reads the claims back from the API
server: the allocation and ``reservedFor`` are written before the binds, parse back
(:func:`resource_claim_from_k8s`) to the allocation the cycle chose, and are taken back when
the gang fails. Races are real: several gangs write one claim at once (409s, re-read, retry),
and a claim allocated by someone else since the cycle chose devices refuses the gang.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import structlog
import structlog.testing
from kubernetes_asyncio.client import ApiClient

from scheduler.cache import Cache
from scheduler.cache.dra_reservations import DraReservations
from scheduler.cluster.dra import ClaimAllocation, DeviceResult, ResourceClaim
from scheduler.cluster.dra_extended import EXTENDED_CLAIM_ANNOTATION, special_claim_key
from scheduler.cluster.draspec import resource_claim_from_k8s
from scheduler.cluster.pod import Pod
from scheduler.cluster.podspec import pod_from_k8s
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm
from scheduler.commit.dra import FINALIZER, FORBIDDEN, allocation_to_k8s
from scheduler.commit.transaction import GangCommit, assume_gang, bind_gang, commit_gang
from scheduler.k8s.client import ClientSettings, make_api_client
from scheduler.k8s.resources import DRA_KINDS, RESOURCE_CLAIM
from scheduler.k8s.watch import Watcher
from scheduler.k8s.writer import Writer
from scheduler.solver.placement import ClaimGrant, GangOutcome, PodAssignment
from testenv.controlplane import ControlPlane
from tests.integration.support import FAST_WATCH, eventually, kubectl


@contextlib.contextmanager
def all_logs() -> Iterator[list[dict[str, Any]]]:
    """structlog's capture_logs at every level: an earlier test of the session may have set
    up the scheduler's logging at WARNING, whose filtering logger drops info events before
    any processor (capture_logs only swaps the processors)."""
    kept = structlog.get_config()["wrapper_class"]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with structlog.testing.capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(wrapper_class=kept)


pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

#: Nobody schedules these pods: only the commits of the tests bind them.
SCHED = "kai-scheduler-dra-commit"
DRIVER = "gpu.dra-commit.example.com"


def claim_manifest(name: str, count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": count}}]
            }
        },
    }


def pod_manifest(name: str, *claims: str) -> dict[str, Any]:
    entries = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": SCHED,
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "resourceClaims": entries,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/fake:1",
                    "resources": {
                        "requests": {"cpu": "100m"},
                        "claims": [{"name": e["name"]} for e in entries],
                    },
                }
            ],
        },
    }


def as_list(*objs: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)})


def on_node(node: str, *devices: str, request: str = "gpu") -> ClaimAllocation:
    term = NodeSelectorTerm((NodeSelectorRequirement("metadata.name", "In", (node,)),))
    return ClaimAllocation(tuple(DeviceResult(request, DRIVER, node, d) for d in devices), (term,))


def extended_pod(name: str, resource: str, count: int) -> dict[str, Any]:
    """A pod asking ``count`` of an extended resource (limits as requests, as required)."""
    pod = pod_manifest(name)
    del pod["spec"]["resourceClaims"]
    want = {"cpu": "100m", resource: str(count)}
    pod["spec"]["containers"][0]["resources"] = {"requests": want, "limits": want}
    return pod


async def get(cp: ControlPlane, *args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(await kubectl(cp, "get", *args, "-o", "json"))
    return out


async def read_claim(
    cp: ControlPlane, namespace: str, name: str
) -> tuple[dict[str, Any], ResourceClaim]:
    obj = await get(cp, "resourceclaim", name, "-n", namespace)
    return obj, resource_claim_from_k8s(obj)


class Gangs:
    """Pods of one test namespace as the domain sees them, and placements of them."""

    def __init__(self, cp: ControlPlane, namespace: str, node: str) -> None:
        self.cp = cp
        self.namespace = namespace
        self.node = node
        self.pods: dict[str, Pod] = {}

    async def create(self, *objs: dict[str, Any]) -> None:
        await kubectl(self.cp, "create", "-n", self.namespace, "-f", "-", input=as_list(*objs))
        for obj in objs:
            if obj["kind"] != "Pod":
                continue
            name = obj["metadata"]["name"]
            live = await get(self.cp, "pod", name, "-n", self.namespace)
            pod = pod_from_k8s(live, scheduler_name=SCHED, default_queue="default-queue")
            self.pods[pod.key] = pod

    def outcome(
        self, gang: str, members: Sequence[tuple[str, Sequence[ClaimGrant]]]
    ) -> GangOutcome:
        """A placed gang: each (pod name, its claim grants) on the test's node."""
        pods = []
        for name, grants in members:
            pod = self.pods[f"{self.namespace}/{name}"]
            pods.append(
                PodAssignment(
                    pod.uid, pod.key, f"{self.namespace}/{gang}", self.node, claims=tuple(grants)
                )
            )
        return GangOutcome(f"{self.namespace}/{gang}", "default-queue", True, tuple(pods))

    def key(self, claim: str) -> str:
        return f"{self.namespace}/{claim}"

    def uid(self, pod: str) -> str:
        return self.pods[f"{self.namespace}/{pod}"].uid


class Seen:
    """What a watcher hands the cache: the objects by (kind, namespace/name), and which
    kinds were listed or found missing."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.listed: set[str] = set()
        self.absent: set[str] = set()

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = (kind, f"{meta.get('namespace', '')}/{meta['name']}")
        if event_type == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj

    def relisted(self, kind: str, objs: Any) -> None:
        for obj in objs:
            self.apply(kind, "ADDED", obj)
        self.listed.add(kind)

    def relist_done(self, kind: str, listed: Any) -> None:
        self.listed.add(kind)

    def set_absent(self, kind: str, absent: bool) -> None:
        if absent:
            self.absent.add(kind)
        else:
            self.absent.discard(kind)


class CommitCache(Cache):
    """A real cache (fed by nothing: the commit is all these tests need of it) whose in-flight
    device reservations the test reads."""

    def __init__(self, reservations: DraReservations) -> None:
        super().__init__(SCHED, "default-queue")
        self._reservations = reservations

    @property
    def dra_reservations(self) -> DraReservations:
        return self._reservations


async def commit(
    outcome: GangOutcome, gangs: Gangs, writer: Writer, reservations: DraReservations
) -> GangCommit:
    """Assume and bind one gang with ``reservations`` as the cache's in-flight record."""
    cache = CommitCache(reservations)
    result = await commit_gang(outcome, gangs.pods, writer, cache, lambda: True)
    assert all(a.pod_uid not in cache.assumed() for a, _ in result.failed)
    return result


async def test_watcher_lists_and_watches_the_dra_kinds(
    api: ApiClient, control_plane: ControlPlane, namespace: str
) -> None:
    """DeviceClass and ResourceSlice are cluster-scoped, ResourceClaim namespaced: the watch
    reaches each at its own path on a control plane serving resource.k8s.io/v1."""

    seen = Seen()
    watcher = Watcher(api, seen, DRA_KINDS, settings=FAST_WATCH)
    task = asyncio.create_task(watcher.run())
    tag = uuid.uuid4().hex[:6]
    try:
        await asyncio.wait_for(watcher.synced.wait(), 30)
        assert seen.listed == set(DRA_KINDS) and not watcher.absent
        device_class = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"dc-{tag}"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
        slice_ = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"rs-{tag}"},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": f"pool-{tag}", "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "devices": [{"name": "gpu-0"}],
            },
        }
        await kubectl(control_plane, "create", "-f", "-", input=as_list(device_class, slice_))
        await kubectl(
            control_plane, "create", "-n", namespace, "-f", "-", input=as_list(claim_manifest("c"))
        )
        await eventually(
            "the three objects watched",
            lambda: (
                {
                    ("DeviceClass", f"/dc-{tag}"),
                    ("ResourceSlice", f"/rs-{tag}"),
                    ("ResourceClaim", f"{namespace}/c"),
                }
                <= set(seen.objects)
            ),
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        control_plane.kubectl("delete", "deviceclass", f"dc-{tag}", check=False)
        control_plane.kubectl("delete", "resourceslice", f"rs-{tag}", check=False)


async def test_without_the_dra_kinds_in_its_role_the_watch_still_syncs(
    control_plane: ControlPlane, namespace: str
) -> None:
    """A role from an older release (no resource.k8s.io): the DRA kinds count as listed with
    no objects and as absent, so everything else is scheduled (pods with claims wait)."""
    cp = control_plane
    role = f"no-dra-{namespace}"
    await kubectl(cp, "create", "clusterrole", role, "--verb=get,list,watch", "--resource=nodes")
    await kubectl(cp, "create", "serviceaccount", "old", "-n", namespace)
    await kubectl(
        cp, "create", "clusterrolebinding", role, f"--clusterrole={role}",
        f"--serviceaccount={namespace}:old",
    )  # fmt: skip
    token = await asyncio.to_thread(cp.service_account_token, namespace, "old")
    limited = await make_api_client(
        ClientSettings(kube_config=str(cp.kubeconfig_for_token(token, f"old-{namespace}")))
    )
    seen = Seen()
    watcher = Watcher(limited, seen, ("Node", *DRA_KINDS), settings=FAST_WATCH)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.wait_for(watcher.synced.wait(), 30)
        assert watcher.absent == set(DRA_KINDS) == seen.absent
        assert watcher.listed == {"Node", *DRA_KINDS}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await limited.close()
        cp.kubectl("delete", "clusterrolebinding", role, check=False)
        cp.kubectl("delete", "clusterrole", role, check=False)


async def test_commit_writes_allocation_and_reserved_for_before_binding(
    api: ApiClient, control_plane: ControlPlane, namespace: str, make_gpu_nodes: Any
) -> None:
    (node,) = make_gpu_nodes(1)
    gangs = Gangs(control_plane, namespace, node)
    await gangs.create(
        claim_manifest("shared", count=2),
        claim_manifest("own"),
        pod_manifest("p0", "shared", "own"),
        pod_manifest("p1", "shared"),
    )
    shared = on_node(node, "gpu-0", "gpu-1")
    own = on_node(node, "gpu-2")
    # As the solver hands it over: the first member carries the shared claim's allocation,
    # the second only uses it.
    outcome = gangs.outcome(
        "g",
        [
            ("p0", [ClaimGrant(gangs.key("shared"), shared), ClaimGrant(gangs.key("own"), own)]),
            ("p1", [ClaimGrant(gangs.key("shared"))]),
        ],
    )
    reservations = DraReservations()
    cache = CommitCache(reservations)
    writer = Writer(api)
    assert assume_gang(outcome, gangs.pods, cache, lambda: True) is None
    # Reserved at assume time, before anything is written.
    assert reservations.devices() == {(DRIVER, node, d) for d in ("gpu-0", "gpu-1", "gpu-2")}
    result = await bind_gang(outcome, gangs.pods, writer, cache)
    assert result.complete, result

    for name, want, users in (("shared", shared, ["p0", "p1"]), ("own", own, ["p0"])):
        obj, claim = await read_claim(control_plane, namespace, name)
        assert claim.allocation == want
        assert [(c.resource, c.name, c.uid) for c in claim.reserved_for] == [
            ("pods", u, gangs.uid(u)) for u in users
        ]
        assert FINALIZER in obj["metadata"]["finalizers"]
    for name in ("p0", "p1"):
        assert (await get(control_plane, "pod", name, "-n", namespace))["spec"]["nodeName"] == node
    # The reservations stay until the watch shows the claims allocated (the store settles them).
    assert len(reservations) == 2

    # The claim controller of kube-controller-manager takes over from there: once no pod uses
    # the shared claim any more, it deallocates it (that is what the finalizer is for).
    await kubectl(
        control_plane, "delete", "pod", "p0", "p1", "-n", namespace, "--grace-period=0", "--force"
    )

    async def deallocated() -> bool:
        obj, claim = await read_claim(control_plane, namespace, "shared")
        return claim.allocation is None and not obj["metadata"].get("finalizers")

    deadline = asyncio.get_running_loop().time() + 30
    while not await deallocated():
        assert asyncio.get_running_loop().time() < deadline, "the claim was not deallocated"
        await asyncio.sleep(0.5)


async def test_concurrent_gangs_on_one_claim_all_get_reserved_through_409s(
    api: ApiClient, control_plane: ControlPlane, namespace: str, make_gpu_nodes: Any
) -> None:
    """Eight gangs of one pod each join one claim allocated before, at the same time, through
    two writers (two scheduler replicas, or us and another client): each write carries the
    resourceVersion it read, so the writers' first writes collide; the loser gets a 409, reads
    again and retries. Within one writer, the writes of one claim take turns."""
    (node,) = make_gpu_nodes(1)
    gangs = Gangs(control_plane, namespace, node)
    names = [f"p{i}" for i in range(9)]
    await gangs.create(claim_manifest("shared"), *(pod_manifest(n, "shared") for n in names))
    first = gangs.outcome(
        "g-first", [("p0", [ClaimGrant(gangs.key("shared"), on_node(node, "gpu-0"))])]
    )
    reservations = DraReservations()
    assert (await commit(first, gangs, Writer(api), reservations)).complete

    writers = (Writer(api), Writer(api))
    others = [gangs.outcome(f"g-{n}", [(n, [ClaimGrant(gangs.key("shared"))])]) for n in names[1:]]
    with all_logs() as logs:
        results = await asyncio.gather(
            *(commit(o, gangs, writers[i % 2], reservations) for i, o in enumerate(others))
        )
    assert all(r.complete for r in results), [r.failed for r in results]
    _, claim = await read_claim(control_plane, namespace, "shared")
    assert sorted(c.uid for c in claim.reserved_for) == sorted(gangs.uid(n) for n in names)
    assert claim.allocation == on_node(node, "gpu-0")
    conflicts = [e for e in logs if e["event"] == "claim_conflict"]
    assert conflicts, "the two writers never collided"
    assert all("the object has been modified" in e["error"] for e in conflicts)


async def test_a_gang_waits_for_the_claim_another_gang_of_the_cycle_allocates(
    api: ApiClient, control_plane: ControlPlane, namespace: str, make_gpu_nodes: Any
) -> None:
    """Two gangs of one cycle share a claim: the solver gives the devices to the first, and
    the second only joins. Their commits run side by side; the joiner, finding the claim not
    allocated yet while the other commit holds its reservation, waits for it."""
    (node,) = make_gpu_nodes(1)
    gangs = Gangs(control_plane, namespace, node)
    await gangs.create(
        claim_manifest("shared"), pod_manifest("a", "shared"), pod_manifest("b", "shared")
    )
    allocation = on_node(node, "gpu-4")
    first = gangs.outcome("g-a", [("a", [ClaimGrant(gangs.key("shared"), allocation)])])
    joiner = gangs.outcome("g-b", [("b", [ClaimGrant(gangs.key("shared"))])])
    reservations = DraReservations()
    writer = Writer(api)
    # The joiner's commit starts first: its first read finds the claim unallocated.
    results = await asyncio.gather(
        commit(joiner, gangs, writer, reservations), commit(first, gangs, writer, reservations)
    )
    assert all(r.complete for r in results), [r.failed for r in results]
    _, claim = await read_claim(control_plane, namespace, "shared")
    assert claim.allocation == allocation
    assert sorted(c.uid for c in claim.reserved_for) == sorted([gangs.uid("a"), gangs.uid("b")])


async def test_a_claim_allocated_elsewhere_since_the_cycle_refuses_the_gang(
    api: ApiClient, control_plane: ControlPlane, namespace: str, make_gpu_nodes: Any
) -> None:
    (node,) = make_gpu_nodes(1)
    gangs = Gangs(control_plane, namespace, node)
    await gangs.create(claim_manifest("c"), claim_manifest("d"), pod_manifest("p", "c", "d"))
    # Another scheduler allocated claim c to another device after our cycle read it.
    writer = Writer(api)
    obj = await writer.get_object(RESOURCE_CLAIM, namespace, "c")
    assert obj is not None
    taken = on_node(node, "gpu-7")
    obj["status"] = {"allocation": allocation_to_k8s(taken)}
    await writer.update_object(RESOURCE_CLAIM, namespace, "c", obj, subresource="status")

    outcome = gangs.outcome(
        "g",
        [
            (
                "p",
                [
                    ClaimGrant(gangs.key("c"), on_node(node, "gpu-0")),
                    ClaimGrant(gangs.key("d"), on_node(node, "gpu-1")),
                ],
            )
        ],
    )
    reservations = DraReservations()
    result = await commit(outcome, gangs, writer, reservations)
    assert not result.bound and result.skipped
    ((_, why),) = result.failed
    assert why == (
        f"ResourceClaim {namespace}/c was allocated other devices (gpu-7) since the cycle chose "
        "devices for it"
    )
    assert not (await get(control_plane, "pod", "p", "-n", namespace))["spec"].get("nodeName")
    # What was written for claim d (the writes run side by side) is taken back whole.
    _, c = await read_claim(control_plane, namespace, "c")
    assert c.allocation == taken and not c.reserved_for
    obj_d, d = await read_claim(control_plane, namespace, "d")
    assert d.allocation is None and not d.reserved_for
    assert FINALIZER not in (obj_d["metadata"].get("finalizers") or [])
    assert reservations.devices() == frozenset() and len(reservations) == 0


async def test_a_failed_gang_is_undone(
    api: ApiClient, control_plane: ControlPlane, namespace: str, make_gpu_nodes: Any
) -> None:
    """A claim that cannot be written (it was deleted) fails the gang before any bind: the
    other claims lose the allocation and reservations written for it."""
    (node,) = make_gpu_nodes(1)
    gangs = Gangs(control_plane, namespace, node)
    await gangs.create(
        claim_manifest("a"),
        claim_manifest("b"),
        claim_manifest("used"),
        claim_manifest("gone"),
        pod_manifest("other", "used"),
        pod_manifest("p0", "a", "used"),
        pod_manifest("p1", "b", "gone"),
    )
    reservations = DraReservations()
    writer = Writer(api)
    # Claim "used" is allocated and used by a pod that runs (committed before).
    before = gangs.outcome(
        "g0", [("other", [ClaimGrant(gangs.key("used"), on_node(node, "gpu-5"))])]
    )
    assert (await commit(before, gangs, writer, reservations)).complete
    reservations.settle(gangs.key("used"))  # as the store does when the watch shows it
    await kubectl(control_plane, "delete", "resourceclaim", "gone", "-n", namespace)

    outcome = gangs.outcome(
        "g",
        [
            (
                "p0",
                [ClaimGrant(gangs.key("a"), on_node(node, "gpu-0")), ClaimGrant(gangs.key("used"))],
            ),
            (
                "p1",
                [
                    ClaimGrant(gangs.key("b"), on_node(node, "gpu-1")),
                    ClaimGrant(gangs.key("gone"), on_node(node, "gpu-2")),
                ],
            ),
        ],
    )
    result = await commit(outcome, gangs, writer, reservations)
    assert not result.bound
    assert {why for _, why in result.failed} == {
        f"ResourceClaim {namespace}/gone does not exist any more"
    }
    for name in ("p0", "p1"):
        assert not (await get(control_plane, "pod", name, "-n", namespace))["spec"].get("nodeName")
    for name in ("a", "b"):
        obj, claim = await read_claim(control_plane, namespace, name)
        assert claim.allocation is None and not claim.reserved_for, name
        assert FINALIZER not in (obj["metadata"].get("finalizers") or []), name
    # The claim allocated before keeps its allocation and its other user.
    _, used = await read_claim(control_plane, namespace, "used")
    assert used.allocation == on_node(node, "gpu-5")
    assert [c.uid for c in used.reserved_for] == [gangs.uid("other")]
    assert len(reservations) == 0


async def test_a_member_refused_at_bind_leaves_its_claims(
    api: ApiClient, control_plane: ControlPlane, namespace: str, make_gpu_nodes: Any
) -> None:
    (node,) = make_gpu_nodes(1)
    gangs = Gangs(control_plane, namespace, node)
    await gangs.create(
        claim_manifest("shared"),
        claim_manifest("mine"),
        pod_manifest("p0", "shared"),
        pod_manifest("p1", "shared", "mine"),
    )
    # p1 is deleted after the cycle read it: its bind is refused for good.
    await kubectl(
        control_plane, "delete", "pod", "p1", "-n", namespace, "--grace-period=0", "--force"
    )
    outcome = gangs.outcome(
        "g",
        [
            ("p0", [ClaimGrant(gangs.key("shared"), on_node(node, "gpu-0"))]),
            (
                "p1",
                [
                    ClaimGrant(gangs.key("shared")),
                    ClaimGrant(gangs.key("mine"), on_node(node, "gpu-1")),
                ],
            ),
        ],
    )
    reservations = DraReservations()
    result = await commit(outcome, gangs, Writer(api), reservations)
    assert [a.pod_key for a in result.bound] == [f"{namespace}/p0"]
    assert [a.pod_key for a, _ in result.failed] == [f"{namespace}/p1"]
    _, shared = await read_claim(control_plane, namespace, "shared")
    assert shared.allocation == on_node(node, "gpu-0")
    assert [c.uid for c in shared.reserved_for] == [gangs.uid("p0")]
    _, mine = await read_claim(control_plane, namespace, "mine")
    assert mine.allocation is None and not mine.reserved_for
    assert reservations.devices() == {(DRIVER, node, "gpu-0")}


async def test_without_permission_to_write_claims_the_pods_wait_naming_it(
    api: ApiClient, control_plane: ControlPlane, namespace: str, make_gpu_nodes: Any
) -> None:
    cp = control_plane
    (node,) = make_gpu_nodes(1)
    role = f"dra-reader-{namespace}"
    await kubectl(
        cp, "create", "clusterrole", role, "--verb=get,list,watch",
        "--resource=pods,resourceclaims.resource.k8s.io",
    )  # fmt: skip
    await kubectl(cp, "create", "serviceaccount", "reader", "-n", namespace)
    await kubectl(
        cp, "create", "clusterrolebinding", role, f"--clusterrole={role}",
        f"--serviceaccount={namespace}:reader",
    )  # fmt: skip
    token = await asyncio.to_thread(cp.service_account_token, namespace, "reader")
    limited = await make_api_client(
        ClientSettings(kube_config=str(cp.kubeconfig_for_token(token, f"reader-{namespace}")))
    )
    try:
        gangs = Gangs(cp, namespace, node)
        await gangs.create(claim_manifest("c"), pod_manifest("p", "c"))
        outcome = gangs.outcome("g", [("p", [ClaimGrant(gangs.key("c"), on_node(node, "gpu-0"))])])
        reservations = DraReservations()
        result = await commit(outcome, gangs, Writer(limited), reservations)
        ((_, why),) = result.failed
        assert why == f"ResourceClaim {namespace}/c could not be written: {FORBIDDEN}"
        assert reservations.forbidden == FORBIDDEN
        assert len(reservations) == 0
        # Until writing is tried again, the gang is refused before anything is sent.
        again = await commit(outcome, gangs, Writer(limited), reservations)
        assert again.skipped and [why for _, why in again.failed] == [FORBIDDEN]
        _, claim = await read_claim(cp, namespace, "c")
        assert claim.allocation is None and not claim.reserved_for
    finally:
        await limited.close()
        cp.kubectl("delete", "clusterrolebinding", role, check=False)
        cp.kubectl("delete", "clusterrole", role, check=False)


async def test_the_claim_of_extended_resources_is_created_and_named_in_the_pod(
    api: ApiClient, control_plane: ControlPlane, namespace: str, make_gpu_nodes: Any
) -> None:
    """A pod asks example.com/gpu, which a DeviceClass serves on a node without a device
    plugin for it: the commit creates the pod's claim as kube-scheduler does, allocates it,
    and names it in the pod's status before the bind."""
    (node,) = make_gpu_nodes(1)
    gangs = Gangs(control_plane, namespace, node)
    resource = "example.com/gpu"
    await gangs.create(extended_pod("p", resource, 2))
    request = "container-0-request-0"
    allocation = on_node(node, "gpu-0", "gpu-1", request=request)
    grant = ClaimGrant(
        special_claim_key(namespace, "p"),
        allocation,
        requests=((request, "gpu", 2),),
        mappings=(("main", resource, request),),
    )
    reservations = DraReservations()
    result = await commit(gangs.outcome("g", [("p", [grant])]), gangs, Writer(api), reservations)
    assert result.complete, result.failed

    pod = await get(control_plane, "pod", "p", "-n", namespace)
    assert pod["spec"]["nodeName"] == node
    named = pod["status"]["extendedResourceClaimStatus"]
    name = named["resourceClaimName"]
    assert name.startswith("p-extended-resources-")
    assert named["requestMappings"] == [
        {"containerName": "main", "resourceName": resource, "requestName": request}
    ]
    obj, claim = await read_claim(control_plane, namespace, name)
    assert claim.allocation == allocation
    assert [(c.name, c.uid) for c in claim.reserved_for] == [("p", gangs.uid("p"))]
    meta = obj["metadata"]
    assert meta["annotations"] == {EXTENDED_CLAIM_ANNOTATION: "true"}
    assert FINALIZER in meta["finalizers"]
    ((owner),) = meta["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Pod", gangs.uid("p"), True)
    assert [
        (r.name, r.alternatives[0].device_class, r.alternatives[0].count) for r in claim.requests
    ] == [(request, "gpu", 2)]
    # The devices stay reserved under the claim's real name, where the watch will settle them.
    assert reservations.allocation(f"{namespace}/{name}") == allocation
    assert len(reservations) == 1


async def test_the_claim_of_extended_resources_of_a_failed_gang_is_deleted(
    api: ApiClient, control_plane: ControlPlane, namespace: str, make_gpu_nodes: Any
) -> None:
    (node,) = make_gpu_nodes(1)
    gangs = Gangs(control_plane, namespace, node)
    resource = "example.com/gpu"
    await gangs.create(extended_pod("p", resource, 1), pod_manifest("q", "missing"))
    request = "container-0-request-0"
    grant = ClaimGrant(
        special_claim_key(namespace, "p"),
        on_node(node, "gpu-3", request=request),
        requests=((request, "gpu", 1),),
        mappings=(("main", resource, request),),
    )
    outcome = gangs.outcome(
        "g",
        [("p", [grant]), ("q", [ClaimGrant(gangs.key("missing"), on_node(node, "gpu-4"))])],
    )
    reservations = DraReservations()
    with all_logs() as logs:
        result = await commit(outcome, gangs, Writer(api), reservations)
    assert not result.bound
    assert {why for _, why in result.failed} == {
        f"ResourceClaim {namespace}/missing does not exist any more"
    }
    (created,) = [e["claim"] for e in logs if e["event"] == "extended_claim_created"]
    pod = await get(control_plane, "pod", "p", "-n", namespace)
    assert not pod["spec"].get("nodeName")
    # The API server keeps this field once set (as for kube-scheduler's claims): the next
    # commit of the pod names its new claim there.
    assert (
        pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        == created.split("/", 1)[1]
    )

    async def gone() -> bool:
        out = await kubectl(
            control_plane, "get", "resourceclaim", "-n", namespace, "-o", "name",
            "--ignore-not-found", created.split("/", 1)[1],
        )  # fmt: skip
        return not out.strip()

    deadline = asyncio.get_running_loop().time() + 10
    while not await gone():
        assert asyncio.get_running_loop().time() < deadline, f"{created} was not deleted"
        await asyncio.sleep(0.2)
    assert len(reservations) == 0
