"""The API server itself validates and defaults Queues and PodGroups from crds/.

Table-driven: every invalid object is rejected with a message that names the field and says
what to fix; valid KAI-style manifests (every KAI field) are accepted unchanged.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from testenv.controlplane import ControlPlane

__all__: list[str] = []

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CRD_NAMES = ("crd/queues.scheduling.run.ai", "crd/podgroups.scheduling.run.ai")

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with crds/ applied and Established."""
    control_plane.kubectl("apply", "-f", str(ROOT / "crds"))
    control_plane.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", *CRD_NAMES, timeout=75
    )
    return control_plane


@pytest.fixture
def queue_name(crds: ControlPlane) -> Generator[str, None, None]:
    """A unique Queue name, deleted after the test."""
    name = f"q-{uuid.uuid4().hex[:8]}"
    yield name
    crds.kubectl("delete", "queue", name, "--ignore-not-found", "--wait=false")


def _queue(name: str, spec: Obj) -> Obj:
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": spec,
    }


def _podgroup(name: str, spec: Obj) -> Obj:
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": spec,
    }


def _create(cp: ControlPlane, obj: Obj, namespace: str | None = None) -> Any:
    args = ["create", "-f", "-", "-o", "json"]
    if namespace:
        args += ["-n", namespace]
    return cp.kubectl(*args, input=json.dumps(obj), check=False)


# (case id, spec, field path in the error, text that says what to fix)
INVALID_QUEUES: list[tuple[str, Obj, str, str]] = [
    (
        "negative-gpu-quota",
        {"resources": {"gpu": {"quota": -2}}},
        "spec.resources.gpu.quota",
        "quota must be >= 0, or -1 for unlimited",
    ),
    (
        "fractional-negative-cpu-quota",
        {"resources": {"cpu": {"quota": -0.5}}},
        "spec.resources.cpu.quota",
        "quota must be >= 0, or -1 for unlimited",
    ),
    (
        "negative-memory-limit",
        {"resources": {"memory": {"quota": 0, "limit": -3}}},
        "spec.resources.memory.limit",
        "limit must be >= 0, or -1 for unlimited",
    ),
    (
        "limit-below-quota",
        {"resources": {"gpu": {"quota": 4, "limit": 2}}},
        "spec.resources.gpu.limit",
        "limit is below quota; raise limit to at least the quota",
    ),
    (
        "finite-limit-with-unlimited-quota",
        {"resources": {"cpu": {"quota": -1, "limit": 4000}}},
        "spec.resources.cpu.limit",
        "quota is -1 (unlimited), so limit must be -1 too",
    ),
    (
        "negative-over-quota-weight",
        {"resources": {"gpu": {"quota": 1, "overQuotaWeight": -1}}},
        "spec.resources.gpu.overQuotaWeight",
        "overQuotaWeight must be >= 0",
    ),
    (
        "quota-not-a-number",
        {"resources": {"gpu": {"quota": "lots"}}},
        "spec.resources.gpu.quota",
        "must be of type number",
    ),
    (
        "priority-not-an-integer",
        {"priority": "high"},
        "spec.priority",
        "must be of type integer",
    ),
    (
        "bad-reclaim-min-runtime",
        {"reclaimMinRuntime": "ten minutes"},
        "spec.reclaimMinRuntime",
        "must be a duration such as 30s",
    ),
    (
        "bad-preempt-min-runtime",
        {"preemptMinRuntime": "5 min"},
        "spec.preemptMinRuntime",
        "must be a duration such as 30s",
    ),
    (
        "parent-not-a-queue-name",
        {"parentQueue": "Team_A"},
        "spec.parentQueue",
        "must be a queue name",
    ),
]

INVALID_PODGROUPS: list[tuple[str, Obj, str, str]] = [
    (
        "negative-min-member",
        {"minMember": -1, "queue": "default-queue"},
        "spec.minMember",
        "must not be negative",
    ),
    (
        "min-member-not-an-integer",
        {"minMember": "three"},
        "spec.minMember",
        "must be of type integer",
    ),
    (
        "bad-preemptibility",
        {"minMember": 1, "preemptibility": "sometimes"},
        "spec.preemptibility",
        'supported values: "preemptible", "non-preemptible"',
    ),
    (
        "bad-staleness-grace-period",
        {"minMember": 1, "stalenessGracePeriod": "soon"},
        "spec.stalenessGracePeriod",
        "must be a duration such as 30s",
    ),
    (
        "queue-not-a-queue-name",
        {"minMember": 1, "queue": "Default Queue"},
        "spec.queue",
        "must be a queue name",
    ),
    (
        "duplicate-subgroup-names",
        {"minMember": 2, "subGroups": [{"name": "a"}, {"name": "a"}]},
        "spec.subGroups[1]",
        "Duplicate value",
    ),
    (
        "subgroup-parent-missing",
        {"minMember": 2, "subGroups": [{"name": "a", "parent": "nope"}]},
        "spec.subGroups",
        "parent must be the name of another entry",
    ),
    (
        "subgroup-own-parent",
        {"minMember": 2, "subGroups": [{"name": "a", "parent": "a"}]},
        "spec.subGroups[0].parent",
        "must not name itself as parent",
    ),
    (
        "min-subgroup-without-subgroups",
        {"minSubGroup": 1},
        "spec.minSubGroup",
        "needs spec.subGroups",
    ),
]


