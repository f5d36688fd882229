"""Dynamic Resource Allocation end to end, on the real control plane.

A test driver (:mod:`tests.e2e.dra_driver`) publishes ResourceSlices for kwok nodes (devices
with ``model``, ``index`` and ``memory``); kube-controller-manager's ResourceClaim controller
makes a claim per pod from each ResourceClaimTemplate and names it in
``pod.status.resourceClaimStatuses``. The scheduler (shipped RBAC) chooses the devices, writes
``status.allocation`` and ``status.reservedFor`` and binds.

What kube-controller-manager does on its own (measured on Kubernetes 1.37, no flag needed):
when a pod is deleted it removes the pod from every claim's ``reservedFor``; it clears
``status.allocation`` only when the claim carries the finalizer
``resource.kubernetes.io/delete-protection`` (which the allocating scheduler adds, as
kube-scheduler does); a template's claim is then garbage-collected with its pod. So the
devices of a deleted pod come free only if the scheduler set that finalizer.

The API server refuses CEL selectors that do not compile, so the "bad selector" a scheduler
can meet is one that fails when evaluated (a missing attribute, a non-boolean result).

Each test has its own driver name, DeviceClass, nodes (selected by a per-test label) and
namespace, so tests never see each other's devices.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping
from typing import Any

import pytest

from tests.e2e.dra_driver import (
    DeviceSpec,
    TestDriver,
    claim_spec,
    claim_template,
    request,
    resource_claim,
    with_claims,
)
from tests.e2e.scheduler_process import (
    KaiCluster,
    StartScheduler,
    bound_nodes,
    kai_cluster,
    kubectl_json,
    pod_manifest,
    podgroup_manifest,
    run_tag,
    start_scheduler,
    wait_for,
)

pytestmark = pytest.mark.e2e
__all__ = ["kai_cluster", "start_scheduler"]  # fixtures used by this module

#: The finalizer kube-controller-manager looks for before it deallocates a claim.
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"

DeviceId = tuple[str, str, str]


@pytest.fixture
def driver(kai_cluster: KaiCluster) -> Generator[TestDriver, None, None]:
    """A test driver with a unique name; its slices and classes are deleted afterwards."""
    drv = TestDriver(kai_cluster.cp)
    try:
        yield drv
    finally:
        drv.cleanup()


# --- reading the cluster ---------------------------------------------------------------------


def _pod(kai_cluster: KaiCluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(kubectl_json(kai_cluster.cp, "get", "pod", name, "-n", namespace))


def _claims(kai_cluster: KaiCluster, namespace: str) -> dict[str, dict[str, Any]]:
    """Every ResourceClaim of ``namespace`` by name."""
    items = kubectl_json(kai_cluster.cp, "get", "resourceclaims", "-n", namespace)["items"]
    return {c["metadata"]["name"]: c for c in items}


def _claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """The pod's claim name (``spec.resourceClaims[].name``) -> ResourceClaim name, for
    claims from templates (status) and named claims (spec)."""
    out = {
        e["name"]: e["resourceClaimName"]
        for e in pod["spec"].get("resourceClaims") or []
        if e.get("resourceClaimName")
    }
    for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if s.get("resourceClaimName"):
            out[s["name"]] = s["resourceClaimName"]
    return out


def _devices(claim: Mapping[str, Any]) -> list[DeviceId]:
    """The devices the claim's allocation holds (driver, pool, device)."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    results = (alloc.get("devices") or {}).get("results") or []
    return [(r["driver"], r["pool"], r["device"]) for r in results]


def _reserved_for(claim: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (r.get("resource", ""), r.get("name", ""), r.get("uid", ""))
        for r in (claim.get("status") or {}).get("reservedFor") or []
    }


def _waiting(pods: list[dict[str, Any]]) -> dict[str, str]:
    """Pod name -> PodScheduled=False message, for the pods the scheduler says wait."""
    out = {}
    for p in pods:
        for c in (p.get("status") or {}).get("conditions") or []:
            if (
                c.get("type") == "PodScheduled"
                and c.get("status") == "False"
                and c.get("reason") == "Unschedulable"
            ):
                out[p["metadata"]["name"]] = str(c.get("message", ""))
    return out


def _claim_pod(
    name: str, tag: Mapping[str, str], templates: Mapping[str, str], **kw: Any
) -> dict[str, Any]:
    return with_claims(pod_manifest(name, node_selector=tag, **kw), templates=templates)


