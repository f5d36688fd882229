"""Binding WaitForFirstConsumer claims at commit, against a real API server and the real PV
controller (kube-controller-manager), with the races made deterministic.

The cache is fed by one list and then by what each test hands it - a stalled watch - so the
scheduler's view of a volume can be made stale on purpose: another claim takes the volume on
the API server after the list, and the commit's write (which carries the volume's
resourceVersion as a precondition) gets a 409. The gang must then not be bound at all, its
assumption and reservation forgotten, and the next cycle binds it to another volume. With a
role that may not patch volumes, the write gets a 403: the pod waits naming the permission and
a pod without claims is still bound.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from scheduler.cache import Cache
from scheduler.commit import LiveBackend
from scheduler.cycle import run_cycle
from scheduler.k8s.client import ClientSettings, make_api_client
from scheduler.k8s.watch import Watcher
from scheduler.k8s.writer import Writer
from scheduler.solver import PlacementSettings
from testenv.controlplane import ControlPlane
from tests.integration.support import kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

#: Nobody else schedules these pods: only the cycles run by the tests bind them.
SCHED = "kai-scheduler-volume-binding"
SETTINGS = PlacementSettings()
HOST = "kubernetes.io/hostname"


def local_class(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
    }


def local_pv(name: str, node: str, storage_class: str, capacity: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": capacity},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": storage_class,
            "local": {"path": "/mnt/disks/data"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": HOST, "operator": "In", "values": [node]}]}
                    ]
                }
            },
        },
    }


def claim(name: str, storage_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def pod(name: str, claim_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": SCHED,
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/fake:1",
                "resources": {"requests": {"cpu": "100m"}},
            }
        ],
    }
    if claim_name is not None:
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def as_list(*objs: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)})


async def get(cp: ControlPlane, *args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(await kubectl(cp, "get", *args, "-o", "json"))
    return out


async def list_once(api: ApiClient, cache: Cache) -> None:
    """One list of every kind into the cache, and no watch after it (a stalled watch)."""
    await Watcher(api, cache).run(iterations=1)


class Volumes:
    """A StorageClass and local volumes of this test only (volumes are cluster-scoped)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.suffix = uuid.uuid4().hex[:8]
        self.storage_class = f"local-{self.suffix}"
        self.names: list[str] = []

    async def create(self, node: str, *capacities: str) -> list[str]:
        names = [f"pv-{i}-{self.suffix}" for i in range(len(capacities))]
        self.names += names
        objs = [
            local_pv(n, node, self.storage_class, c) for n, c in zip(names, capacities, strict=True)
        ]
        await kubectl(
            self.cp, "create", "-f", "-", input=as_list(local_class(self.storage_class), *objs)
        )

        async def available() -> bool:
            phases = [(await get(self.cp, "pv", n)).get("status", {}).get("phase") for n in names]
            return all(p == "Available" for p in phases)

        for _ in range(300):  # the PV controller marks new volumes Available
            if await available():
                return names
            await asyncio.sleep(0.1)
        raise AssertionError(f"volumes {names} never became Available")

    def delete(self) -> None:
        self.cp.kubectl("delete", "pv", *self.names, "--wait=false", check=False)
        self.cp.kubectl("delete", "storageclass", self.storage_class, check=False)


@pytest.fixture
async def volumes(control_plane: ControlPlane) -> AsyncIterator[Volumes]:
    made = Volumes(control_plane)
    try:
        yield made
    finally:
        made.delete()


