"""Objects as the API returns them, parsed, for the pod grouper's unit tests."""

from __future__ import annotations

from typing import Any

from scheduler.podgrouper.owners import ObjectInfo

__all__ = ["NS", "job", "obj", "pod", "raw"]

NS = "team"


def raw(
    kind: str,
    name: str,
    *,
    api_version: str = "v1",
    uid: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner: ObjectInfo | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An object as the API would return it."""
    out: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid or f"uid-{name}",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": spec or {},
    }
    if owner is not None:
        out["metadata"]["ownerReferences"] = [
            {
                "apiVersion": owner.api_version,
                "kind": owner.kind,
                "name": owner.name,
                "uid": owner.uid,
                "controller": True,
            }
        ]
    return out


def obj(kind: str, name: str, **kw: Any) -> ObjectInfo:
    """An object as the API would return it, parsed (arguments as :func:`raw`)."""
    return ObjectInfo.from_k8s(raw(kind, name, **kw))


def pod(name: str = "p-0", *, owner: ObjectInfo | None = None, **kw: Any) -> ObjectInfo:
    """A pod of kai-scheduler."""
    spec = {"schedulerName": "kai-scheduler", **kw.pop("spec", {})}
    return obj("Pod", name, owner=owner, spec=spec, **kw)


def job(name: str = "train", **kw: Any) -> ObjectInfo:
    """A batch/v1 Job."""
    return obj("Job", name, api_version="batch/v1", **kw)
