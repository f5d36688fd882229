"""GPU sharing made real: reservation pods, the per-pod device ConfigMap, and the env patch.

A pod that asks for part of a GPU (``gpu-fraction`` / ``gpu-memory``) is granted a device index
by the solver (see :mod:`scheduler.cache.grants`). Two objects make that grant real:

- A **reservation pod** per shared device (namespace :data:`RESERVATION_NAMESPACE`), bound to
  the node with ``nodeName`` and requesting ``nvidia.com/gpu: 1``, so the kubelet's device
  plugin really holds one device for the sharers and no whole-GPU pod gets it.
- A **device ConfigMap** per sharing pod (``<pod>-gpu-share``, owned by the pod so it is
  garbage-collected with it), whose key :data:`VISIBLE_DEVICES_KEY` names the device; the
  admission webhook (:mod:`scheduler.admission`) points the containers' env at it when the pod
  is created, and the scheduler fills it at bind time.

Everything here is pure: names, manifests, and what the garbage collection should do given the
reservation pods and the sharers the cache knows (see docs/gpu-sharing.md).

Optionally (``gpuSharing.scalingPods``), sharing demand that no node has room for is shown to
Cluster Autoscaler / Karpenter as **scaling pods**: pending pods that ask for whole devices
(:func:`scaling_groups` packs the shares into devices), marked unschedulable, removed again once
the sharers are placed (see :mod:`scheduler.commit.gpusharing`).
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import Pod

__all__ = [
    "CONFIG_MAP_LABEL",
    "DEVICE_ANNOTATION",
    "DEVICE_LABEL",
    "GPU_PORTION_KEY",
    "NODE_LABEL",
    "REAL_INDEX_ANNOTATION",
    "RESERVATION_LABEL",
    "RESERVATION_NAMESPACE",
    "SCALING_LABEL",
    "VISIBLE_DEVICES_KEY",
    "Reservation",
    "ReservationPlan",
    "ScalingPod",
    "config_map_name",
    "device_config_map",
    "devices_in_use",
    "is_sharer",
    "plan_reservations",
    "pod_config_map",
    "reservation_from_k8s",
    "reservation_name",
    "reservation_pod",
    "scaling_from_k8s",
    "scaling_groups",
    "scaling_name",
    "scaling_pod",
    "shared_devices",
]

#: Where reservation pods live (KAI uses the same name; the chart creates it).
RESERVATION_NAMESPACE = "kai-resource-reservation"
#: Marks a pod as one of ours: the cache keeps such pods out of the node's accounting.
RESERVATION_LABEL = "kai.scheduler/gpu-reservation"
#: The node and device index (as the scheduler's grant names it) a reservation pod holds.
NODE_LABEL = "kai.scheduler/gpu-reservation-node"
DEVICE_LABEL = "kai.scheduler/gpu-reservation-device"
#: Same as :data:`DEVICE_LABEL`, as an annotation, for people reading the pod.
DEVICE_ANNOTATION = "kai.scheduler/gpu-device"
#: Written on a reservation pod by whatever runs inside it on a real node (KAI's reservation
#: image reads the device the kubelet gave it, e.g. from ``NVIDIA_VISIBLE_DEVICES``): the
#: kubelet's own device id. When present it is what the sharers' ConfigMap names.
REAL_INDEX_ANNOTATION = "run.ai/reserve_for_gpu_index"
#: Marks a scaling pod (whole-GPU stand-in for sharing demand, for autoscalers only).
SCALING_LABEL = "kai.scheduler/gpu-scaling-pod"
#: On a sharing pod: the name of its device ConfigMap (set by the admission webhook).
CONFIG_MAP_LABEL = "kai.scheduler/gpu-share-configmap"
#: ConfigMap keys the containers' env is sourced from.
VISIBLE_DEVICES_KEY = "NVIDIA_VISIBLE_DEVICES"
GPU_PORTION_KEY = "GPU_PORTION"
_GPU = "nvidia.com/gpu"


def is_sharer(pod: Pod) -> bool:
    """The pod takes part of a device (``gpu-fraction`` / ``gpu-memory``), not whole ones."""
    return pod.gpu is not None and not pod.gpu.whole


def shared_devices(pod: Pod, grant: Iterable[tuple[int, int]] | None = None) -> tuple[int, ...]:
    """Device indexes a sharing pod uses (from ``grant``, or its own bound grant)."""
    if not is_sharer(pod):
        return ()
    return tuple(sorted(i for i, _ in (pod.gpu_grant if grant is None else grant)))


def reservation_name(node: str, device: int) -> str:
    """A stable name per (node, device), a DNS label (at most 63 characters, ASCII): the
    node's name is shortened and the hash of the full pair keeps look-alikes apart."""
    digest = hashlib.sha256(f"{node}/{device}".encode()).hexdigest()[:10]
    allowed = string.ascii_lowercase + string.digits
    stem = "".join(c if c in allowed else "-" for c in node.lower())[:28].strip("-")
    return f"gpu-reservation-{stem}-{device}-{digest}".replace("--", "-")


