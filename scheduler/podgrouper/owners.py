"""A pod and its owners, as the grouper sees them: plain frozen data, no I/O.

A pod's **owner chain** is what following ``metadata.ownerReferences`` upwards finds: the
pod's controller (say a ReplicaSet), that object's controller (a Deployment), and so on up to
an object with no owner, the **top owner** - the workload one PodGroup stands for. A bare pod
is its own top owner (an empty chain).

Which reference is followed: the one marked ``controller: true``, else the only one, else the
first (KAI follows the first). Walking the chain needs the API (see
:mod:`scheduler.podgrouper.api`); everything here is pure, so each grouping rule is a function
of (pod, chain) and tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.podgrouper.keys import SKIP_KEY

__all__ = [
    "ObjectInfo",
    "OwnerRef",
    "controller_ref",
    "skip_requested",
    "split_api_version",
]


def split_api_version(api_version: str) -> tuple[str, str]:
    """``"apps/v1"`` to ``("apps", "v1")``; the core group's ``"v1"`` to ``("", "v1")``."""
    group, sep, version = api_version.rpartition("/")
    return (group, version) if sep else ("", api_version)


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """One entry of ``metadata.ownerReferences``."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool = False

    @classmethod
    def from_k8s(cls, raw: Mapping[str, Any]) -> OwnerRef:
        """Parse an ownerReference (missing fields read as empty)."""
        return cls(
            api_version=str(raw.get("apiVersion") or ""),
            kind=str(raw.get("kind") or ""),
            name=str(raw.get("name") or ""),
            uid=str(raw.get("uid") or ""),
            controller=bool(raw.get("controller")),
        )

    @property
    def group(self) -> str:
        """The API group ("" for the core group)."""
        return split_api_version(self.api_version)[0]

    def to_k8s(self) -> dict[str, Any]:
        """As an ownerReference of an object the grouper writes: never blocks the owner's
        deletion (which would need the owner's ``finalizers`` permission), not a controller."""
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "blockOwnerDeletion": False,
        }


def _str_map(raw: Any) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items() if v is not None}


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What the grouper reads of one object: the pod, or one of its owners."""

    api_version: str
    kind: str
    name: str
    namespace: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owner_refs: tuple[OwnerRef, ...] = ()
    #: The object's ``spec`` (kept whole: the LeaderWorkerSet size, the StatefulSet policy,
    #: the pod's priorityClassName and nodeName live there).
    spec: Mapping[str, Any] = field(default_factory=dict)
    #: Set when the object is being deleted.
    deleting: bool = False

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> ObjectInfo:
        """From a raw API object (a dict as the API returns it)."""
        meta = obj.get("metadata") or {}
        refs = meta.get("ownerReferences") or []
        spec = obj.get("spec")
        return cls(
            api_version=str(obj.get("apiVersion") or ""),
            kind=str(obj.get("kind") or ""),
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or ""),
            uid=str(meta.get("uid") or ""),
            labels=_str_map(meta.get("labels")),
            annotations=_str_map(meta.get("annotations")),
            owner_refs=tuple(OwnerRef.from_k8s(r) for r in refs if isinstance(r, Mapping)),
            spec=spec if isinstance(spec, Mapping) else {},
            deleting=bool(meta.get("deletionTimestamp")),
        )

    @property
    def group(self) -> str:
        """The API group ("" for the core group)."""
        return split_api_version(self.api_version)[0]

    @property
    def version(self) -> str:
        """The API version within the group."""
        return split_api_version(self.api_version)[1]

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    def describe(self) -> str:
        """``Kind/name`` for messages."""
        return f"{self.kind}/{self.name}"

    def as_owner(self) -> OwnerRef:
        """A reference to this object, for an ownerReference."""
        return OwnerRef(self.api_version, self.kind, self.name, self.uid)

    def label_or_annotation(self, key: str) -> str | None:
        """The value of ``key`` as an annotation, else as a label, else None."""
        if key in self.annotations:
            return self.annotations[key]
        return self.labels.get(key)


def controller_ref(obj: ObjectInfo) -> OwnerRef | None:
    """The owner reference to follow upwards, or None for a top owner."""
    if not obj.owner_refs:
        return None
    for ref in obj.owner_refs:
        if ref.controller:
            return ref
    return obj.owner_refs[0]


def skip_requested(pod: ObjectInfo, chain: Sequence[ObjectInfo] = ()) -> ObjectInfo | None:
    """The first object (pod, then owners upwards) carrying ``kai.scheduler/skip-podgrouper:
    "true"`` as an annotation or label, or None. Only the exact value ``true`` counts."""
    for obj in (pod, *chain):
        if (obj.label_or_annotation(SKIP_KEY) or "").strip().lower() == "true":
            return obj
    return None
