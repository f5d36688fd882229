"""A test "driver" for Dynamic Resource Allocation (``resource.k8s.io/v1``) on kwok nodes.

Nothing runs on a kwok node, so no kubelet plugin publishes devices: :class:`TestDriver`
does what a DRA driver's kubelet plugin would, from the test process. Per node it publishes
one ResourceSlice (pool = the node's name) with ``gpus`` devices ``gpu-0`` ... carrying

- ``model`` (string attribute, e.g. ``"a100"``),
- ``index`` (int attribute, the device's position on the node),
- ``memory`` (capacity, a quantity such as ``"80Gi"``),

and owned by the Node, so the garbage collector removes them with the node (kubelet
plugins do the same). The driver's name is unique per test run: slices and DeviceClasses
are cluster-scoped and the control plane is shared by every test of the session, so a
class that selects ``device.driver == <this driver>`` sees only this test's devices.

The builders return manifests as dicts: :meth:`TestDriver.device_class`,
:func:`claim_template` and :func:`resource_claim` (one request: ``exactly`` a count of a
class with CEL selectors, or ``firstAvailable`` alternatives), and :func:`with_claims`, which
adds ``spec.resourceClaims`` (templates or named claims) to a pod from
:func:`tests.e2e.scheduler_process.pod_manifest` and lets its container use them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from testenv import ControlPlane

__all__ = [
    "API_VERSION",
    "DeviceSpec",
    "TestDriver",
    "claim_spec",
    "claim_template",
    "request",
    "resource_claim",
    "with_claims",
]

API_VERSION = "resource.k8s.io/v1"


@dataclass(frozen=True)
class DeviceSpec:
    """The devices of one node: ``count`` devices of one ``model`` with ``memory`` each."""

    count: int = 8
    model: str = "a100"
    memory: str = "80Gi"


def request(
    name: str = "gpu",
    *,
    device_class: str,
    selectors: Sequence[str] = (),
    count: int = 1,
    all_devices: bool = False,
) -> dict[str, Any]:
    """One ``exactly`` request: ``count`` devices of ``device_class`` passing the CEL
    ``selectors`` (``all_devices``: allocationMode All instead)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if all_devices:
        exactly["allocationMode"] = "All"
    else:
        exactly["count"] = count
    return {"name": name, "exactly": exactly}


def first_available(
    name: str, alternatives: Sequence[tuple[str, str, Sequence[str], int]]
) -> dict[str, Any]:
    """A ``firstAvailable`` request: (sub-request name, class, CEL selectors, count) tried in
    order."""
    subs = []
    for sub, device_class, selectors, count in alternatives:
        item: dict[str, Any] = {"name": sub, "deviceClassName": device_class, "count": count}
        if selectors:
            item["selectors"] = [{"cel": {"expression": e}} for e in selectors]
        subs.append(item)
    return {"name": name, "firstAvailable": subs}


def claim_spec(
    requests: Sequence[Mapping[str, Any]], match_attribute: str | None = None
) -> dict[str, Any]:
    """A claim's ``spec``: the requests, and optionally one ``matchAttribute`` constraint
    over all of them (a qualified attribute name, ``domain/name``)."""
    devices: dict[str, Any] = {"requests": [dict(r) for r in requests]}
    if match_attribute is not None:
        devices["constraints"] = [{"matchAttribute": match_attribute}]
    return {"devices": devices}


