"""GPU-class devices of ResourceClaims, counted toward the queues of the pods that use them.

A queue's GPU quota is in GPUs, whichever way a pod asks for them: ``nvidia.com/gpu`` in its
requests, a GPU share, or devices of a *GPU class* through its ResourceClaims. A DeviceClass
is a GPU class when its ``extendedResourceName`` is a GPU resource (``nvidia.com/gpu``,
``amd.com/gpu``, any ``*/gpu``) or its name's first DNS label is ``gpu`` (the drivers' own
classes: ``gpu.nvidia.com``, ``gpu.amd.com``; and ``gpu.example.com`` in examples).

- A pending pod counts what its claims ask for: per request, the ``count`` of an
  ``ExactCount`` alternative of a GPU class (the first alternative of ``firstAvailable``;
  ``All`` counts one, the least it can get), or what an already allocated claim holds.
- A bound pod counts the GPU-class devices of the allocated claims that name it in
  ``status.reservedFor``.

A claim shared by several pods is counted for each of them: sharing a device does not make
it cheaper for a queue.
"""

from __future__ import annotations

import dataclasses

from scheduler.cluster.dra import DeviceClass, ResourceClaim
from scheduler.cluster.draview import DraView
from scheduler.cluster.pod import Pod

__all__ = ["claim_gpus", "is_gpu_class", "with_claim_gpus"]


def is_gpu_class(cls: DeviceClass | None) -> bool:
    """True for a DeviceClass whose devices are GPUs (see the module docstring)."""
    if cls is None:
        return False
    ext = cls.extended_resource_name or ""
    return ext.endswith("/gpu") or cls.name.split(".", 1)[0] == "gpu"


def claim_gpus(claim: ResourceClaim, classes: dict[str, DeviceClass]) -> int:
    """GPU-class devices ``claim`` holds (allocated) or asks for (not yet)."""
    gpu_requests: dict[str, bool] = {}
    for request in claim.requests:
        for alt in request.alternatives:
            gpu_requests[alt.name] = is_gpu_class(classes.get(alt.device_class))
    if claim.allocation is not None:
        return sum(
            1
            for r in claim.allocation.results
            if gpu_requests.get(r.request, False) and not r.admin_access
        )
    total = 0
    for request in claim.requests:
        if not request.alternatives:
            continue
        alt = request.alternatives[0]
        if alt.admin_access or not is_gpu_class(classes.get(alt.device_class)):
            continue
        total += alt.count if alt.mode == "ExactCount" else 1
    return total


def with_claim_gpus(pods: tuple[Pod, ...], view: DraView) -> tuple[Pod, ...]:
    """``pods`` with :attr:`Pod.claim_gpus` set where their claims hold or ask for GPUs
    (the same tuple when none does)."""
    classes = view.class_by_name
    if not any(is_gpu_class(c) for c in view.classes):
        return pods
    per_claim = {c.key: claim_gpus(c, classes) for c in view.claims}
    bound: dict[str, int] = {}
    for claim in view.claims:
        gpus = per_claim[claim.key]
        if gpus and claim.allocation is not None:
            for ref in claim.reserved_for:
                bound[ref.uid] = bound.get(ref.uid, 0) + gpus
    pending = view.claim_keys_by_pod
    out: list[Pod] | None = None
    for i, pod in enumerate(pods):
        if pod.node_name is None:
            gpus = sum(per_claim.get(k, 0) for k in pending.get(pod.uid, ()))
        else:
            gpus = bound.get(pod.uid, 0)
        if gpus != pod.claim_gpus:
            if out is None:
                out = list(pods)
            out[i] = dataclasses.replace(pod, claim_gpus=gpus)
    return pods if out is None else tuple(out)
