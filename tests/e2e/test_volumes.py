"""PersistentVolumeClaims against the real control plane: a pod goes where its bound volume
is; a pod whose claim does not exist waits naming it, and is placed once the claim appears;
an unbound claim of a WaitForFirstConsumer StorageClass is bound by the scheduler to a
pre-created local volume on the pod's node, and kube-controller-manager's PV controller
completes the binding.

The volumes are local PersistentVolumes with node affinity to the fake (kwok) nodes: nothing
provisions volumes here. Each test uses its own StorageClass (volumes are cluster-scoped and
the control plane is shared), and the scheduler runs with the shipped RBAC.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.scheduler_process import (
    KaiCluster,
    StartScheduler,
    bound_nodes,
    kai_cluster,
    kubectl_json,
    pod_manifest,
    run_tag,
    start_scheduler,
    wait_for,
)

pytestmark = pytest.mark.e2e
__all__ = ["kai_cluster", "start_scheduler"]  # fixtures used by this module


def _local_pv(
    name: str,
    node: str,
    namespace: str | None,
    claim: str | None,
    storage_class: str = "",
    capacity: str = "1Gi",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "capacity": {"storage": capacity},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": storage_class,
        "local": {"path": "/mnt/disks/data"},
    }
    if claim is not None:
        spec["claimRef"] = {"namespace": namespace, "name": claim}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            **spec,
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


def _claim(name: str, volume: str | None, storage_class: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": storage_class,
        "resources": {"requests": {"storage": "1Gi"}},
    }
    if volume is not None:
        spec["volumeName"] = volume
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": spec,
    }


def _local_class(name: str) -> dict[str, Any]:
    """A StorageClass for pre-created local volumes, bound when a pod uses the claim."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
    }


def _with_claim(pod: dict[str, Any], claim: str) -> dict[str, Any]:
    pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    return pod


def _pod(kai_cluster: KaiCluster, namespace: str, name: str) -> dict[str, Any]:
    return next(p for p in kai_cluster.pods(namespace) if p["metadata"]["name"] == name)


