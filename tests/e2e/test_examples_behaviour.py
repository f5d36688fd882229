"""The files in examples/ do what examples/README.md says, with the real scheduler running.

Set-up as the README asks: the chart installed (its own release, see
``test_install_scheduling.chart_install``), ``examples/queues.yaml`` applied, two kwok nodes
with 8 ``nvidia.com/gpu`` each, and the scheduler run with the chart's ServiceAccount token.
The example files are applied unchanged; their pods select no node, so each test first waits
until no other test's GPU node is left in the shared control plane.

kwok (the fake kubelet) completes a pod owned by a Job the moment it runs, so the Job's
workers cannot be seen *staying* Running here: the Job file is applied as is to show the gang
binds and runs and the Job completes, and its PodGroup plus three pods made from the Job's own
pod template show the "while it runs" part (PodGroup Running, GPU ALLOCATED 3).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testenv.controlplane import ControlPlane
from tests.e2e.scheduler_process import SchedulerProcess, kubectl_json, wait_for
from tests.e2e.test_install_scheduling import (
    ChartInstall,
    bound_pods,
    chart_install,
    forbidden_lines,
    get_queues_table,
)

__all__: list[str] = []

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MakeNodes = Callable[..., list[str]]


@pytest.fixture(scope="module")
def chart(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChartInstall]:
    """The chart installed, and examples/queues.yaml applied, once for this module."""
    with chart_install(control_plane, tmp_path_factory.mktemp("chart")) as install:
        queues = str(EXAMPLES / "queues.yaml")
        control_plane.kubectl("apply", "-f", queues)
        try:
            yield install
        finally:
            control_plane.kubectl("delete", "-f", queues, "--ignore-not-found", "--wait=false")


def _gpu_nodes(cp: ControlPlane) -> set[str]:
    nodes = kubectl_json(cp, "get", "nodes")["items"]
    return {
        n["metadata"]["name"]
        for n in nodes
        if int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")) > 0
    }


@pytest.fixture
def cluster(
    chart: ChartInstall,
    make_gpu_nodes: MakeNodes,
    namespace: str,
    request: pytest.FixtureRequest,
) -> Generator[tuple[ChartInstall, SchedulerProcess, list[str]], None, None]:
    """The README's cluster (exactly two 8-GPU nodes) and a running scheduler; afterwards the
    test's workloads are deleted and gone, so the next test's queues start at 0 GPUs."""
    cp = chart.cp
    wait_for(
        "no GPU nodes left by other tests",
        lambda: not _gpu_nodes(cp) or None,
        timeout=60,
    )
    nodes = make_gpu_nodes(2, gpus=8)
    proc = chart.start_scheduler()
    try:
        yield chart, proc, nodes
    finally:
        chart.stop_schedulers(request.node.name)
        cp.kubectl("delete", "jobs,deployments,podgroups", "--all", "-n", namespace, "--wait=false")
        cp.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force",
            "--timeout=60s", timeout=75,
        )  # fmt: skip


def _apply(cp: ControlPlane, namespace: str, example: str) -> None:
    cp.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / example))


def _pods(cp: ControlPlane, namespace: str, app: str) -> list[dict[str, Any]]:
    return list(kubectl_json(cp, "get", "pods", "-n", namespace, "-l", f"app={app}")["items"])


def _bind_cycles(proc: SchedulerProcess, namespace: str) -> dict[str, int]:
    """{pod name: the cycle that bound it} from the scheduler's log."""
    return {
        r["pod"].split("/", 1)[1]: r["cycle"]
        for r in proc.log_records()
        if r.get("event") == "bound" and r.get("pod", "").startswith(f"{namespace}/")
    }


def _logged_binds(proc: SchedulerProcess, namespace: str, count: int) -> dict[str, int]:
    """Wait until ``count`` binds are logged: the API server shows a pod bound a moment
    before the scheduler logs the answer to its Binding."""

    def logged() -> dict[str, int] | None:
        cycles = _bind_cycles(proc, namespace)
        return cycles if len(cycles) == count else None

    return dict(wait_for(f"{count} binds logged", logged, timeout=10, logs=proc))


def _reached_running(pod: dict[str, Any]) -> bool:
    """Running now, or finished after having run (kwok completes Job pods at once)."""
    status = pod.get("status") or {}
    if status.get("phase") == "Running":
        return True
    states = [c.get("state", {}) for c in status.get("containerStatuses") or []]
    return bool(states) and all(
        "terminated" in s and s["terminated"].get("startedAt") for s in states
    )


def _docs(example: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / example).read_text()) if d]