def _selector(driver: TestDriver, attribute: str, op: str, value: str) -> str:
    return f'device.attributes["{driver.domain}"].{attribute} {op} {value}'


def _memory_at_least(driver: TestDriver, quantity: str) -> str:
    return f'device.capacity["{driver.domain}"].memory.compareTo(quantity("{quantity}")) >= 0'


def _assert_claim_held_on(
    kai_cluster: KaiCluster,
    namespace: str,
    pod_name: str,
    node: str,
    driver: TestDriver,
    devices: int,
) -> list[DeviceId]:
    """The pod's claims are allocated to ``devices`` devices (in total) of ``node``'s pool
    and reserved for the pod; returns those devices."""
    pod = _pod(kai_cluster, namespace, pod_name)
    names = _claim_names(pod)
    assert len(names) == len(pod["spec"]["resourceClaims"]), pod.get("status")
    claims = _claims(kai_cluster, namespace)
    held: list[DeviceId] = []
    for claim_name in names.values():
        claim = claims[claim_name]
        got = _devices(claim)
        assert got, f"claim {claim_name} of bound pod {pod_name} is not allocated: {claim}"
        assert {(d[0], d[1]) for d in got} == {(driver.name, node)}, (pod_name, node, got)
        selector = claim["status"]["allocation"].get("nodeSelector")
        if selector is not None:  # the devices are node-local: the selector names the node
            assert node in str(selector), selector
        assert _reserved_for(claim) == {("pods", pod_name, pod["metadata"]["uid"])}, claim
        # Without it kube-controller-manager never deallocates the claim (devices leak).
        assert DELETE_PROTECTION in (claim["metadata"].get("finalizers") or []), claim
        held.extend(got)
    assert len(held) == devices, (pod_name, held)
    return held


def _cleanup(kai_cluster: KaiCluster, namespace: str) -> None:
    cp = kai_cluster.cp
    cp.kubectl(
        "delete", "pod", "--all", "-n", namespace, "--grace-period=0", "--force",
        "--wait=false", check=False,
    )  # fmt: skip


# --- tests -----------------------------------------------------------------------------------


def test_claim_templates_selecting_by_cel_land_on_matching_nodes(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    driver: TestDriver,
) -> None:
    """Three nodes with 4 devices each (a100/80Gi, h100/80Gi, a100/40Gi): pods whose
    templates select by model and by memory capacity go to the one node that has such
    devices; each claim names that node's devices, reservedFor names the pod, and no device
    is given twice. A third h100 pod finds none left and waits saying so."""
    tag = run_tag()
    a100, h100, small = make_gpu_nodes(3, gpus=0, labels=tag)
    driver.publish(
        [a100, h100, small],
        {
            a100: DeviceSpec(4, "a100", "80Gi"),
            h100: DeviceSpec(4, "h100", "80Gi"),
            small: DeviceSpec(4, "a100", "40Gi"),
        },
    )
    gpu = driver.create_class(f"gpu-{tag['kai-e2e']}")
    kai_cluster.create(
        claim_template(
            "two-h100",
            claim_spec(
                [
                    request(
                        device_class=gpu,
                        selectors=[_selector(driver, "model", "==", '"h100"')],
                        count=2,
                    )
                ]
            ),
        ),
        claim_template(
            "big-a100",
            claim_spec(
                [
                    request(
                        device_class=gpu,
                        selectors=[
                            _selector(driver, "model", "==", '"a100"'),
                            _memory_at_least(driver, "64Gi"),
                        ],
                    )
                ]
            ),
        ),
        claim_template(
            "high-index",
            claim_spec(
                [request(device_class=gpu, selectors=[_selector(driver, "index", ">=", "3")])]
            ),
        ),
        namespace=namespace,
    )
    try:
        sched = start_scheduler()
        pods = [
            _claim_pod("h-0", tag, {"gpu": "two-h100"}),
            _claim_pod("h-1", tag, {"gpu": "two-h100"}),
            _claim_pod("big", tag, {"gpu": "big-a100"}),
            # Two claims in one pod: an a100/80Gi device and a device with index >= 3.
            _claim_pod("pair", tag, {"big": "big-a100", "high": "high-index"}),
        ]
        kai_cluster.create(*pods, namespace=namespace)

        def placed() -> dict[str, str] | None:
            nodes = bound_nodes(kai_cluster.pods(namespace))
            return nodes if len(nodes) == len(pods) else None

        nodes = wait_for("the claim pods bound", placed, timeout=90, logs=sched)
        assert nodes["h-0"] == nodes["h-1"] == h100, nodes
        assert nodes["big"] == a100, nodes
        assert nodes["pair"] == a100, nodes
        held = _assert_claim_held_on(kai_cluster, namespace, "h-0", h100, driver, 2)
        held += _assert_claim_held_on(kai_cluster, namespace, "h-1", h100, driver, 2)
        held += _assert_claim_held_on(kai_cluster, namespace, "big", a100, driver, 1)
        held += _assert_claim_held_on(kai_cluster, namespace, "pair", a100, driver, 2)
        assert len(set(held)) == len(held) == 7, held
        claims = _claims(kai_cluster, namespace)
        pair = _claim_names(_pod(kai_cluster, namespace, "pair"))
        (high,) = _devices(claims[pair["high"]])
        assert int(high[2].removeprefix("gpu-")) >= 3, high

        # Every h100 device is taken now: a third h100 pod waits and says why.
        kai_cluster.create(_claim_pod("h-2", tag, {"gpu": "two-h100"}), namespace=namespace)
        message = wait_for(
            "h-2 waits",
            lambda: _waiting(kai_cluster.pods(namespace)).get("h-2"),
            timeout=60,
            logs=sched,
        )
        assert "claim" in message.lower() or gpu in message, message
        assert "h-2" not in bound_nodes(kai_cluster.pods(namespace))
        h2_claim = _claim_names(_pod(kai_cluster, namespace, "h-2"))["gpu"]
        assert not _devices(_claims(kai_cluster, namespace)[h2_claim])
        assert sched.running()
    finally:
        _cleanup(kai_cluster, namespace)