def claim_template(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceClaimTemplate (namespaced; apply it in the pods' namespace)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": dict(spec)},
    }


def resource_claim(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A standalone ResourceClaim (namespaced)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": dict(spec),
    }


def with_claims(
    pod: dict[str, Any],
    *,
    templates: Mapping[str, str] | None = None,
    claims: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``pod`` with ``spec.resourceClaims``: ``templates`` maps the pod's claim name to a
    ResourceClaimTemplate (the ResourceClaim controller makes a claim per pod), ``claims``
    to an existing ResourceClaim (shared). The first container uses every claim."""
    entries: list[dict[str, str]] = []
    for name, template in (templates or {}).items():
        entries.append({"name": name, "resourceClaimTemplateName": template})
    for name, claim in (claims or {}).items():
        entries.append({"name": name, "resourceClaimName": claim})
    pod["spec"]["resourceClaims"] = entries
    resources = pod["spec"]["containers"][0].setdefault("resources", {})
    resources["claims"] = [{"name": e["name"]} for e in entries]
    return pod


@dataclass
class TestDriver:
    """Publishes devices for kwok nodes and removes them again (:meth:`cleanup`)."""

    __test__ = False  # not a pytest test class, despite the name

    cp: ControlPlane
    #: The driver name, unique per instance (a DNS subdomain, as DRA requires).
    name: str = field(default_factory=lambda: f"gpu-{uuid.uuid4().hex[:8]}.e2e.kai.example.com")
    _slices: list[str] = field(default_factory=list)
    _classes: list[str] = field(default_factory=list)

    @property
    def domain(self) -> str:
        """The attribute domain (the driver name): qualified names are ``domain/name``."""
        return self.name

    def qualified(self, attribute: str) -> str:
        """``domain/attribute``, e.g. for a ``matchAttribute`` constraint."""
        return f"{self.name}/{attribute}"

    def slice_manifest(
        self,
        node: str,
        node_uid: str | None,
        devices: DeviceSpec,
        *,
        generation: int = 1,
    ) -> dict[str, Any]:
        """The ResourceSlice of ``node`` (pool named after the node)."""
        meta: dict[str, Any] = {"name": self._slice_name(node)}
        if node_uid:
            # Owned by the node: the garbage collector deletes it when the node goes.
            meta["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
            ]
        return {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": meta,
            "spec": {
                "driver": self.name,
                "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": f"gpu-{i}",
                        "attributes": {
                            "model": {"string": devices.model},
                            "index": {"int": i},
                        },
                        "capacity": {"memory": {"value": devices.memory}},
                    }
                    for i in range(devices.count)
                ],
            },
        }

    def _slice_name(self, node: str) -> str:
        return f"{node}-{self.name.split('.', 1)[0]}"

    def publish(
        self, nodes: Sequence[str], devices: DeviceSpec | Mapping[str, DeviceSpec] = DeviceSpec()
    ) -> list[str]:
        """Create one slice per node (``devices`` for all, or per node name); returns the
        slice names."""
        uids = self._node_uids(nodes)
        items = []
        for node in nodes:
            spec = devices if isinstance(devices, DeviceSpec) else devices[node]
            items.append(self.slice_manifest(node, uids.get(node), spec))
        self._create(items)
        names = [self._slice_name(n) for n in nodes]
        self._slices.extend(names)
        return names

    def device_class(
        self, name: str, selectors: Sequence[str] = (), extended_resource: str | None = None
    ) -> dict[str, Any]:
        """A DeviceClass picking this driver's devices (plus ``selectors``) by CEL; with
        ``extended_resource``, pods asking that extended resource get its devices."""
        exprs = [f'device.driver == "{self.name}"', *selectors]
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in exprs]}
        if extended_resource is not None:
            spec["extendedResourceName"] = extended_resource
        return {
            "apiVersion": API_VERSION,
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": spec,
        }

    def create_class(
        self, name: str, selectors: Sequence[str] = (), extended_resource: str | None = None
    ) -> str:
        """Create :meth:`device_class` (deleted by :meth:`cleanup`); returns its name."""
        self._create([self.device_class(name, selectors, extended_resource)])
        self._classes.append(name)
        return name

    def cleanup(self) -> None:
        """Delete the slices and classes this driver made (missing ones are ignored)."""
        targets = [f"resourceslice/{n}" for n in self._slices]
        targets += [f"deviceclass/{n}" for n in self._classes]
        if targets:
            self.cp.kubectl("delete", "--ignore-not-found", "--wait=false", *targets, check=False)
        self._slices.clear()
        self._classes.clear()

    def _node_uids(self, nodes: Sequence[str]) -> dict[str, str]:
        out = self.cp.kubectl("get", "nodes", *nodes, "-o", "json").stdout
        data = json.loads(out)
        items = data.get("items", [data])
        return {i["metadata"]["name"]: i["metadata"]["uid"] for i in items}

    def _create(self, items: list[dict[str, Any]]) -> None:
        doc = {"apiVersion": "v1", "kind": "List", "items": items}
        self.cp.kubectl("create", "-f", "-", input=json.dumps(doc))