def _waiting_message(kai_cluster: KaiCluster, namespace: str, name: str) -> str | None:
    for c in (_pod(kai_cluster, namespace, name).get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
            return str(c.get("message", ""))
    return None


def test_pod_lands_where_its_bound_local_volume_is(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    first, second = make_gpu_nodes(2, gpus=4, labels=tag)
    suffix = tag["kai-e2e"]
    volumes = {"data": f"pv-data-{suffix}", "later": f"pv-later-{suffix}"}
    cp = kai_cluster.cp
    kai_cluster.create(
        _local_pv(volumes["data"], second, namespace, "data"),
        _local_pv(volumes["later"], first, namespace, "later"),
    )
    try:
        kai_cluster.create(_claim("data", volumes["data"]), namespace=namespace)

        def bound(claim: str) -> bool:
            pvc = kubectl_json(cp, "get", "pvc", claim, "-n", namespace)
            return (pvc.get("status") or {}).get("phase") == "Bound"

        wait_for("the PV controller binds claim data", lambda: bound("data"))
        sched = start_scheduler()
        pods = [
            _with_claim(pod_manifest(f"user-{i}", gpus=1, node_selector=tag), "data")
            for i in range(2)
        ]
        waiter = _with_claim(pod_manifest("waiter", gpus=1, node_selector=tag), "later")
        kai_cluster.create(*pods, waiter, namespace=namespace)

        def users_bound() -> dict[str, str] | None:
            nodes = bound_nodes(kai_cluster.pods(namespace))
            return nodes if {"user-0", "user-1"} <= set(nodes) else None

        nodes = wait_for("both users of claim data bound", users_bound, logs=sched)
        # Both on the volume's node, though the other node is as free.
        assert nodes["user-0"] == nodes["user-1"] == second, nodes

        message = wait_for(
            "waiter waits for its claim",
            lambda: _waiting_message(kai_cluster, namespace, "waiter"),
            logs=sched,
        )
        assert (
            message == f"pod {namespace}/waiter: persistentvolumeclaim {namespace}/later not found"
        )
        assert "waiter" not in bound_nodes(kai_cluster.pods(namespace))

        # The claim is created and bound: the watch wakes the scheduler, which places the
        # pod on that volume's node.
        kai_cluster.create(_claim("later", volumes["later"]), namespace=namespace)

        def waiter_bound() -> dict[str, str] | None:
            nodes = bound_nodes(kai_cluster.pods(namespace))
            return nodes if "waiter" in nodes else None

        nodes = wait_for("waiter bound once its claim is", waiter_bound, logs=sched)
        assert nodes["waiter"] == first, nodes
        assert sched.running()
    finally:
        cp.kubectl("delete", "pod", "--all", "-n", namespace, "--wait=false", check=False)
        cp.kubectl("delete", "pvc", "--all", "-n", namespace, "--wait=false", check=False)
        cp.kubectl("delete", "pv", *volumes.values(), "--wait=false", check=False)


def _get(kai_cluster: KaiCluster, *args: str) -> dict[str, Any]:
    return dict(kubectl_json(kai_cluster.cp, "get", *args))


def _available(kai_cluster: KaiCluster, *volumes: str) -> bool:
    """The PV controller has marked the new volumes Available (before that they are no
    candidates, as in kube-scheduler)."""
    return all(
        (_get(kai_cluster, "pv", v).get("status") or {}).get("phase") == "Available"
        for v in volumes
    )


def _claim_bound_to(kai_cluster: KaiCluster, namespace: str, claim: str) -> str | None:
    """The volume the PV controller bound the claim to (completed), or None."""
    pvc = _get(kai_cluster, "pvc", claim, "-n", namespace)
    done = "pv.kubernetes.io/bind-completed" in (pvc["metadata"].get("annotations") or {})
    phase = (pvc.get("status") or {}).get("phase")
    return str(pvc["spec"]["volumeName"]) if done and phase == "Bound" else None


def _cleanup(kai_cluster: KaiCluster, namespace: str, volumes: list[str], sc: str) -> None:
    cp = kai_cluster.cp
    cp.kubectl("delete", "pod", "--all", "-n", namespace, "--wait=false", check=False)
    cp.kubectl("delete", "pvc", "--all", "-n", namespace, "--wait=false", check=False)
    cp.kubectl("delete", "pv", *volumes, "--wait=false", check=False)
    cp.kubectl("delete", "storageclass", sc, "--wait=false", check=False)


def test_a_wait_for_first_consumer_claim_is_bound_to_a_volume_on_the_pods_node(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    """One claim, a local volume on each of two nodes: the pod lands on one of them, the
    scheduler writes that volume's claimRef, and the real PV controller binds the claim to
    it before the pod is bound."""
    tag = run_tag()
    nodes = make_gpu_nodes(2, gpus=4, labels=tag)
    suffix = tag["kai-e2e"]
    sc = f"local-{suffix}"
    volumes = {node: f"pv-{i}-{suffix}" for i, node in enumerate(nodes)}
    try:
        kai_cluster.create(
            _local_class(sc),
            *(_local_pv(v, node, None, None, sc) for node, v in volumes.items()),
        )
        wait_for("the volumes Available", lambda: _available(kai_cluster, *volumes.values()))
        kai_cluster.create(_claim("data", None, sc), namespace=namespace)
        sched = start_scheduler()
        pod = _with_claim(pod_manifest("user", gpus=1, node_selector=tag), "data")
        kai_cluster.create(pod, namespace=namespace)

        def bound() -> dict[str, str] | None:
            nodes_now = bound_nodes(kai_cluster.pods(namespace))
            return nodes_now if "user" in nodes_now else None

        node = wait_for("the pod bound", bound, logs=sched)["user"]
        # The claim was bound (by the PV controller, completed) before the pod: at once.
        assert _claim_bound_to(kai_cluster, namespace, "data") == volumes[node]
        pv = _get(kai_cluster, "pv", volumes[node])
        claim = _get(kai_cluster, "pvc", "data", "-n", namespace)
        ref = pv["spec"]["claimRef"]
        assert (ref["kind"], ref["namespace"], ref["name"], ref["uid"]) == (
            "PersistentVolumeClaim",
            namespace,
            "data",
            claim["metadata"]["uid"],
        )
        assert pv["status"]["phase"] == "Bound"
        (other,) = [v for n, v in volumes.items() if n != node]
        assert "claimRef" not in _get(kai_cluster, "pv", other)["spec"]
        assert sched.running()
    finally:
        _cleanup(kai_cluster, namespace, list(volumes.values()), sc)


def test_two_pods_with_one_volume_per_node_end_on_different_nodes(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    """Two pods, each with its own claim, created together; one local volume per node. Both
    nodes would fit both pods, but a volume binds one claim: they end on different nodes,
    each claim bound to the volume of its pod's node, and no volume is bound twice."""
    tag = run_tag()
    nodes = make_gpu_nodes(2, gpus=4, labels=tag)
    suffix = tag["kai-e2e"]
    sc = f"local-{suffix}"
    volumes = {node: f"pv-{i}-{suffix}" for i, node in enumerate(nodes)}
    try:
        kai_cluster.create(
            _local_class(sc),
            *(_local_pv(v, node, None, None, sc) for node, v in volumes.items()),
        )
        wait_for("the volumes Available", lambda: _available(kai_cluster, *volumes.values()))
        kai_cluster.create(_claim("a", None, sc), _claim("b", None, sc), namespace=namespace)
        sched = start_scheduler()
        pods = [_with_claim(pod_manifest(f"user-{c}", gpus=1, node_selector=tag), c) for c in "ab"]
        kai_cluster.create(*pods, namespace=namespace)

        def both_bound() -> dict[str, str] | None:
            nodes_now = bound_nodes(kai_cluster.pods(namespace))
            return nodes_now if {"user-a", "user-b"} <= set(nodes_now) else None

        placed = wait_for("both pods bound", both_bound, timeout=90, logs=sched)
        assert placed["user-a"] != placed["user-b"], placed
        for c in "ab":
            assert _claim_bound_to(kai_cluster, namespace, c) == volumes[placed[f"user-{c}"]]
        assert sched.running()
    finally:
        _cleanup(kai_cluster, namespace, list(volumes.values()), sc)


def test_a_claim_without_a_volume_waits_until_one_is_created(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    (node,) = make_gpu_nodes(1, gpus=4, labels=tag)
    suffix = tag["kai-e2e"]
    sc = f"local-{suffix}"
    volume = f"pv-{suffix}"
    try:
        kai_cluster.create(_local_class(sc))
        kai_cluster.create(_claim("data", None, sc), namespace=namespace)
        sched = start_scheduler()
        pod = _with_claim(pod_manifest("waiter", gpus=1, node_selector=tag), "data")
        kai_cluster.create(pod, namespace=namespace)
        message = wait_for(
            "the pod waits for a volume",
            lambda: _waiting_message(kai_cluster, namespace, "waiter"),
            logs=sched,
        )
        assert message == (
            f"pod {namespace}/waiter: 0 persistentvolumes available for persistentvolumeclaim "
            f"{namespace}/data (StorageClass {sc}); no provisioning is done here"
        )
        assert "waiter" not in bound_nodes(kai_cluster.pods(namespace))

        # A volume appears (the PV controller makes it Available): the pod is placed there.
        kai_cluster.create(_local_pv(volume, node, None, None, sc))

        def waiter_bound() -> dict[str, str] | None:
            nodes_now = bound_nodes(kai_cluster.pods(namespace))
            return nodes_now if "waiter" in nodes_now else None

        assert wait_for("waiter bound", waiter_bound, logs=sched)["waiter"] == node
        assert _claim_bound_to(kai_cluster, namespace, "data") == volume
    finally:
        _cleanup(kai_cluster, namespace, [volume], sc)