def test_gang_of_four_two_device_pods_with_six_devices_binds_nothing(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    driver: TestDriver,
) -> None:
    """A gang of 4 pods, each claiming 2 a100 devices, with only 6 a100 devices published
    (4 + 2; another node's h100 devices do not match): no member is bound and no claim
    allocated, and the pods say why. When a node with 2 more a100 devices appears, the
    whole gang binds."""
    tag = run_tag()
    four, two, other = make_gpu_nodes(3, gpus=0, labels=tag)
    driver.publish(
        [four, two, other],
        {four: DeviceSpec(4, "a100"), two: DeviceSpec(2, "a100"), other: DeviceSpec(4, "h100")},
    )
    gpu = driver.create_class(f"gpu-{tag['kai-e2e']}")
    kai_cluster.create(
        claim_template(
            "two-a100",
            claim_spec(
                [
                    request(
                        device_class=gpu,
                        selectors=[_selector(driver, "model", "==", '"a100"')],
                        count=2,
                    )
                ]
            ),
        ),
        namespace=namespace,
    )
    try:
        sched = start_scheduler()
        members = [
            _claim_pod(
                f"train-{i}", tag, {"gpu": "two-a100"}, annotations={"pod-group-name": "train"}
            )
            for i in range(4)
        ]
        kai_cluster.create(podgroup_manifest("train", 4), *members, namespace=namespace)

        def all_waiting() -> dict[str, str] | None:
            msgs = _waiting(kai_cluster.pods(namespace))
            return msgs if len(msgs) == 4 else None

        messages = wait_for("the 4 members wait", all_waiting, timeout=60, logs=sched)
        time.sleep(1.5)  # a few more cycles: still nothing
        assert not bound_nodes(kai_cluster.pods(namespace))
        assert all(not _devices(c) for c in _claims(kai_cluster, namespace).values())
        assert all("train" in m for m in messages.values()), messages
        # The reason is about devices, not CPU or memory (the nodes have plenty).
        assert any("device" in m.lower() or "claim" in m.lower() for m in messages.values()), (
            messages
        )

        (more,) = make_gpu_nodes(1, gpus=0, labels=tag)
        driver.publish([more], DeviceSpec(2, "a100"))

        def all_bound() -> dict[str, str] | None:
            b = bound_nodes(kai_cluster.pods(namespace))
            return b if len(b) == 4 else None

        nodes = wait_for("the whole gang bound", all_bound, timeout=60, logs=sched)
        assert sorted(nodes.values()).count(four) == 2, nodes
        held: list[DeviceId] = []
        for name, node in nodes.items():
            held += _assert_claim_held_on(kai_cluster, namespace, name, node, driver, 2)
        assert len(set(held)) == 8, held
        assert sched.running()
    finally:
        _cleanup(kai_cluster, namespace)


