"""Scenario loading: valid files become domain objects; every mistake names its field."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import GpuRequest
from scheduler.cluster.resources import GPU
from scheduler.simulate.scenario import ScenarioError, load_scenario, parse_scenario


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The CLI quiets structlog globally; give other tests their configuration back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


BASE: dict[str, Any] = {
    "name": "t",
    "settings": {"cyclePeriod": "5s", "end": "1h", "solver": "greedy", "scoring": "fragmentation"},
    "nodes": [
        {"name": "gpu", "count": 3, "gpus": 4, "labels": {"pool": "a"}},
        {"name": "cpu", "gpus": 0, "taints": [{"key": "cpu-only", "effect": "NoSchedule"}]},
    ],
    "queues": [
        {"metadata": {"name": "dept"}, "spec": {"resources": {"gpu": {"quota": 12}}}},
        {
            "metadata": {"name": "team"},
            "spec": {"parentQueue": "dept", "resources": {"gpu": {"quota": 4, "limit": 8}}},
        },
    ],
    "podGroups": [
        {"metadata": {"name": "shared", "namespace": "ns"}, "spec": {"minMember": 3}},
    ],
    "jobs": [
        {
            "name": "gang",
            "namespace": "ns",
            "queue": "team",
            "at": "1m30s",
            "duration": "10m",
            "podGroup": {},
            "pods": {"count": 2, "resources": {"nvidia.com/gpu": 2, "cpu": "1"}},
        },
        {
            "name": "frac",
            "queue": "team",
            "pods": {
                "count": 3,
                "resources": {"cpu": "500m"},
                "annotations": {"gpu-fraction": "0.5"},
            },
        },
        {
            "name": "leader",
            "namespace": "ns",
            "queue": "team",
            "podGroup": "shared",
            "at": "2m",
            "pods": {"resources": {"cpu": "1"}},
        },
        {
            "name": "workers",
            "namespace": "ns",
            "queue": "team",
            "podGroup": "shared",
            "at": "1m",
            "pods": {"count": 2, "resources": {"nvidia.com/gpu": 1}},
        },
    ],
}


def scenario(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


def test_valid_scenario_becomes_domain_objects() -> None:
    s = parse_scenario(scenario())
    assert s.settings.cycle_period == 5.0
    assert s.settings.end == 3600.0
    assert s.settings.placement.greedy_only is True
    assert s.settings.placement.scoring == "fragmentation"
    assert [n.name for n in s.nodes] == ["gpu-0", "gpu-1", "gpu-2", "cpu"]
    assert s.nodes[0].allocatable[GPU] == 4
    assert s.nodes[0].label_map["pool"] == "a"
    assert s.nodes[3].taints[0].key == "cpu-only"
    gang_job, frac_job, leader, workers = s.jobs
    # Inline podGroup: a PodGroup named after the job, minMember defaults to the pod count.
    assert gang_job.at == 90.0 and gang_job.duration == 600.0
    assert [g.key for g in gang_job.gangs] == ["ns/gang"]
    assert gang_job.gangs[0].min_member == 2 and not gang_job.gangs[0].implicit
    assert {p.gang for p in gang_job.pods} == {"ns/gang"}
    assert gang_job.pods[0].requests[GPU] == 2
    # No podGroup: one implicit gang per pod, named after the pod.
    assert [g.key for g in frac_job.gangs] == ["default/frac-0", "default/frac-1", "default/frac-2"]
    assert all(g.implicit and g.min_member == 1 for g in frac_job.gangs)
    assert frac_job.pods[1].gang == "default/frac-1"
    assert frac_job.pods[0].gpu == GpuRequest(1, GPU_MILLI // 2)
    assert frac_job.duration is None
    # A shared PodGroup is one gang, created when its first job arrives.
    assert leader.gangs[0].key == workers.gangs[0].key == "ns/shared"
    assert leader.gangs[0].min_member == 3
    assert leader.gangs[0].creation_time == workers.gangs[0].creation_time == 60.0
    assert all(p.queue == "team" for j in s.jobs for p in j.pods)


def test_full_pod_template_with_selector_and_tolerations() -> None:
    job = {
        "name": "tpl",
        "queue": "team",
        "priorityClassName": "inference",
        "pods": {
            "count": 1,
            "template": {
                "metadata": {"labels": {"app": "x"}},
                "spec": {
                    "nodeSelector": {"pool": "a"},
                    "tolerations": [{"key": "cpu-only", "operator": "Exists"}],
                    "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                },
            },
        },
    }
    s = parse_scenario(scenario(jobs=[job]))
    pod = s.jobs[0].pods[0]
    assert pod.name == "tpl"
    assert pod.node_selector == (("pool", "a"),)
    assert pod.tolerations[0].key == "cpu-only"
    assert pod.requests[GPU] == 1  # a limit alone becomes the request, as in Kubernetes
    assert pod.priority == 125
    assert s.jobs[0].gangs[0].preemptible is False  # inference (125) is not preemptible


def _with(path: str, value: Any) -> dict[str, Any]:
    """BASE with one field changed; ``path`` like ``jobs.1.pods.count``."""
    data = scenario()
    node: Any = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    last = parts[-1]
    if last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "field", "words"),
    [
        ("jobs.1.pods.count", 0, "jobs[1].pods.count", "positive whole number"),
        ("jobs.1.pods.count", "three", "jobs[1].pods.count", "positive whole number"),
        ("jobs.0.at", "soon", "jobs[0].at", "duration"),
        ("jobs.0.duration", "-5s", "jobs[0].duration", "duration"),
        ("jobs.0.queue", "nope", "jobs[0].queue", "not defined under queues"),
        ("jobs.2.podGroup", "missing", "jobs[2].podGroup", "not defined under podGroups"),
        ("jobs.0.podGroup", {"minMember": -1}, "jobs[0].podGroup.minMember", ">= 0"),
        ("jobs.0.priorityClassName", "gold", "jobs[0].priorityClassName", "gold"),
        ("jobs.0.replicas", 3, "jobs[0].replicas", "unknown field"),
        ("jobs.1.pods.annotations", {"gpu-fraction": "1.5"}, "jobs[1].pods.template", "below 1"),
        ("jobs.1.pods.resources", {"cpu": "lots"}, "jobs[1].pods.template", "cpu"),
        ("jobs.1.pods", {"count": 2}, "jobs[1].pods.template.spec.containers", "container"),
        ("nodes.0.count", 1.5, "nodes[0].count", "positive whole number"),
        ("nodes.0.gpus", -1, "nodes[0].gpus", ">= 0"),
        ("nodes.0.gpus", 10**6, "nodes[0].gpus", "at most 256"),
        ("nodes.0.memory", "big", "nodes[0].memory", "quantity"),
        ("nodes.1.taints", [{"key": "k", "effect": "Sometimes"}], "nodes[1].taints[0].effect", ""),
        ("nodes", [], "nodes", "at least one"),
        ("queues.1.spec", {"resources": {"gpu": {"quota": 4, "limit": 2}}}, "queues[1].spec", ""),
        ("queues.1.metadata", {"name": "dept"}, "queues[1].metadata.name", "twice"),
        ("settings.cyclePeriod", "0s", "settings.cyclePeriod", "at least 0.1s"),
        ("jobs.0.at", float("nan"), "jobs[0].at", "finite"),
        ("jobs.0.duration", float("inf"), "jobs[0].duration", "finite"),
        ("jobs.0.namespace", 7, "jobs[0].namespace", "name"),
        ("jobs.0.queue", ["team"], "jobs[0].queue", "name"),
        ("jobs.1.pods.count", 10**7, "jobs[1].pods.count", "at most"),
        ("settings.gpuStrategy", "random", "settings.gpuStrategy", "binpack, spread"),
        ("settings.solver", "magic", "settings.solver", "cpsat, greedy"),
        ("settings.scoring", "fgd", "settings.scoring", "packing, fragmentation"),
        ("podGroups.0.spec", {"minMember": "x"}, "podGroups[0].spec.minMember", ""),
        ("jobs", {"a": 1}, "jobs", "must be a list"),
    ],
)
def test_errors_name_the_field(path: str, value: Any, field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(_with(path, value))
    assert err.value.field.startswith(field), err.value
    assert words in str(err.value)


def test_duplicate_pod_names_are_rejected() -> None:
    data = scenario()
    data["jobs"].append(copy.deepcopy(data["jobs"][1]))
    with pytest.raises(ScenarioError, match=r"jobs\[4\]\.name"):
        parse_scenario(data)


def test_load_reports_yaml_position_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes:\n\t- name: gpu\n")
    with pytest.raises(ScenarioError, match="line 3"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "absent.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ScenarioError, match="empty"):
        load_scenario(empty)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(scenario(name=None)))
    assert load_scenario(good).name == "good"  # the file name when the scenario has none


def test_cli_exits_2_with_the_field_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from scheduler.simulate.__main__ import main

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_with("jobs.2.pods.count", -3)))
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "jobs[2].pods.count: must be a positive whole number" in err
    assert "Traceback" not in err
    assert main([]) == 2
    assert "SCENARIO.yaml" in capsys.readouterr().err


def _leaf_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        out = [prefix] if prefix else []
        for k, v in node.items():
            out += _leaf_paths(v, (*prefix, k))
        return out
    if isinstance(node, list):
        out = [prefix]
        for i, v in enumerate(node):
            out += _leaf_paths(v, (*prefix, i))
        return out
    return [prefix]


PATHS = _leaf_paths(BASE)
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(index=st.integers(0, len(PATHS) - 1), value=JUNK)
def test_any_bad_value_is_a_scenario_error_never_a_crash(index: int, value: Any) -> None:
    data = scenario()
    node: Any = data
    path = PATHS[index]
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    try:
        parsed = parse_scenario(data)
    except ScenarioError as e:
        assert e.field and e.message
        return
    # Accepted values must be usable: finite times, a positive period.
    assert parsed.settings.cycle_period >= 0.1
    assert parsed.settings.end is None or math.isfinite(parsed.settings.end)
    for job in parsed.jobs:
        assert math.isfinite(job.at) and job.at >= 0
        assert job.duration is None or math.isfinite(job.duration)