def config_map_name(pod_name: str) -> str:
    """The device ConfigMap of a sharing pod named ``pod_name`` (at most 63 characters, so
    it fits the label :data:`CONFIG_MAP_LABEL`); a long name is shortened with a hash of the
    whole, so two pods whose names start alike never share a ConfigMap."""
    if len(pod_name) <= 52:
        return f"{pod_name}-gpu-share"
    digest = hashlib.sha256(pod_name.encode()).hexdigest()[:10]
    return f"{pod_name[:41].rstrip('-.')}-{digest}-gpu-share"


def pod_config_map(pod: Pod) -> str:
    """The device ConfigMap a sharing pod's env names: the webhook's label, else by name."""
    return dict(pod.labels).get(CONFIG_MAP_LABEL) or config_map_name(pod.name)


def _label_value(value: str) -> str:
    return value if len(value) <= 63 else hashlib.sha256(value.encode()).hexdigest()[:63]


_PAUSE = "registry.k8s.io/pause:3.10"
#: Meets the "restricted" Pod Security level the reservation namespace enforces.
_RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 65535,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def reservation_pod(
    node: str,
    device: int,
    *,
    namespace: str = RESERVATION_NAMESPACE,
    priority_class: str = "system-node-critical",
    image: str = _PAUSE,
) -> dict[str, Any]:
    """The reservation pod holding ``device`` on ``node`` for its sharers.

    ``nodeName`` bypasses every scheduler (it is the kubelet's to admit); it tolerates every
    taint, since GPU nodes are usually tainted and the sharers were already judged to fit.
    """
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": reservation_name(node, device),
            "namespace": namespace,
            "labels": {
                RESERVATION_LABEL: "true",
                NODE_LABEL: _label_value(node),
                DEVICE_LABEL: str(device),
            },
            "annotations": {DEVICE_ANNOTATION: str(device), "kai.scheduler/node": node},
        },
        "spec": {
            "nodeName": node,
            "priorityClassName": priority_class,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "reservation",
                    "image": image,
                    "resources": {"limits": {_GPU: "1"}, "requests": {_GPU: "1"}},
                    "securityContext": dict(_RESTRICTED),
                }
            ],
        },
    }


@dataclass(frozen=True)
class Reservation:
    """A reservation pod as the cache saw it."""

    namespace: str
    name: str
    uid: str
    node: str
    device: int
    #: The kubelet's device id, when something on the node reported it.
    real_index: str | None = None
    #: Being deleted, or finished (Failed/Succeeded): it holds nothing any more.
    gone: bool = False


def reservation_from_k8s(obj: Mapping[str, Any]) -> Reservation | None:
    """A reservation pod from its API object; None for any other pod or one we cannot read."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(RESERVATION_LABEL) != "true":
        return None
    annotations = meta.get("annotations") or {}
    node = (obj.get("spec") or {}).get("nodeName") or annotations.get("kai.scheduler/node")
    try:
        device = int(labels.get(DEVICE_LABEL, ""))
    except ValueError:
        return None
    if not node:
        return None
    phase = (obj.get("status") or {}).get("phase")
    real = annotations.get(REAL_INDEX_ANNOTATION)
    return Reservation(
        namespace=meta.get("namespace") or "",
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        node=str(node),
        device=device,
        real_index=str(real) if real not in (None, "") else None,
        gone=bool(meta.get("deletionTimestamp")) or phase in ("Failed", "Succeeded"),
    )


@dataclass(frozen=True)
class ReservationPlan:
    """What the garbage collection does this pass."""

    #: Reservation pods no sharer uses any more.
    delete: tuple[Reservation, ...] = ()
    #: (node, device) pairs whose sharers lost their reservation pod: hold them again.
    recreate: tuple[tuple[str, int], ...] = ()


def devices_in_use(pods: Iterable[Pod]) -> set[tuple[str, int]]:
    """(node, device) pairs that bound, active sharing pods of this scheduler use. A
    fractional pod of another scheduler (KAI's own, run side by side) is that scheduler's to
    hold: counting it would make reservation pods for devices this one never granted."""
    used: set[tuple[str, int]] = set()
    for pod in pods:
        if pod.node_name is None or not pod.active or pod.deleting or not pod.managed:
            continue
        for device in shared_devices(pod):
            used.add((pod.node_name, device))
    return used


def plan_reservations(
    reservations: Iterable[Reservation], used: AbstractSet[tuple[str, int]]
) -> ReservationPlan:
    """Reservation pods to delete (their device has no sharer in ``used``) and devices to
    hold again (in ``used``, no live reservation pod: it was deleted or failed)."""
    live: set[tuple[str, int]] = set()
    delete = []
    for r in reservations:
        if r.gone:
            continue
        if (r.node, r.device) in used:
            live.add((r.node, r.device))
        else:
            delete.append(r)
    recreate = tuple(sorted(set(used) - live))
    return ReservationPlan(tuple(sorted(delete, key=lambda r: r.name)), recreate)


def device_config_map(
    name: str,
    pod_namespace: str,
    pod_name: str,
    pod_uid: str,
    devices: Iterable[str],
    portion: str,
) -> dict[str, Any]:
    """The sharing pod's device ConfigMap ``name``, owned by the pod (deleted with it)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": pod_namespace,
            "labels": {"kai.scheduler/gpu-share": "true"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid}
            ],
        },
        "data": {VISIBLE_DEVICES_KEY: ",".join(devices), GPU_PORTION_KEY: portion},
    }