def test_devices_of_a_deleted_pod_are_freed_for_a_waiting_pod(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    driver: TestDriver,
) -> None:
    """One node with 2 devices: the first pod's claim takes both; the second pod waits. When
    the first pod is deleted, kube-controller-manager deallocates its claim (the scheduler
    set the delete-protection finalizer) and deletes it; the second pod then gets the
    devices."""
    tag = run_tag()
    (node,) = make_gpu_nodes(1, gpus=0, labels=tag)
    driver.publish([node], DeviceSpec(2))
    gpu = driver.create_class(f"gpu-{tag['kai-e2e']}")
    kai_cluster.create(
        claim_template("both", claim_spec([request(device_class=gpu, count=2)])),
        namespace=namespace,
    )
    try:
        sched = start_scheduler()
        kai_cluster.create(_claim_pod("first", tag, {"gpu": "both"}), namespace=namespace)
        wait_for(
            "first bound",
            lambda: "first" in bound_nodes(kai_cluster.pods(namespace)),
            timeout=60,
            logs=sched,
        )
        held = _assert_claim_held_on(kai_cluster, namespace, "first", node, driver, 2)
        first_claim = _claim_names(_pod(kai_cluster, namespace, "first"))["gpu"]

        kai_cluster.create(_claim_pod("second", tag, {"gpu": "both"}), namespace=namespace)
        wait_for(
            "second waits",
            lambda: _waiting(kai_cluster.pods(namespace)).get("second"),
            timeout=60,
            logs=sched,
        )
        assert "second" not in bound_nodes(kai_cluster.pods(namespace))

        kai_cluster.cp.kubectl(
            "delete", "pod", "first", "-n", namespace, "--grace-period=0", "--force"
        )
        wait_for(
            "the first pod's claim deallocated and deleted",
            lambda: first_claim not in _claims(kai_cluster, namespace),
            timeout=60,
            logs=sched,
        )
        wait_for(
            "second bound",
            lambda: bound_nodes(kai_cluster.pods(namespace)).get("second") == node,
            timeout=60,
            logs=sched,
        )
        again = _assert_claim_held_on(kai_cluster, namespace, "second", node, driver, 2)
        assert sorted(again) == sorted(held)
        assert sched.running()
    finally:
        _cleanup(kai_cluster, namespace)


def test_a_shared_claim_is_allocated_once_and_freed_when_its_pods_go(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    driver: TestDriver,
) -> None:
    """A standalone ResourceClaim used by two pods: both go to the node of its device, the
    claim is allocated once and reserved for both. When both pods are deleted,
    kube-controller-manager clears the allocation, and a pod needing every device binds."""
    tag = run_tag()
    nodes = make_gpu_nodes(2, gpus=0, labels=tag)
    driver.publish(nodes, DeviceSpec(2))
    gpu = driver.create_class(f"gpu-{tag['kai-e2e']}")
    kai_cluster.create(
        resource_claim("shared", claim_spec([request(device_class=gpu)])),
        claim_template("all-two", claim_spec([request(device_class=gpu, count=2)])),
        namespace=namespace,
    )
    try:
        sched = start_scheduler()
        users = [
            with_claims(pod_manifest(f"user-{i}", node_selector=tag), claims={"gpu": "shared"})
            for i in range(2)
        ]
        kai_cluster.create(*users, namespace=namespace)

        def both_bound() -> dict[str, str] | None:
            b = bound_nodes(kai_cluster.pods(namespace))
            return b if {"user-0", "user-1"} <= set(b) else None

        placed = wait_for("both users bound", both_bound, timeout=60, logs=sched)
        assert placed["user-0"] == placed["user-1"], placed
        claim = _claims(kai_cluster, namespace)["shared"]
        (device,) = _devices(claim)
        assert device[1] == placed["user-0"], (device, placed)
        uids = {p: _pod(kai_cluster, namespace, p)["metadata"]["uid"] for p in placed}
        assert _reserved_for(claim) == {("pods", p, uid) for p, uid in uids.items()}, claim

        # Both devices of the other node are free; on the shared claim's node one is left.
        kai_cluster.create(_claim_pod("whole", tag, {"gpu": "all-two"}), namespace=namespace)
        wait_for(
            "whole bound",
            lambda: "whole" in bound_nodes(kai_cluster.pods(namespace)),
            timeout=60,
            logs=sched,
        )
        assert bound_nodes(kai_cluster.pods(namespace))["whole"] != placed["user-0"]

        kai_cluster.cp.kubectl(
            "delete", "pod", "user-0", "user-1", "-n", namespace, "--grace-period=0", "--force"
        )

        def released() -> bool:
            c = _claims(kai_cluster, namespace)["shared"]
            return not _devices(c) and not _reserved_for(c)

        wait_for("the shared claim released", released, timeout=60, logs=sched)
        kai_cluster.create(_claim_pod("after", tag, {"gpu": "all-two"}), namespace=namespace)
        wait_for(
            "after bound where the shared claim was",
            lambda: bound_nodes(kai_cluster.pods(namespace)).get("after") == placed["user-0"],
            timeout=60,
            logs=sched,
        )
        assert sched.running()
    finally:
        _cleanup(kai_cluster, namespace)


