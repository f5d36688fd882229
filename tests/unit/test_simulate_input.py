"""What a new user hit feeding the simulator (issue #15): bad files, slow loads, silent input.

Each test fails on the code before the fix: a traceback, a silently accepted value, or no output.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from scheduler.cli import main
from scheduler.simulate import inputs, progresslines
from scheduler.simulate.checks import QUEUE_PARENT_MESSAGE, QUEUE_RESOURCE_MESSAGES
from scheduler.simulate.fields import ScenarioError
from scheduler.simulate.loader import C_LOADER, StrictLoader, load_documents
from scheduler.simulate.progresslines import LineProgress
from scheduler.simulate.scenario import load_scenario, parse_scenario
from scheduler.simulate.workload import DEFAULT_PRIORITY_CLASSES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The CLI quiets structlog globally; give other tests their configuration back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _scenario(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "settings": {"end": "1m"},
        "nodes": [{"name": "dgx", "count": 1, "gpus": 8}],
        "queues": [{"metadata": {"name": "team-a"}, "spec": {"resources": {"gpu": {"quota": 8}}}}],
        "jobs": [{"name": "j", "queue": "team-a", "pods": {"resources": {"nvidia.com/gpu": 1}}}],
    }
    data.update(overrides)
    return data


def _error(data: dict[str, Any]) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data)
    return info.value


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


# --- binary input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content", [b"\x7fELF\x02\x01\x01\x00\x00\x00", b"name: x\n\xd0\xff\xfe garbage\n"]
)
def test_binary_scenario_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    path = _write(tmp_path, "scenario.yaml", content)
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"{path}: is not a text file" in err and "give a YAML file" in err


def test_binary_trace_csv_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = _write(tmp_path, "nodes.csv", "sn,cpu_milli,memory_mib,num_gpu,gpu_model\n")
    pods = _write(tmp_path, "pods.csv", b"name,cpu\n\xd0\xff\x00\x01\x02")
    code = main(["simulate", "--trace", "openb", "--nodes", str(nodes), "--pods", str(pods)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"--pods {pods}: is not a text file" in err and "openb CSV" in err


# --- loading: C loader, duplicate keys, progress ------------------------------------------


def test_the_c_loader_is_used_when_pyyaml_has_it() -> None:
    assert hasattr(yaml, "CSafeLoader") == C_LOADER
    if C_LOADER:
        assert issubclass(StrictLoader, yaml.CSafeLoader)
    assert issubclass(StrictLoader, yaml.CSafeLoader if C_LOADER else yaml.SafeLoader)


def test_duplicate_top_level_keys_are_refused(tmp_path: Path) -> None:
    text = (ROOT / "examples/simulate/quickstart.yaml").read_text()
    path = _write(tmp_path, "dup.yaml", text + "\njobs: []\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    first = 1 + next(i for i, line in enumerate(text.splitlines()) if line.startswith("jobs:"))
    assert "key 'jobs' appears twice" in info.value.message
    assert f"first on line {first}" in info.value.message


def test_duplicate_nested_keys_are_refused_but_merge_keys_work(tmp_path: Path) -> None:
    bad = _write(tmp_path, "bad.yaml", "a: {x: 1, y: 2, x: 3}\n")
    with pytest.raises(ScenarioError, match="line 1, column 17: key 'x' appears twice"):
        load_documents(bad)
    merged = _write(tmp_path, "merge.yaml", "base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 5\n")
    assert load_documents(merged) == [{"base": {"x": 1, "y": 2}, "c": {"x": 5, "y": 2}}]


def test_line_progress_prints_only_every_few_seconds() -> None:
    import io

    clock = iter([0.0, 1.0, 4.9, 5.0, 6.0, 10.5]).__next__
    out = io.StringIO()
    lines = LineProgress(out, lambda d, t: f"{d:g}/{t:g}", every=5.0, clock=clock)
    for step in range(5):
        lines.update(step, 10)
    assert out.getvalue().splitlines() == [
        "kai-scheduler simulate: 2/10, 5 s elapsed",
        "kai-scheduler simulate: 4/10, 10 s elapsed",
    ]


def test_piped_runs_show_load_and_progress_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """stderr is not a terminal under pytest: the bar stays off, plain lines come instead."""
    monkeypatch.setattr(inputs, "BIG_INPUT_BYTES", 0)
    monkeypatch.setattr(progresslines.LineProgress, "__init__", _every_call(LineProgress.__init__))
    jobs = [
        {"name": f"j{i}", "queue": "team-a", "at": f"{i * 10}s", "duration": "30s",
         "pods": {"resources": {"nvidia.com/gpu": 1}}}
        for i in range(5)
    ]  # fmt: skip
    path = _write(tmp_path, "s.yaml", yaml.safe_dump(_scenario(jobs=jobs)))
    assert main(["simulate", str(path), "--json"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"loading .*s\.yaml \(0\.0 MB\)", err)
    assert "loaded 5 jobs (5 pods), 1 nodes, 1 queues" in err
    assert re.search(
        r"simulate: \d+s / 1m0?s? simulated, \d+ s elapsed|simulated, \d+ s elapsed", err
    )

    capsys.readouterr()
    assert main(["simulate", str(path), "--json", "--no-progress"]) == 0
    assert "simulated," not in capsys.readouterr().err


def _every_call(init: Any) -> Any:
    def patched(self: LineProgress, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **{**kwargs, "every": 0.0})

    return patched


# --- values the API server would refuse ---------------------------------------------------


@pytest.mark.parametrize("value", [0.5, "500m", "1.5"])
def test_fractional_gpu_request_is_refused(value: object) -> None:
    job = {"name": "j", "queue": "team-a", "pods": {"resources": {"nvidia.com/gpu": value}}}
    e = _error(_scenario(jobs=[job]))
    assert e.field == "jobs[0].pods.resources.nvidia.com/gpu"
    assert "the API server rejects non-integer extended resources" in e.message
    assert 'gpu-fraction: "' in e.message


def test_fractional_gpu_limit_in_a_template_is_refused() -> None:
    template = {"spec": {"containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 0.5}}}]}}  # fmt: skip
    job = {"name": "j", "queue": "team-a", "pods": {"template": template}}
    e = _error(_scenario(jobs=[job]))
    assert e.field == "jobs[0].pods.template.spec.containers[0].resources.limits.nvidia.com/gpu"
    # A whole GPU, fractional CPU and a gpu-fraction annotation stay fine.
    ok = {"name": "j", "queue": "team-a",
          "pods": {"resources": {"nvidia.com/gpu": 1, "cpu": 0.5}}}  # fmt: skip
    half = {"name": "h", "queue": "team-a",
            "pods": {"resources": {"cpu": 1}, "annotations": {"gpu-fraction": "0.5"}}}  # fmt: skip
    assert len(parse_scenario(_scenario(jobs=[ok, half])).jobs) == 2


def _crd_resource_messages() -> set[str]:
    crd = yaml.safe_load((ROOT / "crds/scheduling.run.ai_queues.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    gpu = schema["properties"]["spec"]["properties"]["resources"]["properties"]["gpu"]
    return {rule["message"] for rule in gpu["x-kubernetes-validations"]}


def test_queue_resource_rules_are_the_crds() -> None:
    assert set(QUEUE_RESOURCE_MESSAGES.values()) == _crd_resource_messages()
    assert (
        f'message: "{QUEUE_PARENT_MESSAGE}"'
        in (ROOT / "crds/scheduling.run.ai_queues.yaml").read_text()
    )


@pytest.mark.parametrize("parent", [["a"], 3, "Team_A"])
def test_parent_queue_must_be_a_queue_name(parent: object) -> None:
    queue = {"metadata": {"name": "team-a"}, "spec": {"parentQueue": parent}}
    e = _error(_scenario(queues=[queue]))
    assert (e.field, e.message) == ("queues[0].spec.parentQueue", QUEUE_PARENT_MESSAGE)


@pytest.mark.parametrize(
    ("resources", "field", "message"),
    [
        ({"quota": -1, "limit": 4}, "limit", "unlimited_quota"),
        ({"quota": 8, "limit": 4}, "limit", "limit_below_quota"),
        ({"quota": -2}, "quota", "negative_quota"),
        ({"quota": 1, "limit": -3}, "limit", "negative_limit"),
        ({"quota": 1, "overQuotaWeight": -1}, "overQuotaWeight", "negative_weight"),
    ],
)
def test_queue_values_the_crd_rejects(resources: dict[str, Any], field: str, message: str) -> None:
    queue = {"metadata": {"name": "team-a"}, "spec": {"resources": {"gpu": resources}}}
    e = _error(_scenario(queues=[queue]))
    assert e.field == f"queues[0].spec.resources.gpu.{field}"
    assert e.message == QUEUE_RESOURCE_MESSAGES[message]


def test_queue_values_the_crd_accepts() -> None:
    for resources in ({"quota": -1, "limit": -1}, {"quota": -1}, {"quota": 4, "limit": -1},
                      {"quota": 4, "limit": 4}, {"limit": 2}):  # fmt: skip
        queue = {"metadata": {"name": "team-a"}, "spec": {"resources": {"gpu": resources}}}
        assert parse_scenario(_scenario(queues=[queue])).queues[0].name == "team-a"


# --- queue trees --------------------------------------------------------------------------


def _queue(name: str, parent: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"parentQueue": parent} if parent else {}}


def test_missing_parent_is_exit_2_naming_queue_and_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _scenario(queues=[_queue("research"), _queue("team-a", "reserch")])
    path = _write(tmp_path, "s.yaml", yaml.safe_dump(data))
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "queues[1].spec.parentQueue: queue 'team-a' names parent 'reserch', which is not " in err
    assert "add a queue named 'reserch' or fix spec.parentQueue" in err


def test_parent_cycle_is_an_error_with_a_stable_message() -> None:
    for order in (["c", "b"], ["b", "c"]):
        queues = [_queue(n, "b" if n == "c" else "c") for n in order]
        queues.append(_queue("team-a"))
        e = _error(_scenario(queues=queues))
        assert e.field == "queues[0].spec.parentQueue"
        assert "is in a cycle of parents (b -> c -> b)" in e.message
        assert "removing its spec.parentQueue" in e.message


def test_self_parent_is_an_error() -> None:
    e = _error(_scenario(queues=[_queue("team-a", "team-a")]))
    assert e.field == "queues[0].spec.parentQueue" and "names itself" in e.message


# --- PodGroup queue and PriorityClasses ---------------------------------------------------


def test_job_queue_differing_from_its_podgroup_is_refused() -> None:
    queues = [_queue("team-a"), _queue("team-b")]
    groups = [{"metadata": {"name": "pg"}, "spec": {"queue": "team-b", "minMember": 1}}]
    job = {"name": "j", "queue": "team-a", "podGroup": "pg",
           "pods": {"resources": {"nvidia.com/gpu": 1}}}  # fmt: skip
    e = _error(_scenario(queues=queues, podGroups=groups, jobs=[job]))
    assert e.field == "jobs[0].queue"
    assert "'team-a' differs from the queue 'team-b' of its PodGroup" in e.message
    inline = {**job, "podGroup": {"queue": "team-b"}}
    assert "differs" in _error(_scenario(queues=queues, jobs=[inline])).message
    same = {**job, "queue": "team-b"}
    assert parse_scenario(_scenario(queues=queues, podGroups=groups, jobs=[same])).jobs


def test_shared_podgroup_without_queue_needs_one_queue() -> None:
    queues = [_queue("team-a"), _queue("team-b")]
    groups = [{"metadata": {"name": "pg"}, "spec": {"minMember": 2}}]
    jobs = [{"name": f"j{q}", "queue": f"team-{q}", "podGroup": "pg",
             "pods": {"resources": {"nvidia.com/gpu": 1}}} for q in "ab"]  # fmt: skip
    e = _error(_scenario(queues=queues, podGroups=groups, jobs=jobs))
    assert e.field == "jobs[1].queue" and "a PodGroup has one queue" in e.message


def _chart_priority_classes() -> dict[str, int]:
    text = (ROOT / "manifests/chart/templates/priorityclasses.yaml").read_text()
    found = re.findall(r'dict "name" "([^"]+)" "value" (\d+)', text)
    assert found, "the chart's PriorityClass list changed shape"
    return {name: int(value) for name, value in found}


def test_builtin_priority_classes_are_the_installs() -> None:
    assert _chart_priority_classes() == DEFAULT_PRIORITY_CLASSES
    job = {"name": "j", "queue": "team-a", "priorityClassName": "build-preemptible",
           "podGroup": {}, "pods": {"resources": {"nvidia.com/gpu": 1}}}  # fmt: skip
    gang = parse_scenario(_scenario(jobs=[job])).jobs[0].gangs[0]
    assert (gang.priority, gang.preemptible) == (75, True)
