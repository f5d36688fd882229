"""PersistentVolumeClaims against the real control plane: a pod goes where its bound volume
is; a pod whose claim does not exist waits naming it, and is placed once the claim appears.

The volumes are local PersistentVolumes created already pointing at their claims
(``claimRef``) and the claims at their volumes (``volumeName``), so kube-controller-manager's
PV controller binds them without a provisioner. The scheduler runs with the shipped RBAC.
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


def _local_pv(name: str, node: str, namespace: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "local": {"path": "/mnt/disks/data"},
            "claimRef": {"namespace": namespace, "name": claim},
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


def _claim(name: str, volume: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": volume,
            "resources": {"requests": {"storage": "1Gi"}},
        },
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