@pytest.mark.parametrize(
    ("spec", "field", "fix"),
    [pytest.param(s, f, x, id=i) for i, s, f, x in INVALID_QUEUES],
)
def test_invalid_queue_is_rejected_naming_the_field(
    crds: ControlPlane, queue_name: str, spec: Obj, field: str, fix: str
) -> None:
    result = _create(crds, _queue(queue_name, spec))
    assert result.returncode != 0, f"accepted: {result.stdout}"
    assert f'The Queue "{queue_name}" is invalid' in result.stderr, result.stderr
    assert field in result.stderr, result.stderr
    assert fix in result.stderr, result.stderr
    gone = crds.kubectl("get", "queue", queue_name, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_queue_cannot_be_its_own_parent(crds: ControlPlane, queue_name: str) -> None:
    result = _create(crds, _queue(queue_name, {"parentQueue": queue_name}))
    assert result.returncode != 0
    assert "spec.parentQueue" in result.stderr
    assert "must not name the queue itself" in result.stderr


@pytest.mark.parametrize(
    ("spec", "field", "fix"),
    [pytest.param(s, f, x, id=i) for i, s, f, x in INVALID_PODGROUPS],
)
def test_invalid_podgroup_is_rejected_naming_the_field(
    crds: ControlPlane, namespace: str, spec: Obj, field: str, fix: str
) -> None:
    result = _create(crds, _podgroup("pg", spec), namespace)
    assert result.returncode != 0, f"accepted: {result.stdout}"
    assert 'The PodGroup "pg" is invalid' in result.stderr, result.stderr
    assert field in result.stderr, result.stderr
    assert fix in result.stderr, result.stderr


def test_queue_defaults_are_filled_in(crds: ControlPlane, queue_name: str) -> None:
    result = _create(crds, _queue(queue_name, {"resources": {"gpu": {"quota": 4}}}))
    assert result.returncode == 0, result.stderr
    spec = json.loads(crds.kubectl("get", "queue", queue_name, "-o", "json").stdout)["spec"]
    assert spec["priority"] == 100
    # An omitted limit is stored as -1 (unlimited), not read as 0 as KAI does.
    assert spec["resources"]["gpu"] == {"quota": 4, "limit": -1, "overQuotaWeight": 1}
    for resource in ("cpu", "memory"):
        assert spec["resources"][resource] == {"quota": 0, "limit": -1, "overQuotaWeight": 1}


def test_queue_without_spec_is_defaulted(crds: ControlPlane, queue_name: str) -> None:
    obj = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": queue_name}}
    assert _create(crds, obj).returncode == 0
    spec = json.loads(crds.kubectl("get", "queue", queue_name, "-o", "json").stdout)["spec"]
    assert spec["priority"] == 100 and spec["resources"]["gpu"]["limit"] == -1


def test_kai_style_queue_with_every_field_is_accepted_strictly(
    crds: ControlPlane, queue_name: str
) -> None:
    parent = f"{queue_name}-parent"
    manifest = [
        _queue(parent, {"resources": {"gpu": {"quota": -1, "limit": -1, "overQuotaWeight": 1}}}),
        _queue(
            queue_name,
            {
                "displayName": "Team A",
                "parentQueue": parent,
                "priority": 150,
                "preemptMinRuntime": "5m",
                "reclaimMinRuntime": "1h30m",
                "resources": {
                    "gpu": {"quota": 2.5, "overQuotaWeight": 2, "limit": 8},
                    "cpu": {"quota": 16000, "overQuotaWeight": 1, "limit": -1},
                    "memory": {"quota": 64000, "overQuotaWeight": 0, "limit": 128000},
                },
            },
        ),
    ]
    try:
        # kubectl's default field validation is Strict: an unknown field would fail here.
        crds.kubectl(
            "apply",
            "--validate=strict",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifest}),
        )
        stored = json.loads(crds.kubectl("get", "queue", queue_name, "-o", "json").stdout)
        assert stored["spec"] == manifest[1]["spec"] | {"priority": 150}
    finally:
        crds.kubectl("delete", "queue", parent, "--ignore-not-found", "--wait=false")