# --------------------------------------------------------------------------- scaling pods


@dataclass(frozen=True)
class ScalingPod:
    """A scaling pod as the cache saw it."""

    namespace: str
    name: str
    uid: str


def scaling_from_k8s(obj: Mapping[str, Any]) -> ScalingPod | None:
    """A scaling pod from its API object; None for any other pod."""
    meta = obj.get("metadata") or {}
    if (meta.get("labels") or {}).get(SCALING_LABEL) != "true":
        return None
    return ScalingPod(meta.get("namespace") or "", meta.get("name") or "", meta.get("uid") or "")


def _devices_needed(pods: Iterable[Pod]) -> int:
    """Whole devices the shares of ``pods`` fill, packed first-fit decreasing, each pod's
    shares on distinct devices (``gpu-fraction-num-devices``). A share asked by memory counts
    as a whole device: the new node's GPU memory is not known."""
    shares = sorted(
        (
            (GPU_MILLI if p.gpu.memory_mib is not None else p.gpu.milli, i)
            for i, p in enumerate(pods)
            if p.gpu is not None
            for _ in range(p.gpu.count)
        ),
        reverse=True,
    )
    free: list[int] = []
    users: list[set[int]] = []
    for share, pod in shares:
        for d, room in enumerate(free):
            if room >= share and pod not in users[d]:
                free[d] -= share
                users[d].add(pod)
                break
        else:
            free.append(GPU_MILLI - share)
            users.append({pod})
    return len(free)


def scaling_groups(pods: Iterable[Pod]) -> dict[str, tuple[Pod, int]]:
    """Group id -> (a member, whole devices the group's shares fill), for sharing ``pods``
    that wait for capacity. Pods are grouped by where they may run (node selector, node
    affinity, tolerations), so the stand-ins ask for the node group the pods could use."""
    groups: dict[str, list[Pod]] = {}
    for pod in pods:
        key = repr((sorted(pod.node_selector), pod.affinity, pod.tolerations))
        group = hashlib.sha256(key.encode()).hexdigest()[:10]
        groups.setdefault(group, []).append(pod)
    return {g: (members[0], _devices_needed(members)) for g, members in sorted(groups.items())}


def scaling_name(group: str, index: int) -> str:
    """The ``index``-th scaling pod of ``group`` (stable, so passes reconcile by name)."""
    return f"gpu-scaling-{group}-{index}"


def scaling_pod(
    name: str, namespace: str, member: Mapping[str, Any], scheduler_name: str
) -> dict[str, Any]:
    """A pending pod asking for one whole device where the sharing pod ``member`` (its API
    object) may run: its node selector, node affinity, tolerations and priority class.

    Its ``schedulerName`` is ``<scheduler_name>-scaling``, which nothing serves (nor does the
    pod grouper group it), and the cache keeps pods labelled :data:`SCALING_LABEL` out, so it
    stays pending for autoscalers to act on.
    """
    spec = member.get("spec") or {}
    out: dict[str, Any] = {
        "schedulerName": f"{scheduler_name}-scaling",
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": "scaling",
                "image": _PAUSE,
                "resources": {"limits": {_GPU: "1"}, "requests": {_GPU: "1"}},
                "securityContext": dict(_RESTRICTED),
            }
        ],
    }
    for key in ("nodeSelector", "tolerations", "priorityClassName"):
        if spec.get(key):
            out[key] = spec[key]
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity")
    if node_affinity:
        out["affinity"] = {"nodeAffinity": node_affinity}
    meta = member.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {SCALING_LABEL: "true"},
            "annotations": {
                "kai.scheduler/scaling-for": f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            },
        },
        "spec": out,
    }
