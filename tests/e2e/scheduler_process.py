"""Run the real scheduler as a subprocess against the test control plane, for e2e tests.

- :class:`SchedulerProcess` starts ``python -m scheduler run`` with a kubeconfig and a config
  file, keeps its (JSON) log in a file, probes ``/readyz`` and ``/metrics``, and stops it with
  SIGTERM (or SIGKILL, for crash tests).
- Fixtures: ``kai_cluster`` (session) installs the CRDs, the scheduler's namespace,
  ServiceAccount and RBAC from ``manifests/`` and the default queues, and returns a kubeconfig
  holding that ServiceAccount's token - so every e2e test proves the scheduler works with
  exactly the permissions it ships with. ``start_scheduler`` (per test) starts processes and
  stops them afterwards, printing their log tails (shown by pytest when the test fails).
- Small helpers shared by the tests: :func:`wait_for`, :func:`kubectl_json`, pod manifests.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testenv import ControlPlane

__all__ = [
    "KaiCluster",
    "SchedulerProcess",
    "kai_cluster",
    "kubectl_json",
    "pod_manifest",
    "remove_install",
    "start_scheduler",
    "wait_for",
]

REPO = Path(__file__).resolve().parents[2]
SCHEDULER_NAMESPACE = "kai-scheduler"
SERVICE_ACCOUNT = "kai-scheduler"
#: Fast settings for tests; each test may override keys.
TEST_CONFIG: dict[str, Any] = {
    "cyclePeriod": "300ms",
    "solverTimeLimit": "0.3s",
    "defaultQueue": "default-queue",
    "stalenessGracePeriod": "60s",
    "eventInterval": "5s",
    "placement": {"gpu": "binpack", "cpu": "binpack", "solverWorkers": 1},
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SchedulerProcess:
    """One scheduler replica as a child process (its own process group)."""

    def __init__(
        self,
        kubeconfig: Path,
        *,
        config: Mapping[str, Any] | None = None,
        args: Iterable[str] = (),
        name: str = "kai-scheduler",
        workdir: Path | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.config = dict(TEST_CONFIG if config is None else config)
        self.extra_args = list(args)
        self.name = name
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="kai-sched-"))
        self.log_path = self.workdir / f"{name}.log"
        self.config_path = self.workdir / f"{name}.yaml"
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None

    @property
    def url(self) -> str:
        """Base URL of /healthz, /readyz and /metrics."""
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        """The command line."""
        return [
            sys.executable,
            "-m",
            "scheduler",
            "run",
            f"--kube-config={self.kubeconfig}",
            f"--config={self.config_path}",
            f"--metrics-address=127.0.0.1:{self.port}",
            "--log-format=json",
            "--log-level=debug",
            *self.extra_args,
        ]

    def start(self) -> SchedulerProcess:
        """Start the process (a restart keeps appending to the same log)."""
        self.config_path.write_text(yaml.safe_dump(self.config))
        self._log_file = self.log_path.open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBECONFIG", None)
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.proc = subprocess.Popen(
            self.argv(),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )
        return self

    def running(self) -> bool:
        """True while the process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def get(self, path: str, timeout: float = 2.0) -> tuple[int, str]:
        """(status, body) of GET path on the probe server; (0, error) when unreachable."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()
        except OSError as e:
            return 0, str(e)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until /readyz answers 200 (the cache synced); fail with the log if it dies."""

        def ready() -> bool:
            if not self.running():
                raise AssertionError(f"{self.name} exited early:\n{self.log_tail()}")
            return self.get("/readyz")[0] == 200

        wait_for(f"{self.name} /readyz", ready, timeout=timeout, logs=self)

    def metrics(self) -> str:
        """The /metrics text."""
        status, body = self.get("/metrics")
        assert status == 200, f"/metrics answered {status}: {body}"
        return body

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process group."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, wait (SIGKILL after ``timeout``); the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return self.proc.returncode

    def log_text(self) -> str:
        """The whole log so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of the log."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def log_records(self) -> list[dict[str, Any]]:
        """Every JSON log line parsed; raises if a line is not JSON."""
        out = []
        for line in self.log_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
        return out


def wait_for(
    what: str,
    check: Callable[[], Any],
    *,
    timeout: float = 60.0,
    interval: float = 0.3,
    logs: SchedulerProcess | Iterable[SchedulerProcess] | None = None,
) -> Any:
    """Poll ``check`` until it returns something truthy; on timeout fail with the last value
    and the scheduler log tails."""
    deadline = time.monotonic() + timeout
    last: Any = None
    procs = [logs] if isinstance(logs, SchedulerProcess) else list(logs or ())
    while True:
        last = check()
        if last:
            return last
        died = [
            p
            for p in procs
            if p.proc is not None and p.proc.returncode is None and p.proc.poll() is not None
        ]
        if died:
            p = died[0]
            raise AssertionError(
                f"{p.name} exited with {p.proc and p.proc.returncode} while "
                f"waiting for {what}:\n{p.log_tail(200)}"
            )
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name} log ---\n{p.log_tail()}" for p in procs)
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}; last value {last!r}\n{tails}"
            )
        time.sleep(interval)


def kubectl_json(cp: ControlPlane, *args: str) -> Any:
    """``kubectl get ... -o json`` as data."""
    return json.loads(cp.kubectl(*args, "-o", "json").stdout)


def podgroup_manifest(
    name: str, min_member: int, queue: str | None = "default-queue", **spec: Any
) -> dict[str, Any]:
    """A KAI PodGroup (``scheduling.run.ai/v2alpha2``); ``spec`` adds fields as they are
    spelled in the CRD (e.g. ``stalenessGracePeriod="2s"``); ``queue=None`` leaves it out."""
    body: dict[str, Any] = {"minMember": min_member, **spec}
    if queue is not None:
        body["queue"] = queue
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": body,
    }


def pod_manifest(
    name: str,
    *,
    gpus: int = 0,
    cpu: str = "100m",
    node_selector: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    scheduler_name: str = "kai-scheduler",
) -> dict[str, Any]:
    """A bare pod for the scheduler (kwok runs it on a fake node)."""
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
        },
        "spec": {
            "schedulerName": scheduler_name,
            "nodeSelector": dict(node_selector or {}),
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "containers": [
                {"name": "main", "image": "registry.invalid/fake:1", "resources": resources}
            ],
        },
    }


@dataclass
class KaiCluster:
    """The control plane with KAI's CRDs and RBAC installed."""

    cp: ControlPlane
    #: Kubeconfig with the scheduler ServiceAccount's token (the shipped ClusterRole).
    kubeconfig: Path

    def apply(self, *objs: Mapping[str, Any], namespace: str | None = None) -> None:
        """``kubectl apply`` the objects (as a List)."""
        doc = {"apiVersion": "v1", "kind": "List", "items": [dict(o) for o in objs]}
        extra = ["-n", namespace] if namespace else []
        self.cp.kubectl("apply", *extra, "-f", "-", input=json.dumps(doc))

    def create(self, *objs: Mapping[str, Any], namespace: str | None = None) -> None:
        """``kubectl create`` the objects."""
        doc = {"apiVersion": "v1", "kind": "List", "items": [dict(o) for o in objs]}
        extra = ["-n", namespace] if namespace else []
        self.cp.kubectl("create", *extra, "-f", "-", input=json.dumps(doc))

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        """Every pod of ``namespace``."""
        return list(kubectl_json(self.cp, "get", "pods", "-n", namespace)["items"])

    def events(self, namespace: str) -> list[dict[str, Any]]:
        """Every core Event of ``namespace``."""
        return list(kubectl_json(self.cp, "get", "events", "-n", namespace)["items"])


