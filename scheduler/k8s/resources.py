"""Where each kind lives in the API: group, version, plural, scope, and its URL paths.

Two APIs name their kinds alike (KAI's ``scheduling.run.ai`` and Volcano's
``scheduling.volcano.sh`` both have a ``Queue`` and a ``PodGroup``), so the watcher and the
cache key every kind by :attr:`ResourceKind.key`: the kind itself, or ``VolcanoQueue`` /
``VolcanoPodGroup`` for Volcano's.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

__all__ = [
    "BINDING",
    "CLUSTER_SCOPED_KINDS",
    "CONFIG_MAP",
    "DEGRADABLE_KINDS",
    "DEVICE_CLASS",
    "DRA_KINDS",
    "EVENT",
    "KINDS",
    "LEASE",
    "NODE",
    "PERSISTENT_VOLUME",
    "PERSISTENT_VOLUME_CLAIM",
    "POD",
    "PODGROUP",
    "POD_DISRUPTION_BUDGET",
    "PRIORITY_CLASS",
    "QUEUE",
    "RESOURCE_CLAIM",
    "RESOURCE_SLICE",
    "STORAGE_CLASS",
    "VOLCANO_KINDS",
    "VOLCANO_PODGROUP",
    "VOLCANO_QUEUE",
    "VOLUME_KINDS",
    "WATCHED_KINDS",
    "ResourceKind",
    "kind_of",
]


@dataclass(frozen=True, slots=True)
class ResourceKind:
    """One resource type of the API (``group`` is empty for the core group)."""

    kind: str
    group: str
    version: str
    plural: str
    namespaced: bool
    #: The name the watcher and the cache know this kind by when ``kind`` alone is ambiguous.
    name: str = ""

    @property
    def key(self) -> str:
        """The kind's key in :data:`KINDS`, the watcher and the cache."""
        return self.name or self.kind

    @property
    def api_version(self) -> str:
        """``group/version``, or just ``version`` for the core group (``v1``)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def base(self) -> str:
        """``/api/v1`` or ``/apis/<group>/<version>``."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def list_path(self, namespace: str | None = None) -> str:
        """Collection URL: all namespaces when ``namespace`` is None (or cluster-scoped)."""
        if self.namespaced and namespace:
            return f"{self.base}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{self.base}/{self.plural}"

    def object_path(self, namespace: str | None, name: str, subresource: str = "") -> str:
        """One object's URL, optionally a subresource (``status``, ``binding``, ``eviction``)."""
        path = f"{self.list_path(namespace if self.namespaced else None)}/{quote(name, safe='')}"
        return f"{path}/{subresource}" if subresource else path


POD = ResourceKind("Pod", "", "v1", "pods", namespaced=True)
NODE = ResourceKind("Node", "", "v1", "nodes", namespaced=False)
QUEUE = ResourceKind("Queue", "scheduling.run.ai", "v2", "queues", namespaced=False)
PODGROUP = ResourceKind("PodGroup", "scheduling.run.ai", "v2alpha2", "podgroups", namespaced=True)
PRIORITY_CLASS = ResourceKind(
    "PriorityClass", "scheduling.k8s.io", "v1", "priorityclasses", namespaced=False
)
POD_DISRUPTION_BUDGET = ResourceKind(
    "PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets", namespaced=True
)
#: Read for the volumes of pending pods (:mod:`scheduler.cluster.volumes`).
PERSISTENT_VOLUME_CLAIM = ResourceKind(
    "PersistentVolumeClaim", "", "v1", "persistentvolumeclaims", namespaced=True
)
PERSISTENT_VOLUME = ResourceKind(
    "PersistentVolume", "", "v1", "persistentvolumes", namespaced=False
)
STORAGE_CLASS = ResourceKind(
    "StorageClass", "storage.k8s.io", "v1", "storageclasses", namespaced=False
)
#: Dynamic Resource Allocation (``resource.k8s.io/v1``): device classes and the devices drivers
#: publish are cluster-wide; claims live with the pods that use them. The scheduler writes
#: claims' ``status`` (allocation, reservedFor) before binding their pods.
DEVICE_CLASS = ResourceKind(
    "DeviceClass", "resource.k8s.io", "v1", "deviceclasses", namespaced=False
)
RESOURCE_SLICE = ResourceKind(
    "ResourceSlice", "resource.k8s.io", "v1", "resourceslices", namespaced=False
)
RESOURCE_CLAIM = ResourceKind(
    "ResourceClaim", "resource.k8s.io", "v1", "resourceclaims", namespaced=True
)
#: Written, not watched: the device ConfigMaps of GPU-sharing pods.
CONFIG_MAP = ResourceKind("ConfigMap", "", "v1", "configmaps", namespaced=True)
#: Written, not watched.
BINDING = ResourceKind("Binding", "", "v1", "bindings", namespaced=True)
EVENT = ResourceKind("Event", "events.k8s.io", "v1", "events", namespaced=True)
LEASE = ResourceKind("Lease", "coordination.k8s.io", "v1", "leases", namespaced=True)
#: Volcano's API, read natively when its CRDs are installed (docs/api.md, "Volcano").
VOLCANO_QUEUE = ResourceKind(
    "Queue", "scheduling.volcano.sh", "v1beta1", "queues", namespaced=False, name="VolcanoQueue"
)
VOLCANO_PODGROUP = ResourceKind(
    "PodGroup",
    "scheduling.volcano.sh",
    "v1beta1",
    "podgroups",
    namespaced=True,
    name="VolcanoPodGroup",
)

