"""The Helm chart's install schedules for real: the scheduler, run with the token of the
ServiceAccount the chart created (its ClusterRole, not admin), binds a gang end to end, and
``kubectl get queues`` shows the allocation the scheduler wrote.

The chart's Deployment cannot run here (no kubelet, no image: kwok only fakes pods bound to
its nodes), so the scheduler runs as a local process with that ServiceAccount's identity and
the chart's Deployment is installed with ``replicas=0``.

:func:`chart_install` is shared with ``test_examples_behaviour.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testenv.controlplane import ControlPlane
from tests.e2e.scheduler_process import (
    TEST_CONFIG,
    SchedulerProcess,
    kubectl_json,
    pod_manifest,
    wait_for,
)

__all__ = [
    "ChartInstall",
    "bound_pods",
    "chart_install",
    "forbidden_lines",
    "get_queues_table",
]

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "manifests" / "chart"
CRD_NAMES = ("crd/queues.scheduling.run.ai", "crd/podgroups.scheduling.run.ai")
DEFAULT_QUEUES = ("default-parent-queue", "default-queue")
PRIORITY_CLASSES = ("train", "build-preemptible", "build", "inference")
QUEUE_COLUMNS = ("NAME", "PRIORITY", "PARENT", "GPU QUOTA", "GPU LIMIT", "GPU ALLOCATED", "AGE")

MakeNodes = Callable[..., list[str]]


@dataclass
class ChartInstall:
    """One ``helm install`` of the chart and the scheduler process run with its identity."""

    cp: ControlPlane
    release: str
    namespace: str
    #: Kubeconfig holding a token of the ServiceAccount the chart created.
    kubeconfig: Path
    workdir: Path
    procs: list[SchedulerProcess] = field(default_factory=list)

    def start_scheduler(self, name: str = "chart-scheduler") -> SchedulerProcess:
        """Start ``kai-scheduler run`` (fast cycles) as the chart's ServiceAccount; wait ready."""
        proc = SchedulerProcess(
            self.kubeconfig, config=dict(TEST_CONFIG), name=name, workdir=self.workdir
        )
        self.procs.append(proc)
        proc.start()
        proc.wait_ready()
        return proc

    def stop_schedulers(self, keep_as: str) -> None:
        """Stop every process, keep its log in the control plane's log dir, print its tail."""
        keep = self.cp.log_dir / "scheduler"
        keep.mkdir(parents=True, exist_ok=True)
        for proc in self.procs:
            code = proc.stop()
            shutil.copyfile(proc.log_path, keep / f"{keep_as}-{proc.name}.log")
            print(f"\n===== {proc.name} (exit {code}) log tail =====\n{proc.log_tail(80)}")
        self.procs.clear()


def _exists(cp: ControlPlane, *args: str) -> bool:
    return cp.kubectl("get", *args, "-o", "name", check=False).returncode == 0


@contextmanager
def chart_install(cp: ControlPlane, workdir: Path) -> Iterator[ChartInstall]:
    """``helm install`` the chart as a release of its own (unique name and namespace), yield
    it, then uninstall it and delete what it created.

    Other tests of the session share the control plane: the plain-YAML install
    (``kai_cluster``, test_install.py) uses the release name ``kai-scheduler``, and its
    cluster-scoped objects must stay untouched (a live session fixture holds a token of its
    ServiceAccount). A release name that contains "kai-scheduler" names every object after
    the release, so the ClusterRole/Binding, ServiceAccount and Role are this release's own.
    The fixed-name cluster objects (CRDs, default queues, priority classes) are created by
    this release only when absent - helm skips existing CRDs itself, and the two toggles
    below do the same for the rest - and removed again by ``helm uninstall``.
    """
    suffix = uuid.uuid4().hex[:6]
    release = f"kai-scheduler-{suffix}"
    namespace = f"kai-{suffix}"
    # `kubectl get queue` fails while the CRD is absent: then there are no default queues.
    have_defaults = any(_exists(cp, "queue", q) for q in DEFAULT_QUEUES)
    have_classes = any(_exists(cp, "priorityclass", c) for c in PRIORITY_CLASSES)
    cp.helm(
        "install", release, str(CHART), "-n", namespace, "--create-namespace", "--wait",
        # The Deployment's pod could never run here (see the module docstring), and must not
        # be a second scheduler anyway: zero replicas keeps the Deployment and creates no pod.
        "--set", "replicas=0", "--set", "podgrouper.replicas=0",
        "--set", f"defaultQueues.enabled={str(not have_defaults).lower()}",
        "--set", f"priorityClasses.enabled={str(not have_classes).lower()}",
        timeout=180,
    )  # fmt: skip
    try:
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", *CRD_NAMES, timeout=75)
        token = cp.service_account_token(namespace, release)
        kubeconfig = cp.kubeconfig_for_token(token, f"{release}-sa")
        yield ChartInstall(cp, release, namespace, kubeconfig, workdir)
    finally:
        cp.helm("uninstall", release, "-n", namespace, "--wait", check=False, timeout=180)
        cp.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")