def test_no_device_is_given_to_two_claims(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    driver: TestDriver,
) -> None:
    """Two nodes with 4 devices each and more demand than devices, created at once: pods
    with one claim and pods with two claims. Across every claim of the namespace no device
    appears twice, a bound pod's claims hold devices of its node, a waiting pod's claims
    hold none, and no waiting pod would fit the devices left free on any node."""
    tag = run_tag()
    nodes = make_gpu_nodes(2, gpus=0, labels=tag)
    driver.publish(nodes, DeviceSpec(4))
    gpu = driver.create_class(f"gpu-{tag['kai-e2e']}")
    kai_cluster.create(
        claim_template("one", claim_spec([request(device_class=gpu)])),
        namespace=namespace,
    )
    try:
        sched = start_scheduler()
        singles = [_claim_pod(f"single-{i}", tag, {"gpu": "one"}) for i in range(4)]
        doubles = [_claim_pod(f"double-{i}", tag, {"a": "one", "b": "one"}) for i in range(3)]
        kai_cluster.create(*singles, *doubles, namespace=namespace)
        demand = {
            p["metadata"]["name"]: len(p["spec"]["resourceClaims"]) for p in singles + doubles
        }

        def settled() -> tuple[dict[str, str], dict[str, str]] | None:
            pods = kai_cluster.pods(namespace)
            b, w = bound_nodes(pods), _waiting(pods)
            return (b, w) if set(b) | set(w) == set(demand) and not set(b) & set(w) else None

        bound, waiting = wait_for("every pod bound or waiting", settled, timeout=90, logs=sched)
        time.sleep(1.5)  # later cycles change nothing
        pods = kai_cluster.pods(namespace)
        assert bound_nodes(pods) == bound
        assert sum(demand[p] for p in bound) <= 8
        assert len(bound) >= 4, bound  # 8 devices fit at least 4 pods of this mix
        claims = _claims(kai_cluster, namespace)
        every = [d for c in claims.values() for d in _devices(c)]
        assert len(every) == len(set(every)), every
        used = {n: 0 for n in nodes}
        for name, node in bound.items():
            held = _assert_claim_held_on(kai_cluster, namespace, name, node, driver, demand[name])
            used[node] += len(held)
        assert len(every) == sum(used.values())
        for name in waiting:
            pod = next(p for p in pods if p["metadata"]["name"] == name)
            for claim_name in _claim_names(pod).values():
                assert not _devices(claims[claim_name]), (name, claims[claim_name])
            free = max(4 - n for n in used.values())
            assert demand[name] > free, (name, demand[name], used, waiting[name])
        assert sched.running()
    finally:
        _cleanup(kai_cluster, namespace)