def remove_install(cp: ControlPlane) -> None:
    """Remove what any install of ours in ``kai-scheduler`` made (not the CRDs): the Helm
    release ``kai-scheduler``, the plain manifests (``kai_cluster`` applies some of them) and
    the default queues, then wait for the namespace to go. An install test starts with this:
    Helm refuses to adopt a ClusterRole or namespace another install left without its labels."""
    cp.helm("uninstall", "kai-scheduler", "-n", SCHEDULER_NAMESPACE, "--wait", "--ignore-not-found",
            check=False)  # fmt: skip
    # The Queue kind is unknown when the CRDs are absent: then there are no queues to delete.
    cp.kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", str(REPO / "manifests" / "defaults"),
        check=False,
    )  # fmt: skip
    cp.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", str(REPO / "manifests"))
    cp.kubectl(
        "delete", "namespace", SCHEDULER_NAMESPACE, "--ignore-not-found", "--timeout=120s",
        timeout=135,
    )  # fmt: skip


@pytest.fixture(scope="session")
def kai_cluster(control_plane: ControlPlane) -> KaiCluster:
    """CRDs, namespace, ServiceAccount, RBAC and default queues; the SA's kubeconfig."""
    cp = control_plane
    cp.kubectl("apply", "-f", str(REPO / "crds"))
    cp.kubectl(
        "wait",
        "--for",
        "condition=Established",
        "--timeout=60s",
        "crd/queues.scheduling.run.ai",
        "crd/podgroups.scheduling.run.ai",
    )
    for manifest in ("00-namespace.yaml", "10-serviceaccount.yaml", "20-rbac.yaml"):
        cp.kubectl("apply", "-f", str(REPO / "manifests" / manifest))
    cp.kubectl("apply", "-f", str(REPO / "manifests" / "defaults"))
    token = cp.service_account_token(SCHEDULER_NAMESPACE, SERVICE_ACCOUNT)
    kubeconfig = cp.kubeconfig_for_token(token, f"kai-scheduler-sa-{uuid.uuid4().hex[:6]}")
    return KaiCluster(cp, kubeconfig)