#: Every kind by its key (:attr:`ResourceKind.key`).
KINDS: dict[str, ResourceKind] = {
    k.key: k
    for k in (
        POD,
        NODE,
        QUEUE,
        PODGROUP,
        PRIORITY_CLASS,
        POD_DISRUPTION_BUDGET,
        PERSISTENT_VOLUME_CLAIM,
        PERSISTENT_VOLUME,
        STORAGE_CLASS,
        DEVICE_CLASS,
        RESOURCE_SLICE,
        RESOURCE_CLAIM,
        BINDING,
        EVENT,
        LEASE,
        VOLCANO_QUEUE,
        VOLCANO_PODGROUP,
    )
}
#: The kinds the scheduler lists and watches to build its snapshot.
WATCHED_KINDS: tuple[str, ...] = (
    "Pod",
    "Node",
    "Queue",
    "PodGroup",
    "PriorityClass",
    "PodDisruptionBudget",
    "PersistentVolumeClaim",
    "PersistentVolume",
    "StorageClass",
    "DeviceClass",
    "ResourceSlice",
    "ResourceClaim",
)
#: The kinds that say where a pod's volumes may be used (pods that use none never wait for
#: them).
VOLUME_KINDS: tuple[str, ...] = ("PersistentVolumeClaim", "PersistentVolume", "StorageClass")
#: The kinds of Dynamic Resource Allocation (pods that use no ResourceClaim never wait for
#: them).
DRA_KINDS: tuple[str, ...] = ("DeviceClass", "ResourceSlice", "ResourceClaim")
#: Volcano's kinds, watched too by the scheduler process (``scheduler.runner``). Optional:
#: without Volcano's CRDs they count as listed with no objects and their list is retried.
VOLCANO_KINDS: tuple[str, ...] = (VOLCANO_QUEUE.key, VOLCANO_PODGROUP.key)
#: Watched kinds the scheduler can work without: a list that is forbidden (an RBAC role from
#: an older release) or not found counts as listed with no objects, so it never holds up
#: scheduling. Without PodDisruptionBudgets the plan cannot honour them, but the Eviction API
#: still does (a refused eviction drops the plan that needed it). Without the volume kinds
#: only pods that use PersistentVolumeClaims wait, with a reason naming what to grant; without
#: the DRA kinds (an API server that does not serve ``resource.k8s.io/v1``, or a role from an
#: older release) only pods that use ResourceClaims wait.
DEGRADABLE_KINDS: frozenset[str] = frozenset(
    {"PodDisruptionBudget", *VOLUME_KINDS, *DRA_KINDS, *VOLCANO_KINDS}
)
#: Keys of the cluster-scoped kinds the cache stores.
CLUSTER_SCOPED_KINDS: frozenset[str] = frozenset(k.key for k in KINDS.values() if not k.namespaced)


def kind_of(name: str) -> ResourceKind:
    """The :class:`ResourceKind` for a kind key; ``KeyError`` names the known kinds."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown kind {name!r}; known: {', '.join(sorted(KINDS))}") from None