def _job_workers(namespace: str) -> list[dict[str, Any]]:
    """The gang example's PodGroup and three pods from its Job's pod template (no Job owner,
    so kwok leaves them Running as `sleep 3600` would on a real node)."""
    docs = {d["kind"]: d for d in _docs("gang-training-job.yaml")}
    template = docs["Job"]["spec"]["template"]
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**template["metadata"], "name": f"llm-train-worker-{i}"},
            "spec": template["spec"],
        }
        for i in range(docs["Job"]["spec"]["parallelism"])
    ]
    return [docs["PodGroup"], *pods]


def _create(cp: ControlPlane, namespace: str, objs: list[dict[str, Any]]) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": objs}
    cp.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(doc))


def _podgroup(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    return dict(kubectl_json(cp, "get", "podgroup", name, "-n", namespace).get("status") or {})


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def _all(pred: Callable[[dict[str, Any]], bool], count: int) -> Callable[..., Any]:
    def check(cp: ControlPlane, namespace: str, app: str) -> list[dict[str, Any]] | None:
        pods = _pods(cp, namespace, app)
        return pods if len(pods) == count and all(pred(p) for p in pods) else None

    return check


def _allocated(cp: ControlPlane, expected: dict[str, str], proc: SchedulerProcess) -> Any:
    """Wait until ``kubectl get queues`` shows ``expected`` GPU ALLOCATED; the table."""

    def check() -> dict[str, dict[str, str]] | None:
        table = get_queues_table(cp, *expected)
        got = {q: table[q]["GPU ALLOCATED"] for q in expected}
        return table if got == expected else None

    try:
        return wait_for(f"GPU ALLOCATED {expected}", check, timeout=30, logs=proc)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{cp.kubectl('get', 'queues').stdout}") from None


def test_gang_training_job_binds_three_workers_in_one_cycle(
    cluster: tuple[ChartInstall, SchedulerProcess, list[str]], namespace: str
) -> None:
    chart, sched, nodes = cluster
    cp = chart.cp
    _apply(cp, namespace, "gang-training-job.yaml")

    pods = wait_for(
        "3 Job workers bound and run",
        lambda: _all(_reached_running, 3)(cp, namespace, "llm-train"),
        timeout=60,
        logs=sched,
    )
    assert {p["spec"]["nodeName"] for p in pods} <= set(nodes)
    cycles = _logged_binds(sched, namespace, 3)
    assert len(set(cycles.values())) == 1, cycles
    # Every worker carries the Job's priority class and its queue.
    assert {p["spec"]["priority"] for p in pods} == {50}
    # The Job controller counts all three workers as done (kwok completed them).
    cp.kubectl(
        "wait", "--for=condition=Complete", "job/llm-train", "-n", namespace, "--timeout=60s",
        timeout=75,
    )  # fmt: skip
    # Finished members still count: the PodGroup reports Succeeded, not a partial gang.
    status = wait_for(
        "the PodGroup to report Succeeded",
        lambda: (s := _podgroup(cp, namespace, "llm-train")).get("phase") == "Succeeded" and s,
        timeout=30,
        logs=sched,
    )
    assert status["succeeded"] == 3, status
    assert not forbidden_lines(sched), forbidden_lines(sched)


def test_gang_training_workers_hold_three_gpus_while_running(
    cluster: tuple[ChartInstall, SchedulerProcess, list[str]], namespace: str
) -> None:
    chart, sched, _ = cluster
    cp = chart.cp
    _create(cp, namespace, _job_workers(namespace))
    wait_for(
        "3 workers Running",
        lambda: _all(lambda p: p["status"].get("phase") == "Running", 3)(
            cp, namespace, "llm-train"
        ),
        timeout=60,
        logs=sched,
    )
    cycles = _logged_binds(sched, namespace, 3)
    assert len(set(cycles.values())) == 1, cycles
    wait_for(
        "PodGroup llm-train Running",
        lambda: _podgroup(cp, namespace, "llm-train").get("phase") == "Running",
        logs=sched,
    )
    pg = cp.kubectl("get", "pg", "llm-train", "-n", namespace).stdout.splitlines()
    assert pg[1].split()[:4] == ["llm-train", "team-a", "3", "Running"], pg
    _allocated(cp, {"team-a": "3", "research": "3"}, sched)
    assert not forbidden_lines(sched), forbidden_lines(sched)


def test_inference_deployment_is_bound_with_priority_125(
    cluster: tuple[ChartInstall, SchedulerProcess, list[str]], namespace: str
) -> None:
    chart, sched, nodes = cluster
    cp = chart.cp
    _apply(cp, namespace, "inference-deployment.yaml")
    pods = wait_for(
        "2 inference replicas Running",
        lambda: _all(lambda p: p["status"].get("phase") == "Running", 2)(
            cp, namespace, "llm-serve"
        ),
        timeout=60,
        logs=sched,
    )
    assert {p["spec"]["nodeName"] for p in pods} <= set(nodes)
    assert [p["spec"]["priority"] for p in pods] == [125, 125]
    assert {p["spec"]["priorityClassName"] for p in pods} == {"inference"}
    _allocated(cp, {"team-b": "2", "research": "2"}, sched)
    assert not forbidden_lines(sched), forbidden_lines(sched)


def test_all_or_nothing_waits_then_binds_together(
    cluster: tuple[ChartInstall, SchedulerProcess, list[str]],
    namespace: str,
    make_gpu_nodes: MakeNodes,
) -> None:
    chart, sched, nodes = cluster
    cp = chart.cp
    _apply(cp, namespace, "all-or-nothing.yaml")

    def unschedulable() -> dict[str, Any] | None:
        status = _podgroup(cp, namespace, "big-gang")
        return status if status.get("phase") == "Unschedulable" else None

    status = wait_for("PodGroup big-gang Unschedulable", unschedulable, timeout=30, logs=sched)
    (condition,) = status["conditions"]
    assert condition["type"] == "Unschedulable" and condition["status"] == "True", condition
    assert condition["reason"] and condition["message"], condition
    assert status["schedulingConditions"], status
    described = cp.kubectl("describe", "pg", "big-gang", "-n", namespace).stdout
    assert condition["message"] in described, described
    waiting = wait_for(
        "PodScheduled=False on the 3 pods",
        lambda: _all(
            lambda p: (
                _condition(p, "PodScheduled").get("status") == "False"
                and _condition(p, "PodScheduled").get("reason") == "Unschedulable"
            ),
            3,
        )(cp, namespace, "big-gang"),
        logs=sched,
    )
    assert all("big-gang" in _condition(p, "PodScheduled")["message"] for p in waiting)
    row = cp.kubectl("get", "pg", "big-gang", "-n", namespace).stdout.splitlines()[1].split()
    assert row[:4] == ["big-gang", "default-queue", "3", "Unschedulable"], row
    # A few more cycles: still nothing bound, so no GPU is held by a partial group.
    time.sleep(1.5)
    assert not bound_pods(cp, namespace), bound_pods(cp, namespace)
    assert not _bind_cycles(sched, namespace)

    # A third 8-GPU node: all three are bound in the same cycle and run together.
    (third,) = make_gpu_nodes(1, gpus=8)
    pods = wait_for(
        "the 3 pods Running",
        lambda: _all(lambda p: p["status"].get("phase") == "Running", 3)(cp, namespace, "big-gang"),
        timeout=60,
        logs=sched,
    )
    assert {p["spec"]["nodeName"] for p in pods} == {*nodes, third}
    cycles = _logged_binds(sched, namespace, 3)
    assert len(set(cycles.values())) == 1, cycles
    wait_for(
        "PodGroup big-gang Running",
        lambda: _podgroup(cp, namespace, "big-gang").get("phase") == "Running",
        logs=sched,
    )
    assert not forbidden_lines(sched), forbidden_lines(sched)


def test_queue_tree_shows_allocations(
    cluster: tuple[ChartInstall, SchedulerProcess, list[str]], namespace: str
) -> None:
    chart, sched, _ = cluster
    cp = chart.cp
    _create(cp, namespace, _job_workers(namespace))
    _apply(cp, namespace, "inference-deployment.yaml")
    table = _allocated(cp, {"research": "5", "team-a": "3", "team-b": "2"}, sched)
    rows = {
        name: {k: v for k, v in row.items() if k not in ("NAME", "AGE")}
        for name, row in table.items()
    }
    assert rows == {
        "research": {
            "PRIORITY": "100", "PARENT": "", "GPU QUOTA": "8", "GPU LIMIT": "12",
            "GPU ALLOCATED": "5",
        },
        "team-a": {
            "PRIORITY": "100", "PARENT": "research", "GPU QUOTA": "4", "GPU LIMIT": "8",
            "GPU ALLOCATED": "3",
        },
        "team-b": {
            "PRIORITY": "120", "PARENT": "research", "GPU QUOTA": "4", "GPU LIMIT": "-1",
            "GPU ALLOCATED": "2",
        },
    }  # fmt: skip
    # `kubectl get queues` lists the whole tree; `-o wide` names each parent's children.
    assert {"default-parent-queue", "default-queue"} <= set(get_queues_table(cp))
    wide = kubectl_json(cp, "get", "queue", "research")["status"]
    assert sorted(wide["childQueues"]) == ["team-a", "team-b"], wide
    assert "team-a" in cp.kubectl("get", "queue", "research", "-o", "wide").stdout
    assert not forbidden_lines(sched), forbidden_lines(sched)