StartScheduler = Callable[..., SchedulerProcess]


@pytest.fixture
def start_scheduler(
    kai_cluster: KaiCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> Generator[StartScheduler, None, None]:
    """``start_scheduler(config=None, args=(), name=..., wait=True) -> SchedulerProcess``;
    every process is stopped after the test, its log tail printed (pytest shows it when
    the test failed) and its whole log kept in the control plane's log dir."""
    procs: list[SchedulerProcess] = []

    def start(
        config: Mapping[str, Any] | None = None,
        args: Iterable[str] = (),
        name: str = "",
        wait: bool = True,
    ) -> SchedulerProcess:
        merged = dict(TEST_CONFIG)
        merged.update(config or {})
        proc = SchedulerProcess(
            kai_cluster.kubeconfig,
            config=merged,
            args=args,
            name=name or f"kai-scheduler-{len(procs)}",
            workdir=tmp_path,
        )
        procs.append(proc)
        proc.start()
        if wait:
            proc.wait_ready()
        return proc

    yield start
    keep = kai_cluster.cp.log_dir / "scheduler"
    keep.mkdir(parents=True, exist_ok=True)
    for proc in procs:
        code = proc.stop()
        # Kept next to the control plane's logs for post-mortems of flaky runs.
        shutil.copyfile(proc.log_path, keep / f"{request.node.name}-{proc.name}.log")
        print(f"\n===== {proc.name} (exit {code}) log tail =====\n{proc.log_tail(120)}")


def run_tag() -> dict[str, str]:
    """A label unique to one test, to select exactly the objects it made."""
    return {"kai-e2e": uuid.uuid4().hex[:10]}


def bound_nodes(pods: list[dict[str, Any]]) -> dict[str, str]:
    """Pod name -> node name, for the pods that are bound."""
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}
