"""Parsing resource.k8s.io/v1 objects (scheduler.cluster.draspec): the shapes of the API,
and bad input reported as a DraSpecError naming the field (never another exception)."""

from __future__ import annotations

import contextlib
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cluster.dra import current_slices
from scheduler.cluster.dracel import Semver
from scheduler.cluster.draspec import (
    DraSpecError,
    device_class_from_k8s,
    node_selector_to_k8s,
    resource_claim_from_k8s,
    resource_slice_from_k8s,
)


def slice_obj(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "driver": "gpu.example.com",
        "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
        "nodeName": "n1",
        "devices": [
            {
                "name": "gpu-0",
                "attributes": {
                    "model": {"string": "a100"},
                    "index": {"int": 0},
                    "healthy": {"bool": True},
                    "driverVersion": {"version": "1.2.3"},
                    "ext.example.com/family": {"string": "ampere"},
                },
                "capacity": {"memory": {"value": "80Gi"}},
            }
        ],
    }
    base.update(spec)
    return {"apiVersion": "resource.k8s.io/v1", "metadata": {"name": "s1"}, "spec": base}


def claim_obj(**devices: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "c1", "namespace": "ns", "uid": "u1"},
        "spec": {"devices": devices},
    }


def test_device_class() -> None:
    dc = device_class_from_k8s(
        {
            "metadata": {"name": "gpu.example.com"},
            "spec": {
                "selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}],
                "extendedResourceName": "example.com/gpu",
            },
        }
    )
    assert dc.name == "gpu.example.com"
    assert dc.selectors == ('device.driver == "gpu.example.com"',)
    assert dc.extended_resource_name == "example.com/gpu"


def test_resource_slice_node_local() -> None:
    s = resource_slice_from_k8s(slice_obj())
    assert (s.driver, s.pool, s.generation, s.slice_count, s.node_name) == (
        "gpu.example.com",
        "n1",
        1,
        1,
        "n1",
    )
    dev = s.devices[0]
    assert dict(dev.attributes)["driverVersion"] == Semver("1.2.3")
    assert dict(dev.capacity)["memory"] == Fraction(80 * 2**30)
    assert dev.attribute("gpu.example.com/model", "gpu.example.com") == "a100"
    assert dev.attribute("ext.example.com/family", "gpu.example.com") == "ampere"
    assert s.reaches("n1", {}) and not s.reaches("n2", {})


def test_resource_slice_node_selector_and_all_nodes() -> None:
    sel = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}
        ]
    }
    s = resource_slice_from_k8s(slice_obj(nodeName=None, nodeSelector=sel))
    assert s.reaches("n5", {"rack": "r1"}) and not s.reaches("n5", {"rack": "r2"})
    assert node_selector_to_k8s(s.node_selector or ()) == sel
    s = resource_slice_from_k8s(slice_obj(nodeName=None, allNodes=True))
    assert s.reaches("anything", {})


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"nodeName": None}, "spec"),
        ({"allNodes": True}, "spec"),
        ({"driver": None}, "spec.driver"),
        ({"pool": {"generation": 1}}, "spec.pool.name"),
        ({"pool": {"name": "p", "resourceSliceCount": 0}}, "spec.pool.resourceSliceCount"),
        (
            {"devices": [{"name": "d", "attributes": {"v": {"version": "1.2"}}}]},
            "spec.devices[0].attributes[v].version",
        ),
        (
            {"devices": [{"name": "d", "attributes": {"v": {"int": 1, "string": "x"}}}]},
            "spec.devices[0].attributes[v]",
        ),
        (
            {"devices": [{"name": "d", "capacity": {"memory": {"value": "lots"}}}]},
            "spec.devices[0].capacity[memory].value",
        ),
        ({"devices": [{"name": "d"}, {"name": "d"}]}, "spec.devices[1].name"),
        ({"devices": "gpu"}, "spec.devices"),
        ({"perDeviceNodeSelection": True, "nodeName": None}, "spec.perDeviceNodeSelection"),
    ],
)
def test_resource_slice_errors_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(DraSpecError) as err:
        resource_slice_from_k8s(slice_obj(**spec))
    assert err.value.field == field


