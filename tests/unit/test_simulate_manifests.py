"""``kai-scheduler simulate`` on the manifests users ``kubectl apply`` (issue #15).

Every ``examples/*.yaml`` is simulated exactly as it is, through the scheduler's own parsers
and the pod grouper's rules; the outcomes are what the examples' comments promise.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.cli import main
from scheduler.simulate.engine import SimulationResult, simulate
from scheduler.simulate.fields import ScenarioError
from scheduler.simulate.inputs import load_inputs
from scheduler.simulate.report import summary

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
QUEUES = ROOT / "examples" / "queues.yaml"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _nodes(tmp_path: Path, count: int = 4) -> str:
    p = tmp_path / "nodes.yaml"
    p.write_text(
        "kind: SimulatedNodes\n"
        f"nodes:\n  - {{name: dgx, count: {count}, gpus: 8, cpu: 64, memory: 512Gi}}\n"
    )
    return str(p)


def _run(files: list[Path | str], nodes: str, notes: list[str] | None = None) -> SimulationResult:
    scenario = load_inputs(
        [str(f) for f in files], nodes=nodes, note=None if notes is None else notes.append
    )
    return simulate(scenario)


def _gangs(result: SimulationResult) -> dict[str, dict[str, Any]]:
    return {g["gang"]: g for g in summary(result)["gangs"]}


def test_examples_are_all_here() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"queues.yaml", "gang-training-job.yaml", "inference-deployment.yaml",
            "all-or-nothing.yaml"} <= names  # fmt: skip


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_each_example_simulates_as_it_is(example: Path, tmp_path: Path) -> None:
    files = [QUEUES] if example == QUEUES else [QUEUES, example]
    result = _run(files, _nodes(tmp_path))
    data = summary(result)
    assert {q["name"] for q in data["queues"]} >= {"research", "team-a", "team-b"}
    docs = [d for d in yaml.safe_load_all(example.read_text()) if d]
    pods_declared = sum(
        1 if d["kind"] == "Pod" else d["spec"].get("parallelism") or d["spec"].get("replicas") or 1
        for d in docs
        if d["kind"] in ("Pod", "Job", "Deployment")
    )
    pods = sum(g["pods"]["total"] for g in data["gangs"])
    assert pods == pods_declared
    # 32 GPUs on 4 nodes: every example fits, and every gang runs.
    assert all(g["status"] == "running" for g in data["gangs"]), data["gangs"]


def test_gang_training_job_is_one_gang_in_team_a(tmp_path: Path) -> None:
    result = _run([QUEUES, ROOT / "examples/gang-training-job.yaml"], _nodes(tmp_path))
    gang = _gangs(result)["default/llm-train"]
    assert (gang["queue"], gang["min_member"], gang["pods"]["running"]) == ("team-a", 3, 3)
    pods = [p.pod for p in result.cluster.pods.values()]
    assert {p.priority for p in pods} == {50}  # train, from spec.priorityClassName


def test_inference_deployment_is_one_gang_per_replica(tmp_path: Path) -> None:
    result = _run([QUEUES, ROOT / "examples/inference-deployment.yaml"], _nodes(tmp_path))
    gangs = _gangs(result)
    assert len(gangs) == 2
    assert all(k.startswith("default/pg-llm-serve-") for k in gangs)
    assert {(g["queue"], g["min_member"]) for g in gangs.values()} == {("team-b", 1)}
    # The pod grouper's default class for a Deployment: inference, not preemptible.
    scenario_gangs = [g for j in result.scenario.jobs for g in j.gangs]
    assert {(g.priority, g.preemptible) for g in scenario_gangs} == {(125, False)}


def test_all_or_nothing_waits_whole_on_two_nodes(tmp_path: Path) -> None:
    notes: list[str] = []
    example = ROOT / "examples/all-or-nothing.yaml"
    small = _run([example], _nodes(tmp_path, count=2), notes)
    gang = _gangs(small)["default/big-gang"]
    assert gang["status"] == "waiting" and gang["pods"]["running"] == 0
    assert gang["queue"] == "default-queue"
    assert any("default queues" in n for n in notes)
    big = _run([example], _nodes(tmp_path, count=3))
    assert _gangs(big)["default/big-gang"]["pods"]["running"] == 3


def test_cli_runs_manifests_with_a_nodes_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", str(QUEUES), str(ROOT / "examples/gang-training-job.yaml"),
                 "--nodes", _nodes(tmp_path), "--json"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(out)
    assert data["scenario"] == "queues+gang-training-job"
    assert [g["gang"] for g in data["gangs"]] == ["default/llm-train"]


def _write(tmp_path: Path, name: str, docs: list[dict[str, Any]]) -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump_all(docs))
    return p


def _template(gpus: int = 1, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": meta,
        "spec": {"schedulerName": "kai-scheduler",
                 "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
    }  # fmt: skip


def test_leaderworkerset_groups_and_job_min_member(tmp_path: Path) -> None:
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "serve", "labels": {"kai.scheduler/queue": "team-a"}},
        "spec": {"replicas": 2, "leaderWorkerTemplate": {
            "size": 3, "leaderTemplate": _template(0), "workerTemplate": _template(2)}},
    }  # fmt: skip
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "sweep", "annotations": {"kai.scheduler/batch-min-member": "2"}},
        "spec": {"parallelism": 4, "completions": 3,
                 "template": _template(1, labels={"kai.scheduler/queue": "team-b"})},
    }  # fmt: skip
    path = _write(tmp_path, "work.yaml", [lws, job])
    result = _run([QUEUES, path], _nodes(tmp_path))
    gangs = _gangs(result)
    lws_gangs = {k: g for k, g in gangs.items() if k.startswith("default/pg-serve-")}
    assert sorted(k.rsplit("-", 2)[-2:][1] for k in lws_gangs) == ["0", "1"]
    assert {(g["min_member"], g["pods"]["total"], g["queue"]) for g in lws_gangs.values()} == {
        (3, 3, "team-a")
    }
    pods = result.cluster.pods
    assert "default/serve-1-2" in pods and "default/serve-1" in pods
    assert pods["default/serve-0"].pod.requests.get("nvidia.com/gpu") == 0
    assert pods["default/serve-0-1"].pod.requests.get("nvidia.com/gpu") == 2
    (sweep,) = [g for k, g in gangs.items() if k.startswith("default/pg-sweep-")]
    assert (sweep["min_member"], sweep["pods"]["total"], sweep["queue"]) == (2, 3, "team-b")


def test_node_list_and_notes(tmp_path: Path) -> None:
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-node", "labels": {"pool": "a"}},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110",
                                       "nvidia.com/gpu": "4"}}}  # fmt: skip
    nodes = _write(tmp_path, "nodes.yaml", [{"apiVersion": "v1", "kind": "List", "items": [node]}])
    other = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "elsewhere"},
             "spec": {"containers": [{"name": "c"}]}}  # fmt: skip
    mine = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "annotations": {"simulate.kai.scheduler/duration": "5m"}},
            **{"spec": _template(4)["spec"]}}  # fmt: skip
    work = _write(
        tmp_path, "pods.yaml", [{"kind": "Service", "metadata": {"name": "s"}}, other, mine]
    )
    notes: list[str] = []
    result = _run([QUEUES, work], str(nodes), notes)
    assert [n.name for n in result.scenario.nodes] == ["gpu-node"]
    assert result.scenario.nodes[0].allocatable.get("nvidia.com/gpu") == 4
    assert any("pod elsewhere left out" in n for n in notes)
    (job,) = result.scenario.jobs
    assert (job.name, job.duration) == ("p", 300.0)
    assert summary(result)["gangs"][0]["pods"]["finished"] == 1


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            {
                "kind": "Job",
                "metadata": {"name": "j"},
                "spec": {"template": _template(1, annotations={"pod-group-name": "nope"})},
            },
            "pod j-0: names PodGroup default/nope (annotation pod-group-name), which no document",
        ),
        (
            {
                "kind": "Pod",
                "metadata": {"name": "half"},
                "spec": {
                    **_template()["spec"],
                    "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 0.5}}}],
                },
            },
            "work.yaml document 1 (Pod half), pod half: spec.containers[0].resources"
            ".limits.nvidia.com/gpu: 0.5 is not a whole number",
        ),
        (
            {"kind": "Queue", "metadata": {"name": "lab"}, "spec": {"parentQueue": "nowhere"}},
            "work.yaml document 1 (Queue lab): spec.parentQueue: queue 'lab' names parent "
            "'nowhere'",
        ),
        (
            {
                "kind": "Deployment",
                "metadata": {"name": "d"},
                "spec": {
                    "template": {
                        **_template(),
                        "spec": {**_template()["spec"], "priorityClassName": "gold"},
                    }
                },
            },
            "spec.template.spec.priorityClassName: PriorityClass 'gold' does not exist",
        ),
        (
            {"kind": "CronJob", "metadata": {"name": "c"}},
            "'CronJob' is not a kind the simulator reads",
        ),
        (
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "huge"},
                "spec": {"parallelism": 10**6, "template": _template()},
            },
            "(Job huge).spec: makes 1000000 pods; the simulator takes at most 100000",
        ),
        (
            {
                "apiVersion": "leaderworkerset.x-k8s.io/v1",
                "kind": "LeaderWorkerSet",
                "metadata": {"name": "l"},
                "spec": {
                    "replicas": 60000,
                    "leaderWorkerTemplate": {"size": 2, "workerTemplate": _template()},
                },
            },
            "spec.replicas x spec.leaderWorkerTemplate.size: makes 120000 pods",
        ),
    ],
    ids=[
        "missing-podgroup",
        "half-gpu",
        "queue-parent",
        "priority-class",
        "unknown-kind",
        "huge-job",
        "huge-lws",
    ],
)
def test_errors_name_the_manifest(tmp_path: Path, doc: dict[str, Any], expected: str) -> None:
    path = _write(tmp_path, "work.yaml", [doc, {"kind": "Namespace", "metadata": {"name": "x"}}])
    with pytest.raises(ScenarioError) as info:
        load_inputs([str(QUEUES), str(path)], nodes=_nodes(tmp_path))
    assert expected in str(info.value)


def test_manifests_without_nodes_are_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(QUEUES), str(ROOT / "examples/gang-training-job.yaml")]) == 2
    assert "the input has no nodes; give --nodes NODES.yaml" in capsys.readouterr().err


def _leaves(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [prefix] * bool(prefix) + [
            p for k, v in node.items() for p in _leaves(v, (*prefix, k))
        ]
    if isinstance(node, list):
        return [prefix] + [p for i, v in enumerate(node) for p in _leaves(v, (*prefix, i))]
    return [prefix]


_NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": {"a": "b"}},
         "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
         "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "8"}}}  # fmt: skip
_LWS = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "l"}, "spec": {"replicas": 1, "leaderWorkerTemplate": {
            "size": 2, "workerTemplate": _template(1)}}}  # fmt: skip
_BASE_DOCS = [
    *(d for d in yaml.safe_load_all(QUEUES.read_text()) if d),
    *(d for d in yaml.safe_load_all((ROOT / "examples/gang-training-job.yaml").read_text()) if d),
    _LWS,
    {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "x"},
        "value": 10,
    },
    _NODE,
]
_PATHS = [p for p in _leaves(_BASE_DOCS) if len(p) > 1]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    index=st.integers(0, len(_PATHS) - 1),
    value=st.one_of(
        st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=True),
        st.text(max_size=6), st.lists(st.integers(), max_size=2),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    ),
)  # fmt: skip
def test_any_bad_manifest_value_is_a_scenario_error_never_a_crash(index: int, value: Any) -> None:
    import copy
    import tempfile

    docs = copy.deepcopy(_BASE_DOCS)
    *parents, last = _PATHS[index]
    target: Any = docs
    for key in parents:
        target = target[key]
    target[last] = value
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "all.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        with contextlib.suppress(ScenarioError):
            load_inputs([str(path)])