def test_kai_style_podgroup_with_every_field_is_accepted_strictly(
    crds: ControlPlane, namespace: str
) -> None:
    topology = {
        "topology": "cluster-topology",
        "requiredTopologyLevel": "rack",
        "preferredTopologyLevel": "node",
    }
    spec = {
        "minMember": 4,
        "queue": "team-a",
        "priorityClassName": "train",
        "preemptibility": "non-preemptible",
        "stalenessGracePeriod": "2m",
        "markUnschedulable": True,
        "schedulingBackoff": 1,
        "topologyConstraint": topology,
        "subGroups": [
            {"name": "leaders", "minMember": 1},
            {"name": "workers", "minMember": 3, "topologyConstraint": topology},
            {"name": "workers-a", "parent": "workers", "minMember": 1},
        ],
    }
    crds.kubectl(
        "apply", "--validate=strict", "-n", namespace, "-f", "-",
        input=json.dumps(_podgroup("gang", spec)),
    )  # fmt: skip
    stored = json.loads(crds.kubectl("get", "pg", "gang", "-n", namespace, "-o", "json").stdout)
    assert stored["spec"] == spec


def test_unknown_field_is_reported(crds: ControlPlane, namespace: str) -> None:
    result = crds.kubectl(
        "apply", "--validate=strict", "-n", namespace, "-f", "-",
        input=json.dumps(_podgroup("typo", {"minMembers": 3})),
        check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert 'unknown field "spec.minMembers"' in result.stderr


def _table(cp: ControlPlane, *args: str) -> tuple[list[str], dict[str, list[str]]]:
    """Header cells and rows (by NAME) of `kubectl get`, cut at the header's column starts."""
    lines = cp.kubectl("get", *args).stdout.splitlines()
    header = re.split(r"\s{2,}", lines[0].rstrip())
    starts = [lines[0].index(h) for h in header]

    def cells(line: str) -> list[str]:
        ends = [*starts[1:], len(line) + 1]
        return [line[s:e].strip() for s, e in zip(starts, ends, strict=True)]

    return header, {cells(line)[0]: cells(line) for line in lines[1:]}


def test_kubectl_get_queues_columns(crds: ControlPlane, queue_name: str) -> None:
    spec = {"priority": 120, "resources": {"gpu": {"quota": 4, "limit": 8}}}
    assert _create(crds, _queue(queue_name, spec)).returncode == 0
    child = f"{queue_name}-child"
    try:
        assert _create(crds, _queue(child, {"parentQueue": queue_name})).returncode == 0
        # The scheduler writes status; write it here as the scheduler would.
        crds.kubectl(
            "patch", "queue", queue_name, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"allocated": {"gpu": "3", "cpu": 1500},
                                         "fairShare": {"gpu": "5.5"}, "childQueues": [child]}}),
        )  # fmt: skip
        header, rows = _table(crds, "queues")
        assert header == [
            "NAME", "PRIORITY", "PARENT", "GPU QUOTA", "GPU LIMIT", "GPU ALLOCATED", "AGE",
        ]  # fmt: skip
        assert rows[queue_name][1:6] == ["120", "", "4", "8", "3"]
        assert rows[child][1:6] == ["100", queue_name, "0", "-1", ""]
        wide_header, wide = _table(crds, "queues", "-o", "wide")
        assert "GPU FAIR SHARE" in wide_header and "CHILDREN" in wide_header
        assert wide[queue_name][wide_header.index("GPU FAIR SHARE")] == "5.5"
    finally:
        crds.kubectl("delete", "queue", child, "--ignore-not-found", "--wait=false")


def test_kubectl_get_podgroups_columns(crds: ControlPlane, namespace: str) -> None:
    pg = _podgroup("gang", {"minMember": 3, "queue": "team-a"})
    assert _create(crds, pg, namespace).returncode == 0
    crds.kubectl(
        "patch", "pg", "gang", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Running", "running": 3}}),
    )  # fmt: skip
    header, rows = _table(crds, "pg", "-n", namespace)
    assert header == ["NAME", "QUEUE", "MINMEMBER", "PHASE", "AGE"]
    assert rows["gang"][1:4] == ["team-a", "3", "Running"]