def test_current_slices_keeps_newest_generation_and_flags_incomplete() -> None:
    old = resource_slice_from_k8s(slice_obj(pool={"name": "p", "generation": 1}))
    new = resource_slice_from_k8s(
        slice_obj(pool={"name": "p", "generation": 2, "resourceSliceCount": 2})
    )
    current, incomplete = current_slices([old, new])
    assert current == [new]
    assert incomplete == {("gpu.example.com", "p")}


def test_resource_claim_full_shape() -> None:
    obj = claim_obj(
        requests=[
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpu.example.com",
                    "selectors": [{"cel": {"expression": "true"}}],
                    "count": 2,
                },
            },
            {
                "name": "nic",
                "firstAvailable": [
                    {"name": "fast", "deviceClassName": "nic", "allocationMode": "All"},
                    {"name": "slow", "deviceClassName": "nic"},
                ],
            },
            {"name": "mon", "exactly": {"deviceClassName": "gpu", "adminAccess": True}},
        ],
        constraints=[{"requests": ["gpu", "nic/fast"], "matchAttribute": "example.com/numa"}],
    )
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "g0"}
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": "p1", "uid": "pu1"}],
    }
    c = resource_claim_from_k8s(obj)
    assert c.key == "ns/c1"
    gpu, nic, mon = c.requests
    assert gpu.alternatives[0].count == 2 and gpu.alternatives[0].selectors == ("true",)
    assert nic.first_available and [a.name for a in nic.alternatives] == ["nic/fast", "nic/slow"]
    assert nic.alternatives[0].mode == "All"
    assert mon.alternatives[0].admin_access
    assert c.constraints[0].requests == ("gpu", "nic/fast")
    assert c.allocation is not None
    assert c.allocation.results[0].device_id == ("gpu.example.com", "n1", "g0")
    assert c.allocation.node_selector is not None
    assert c.allocation.node_selector[0].matches({"metadata.name": "n1"})
    assert c.reserved_for[0].name == "p1"


@pytest.mark.parametrize(
    ("devices", "field"),
    [
        ({"requests": [{"name": "r"}]}, "spec.devices.requests[0]"),
        (
            {"requests": [{"name": "r", "exactly": {}}]},
            "spec.devices.requests[0].exactly.deviceClassName",
        ),
        (
            {"requests": [{"name": "r", "exactly": {"deviceClassName": "c", "count": 0}}]},
            "spec.devices.requests[0].exactly.count",
        ),
        (
            {
                "requests": [
                    {"name": "r", "exactly": {"deviceClassName": "c", "allocationMode": "Some"}}
                ]
            },
            "spec.devices.requests[0].exactly.allocationMode",
        ),
        (
            {"requests": [{"name": "r", "exactly": {"deviceClassName": "c", "selectors": [{}]}}]},
            "spec.devices.requests[0].exactly.selectors[0].cel",
        ),
        (
            {
                "requests": [{"name": "r", "exactly": {"deviceClassName": "c"}}],
                "constraints": [{"matchAttribute": "numa"}],
            },
            "spec.devices.constraints[0].matchAttribute",
        ),
        (
            {
                "requests": [{"name": "r", "exactly": {"deviceClassName": "c"}}],
                "constraints": [{"requests": ["x"], "matchAttribute": "d/numa"}],
            },
            "spec.devices.constraints[0].requests[0]",
        ),
    ],
)
def test_resource_claim_errors_name_the_field(devices: dict[str, Any], field: str) -> None:
    with pytest.raises(DraSpecError) as err:
        resource_claim_from_k8s(claim_obj(**devices))
    assert err.value.field == field


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "spec",
                    "devices",
                    "requests",
                    "exactly",
                    "firstAvailable",
                    "pool",
                    "nodeName",
                    "allNodes",
                    "nodeSelector",
                    "attributes",
                    "capacity",
                    "value",
                    "int",
                    "string",
                    "version",
                    "deviceClassName",
                    "count",
                    "selectors",
                    "cel",
                    "expression",
                    "status",
                    "allocation",
                    "results",
                    "reservedFor",
                    "metadata",
                    "driver",
                    "constraints",
                    "matchAttribute",
                    "nodeSelectorTerms",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None)
@given(_json)
def test_junk_input_raises_only_dra_spec_error(obj: Any) -> None:
    for parse in (resource_slice_from_k8s, resource_claim_from_k8s, device_class_from_k8s):
        with contextlib.suppress(DraSpecError):  # any other exception fails the test
            parse(obj)
