"""Scenario YAML with DRA objects: deviceClasses, resourceSlices and resourceClaims become the
scenario's DraView; every mistake names its field."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.cluster.dra_alloc import AllocationFailure, allocate_pod_claims
from scheduler.cluster.dracel import Semver
from scheduler.simulate.scenario import ScenarioError, load_scenario, parse_scenario

DRIVER = "gpu.example.com"
H100 = f'device.attributes["{DRIVER}"].model == "h100"'

BASE: dict[str, Any] = {
    "name": "dra",
    "nodes": [{"name": "dgx", "count": 2, "gpus": 0}],
    "queues": [{"metadata": {"name": "team"}, "spec": {"resources": {"gpu": {"quota": 8}}}}],
    "jobs": [],
    "deviceClasses": [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        }
    ],
    "resourceSlices": [
        {
            "metadata": {"name": f"dgx-{n}-gpus"},
            "spec": {
                "driver": DRIVER,
                "nodeName": f"dgx-{n}",
                "pool": {"name": f"dgx-{n}"},
                "devices": [
                    {
                        "name": f"gpu-{i}",
                        "attributes": {
                            "model": {"string": "a100" if n == 0 else "h100"},
                            "driverVersion": {"version": "1.2.3"},
                        },
                        "capacity": {"memory": {"value": "80Gi"}},
                    }
                    for i in range(2)
                ],
            },
        }
        for n in range(2)
    ],
    "resourceClaims": [
        {
            "metadata": {"name": "h100", "namespace": "team"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "g",
                            "exactly": {
                                "deviceClassName": DRIVER,
                                "count": 2,
                                "selectors": [{"cel": {"expression": H100}}],
                            },
                        }
                    ]
                }
            },
        }
    ],
}


def scenario(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


def test_dra_objects_fill_the_view() -> None:
    view = parse_scenario(scenario()).dra
    assert view is not None
    assert [c.name for c in view.classes] == [DRIVER]
    assert [s.node_name for s in view.slices] == ["dgx-0", "dgx-1"]
    attrs = dict(view.slices[0].devices[0].attributes)
    assert attrs["driverVersion"] == Semver("1.2.3")
    assert [c.key for c in view.claims] == ["team/h100"]
    # The view allocates: the h100 claim fits on dgx-1 only.
    claim = view.claim_by_key["team/h100"]
    catalog = view.catalog()
    assert isinstance(
        allocate_pod_claims(catalog, (claim,), "dgx-0", {}, view.busy), AllocationFailure
    )
    got = allocate_pod_claims(catalog, (claim,), "dgx-1", {}, view.busy)
    assert not isinstance(got, AllocationFailure)
    assert {r.device for r in got[0].results} == {"gpu-0", "gpu-1"}


def test_scenario_without_devices_has_no_view() -> None:
    data = scenario()
    for key in ("deviceClasses", "resourceSlices", "resourceClaims"):
        del data[key]
    assert parse_scenario(data).dra is None


def _set(data: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


REQ = ["resourceClaims", 0, "spec", "devices", "requests", 0]


@pytest.mark.parametrize(
    ("path", "value", "field", "words"),
    [
        (["deviceClasses"], {"a": 1}, "deviceClasses", "list"),
        (["deviceClasses", 0, "metadata", "name"], None, "deviceClasses[0].metadata.name", ""),
        (
            ["deviceClasses", 0, "spec", "selectors", 0, "cel", "expression"],
            "device.driver ==",
            "deviceClasses[0].spec.selectors[0].cel.expression",
            "",
        ),
        (["resourceSlices", 0], "junk", "resourceSlices[0]", ""),
        (
            ["resourceSlices", 1, "metadata", "name"],
            "dgx-0-gpus",
            "resourceSlices[1].metadata.name",
            "defined twice",
        ),
        (
            ["resourceSlices", 0, "spec", "nodeName"],
            "dgx",
            "resourceSlices[0].spec.nodeName",
            "NAME-0",
        ),
        (
            ["resourceSlices", 0, "spec", "devices", 1, "capacity", "memory", "value"],
            "lots",
            "resourceSlices[0].spec.devices[1].capacity[memory].value",
            "",
        ),
        (
            [*REQ, "exactly", "deviceClassName"],
            "nic.example.com",
            "resourceClaims[0].spec.devices.requests[0].exactly.deviceClassName",
            "add it to deviceClasses",
        ),
        (
            [*REQ, "exactly", "selectors", 0, "cel", "expression"],
            "device.attributes[",
            "resourceClaims[0].spec.devices.requests[0].exactly.selectors[0].cel.expression",
            "",
        ),
        (
            [*REQ, "exactly", "count"],
            0,
            "resourceClaims[0].spec.devices.requests[0].exactly.count",
            "at least 1",
        ),
        (
            REQ,
            {"name": "g", "firstAvailable": [{"name": "a", "deviceClassName": "missing"}]},
            "resourceClaims[0].spec.devices.requests[0].firstAvailable[0].deviceClassName",
            "missing",
        ),
    ],
)
def test_mistakes_name_the_field(path: list[Any], value: Any, field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(_set(scenario(), path, value))
    assert err.value.field == field, err.value
    assert words in str(err.value)


def test_duplicate_claims_are_refused() -> None:
    data = scenario()
    data["resourceClaims"].append(copy.deepcopy(data["resourceClaims"][0]))
    with pytest.raises(ScenarioError, match="defined twice") as err:
        parse_scenario(data)
    assert err.value.field == "resourceClaims[1].metadata.name"


def test_loads_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "dra.yaml"
    path.write_text(yaml.safe_dump(scenario()))
    view = load_scenario(path).dra
    assert view is not None and len(view.slices) == 2


def test_scenario_without_devices_does_not_import_cel() -> None:
    code = (
        "import sys\n"
        "from scheduler.simulate.scenario import parse_scenario\n"
        "from scheduler.cluster.snapshot import Snapshot\n"
        f"data = {BASE!r}\n"
        "for k in ('deviceClasses', 'resourceSlices', 'resourceClaims'): del data[k]\n"
        "parse_scenario(data)\n"
        "Snapshot.from_json(Snapshot().to_json())\n"
        "print('cel' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
