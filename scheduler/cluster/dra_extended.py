"""Extended resources backed by DRA: a pod asks ``example.com/gpu: 2`` in a container's
resources, and a DeviceClass serves that name, so nodes without a device plugin for it give
the devices through Dynamic Resource Allocation (Kubernetes' DRAExtendedResource, stable in the
release we test against).

What Kubernetes defines, and this module follows:

- **Which class serves a name** (:func:`classes_by_resource`): a DeviceClass serves its
  ``spec.extendedResourceName`` and, always, ``deviceclass.resource.kubernetes.io/<class>``.
  When two classes name the same resource the newer one wins (the name breaks a tie: the
  lower one wins), so a migration from one class to another works.
- **Per node**: a requested resource the node advertises in ``status.allocatable`` is taken
  from there (a device plugin); one it does not advertise and a class serves is allocated
  through DRA; one neither way cannot run there.
- **The claim** (:func:`special_claim`): the devices of all such resources of the pod are one
  ResourceClaim the scheduler creates for it (owned by the pod, annotation
  ``resource.kubernetes.io/extended-resource-claim: "true"``, generated name
  ``<pod>-extended-resources-``). Each long-lived container (regular containers and sidecar
  init containers) gets its own request ``container-<i>-request-<j>`` (``i``: index among init
  containers then containers; ``j``: index of the resource among the container's requested
  names in sorted order) for ``count`` devices of the class; an init container that runs
  before them first uses the requests of the long-lived containers after it, and asks for
  the rest in a request of its own; init containers share the largest such request (they run
  one after another). The pod's status then maps each (container, resource) to its requests
  (``status.extendedResourceClaimStatus.requestMappings``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from scheduler.cluster.dra import DeviceClass, DeviceRequest, RequestAlternative, ResourceClaim
from scheduler.cluster.pod import ContainerExtended

__all__ = [
    "DEVICE_CLASS_PREFIX",
    "EXTENDED_CLAIM_ANNOTATION",
    "ContainerExtended",
    "RequestMapping",
    "SpecialClaim",
    "backed_on_node",
    "classes_by_resource",
    "special_claim",
    "special_claim_key",
]

#: The implicit extended resource name of every DeviceClass: this prefix + the class name.
DEVICE_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
#: Marks the claim the scheduler made for a pod's extended resources.
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


@dataclass(frozen=True, slots=True)
class RequestMapping:
    """``status.extendedResourceClaimStatus.requestMappings[]`` of a pod."""

    container: str
    resource: str
    request: str


@dataclass(frozen=True, slots=True)
class SpecialClaim:
    """The claim for a pod's extended resources on one node, and its request mappings."""

    claim: ResourceClaim
    mappings: tuple[RequestMapping, ...]


def classes_by_resource(classes: Iterable[DeviceClass]) -> dict[str, DeviceClass]:
    """Resource name -> the DeviceClass that serves it (see the module docstring)."""
    out: dict[str, DeviceClass] = {}
    explicit: dict[str, DeviceClass] = {}
    for cls in classes:
        out[DEVICE_CLASS_PREFIX + cls.name] = cls
        name = cls.extended_resource_name
        if not name:
            continue
        known = explicit.get(name)
        if known is not None:
            mine, theirs = cls.created, known.created
            if mine < theirs or (mine == theirs and cls.name >= known.name):
                continue
        explicit[name] = cls
    out.update(explicit)
    return out


def backed_on_node(
    requested: Iterable[str], allocatable: Mapping[str, int], served: Mapping[str, DeviceClass]
) -> tuple[str, ...]:
    """The requested resources a node gives through DRA: served by a class and not in the
    node's allocatable (sorted)."""
    return tuple(sorted(r for r in set(requested) if r in served and allocatable.get(r, 0) <= 0))


def special_claim_key(namespace: str, pod_name: str) -> str:
    """The key under which a cycle tracks the claim it will create for a pod (the real name
    is generated at creation; ``<`` cannot appear in one)."""
    return f"{namespace}/<extended-resources:{pod_name}>"


def _request_name(c: ContainerExtended, resource: str) -> str:
    names = sorted(n for n, _ in c.requests)
    return f"container-{c.index}-request-{names.index(resource)}"


def special_claim(
    namespace: str,
    pod_name: str,
    containers: Sequence[ContainerExtended],
    resources: Sequence[str],
    served: Mapping[str, DeviceClass],
) -> SpecialClaim | None:
    """The claim for ``resources`` (those the node gives through DRA) of a pod, or None when
    its containers ask for none of them."""
    requests: list[DeviceRequest] = []
    mappings: list[RequestMapping] = []
    for resource in sorted(resources):
        cls = served[resource]
        long_lived: dict[int, tuple[str, int]] = {}  # container index -> (request, count)
        long_maps: list[RequestMapping] = []
        for c in containers:
            count = dict(c.requests).get(resource, 0)
            if c.short_lived or count <= 0:
                continue
            name = _request_name(c, resource)
            long_lived[c.index] = (name, count)
            long_maps.append(RequestMapping(c.name, resource, name))
        largest: tuple[str, int] | None = None
        short_names: set[str] = set()
        short_maps: list[RequestMapping] = []
        for c in containers:
            count = dict(c.requests).get(resource, 0)
            if not c.short_lived or count <= 0:
                continue
            # Long-lived containers after this init container run with it: use theirs first.
            covered = 0
            for index in sorted(i for i in long_lived if i > c.index):
                name, n = long_lived[index]
                covered += n
                short_maps.append(RequestMapping(c.name, resource, name))
                if covered >= count:
                    break
            if covered >= count:
                continue
            name = _request_name(c, resource)
            short_names.add(name)
            short_maps.append(RequestMapping(c.name, resource, name))
            if largest is None or largest[1] < count - covered:
                largest = (name, count - covered)
        if largest is not None and len(short_names) > 1:
            short_maps = [
                RequestMapping(m.container, m.resource, largest[0])
                if m.request in short_names
                else m
                for m in short_maps
            ]
        wanted = [*([largest] if largest is not None else []), *long_lived.values()]
        for name, count in wanted:
            alt = RequestAlternative(name, cls.name, count=count)
            requests.append(DeviceRequest(name, (alt,)))
        mappings += long_maps + short_maps
    if not requests:
        return None
    requests.sort(key=lambda r: r.name)
    name = special_claim_key(namespace, pod_name).split("/", 1)[1]
    return SpecialClaim(ResourceClaim(namespace, name, "", tuple(requests)), tuple(mappings))