async def test_a_volume_taken_before_the_commit_leaves_the_gang_unbound_and_retried(
    control_plane: ControlPlane,
    api: ApiClient,
    namespace: str,
    make_gpu_nodes: Any,
    volumes: Volumes,
) -> None:
    cp = control_plane
    (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=1, name_prefix=f"{namespace}-n")
    small, big = await volumes.create(node, "1Gi", "2Gi")
    sc = volumes.storage_class
    await kubectl(
        cp, "create", "-n", namespace, "-f", "-",
        input=as_list(claim("data", sc), claim("other", sc), pod("p", "data")),
    )  # fmt: skip
    cache = Cache(SCHED, "default-queue")
    await list_once(api, cache)
    # Between the snapshot and the commit another claim takes the volume the scheduler will
    # choose (the smallest that fits): its view of that volume is now stale.
    ref = {"spec": {"claimRef": {"namespace": namespace, "name": "other"}}}
    await kubectl(cp, "patch", "pv", small, "--type=merge", "-p", json.dumps(ref))
    backend = LiveBackend(cache, Writer(api))

    report = await run_cycle(backend, SETTINGS, 1)
    assert report.commit.dispatched_pods == 1, report.placement.outcomes
    await backend.flush()
    # The write got a 409 (resourceVersion precondition): nothing of the gang was bound, the
    # assumption and the reservation are forgotten, the other claim's volume is untouched.
    assert not (await get(cp, "pod", "p", "-n", namespace))["spec"].get("nodeName")
    assert cache.assumed() == {}
    assert cache.volumes.reservations() == {}
    taken = await get(cp, "pv", small)
    assert taken["spec"]["claimRef"]["name"] == "other"
    assert "claimRef" not in (await get(cp, "pv", big))["spec"]
    data = await get(cp, "pvc", "data", "-n", namespace)
    assert not data["spec"].get("volumeName")

    # The watch catches up (one more list): the next cycle binds the other volume, and the
    # PV controller completes the binding before the pod is bound.
    await list_once(api, cache)
    report = await run_cycle(backend, SETTINGS, 2)
    assert report.commit.dispatched_pods == 1, report.placement.outcomes
    await backend.flush()
    bound = await get(cp, "pod", "p", "-n", namespace)
    assert bound["spec"]["nodeName"] == node
    data = await get(cp, "pvc", "data", "-n", namespace)
    assert data["spec"]["volumeName"] == big
    assert data["status"]["phase"] == "Bound"
    assert "pv.kubernetes.io/bind-completed" in data["metadata"]["annotations"]
    ref_now = (await get(cp, "pv", big))["spec"]["claimRef"]
    assert (ref_now["name"], ref_now["uid"]) == ("data", data["metadata"]["uid"])


async def test_without_permission_to_patch_volumes_the_pod_waits_and_others_are_bound(
    control_plane: ControlPlane,
    api: ApiClient,
    namespace: str,
    make_gpu_nodes: Any,
    volumes: Volumes,
) -> None:
    cp = control_plane
    (node,) = await asyncio.to_thread(make_gpu_nodes, 1, gpus=1, name_prefix=f"{namespace}-n")
    (volume,) = await volumes.create(node, "1Gi")
    sc = volumes.storage_class
    # A role from an older release: it may bind pods, but not patch volumes.
    role = f"binder-only-{volumes.suffix}"
    await kubectl(cp, "create", "serviceaccount", "binder", "-n", namespace)
    await kubectl(
        cp, "create", "clusterrole", role, "--verb=create", "--resource=pods/binding",
    )  # fmt: skip
    await kubectl(
        cp, "create", "clusterrolebinding", role, f"--clusterrole={role}",
        f"--serviceaccount={namespace}:binder",
    )  # fmt: skip
    token = await asyncio.to_thread(cp.service_account_token, namespace, "binder")
    limited = await make_api_client(
        ClientSettings(kube_config=str(cp.kubeconfig_for_token(token, f"binder-{namespace}")))
    )
    try:
        await kubectl(
            cp, "create", "-n", namespace, "-f", "-",
            input=as_list(claim("data", sc), pod("p", "data"), pod("plain")),
        )  # fmt: skip
        cache = Cache(SCHED, "default-queue")
        await list_once(api, cache)
        backend = LiveBackend(cache, Writer(limited))
        report = await run_cycle(backend, SETTINGS, 1)
        await backend.flush()
        assert report.commit.dispatched_pods == 2, report.placement.outcomes
        assert (await get(cp, "pod", "plain", "-n", namespace))["spec"]["nodeName"] == node
        waiting = await get(cp, "pod", "p", "-n", namespace)
        assert not waiting["spec"].get("nodeName")
        assert waiting["metadata"]["uid"] not in cache.assumed()
        assert "claimRef" not in (await get(cp, "pv", volume))["spec"]
        # The next cycle tells why: the missing permission, named.
        await list_once(api, cache)
        report = await run_cycle(backend, SETTINGS, 2)
        outcome = report.placement.outcomes[f"{namespace}/p"]
        assert not outcome.placed
        assert (outcome.reason_code, outcome.reason) == (
            "VolumeNotBound",
            f"pod {namespace}/p: persistentvolumeclaim {namespace}/data (StorageClass {sc}) "
            "cannot be bound: the scheduler may not patch persistentvolumes (grant patch on "
            "persistentvolumes to the scheduler; see manifests/20-rbac.yaml)",
        )
        await backend.flush()
    finally:
        await limited.close()
        cp.kubectl("delete", "clusterrolebinding", role, check=False)
        cp.kubectl("delete", "clusterrole", role, check=False)