def test_missing_device_class_and_failing_selector_give_reasons_while_others_schedule(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    driver: TestDriver,
) -> None:
    """A claim naming a DeviceClass that does not exist and a selector that fails when
    evaluated (an attribute no device has; the API server already refuses selectors that do
    not compile): those pods wait, each naming its problem, while a good pod is placed and
    the scheduler keeps running. Once the class is created, its pod is placed too."""
    tag = run_tag()
    (node,) = make_gpu_nodes(1, gpus=0, labels=tag)
    driver.publish([node], DeviceSpec(4))
    suffix = tag["kai-e2e"]
    gpu = driver.create_class(f"gpu-{suffix}")
    missing = f"missing-{suffix}"
    kai_cluster.create(
        claim_template("good", claim_spec([request(device_class=gpu)])),
        claim_template("no-class", claim_spec([request(device_class=missing)])),
        claim_template(
            "bad-cel",
            claim_spec(
                [request(device_class=gpu, selectors=[_selector(driver, "nosuch", "==", '"x"')])]
            ),
        ),
        namespace=namespace,
    )
    try:
        sched = start_scheduler()
        kai_cluster.create(
            _claim_pod("no-class", tag, {"gpu": "no-class"}),
            _claim_pod("bad-cel", tag, {"gpu": "bad-cel"}),
            _claim_pod("good", tag, {"gpu": "good"}),
            namespace=namespace,
        )

        def both_waiting() -> dict[str, str] | None:
            w = _waiting(kai_cluster.pods(namespace))
            return w if {"no-class", "bad-cel"} <= set(w) else None

        messages = wait_for("the two bad pods wait", both_waiting, timeout=60, logs=sched)
        wait_for(
            "good bound",
            lambda: "good" in bound_nodes(kai_cluster.pods(namespace)),
            timeout=60,
            logs=sched,
        )
        _assert_claim_held_on(kai_cluster, namespace, "good", node, driver, 1)
        assert missing in messages["no-class"], messages
        assert "nosuch" in messages["bad-cel"], messages
        assert not {"no-class", "bad-cel"} & set(bound_nodes(kai_cluster.pods(namespace)))

        driver.create_class(missing)
        wait_for(
            "no-class bound once its class exists",
            lambda: "no-class" in bound_nodes(kai_cluster.pods(namespace)),
            timeout=60,
            logs=sched,
        )
        assert "bad-cel" not in bound_nodes(kai_cluster.pods(namespace))
        assert sched.running()
    finally:
        _cleanup(kai_cluster, namespace)


def test_extended_resource_backed_by_a_device_class(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    driver: TestDriver,
) -> None:
    """A DeviceClass with ``extendedResourceName``: a pod asking that resource in its
    container, on kwok nodes that do not advertise it, gets a claim the scheduler creates
    (owned by the pod, annotated, allocated to devices of the node it is bound to, reserved
    for it) and ``status.extendedResourceClaimStatus`` mapping its container to the claim's
    request - what kube-scheduler does. Two such pods on one node never share a device; a
    third that does not fit waits."""
    tag = run_tag()
    (node,) = make_gpu_nodes(1, gpus=0, labels=tag)
    driver.publish([node], DeviceSpec(4, "a100", "80Gi"))
    resource = f"{driver.name.split('.', 1)[0]}.example.com/gpu"
    cls = driver.create_class(f"gpu-{tag['kai-e2e']}", extended_resource=resource)

    def ext_pod(name: str, count: int) -> dict[str, Any]:
        pod = pod_manifest(name, node_selector=tag)
        res = pod["spec"]["containers"][0]["resources"]
        res["requests"][resource] = str(count)
        res["limits"] = {resource: str(count)}
        return pod

    try:
        sched = start_scheduler()
        kai_cluster.create(ext_pod("x-0", 2), ext_pod("x-1", 2), namespace=namespace)

        def placed() -> dict[str, str] | None:
            nodes = bound_nodes(kai_cluster.pods(namespace))
            return nodes if len(nodes) == 2 else None

        nodes = wait_for("the extended-resource pods bound", placed, timeout=90, logs=sched)
        assert set(nodes.values()) == {node}, nodes
        claims = _claims(kai_cluster, namespace)
        held: list[DeviceId] = []
        for name in ("x-0", "x-1"):
            pod = _pod(kai_cluster, namespace, name)
            status = pod["status"].get("extendedResourceClaimStatus") or {}
            claim = claims[status["resourceClaimName"]]
            meta = claim["metadata"]
            assert meta["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
            (owner,) = meta["ownerReferences"]
            assert owner["uid"] == pod["metadata"]["uid"] and owner["controller"] is True
            (mapping,) = status["requestMappings"]
            assert mapping["containerName"] == "main" and mapping["resourceName"] == resource
            (req,) = claim["spec"]["devices"]["requests"]
            assert req["name"] == mapping["requestName"]
            assert req["exactly"]["deviceClassName"] == cls
            assert req["exactly"]["count"] == 2
            got = _devices(claim)
            assert len(got) == 2 and {(d[0], d[1]) for d in got} == {(driver.name, node)}, got
            assert _reserved_for(claim) == {("pods", name, pod["metadata"]["uid"])}, claim
            held += got
        assert len(set(held)) == 4, held

        kai_cluster.create(ext_pod("x-2", 1), namespace=namespace)
        message = wait_for(
            "x-2 waits",
            lambda: _waiting(kai_cluster.pods(namespace)).get("x-2"),
            timeout=60,
            logs=sched,
        )
        assert "claim" in message, message
        assert sched.running()
    finally:
        _cleanup(kai_cluster, namespace)
