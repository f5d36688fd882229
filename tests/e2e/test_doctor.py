"""`kai-scheduler doctor` on the real control plane: all ok on a good Helm install, then each
test breaks the one thing a check looks at (deletes the default queue or a PriorityClass, takes
a verb away from the ClusterRole, scales the scheduler to 0, removes a CRD, stops the leader)
and expects that check to `fail` with the right fix - and puts it back.

The install is this module's own: a Helm release in its own namespace, with its own default
queue names and scheduler name, so breaking it does not touch what other tests of the session
use (the shared CRDs are the exception: the CRD test re-creates the one it removed and waits
until it is Established again). There is no kubelet and no image here, so the Deployment's
pod is bound by hand to a kwok node (kwok then reports it Running and Ready) and the
scheduler itself runs as a local process with the release ServiceAccount's token, the
pod's name as its identity and leader election on - the Lease, the pod and ``/metrics`` that
doctor reads are the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from testenv import nodes
from testenv.controlplane import ControlPlane
from tests.e2e.scheduler_process import (
    REPO,
    TEST_CONFIG,
    SchedulerProcess,
    kubectl_json,
    pod_manifest,
    wait_for,
)

pytestmark = pytest.mark.e2e

CHART = REPO / "manifests" / "chart"
PODGROUP_CRD = "podgroups.scheduling.run.ai"
PODGROUP_CRD_FILE = REPO / "crds" / "scheduling.run.ai_podgroups.yaml"
PRIORITY_CLASSES = ("train", "build-preemptible", "build", "inference")
#: Checks whose subject may be installed by other tests of the session (never a fail).
OPTIONAL = {"volcano", "lws"}


@dataclass
class DoctorInstall:
    """The release, its names, and the scheduler process running as its pod."""

    cp: ControlPlane
    release: str
    namespace: str
    scheduler_name: str
    default_queue: str
    node: str
    proc: SchedulerProcess

    def doctor(self, *flags: str, metrics: bool = True) -> tuple[int, dict[str, dict[str, Any]]]:
        """Run ``kai-scheduler doctor --output json`` as a user would; (exit code, checks)."""
        argv = [
            sys.executable, "-m", "scheduler", "doctor", f"--kube-config={self.cp.kubeconfig}",
            f"--namespace={self.namespace}", "--output=json", "--timeout=5", *flags,
        ]  # fmt: skip
        if metrics:
            argv.append(f"--metrics-url={self.proc.url}/metrics")
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=90)
        assert done.returncode in (0, 1), done.stderr
        doc = json.loads(done.stdout)
        assert doc["exitCode"] == done.returncode
        return done.returncode, {c["name"]: c for c in doc["checks"]}

    def until(self, name: str, status: str, *flags: str) -> tuple[int, dict[str, Any]]:
        """Run doctor until check ``name`` reports ``status`` (RBAC and watches settle in
        well under a second, but not instantly); (exit code, that check)."""
        seen: list[Any] = []

        def probe() -> Any:
            code, checks = self.doctor(*flags)
            seen[:] = [code, checks[name]]
            return checks[name]["status"] == status

        wait_for(f"doctor {name} = {status} (last: {seen[1:]})", probe, timeout=30, interval=1)
        return seen[0], seen[1]


def _exists(cp: ControlPlane, *what: str) -> bool:
    return cp.kubectl("get", *what, "-o", "name", check=False).returncode == 0


def _live_pods(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    """The scheduler Deployment's pods that are not terminating."""
    pods = kubectl_json(
        cp, "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=scheduler"
    )["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _scheduler_pod(cp: ControlPlane, namespace: str, *, unbound: bool = False) -> str:
    """Wait for the Deployment's pod (``unbound``: one not on a node yet) and return its
    name; a terminating pod (scaled away) never counts."""

    def pending() -> str:
        live = [p for p in _live_pods(cp, namespace) if not (unbound and p["spec"].get("nodeName"))]
        return str(live[0]["metadata"]["name"]) if live else ""

    name: str = wait_for("the scheduler Deployment's pod", pending, timeout=60)
    return name


def _bind_and_wait_ready(cp: ControlPlane, namespace: str, pod: str, node: str) -> None:
    """Place the pod by hand (nothing here schedules non-KAI pods); kwok runs it."""
    binding = {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod, "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }  # fmt: skip
    cp.kubectl(
        "create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}/binding", "-f", "-",
        input=json.dumps(binding),
    )  # fmt: skip
    cp.kubectl("wait", "--for=condition=Ready", f"pod/{pod}", "-n", namespace, "--timeout=60s",
               timeout=75)  # fmt: skip


def _clean(obj: dict[str, Any]) -> dict[str, Any]:
    """An object read from the API, ready to be created again."""
    meta = {k: v for k, v in obj["metadata"].items()
            if k not in ("resourceVersion", "uid", "creationTimestamp", "managedFields",
                         "generation")}  # fmt: skip
    return {k: v for k, v in {**obj, "metadata": meta}.items() if k != "status"}


@pytest.fixture(scope="module")
def install(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DoctorInstall]:
    """The chart installed as its own release, its pod Running on a kwok node, and the
    scheduler process holding the Lease as that pod."""
    cp = control_plane
    suffix = uuid.uuid4().hex[:6]
    release, namespace = f"kai-scheduler-doc-{suffix}", f"kai-doc-{suffix}"
    scheduler_name, parent, child = f"doc-{suffix}", f"doc-parent-{suffix}", f"doc-queue-{suffix}"
    have_classes = any(_exists(cp, "priorityclass", c) for c in PRIORITY_CLASSES)
    (node,) = nodes.make_gpu_nodes(cp, 1, gpus=8, name_prefix=f"doc-{suffix}")
    proc: SchedulerProcess | None = None
    try:
        cp.helm(
            "install", release, str(CHART), "-n", namespace, "--create-namespace",
            "--set", "replicas=1", "--set", "leaderElection.enabled=true",
            "--set", f"schedulerName={scheduler_name}",
            "--set", f"defaultQueues.parentName={parent}",
            "--set", f"defaultQueues.childName={child}",
            "--set", f"priorityClasses.enabled={str(not have_classes).lower()}",
            "--set", "podgrouper.enabled=false",
            timeout=180,
        )  # fmt: skip
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                   "crd/queues.scheduling.run.ai", f"crd/{PODGROUP_CRD}", timeout=75)  # fmt: skip
        pod = _scheduler_pod(cp, namespace, unbound=True)
        _bind_and_wait_ready(cp, namespace, pod, node)
        token = cp.service_account_token(namespace, release)
        config = {
            **TEST_CONFIG,
            "defaultQueue": child,
            "leaderElection": {"leaseNamespace": namespace},
        }
        proc = SchedulerProcess(
            cp.kubeconfig_for_token(token, f"{release}-sa"), config=config, name="doctor-sched",
            args=["--leader-elect=true", f"--scheduler-name={scheduler_name}"],
            workdir=tmp_path_factory.mktemp("doctor"),
        )  # fmt: skip
        # The scheduler names itself after its pod in the Lease (POD_NAME, as in the chart).
        old = os.environ.get("POD_NAME")
        os.environ["POD_NAME"] = pod
        try:
            proc.start()
        finally:
            if old is None:
                os.environ.pop("POD_NAME", None)
            else:
                os.environ["POD_NAME"] = old
        proc.wait_ready()
        yield DoctorInstall(cp, release, namespace, scheduler_name, child, node, proc)
    finally:
        if proc is not None:
            proc.stop()
            print(f"\n===== doctor-sched log tail =====\n{proc.log_tail(40)}")
        cp.helm("uninstall", release, "-n", namespace, "--wait", check=False, timeout=180)
        cp.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")
        nodes.delete_nodes(cp, [node])


def test_good_install_is_all_ok(install: DoctorInstall) -> None:
    install.until("leader", "ok")  # the process has taken the Lease
    code, checks = install.doctor()
    assert list(checks) == [
        "api", "deployment", "leader", "cycle", "crds", "queues", "priorityclasses", "rbac",
        "gpu-nodes", "pending-pods", "volcano", "lws",
    ]  # fmt: skip
    wrong = {n: c for n, c in checks.items() if c["status"] != "ok" and n not in OPTIONAL}
    assert not wrong, json.dumps(wrong, indent=1)
    assert all(checks[n]["status"] != "fail" for n in OPTIONAL), checks
    assert code == 0
    assert checks["cycle"]["source"] == "metrics", checks["cycle"]
    assert install.default_queue in checks["queues"]["message"]
    assert (
        f"system:serviceaccount:{install.namespace}:{install.release}"
        in (checks["rbac"]["message"])
    )
    # The same run as people read it when the output is not a terminal: plain lines.
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    plain = subprocess.run(
        [sys.executable, "-m", "scheduler", "doctor", f"--kube-config={install.cp.kubeconfig}",
         "-n", install.namespace, f"--metrics-url={install.proc.url}/metrics"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=90,
    )  # fmt: skip
    lines = plain.stdout.splitlines()
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert lines[0].startswith("[ok]   api ") and "[ok]   rbac " in plain.stdout
    assert lines[-1].startswith("kai-scheduler doctor: ") and ", 0 fail)" in lines[-1]
    assert checks["leader"]["message"].startswith(
        _scheduler_pod(install.cp, install.namespace) + "_"
    )


def test_cycle_age_from_the_lease_when_metrics_are_out_of_reach(install: DoctorInstall) -> None:
    # Without --metrics-url doctor tries the API server's pod proxy, which cannot reach a
    # kwok pod's fake IP; it then tells the age from the leader's Lease and says so.
    code, checks = install.doctor(metrics=False)
    cycle = checks["cycle"]
    assert (cycle["status"], cycle["source"]) == ("ok", "lease"), cycle
    assert "renewed the Lease" in cycle["message"] and "port-forward" in cycle["details"][0]
    assert code == 0


def test_a_stuck_pod_is_reported_with_why(install: DoctorInstall, namespace: str) -> None:
    pod = pod_manifest("too-big", gpus=64, scheduler_name=install.scheduler_name)
    pod["metadata"]["labels"]["kai.scheduler/queue"] = install.default_queue
    install.cp.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(pod))

    def told() -> bool:
        got = kubectl_json(install.cp, "get", "pod", "too-big", "-n", namespace)
        return any(c.get("type") == "PodScheduled" and c.get("message")
                   for c in got["status"].get("conditions") or [])  # fmt: skip

    wait_for("the scheduler's PodScheduled message", told, timeout=30, logs=install.proc)
    _, check = install.until("pending-pods", "warn", "--pending-minutes=0")
    (line,) = [d for d in check["details"] if d.startswith(f"{namespace}/too-big ")]
    assert "Unschedulable" in line and "gpu" in line.lower(), line


def test_deleting_the_default_queue_fails(install: DoctorInstall) -> None:
    cp, queue = install.cp, install.default_queue
    saved = _clean(kubectl_json(cp, "get", "queue", queue))
    cp.kubectl("delete", "queue", queue)
    try:
        code, check = install.until("queues", "fail")
        assert code == 1
        assert f"queue {queue} does not exist" in check["message"]
        assert f"create the leaf Queue {queue}" in check["fix"]
    finally:
        cp.kubectl("create", "-f", "-", input=json.dumps(saved))
    assert install.until("queues", "ok")[1]["status"] == "ok"


def test_taking_a_verb_from_the_cluster_role_fails(install: DoctorInstall) -> None:
    cp, role = install.cp, install.release
    rules = kubectl_json(cp, "get", "clusterrole", role)["rules"]
    (pods,) = [i for i, r in enumerate(rules) if r["resources"] == ["pods"]]
    assert "delete" in rules[pods]["verbs"]
    cut = [dict(r) for r in rules]
    cut[pods] = {**cut[pods], "verbs": [v for v in cut[pods]["verbs"] if v != "delete"]}

    def set_rules(value: list[Any]) -> None:
        patch = [{"op": "replace", "path": "/rules", "value": value}]
        cp.kubectl("patch", "clusterrole", role, "--type=json", "-p", json.dumps(patch))

    set_rules(cut)
    try:
        code, check = install.until("rbac", "fail")
        assert code == 1
        assert "may not: delete pods" in check["message"]
        assert check["details"] == ["missing: delete pods"]
        assert f"ClusterRole {role}" in check["fix"] and "manifests/20-rbac.yaml" in check["fix"]
    finally:
        set_rules(rules)
    assert install.until("rbac", "ok")[1]["status"] == "ok"


def test_scaling_the_scheduler_to_zero_fails(install: DoctorInstall) -> None:
    cp, ns, name = install.cp, install.namespace, install.release
    cp.kubectl("scale", f"deployment/{name}", "-n", ns, "--replicas=0")
    try:
        code, check = install.until("deployment", "fail")
        assert code == 1
        assert "scaled to 0 replicas" in check["message"]
        assert f"kubectl scale deployment/{name} -n {ns} --replicas=1" in check["fix"]
        # The old pod must be on its way out before scaling back, or it is kept as the one.
        wait_for("the old pod to terminate", lambda: not _live_pods(cp, ns), timeout=30)
    finally:
        cp.kubectl("scale", f"deployment/{name}", "-n", ns, "--replicas=1")
    _bind_and_wait_ready(cp, ns, _scheduler_pod(cp, ns, unbound=True), install.node)
    assert install.until("deployment", "ok")[1]["status"] == "ok"


def test_removing_a_crd_fails(install: DoctorInstall) -> None:
    cp = install.cp
    cp.kubectl("delete", "crd", PODGROUP_CRD, "--timeout=60s", timeout=75)
    try:
        code, check = install.until("crds", "fail")
        assert code == 1
        assert f"{PODGROUP_CRD} is not installed" in check["message"]
        assert "kubectl apply -f crds/" in check["fix"]
    finally:
        cp.kubectl("apply", "-f", str(PODGROUP_CRD_FILE))
        cp.kubectl("wait", "--for=condition=Established", f"crd/{PODGROUP_CRD}",
                   "--timeout=60s", timeout=75)  # fmt: skip
    assert install.until("crds", "ok")[1]["status"] == "ok"


def test_deleting_a_priority_class_fails(install: DoctorInstall) -> None:
    cp = install.cp
    saved = _clean(kubectl_json(cp, "get", "priorityclass", "build"))
    cp.kubectl("delete", "priorityclass", "build")
    try:
        code, check = install.until("priorityclasses", "fail")
        assert code == 1
        assert check["message"].startswith("missing: build ")
        assert "manifests/60-priorityclasses.yaml" in check["fix"]
    finally:
        cp.kubectl("create", "-f", "-", input=json.dumps(saved))
    assert install.until("priorityclasses", "ok")[1]["status"] == "ok"


def test_no_leader_once_the_scheduler_stops_fails(install: DoctorInstall) -> None:
    """Last in the module: the scheduler process stops (releasing its Lease on SIGTERM, as a
    rolling update's old pod does) and nothing takes over."""
    # The process still leads (warn when an earlier test replaced the pod it is named after).
    assert install.doctor()[1]["leader"]["status"] in ("ok", "warn")
    assert install.proc.stop() == 0
    code, check = install.until("leader", "fail")
    assert code == 1
    assert "no replica leads" in check["message"] or "stopped renewing" in check["message"]
    assert f"kubectl logs deployment/{install.release} -n {install.namespace}" in check["fix"]