def bound_pods(cp: ControlPlane, namespace: str, *selector: str) -> dict[str, str]:
    """{pod name: node} of the bound pods of ``namespace`` (optionally ``-l`` selected)."""
    args = ["get", "pods", "-n", namespace, *(("-l", selector[0]) if selector else ())]
    pods = kubectl_json(cp, *args)["items"]
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}


def forbidden_lines(proc: SchedulerProcess) -> list[str]:
    """Log lines of ``proc`` that report a denied API call."""
    # The API server's words for a denied request ("pods is forbidden: User ... cannot list
    # resource ...") and the scheduler's error classes (Forbidden, Unauthorized).
    pattern = re.compile(
        r"forbidden|unauthorized|\bcannot (get|list|watch|create|update|patch|delete)\b",
        re.IGNORECASE,
    )
    return [line for line in proc.log_text().splitlines() if pattern.search(line)]


def get_queues_table(cp: ControlPlane, *names: str) -> dict[str, dict[str, str]]:
    """``kubectl get queues NAMES`` as {name: {column: cell}} (cells cut at the header's
    column starts, so empty cells read as "")."""
    lines = cp.kubectl("get", "queues", *names).stdout.splitlines()
    header = lines[0]
    starts = [header.index(c) for c in QUEUE_COLUMNS]
    assert starts == sorted(starts), f"unexpected column order: {header!r}"
    table = {}
    for line in lines[1:]:
        cells = [
            line[s:e].strip() for s, e in zip(starts, [*starts[1:], len(line) + 1], strict=True)
        ]
        table[cells[0]] = dict(zip(QUEUE_COLUMNS, cells, strict=True))
    return table


@pytest.fixture(scope="module")
def chart(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChartInstall]:
    """The chart installed once for this module."""
    with chart_install(control_plane, tmp_path_factory.mktemp("chart")) as install:
        yield install


@pytest.fixture
def chart_scheduler(
    chart: ChartInstall, request: pytest.FixtureRequest
) -> Generator[SchedulerProcess, None, None]:
    """A scheduler process with the chart's ServiceAccount token, stopped after the test."""
    proc = chart.start_scheduler()
    try:
        yield proc
    finally:
        chart.stop_schedulers(request.node.name)


def test_chart_service_account_is_not_admin(chart: ChartInstall, namespace: str) -> None:
    # The identity really is the chart's ServiceAccount with its own, limited permissions.
    who = json.loads(
        chart.cp.kubectl("auth", "whoami", "-o", "json", kubeconfig=chart.kubeconfig).stdout
    )
    assert who["status"]["userInfo"]["username"] == (
        f"system:serviceaccount:{chart.namespace}:{chart.release}"
    )
    denied = chart.cp.kubectl(
        "get", "secrets", "-n", namespace, kubeconfig=chart.kubeconfig, check=False
    )
    assert denied.returncode != 0 and "Forbidden" in denied.stderr, denied.stderr


