"""Dynamic Resource Allocation objects (``resource.k8s.io/v1``) as domain types.

- :class:`DeviceClass`: CEL selectors every device of the class must pass (and an optional
  ``extendedResourceName``).
- :class:`ResourceSlice`: one driver's devices in one *pool*, published for one node
  (``nodeName``), for the nodes a ``nodeSelector`` picks, or for every node (``allNodes``).
  A pool may span several slices (``pool.resourceSliceCount``); only slices of the newest
  ``pool.generation`` count (see :func:`current_slices`).
- :class:`ResourceClaim`: the requests (``exactly`` one kind of device, or ``firstAvailable``
  alternatives tried in order), ``matchAttribute`` constraints, and the status the scheduler
  writes: ``allocation`` (results and node selector) and ``reservedFor``.

Parsing from the API's JSON form is in :mod:`scheduler.cluster.draspec`; choosing devices
in :mod:`scheduler.cluster.dra_alloc`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from scheduler.cluster.dracel import AttributeValue
from scheduler.cluster.selectors import NodeSelectorTerm

__all__ = [
    "DRA_GROUP",
    "AllocationMode",
    "ClaimAllocation",
    "ConsumerRef",
    "Device",
    "DeviceClass",
    "DeviceConstraint",
    "DeviceId",
    "DeviceRequest",
    "DeviceResult",
    "RequestAlternative",
    "ResourceClaim",
    "ResourceSlice",
    "current_slices",
]

DRA_GROUP = "resource.k8s.io"
#: ``ExactCount`` takes ``count`` devices; ``All`` takes every matching device in reach.
AllocationMode = Literal["ExactCount", "All"]
#: A device as the allocation names it: (driver, pool, device name).
DeviceId = tuple[str, str, str]


# --- types -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a slice. Attribute and capacity names are as published: qualified
    (``domain/name``) or in the driver's domain."""

    name: str
    attributes: tuple[tuple[str, AttributeValue], ...] = ()
    capacity: tuple[tuple[str, Fraction], ...] = ()
    allow_multiple_allocations: bool = False
    #: Why the device is never allocated (empty: it may be): it uses a DRA feature this
    #: scheduler does not evaluate yet (device taints, shared counters), and allocating it
    #: as a plain device could break what that feature promises.
    left_out: str = ""

    def attribute(self, qualified: str, driver: str) -> AttributeValue | None:
        """The value of ``domain/name`` (an unqualified published name is in ``driver``'s
        domain), or None."""
        for name, value in self.attributes:
            full = name if "/" in name else f"{driver}/{name}"
            if full == qualified:
                return value
        return None


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    """Devices of one driver in one pool, and the nodes that reach them: exactly one of
    ``node_name``, ``node_selector`` (terms, any may match) or ``all_nodes``."""

    name: str
    driver: str
    pool: str
    generation: int = 0
    slice_count: int = 1
    node_name: str | None = None
    node_selector: tuple[NodeSelectorTerm, ...] | None = None
    all_nodes: bool = False
    devices: tuple[Device, ...] = ()

    def reaches(self, node_name: str, labels: Mapping[str, str]) -> bool:
        """True when a pod on ``node_name`` (with ``labels``) can use these devices."""
        if self.node_name is not None:
            return self.node_name == node_name
        if self.all_nodes:
            return True
        if self.node_selector is not None:
            with_name = {**labels, "metadata.name": node_name}
            return any(t.matches(with_name) for t in self.node_selector)
        return False


@dataclass(frozen=True, slots=True)
class DeviceClass:
    """A class of devices: every selector must pass for a device to belong to it."""

    name: str
    selectors: tuple[str, ...] = ()
    extended_resource_name: str | None = None
    #: ``metadata.creationTimestamp`` (seconds; 0 unknown): of two classes serving the same
    #: extended resource, the newer one wins (:mod:`scheduler.cluster.dra_extended`).
    created: float = 0.0


@dataclass(frozen=True, slots=True)
class RequestAlternative:
    """One way to satisfy a request: a class, extra selectors, and how many devices.
    ``name`` is what the allocation result names (``req`` or ``req/sub``)."""

    name: str
    device_class: str
    selectors: tuple[str, ...] = ()
    mode: AllocationMode = "ExactCount"
    count: int = 1
    admin_access: bool = False


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """A request of a claim: ``exactly`` gives one alternative; ``firstAvailable`` gives
    several, and the first that can be satisfied is used."""

    name: str
    alternatives: tuple[RequestAlternative, ...]
    first_available: bool = False


@dataclass(frozen=True, slots=True)
class DeviceConstraint:
    """``matchAttribute``: the devices of ``requests`` (all requests when empty) share the
    value of the qualified attribute ``attribute``."""

    attribute: str
    requests: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceResult:
    """One allocated device (``status.allocation.devices.results[]``)."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False

    @property
    def device_id(self) -> DeviceId:
        """(driver, pool, device)."""
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    """``status.allocation``: the devices, and the nodes that reach all of them (None: any)."""

    results: tuple[DeviceResult, ...]
    node_selector: tuple[NodeSelectorTerm, ...] | None = None


@dataclass(frozen=True, slots=True)
class ConsumerRef:
    """An entry of ``status.reservedFor`` (normally a pod)."""

    resource: str
    name: str
    uid: str
    api_group: str = ""


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    """A ResourceClaim: what it asks for and what it holds."""

    namespace: str
    name: str
    uid: str = ""
    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[DeviceConstraint, ...] = ()
    allocation: ClaimAllocation | None = None
    reserved_for: tuple[ConsumerRef, ...] = ()

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


def current_slices(
    slices: Iterable[ResourceSlice],
) -> tuple[list[ResourceSlice], set[tuple[str, str]]]:
    """The slices of each pool's newest generation, and the (driver, pool) pairs that are
    incomplete (fewer slices seen than ``resourceSliceCount``): a driver mid-update. Older
    generations are dropped, as Kubernetes does."""
    newest: dict[tuple[str, str], int] = {}
    items = list(slices)
    for s in items:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    current = [s for s in items if s.generation == newest[(s.driver, s.pool)]]
    seen: dict[tuple[str, str], int] = {}
    wanted: dict[tuple[str, str], int] = {}
    for s in current:
        key = (s.driver, s.pool)
        seen[key] = seen.get(key, 0) + 1
        wanted[key] = s.slice_count
    incomplete = {k for k, n in seen.items() if n < wanted[k]}
    return current, incomplete
