"""Fake GPU nodes: Node objects that kwok manages (Ready, heartbeats, bound pods Running)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from testenv.controlplane import ControlPlane

__all__ = ["GPU_RESOURCE", "KWOK_ANNOTATION", "delete_nodes", "make_gpu_nodes"]

GPU_RESOURCE = "nvidia.com/gpu"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")


def _node_manifest(
    name: str,
    *,
    gpus: int,
    cpu: str,
    memory: str,
    pods: int,
    labels: Mapping[str, str],
    taints: Sequence[Mapping[str, str]],
) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods), GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **labels,
            },
        },
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }


def make_gpu_nodes(
    cp: ControlPlane,
    count: int,
    gpus: int = 8,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: int = 110,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] | None = None,
    name_prefix: str = "gpu-node",
    gpu_memory_mib: int | None = None,
) -> list[str]:
    """Create `count` kwok-managed nodes named ``{name_prefix}-{i}`` with `gpus` x
    ``nvidia.com/gpu`` (and label ``nvidia.com/gpu.memory`` when `gpu_memory_mib` is given),
    wait until every one is Ready, and return their names.

    `taints` items are Node taint dicts, e.g. ``{"key": "k", "value": "v", "effect":
    "NoSchedule"}``.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if gpus < 0:
        raise ValueError(f"gpus must be >= 0, got {gpus}")
    all_labels = dict(labels or {})
    if gpu_memory_mib is not None:
        all_labels[GPU_MEMORY_LABEL] = str(gpu_memory_mib)
    for taint in taints or ():
        if "key" not in taint or "effect" not in taint:
            raise ValueError(f"each taint needs 'key' and 'effect', got {dict(taint)!r}")
    names = [f"{name_prefix}-{i}" for i in range(count)]
    if not names:
        return []
    manifest = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            _node_manifest(
                n, gpus=gpus, cpu=cpu, memory=memory, pods=pods, labels=all_labels,
                taints=taints or (),
            )
            for n in names
        ],
    }  # fmt: skip
    cp.kubectl("create", "-f", "-", input=json.dumps(manifest))
    timeout = 60 + count // 10
    cp.kubectl(
        "wait", "--for=condition=Ready", f"--timeout={timeout}s",
        *(f"node/{n}" for n in names),
        timeout=timeout + 15,
    )  # fmt: skip
    return names


def delete_nodes(cp: ControlPlane, names: Iterable[str]) -> None:
    """Delete the named nodes (missing ones are ignored); does not wait for pods on them."""
    targets = [f"node/{n}" for n in names]
    if targets:
        cp.kubectl("delete", "--ignore-not-found", "--wait=false", *targets)