def test_chart_identity_schedules_a_gang_and_queues_show_it(
    chart: ChartInstall,
    chart_scheduler: SchedulerProcess,
    namespace: str,
    make_gpu_nodes: MakeNodes,
) -> None:
    cp = chart.cp
    tag = {"kai-e2e": uuid.uuid4().hex[:10]}
    nodes = make_gpu_nodes(2, gpus=2, labels=tag)
    parent, child = f"h8-dept-{uuid.uuid4().hex[:5]}", f"h8-team-{uuid.uuid4().hex[:5]}"
    queues = [
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": parent},
            "spec": {"resources": {"gpu": {"quota": 6, "limit": 10}}},
        },
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": child},
            "spec": {
                "parentQueue": parent,
                "priority": 110,
                "resources": {"gpu": {"quota": 4, "limit": 8}},
            },
        },
    ]
    podgroup = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": "gang"},
        "spec": {"minMember": 3, "queue": child},
    }
    # Three 1-GPU members on two 2-GPU nodes: the gang must span both nodes.
    members = [
        pod_manifest(
            f"gang-{i}",
            gpus=1,
            node_selector=tag,
            annotations={"pod-group-name": "gang"},
            labels={"kai.scheduler/queue": child},
        )
        for i in range(3)
    ]
    cp.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": queues})
    )
    try:
        doc = {"apiVersion": "v1", "kind": "List", "items": [podgroup, *members]}
        cp.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(doc))

        def all_bound() -> dict[str, str] | None:
            got = bound_pods(cp, namespace)
            return got if len(got) == 3 else None

        bound = wait_for("the 3 gang members bound", all_bound, timeout=60, logs=chart_scheduler)
        assert set(bound) == {"gang-0", "gang-1", "gang-2"}
        assert set(bound.values()) == set(nodes)
        # Bound as one gang: the three binds were logged by the same cycle.
        # The API server shows a pod bound a moment before the scheduler logs the answer.
        binds = wait_for(
            "3 binds logged",
            lambda: (
                b
                if len(b := [r for r in chart_scheduler.log_records() if r.get("event") == "bound"])
                >= 3
                else None
            ),
            timeout=10,
            logs=chart_scheduler,
        )
        assert {r["pod"] for r in binds} == {f"{namespace}/gang-{i}" for i in range(3)}
        assert len({r["cycle"] for r in binds}) == 1, binds

        phase = wait_for(
            "PodGroup Running",
            lambda: (
                kubectl_json(cp, "get", "podgroup", "gang", "-n", namespace)
                .get("status", {})
                .get("phase")
                == "Running"
            ),
            logs=chart_scheduler,
        )
        assert phase
        wait_for(
            "the 3 pods Running on kwok",
            lambda: all(
                p["status"].get("phase") == "Running"
                for p in kubectl_json(cp, "get", "pods", "-n", namespace)["items"]
            ),
            logs=chart_scheduler,
        )

        # `kubectl get queues`: every column carries a real value; GPU ALLOCATED is the
        # scheduler's Queue status (the test never writes status).
        def allocated() -> dict[str, dict[str, str]] | None:
            table = get_queues_table(cp, parent, child)
            return table if table[child]["GPU ALLOCATED"] == "3" else None

        table = wait_for("GPU ALLOCATED 3", allocated, timeout=30, logs=chart_scheduler)
        assert {k: v for k, v in table[child].items() if k != "AGE"} == {
            "NAME": child,
            "PRIORITY": "110",
            "PARENT": parent,
            "GPU QUOTA": "4",
            "GPU LIMIT": "8",
            "GPU ALLOCATED": "3",
        }
        assert {k: v for k, v in table[parent].items() if k != "AGE"} == {
            "NAME": parent,
            "PRIORITY": "100",
            "PARENT": "",
            "GPU QUOTA": "6",
            "GPU LIMIT": "10",
            "GPU ALLOCATED": "3",
        }
        for row in table.values():
            assert re.fullmatch(r"\d+(s|m\d*s?)", row["AGE"]), row

        assert chart_scheduler.running()
        assert not forbidden_lines(chart_scheduler), forbidden_lines(chart_scheduler)
    finally:
        cp.kubectl(
            "delete",
            "podgroup,pods",
            "--all",
            "-n",
            namespace,
            "--wait=false",
            "--grace-period=0",
            "--force",
            check=False,
        )
        cp.kubectl("delete", "queue", child, parent, "--ignore-not-found", "--wait=false")
