"""The pod grouper as a process on the real control plane, with the shipped RBAC.

``kai-scheduler podgrouper`` runs as a subprocess with the token of the ServiceAccount from
manifests/70-podgrouper.yaml (its own least-privilege ClusterRole), next to the scheduler run
as in the other e2e tests. kube-controller-manager turns Jobs and Deployments into pods, and
garbage-collects PodGroups with their owners.

The gang tests start the scheduler only once the grouper has annotated every pod: today the
scheduler places a pod that names no PodGroup as a gang of one at once, so a scheduler
already running could bind a Job's first pods before the grouper names their PodGroup (see
docs/podgrouper.md, "Ordering").
"""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from testenv.controlplane import ControlPlane
from tests.e2e.scheduler_process import (
    KaiCluster,
    SchedulerProcess,
    StartScheduler,
    bound_nodes,
    kai_cluster,
    kubectl_json,
    run_tag,
    start_scheduler,
    wait_for,
)

pytestmark = pytest.mark.e2e
__all__ = ["kai_cluster", "start_scheduler"]  # fixtures used by this module

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "manifests" / "70-podgrouper.yaml"
CHART = REPO / "manifests" / "chart"
NS = "kai-scheduler"
SA = "kai-podgrouper"

MakeNodes = Callable[..., list[str]]


class PodGrouperProcess(SchedulerProcess):
    """``python -m scheduler podgrouper`` as a child process (probes, log, stop as for the
    scheduler)."""

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "scheduler",
            "podgrouper",
            f"--kube-config={self.kubeconfig}",
            f"--metrics-address=127.0.0.1:{self.port}",
            "--log-format=json",
            "--log-level=debug",
            *self.extra_args,
        ]


@pytest.fixture(scope="module")
def grouper_kubeconfig(kai_cluster: KaiCluster) -> Path:
    """The pod grouper's ServiceAccount and RBAC from the shipped manifest (not its
    Deployment: there is no image to run here); a kubeconfig with that account's token."""
    cp = kai_cluster.cp
    cp.kubectl("apply", "-f", str(REPO / "manifests" / "00-namespace.yaml"))
    # KAI's classes: the grouper names train or inference only when they exist.
    cp.kubectl("apply", "-f", str(REPO / "manifests" / "60-priorityclasses.yaml"))
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] != "Deployment"]
    cp.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    )
    token = cp.service_account_token(NS, SA)
    return cp.kubeconfig_for_token(token, f"kai-podgrouper-{uuid.uuid4().hex[:6]}")


StartGrouper = Callable[..., PodGrouperProcess]


@pytest.fixture
def start_podgrouper(
    kai_cluster: KaiCluster,
    grouper_kubeconfig: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Generator[StartGrouper, None, None]:
    """``start_podgrouper(args=()) -> PodGrouperProcess``, ready; stopped after the test."""
    procs: list[PodGrouperProcess] = []

    def start(args: Iterable[str] = ()) -> PodGrouperProcess:
        proc = PodGrouperProcess(
            grouper_kubeconfig, args=args, name=f"podgrouper-{len(procs)}", workdir=tmp_path
        )
        procs.append(proc)
        proc.start()
        proc.wait_ready()
        return proc

    yield start
    keep = kai_cluster.cp.log_dir / "scheduler"
    keep.mkdir(parents=True, exist_ok=True)
    for proc in procs:
        code = proc.stop()
        shutil.copyfile(proc.log_path, keep / f"{request.node.name}-{proc.name}.log")
        print(f"\n===== {proc.name} (exit {code}) log tail =====\n{proc.log_tail(120)}")


def _template(
    tag: dict[str, str], gpus: int = 0, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"labels": {**tag, **(labels or {})}},
        "spec": {
            "schedulerName": "kai-scheduler",
            "nodeSelector": dict(tag),
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "containers": [
                {"name": "main", "image": "registry.invalid/fake:1", "resources": resources}
            ],
        },
    }


def _job(
    name: str,
    tag: dict[str, str],
    *,
    workers: int,
    gpus: int = 1,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    template = _template(tag, gpus)
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
        },
        "spec": {
            "parallelism": workers,
            "completions": workers,
            "backoffLimit": 0,
            "template": template,
        },
    }


def _podgroups(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    return list(kubectl_json(cp, "get", "podgroups", "-n", namespace)["items"])


def _pods(cp: ControlPlane, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    args = ["get", "pods", "-n", namespace, *(("-l", selector) if selector else ())]
    return list(kubectl_json(cp, *args)["items"])


def _events(cp: ControlPlane, namespace: str, reason: str) -> list[dict[str, Any]]:
    items = kubectl_json(cp, "get", "events", "-n", namespace)["items"]
    return [e for e in items if e.get("reason") == reason]


def _grouped(
    cp: ControlPlane, namespace: str, selector: str, count: int
) -> Callable[[], dict[str, str] | None]:
    """A check: {pod: PodGroup} once ``count`` pods exist and all carry pod-group-name."""

    def check() -> dict[str, str] | None:
        pods = _pods(cp, namespace, selector)
        names = {
            p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get("pod-group-name")
            for p in pods
        }
        if len(names) == count and all(names.values()):
            return {k: str(v) for k, v in names.items()}
        return None

    return check


def test_batch_job_with_min_member_is_one_gang_that_binds_together(
    kai_cluster: KaiCluster,
    start_podgrouper: StartGrouper,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: MakeNodes,
) -> None:
    cp = kai_cluster.cp
    tag = run_tag()
    nodes = make_gpu_nodes(2, gpus=2, labels=tag)
    grouper = start_podgrouper()
    job = _job("train", tag, workers=3, annotations={"kai.scheduler/batch-min-member": "3"})
    kai_cluster.create(job, namespace=namespace)
    job_uid = kubectl_json(cp, "get", "job", "train", "-n", namespace)["metadata"]["uid"]
    grouped = wait_for(
        "3 Job pods annotated",
        _grouped(cp, namespace, f"kai-e2e={tag['kai-e2e']}", 3),
        timeout=60,
        logs=grouper,
    )
    expected = f"pg-train-{job_uid}"
    assert set(grouped.values()) == {expected}
    (pg,) = _podgroups(cp, namespace)
    assert pg["metadata"]["name"] == expected
    assert pg["spec"]["minMember"] == 3
    assert pg["spec"]["queue"] == "default-queue"
    assert pg["spec"]["priorityClassName"] == "train"
    (owner,) = pg["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Job", "train", job_uid)
    assert owner["blockOwnerDeletion"] is False
    # kopf keeps no state on the pods: only our annotation is added, no finalizer of ours.
    for p in _pods(cp, namespace):
        meta = p["metadata"]
        assert not [k for k in meta.get("annotations") or {} if k.startswith("kopf.")]
        assert not [f for f in meta.get("finalizers") or [] if "kopf" in f or "kai" in f]

    # Three 1-GPU workers on two 2-GPU nodes: the gang spans both, bound in one cycle.
    sched = start_scheduler()
    bound = wait_for(
        "3 workers bound",
        lambda: b if len(b := bound_nodes(_pods(cp, namespace))) == 3 else None,
        timeout=60,
        logs=[sched, grouper],
    )
    assert set(bound.values()) <= set(nodes)
    binds = wait_for(
        "3 binds logged",
        lambda: (
            b
            if len(b := [r for r in sched.log_records() if r.get("event") == "bound"]) >= 3
            else None
        ),
        timeout=15,
        logs=sched,
    )
    assert len({r["cycle"] for r in binds}) == 1, binds

    # A user edit of an owned field is set back, with an Event on the PodGroup.
    cp.kubectl(
        "patch", "podgroup", expected, "-n", namespace, "--type=merge",
        "-p", '{"spec": {"minMember": 1}}',
    )  # fmt: skip
    wait_for(
        "minMember set back to 3",
        lambda: (
            kubectl_json(cp, "get", "podgroup", expected, "-n", namespace)["spec"]["minMember"] == 3
        ),
        timeout=30,
        logs=grouper,
    )
    (event,) = wait_for(
        "PodGroupEditReverted Event",
        lambda: _events(cp, namespace, "PodGroupEditReverted"),
        timeout=15,
        logs=grouper,
    )
    assert event["involvedObject"]["name"] == expected
    assert "spec.minMember is 1" in event["message"]

    # Garbage-collected with the Job.
    cp.kubectl("delete", "job", "train", "-n", namespace, "--wait=false")
    wait_for("PodGroup deleted with its Job", lambda: not _podgroups(cp, namespace), timeout=60)
    assert grouper.running()


def test_batch_job_gang_without_room_binds_none(
    kai_cluster: KaiCluster,
    start_podgrouper: StartGrouper,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: MakeNodes,
) -> None:
    cp = kai_cluster.cp
    tag = run_tag()
    make_gpu_nodes(1, gpus=2, labels=tag)
    grouper = start_podgrouper()
    job = _job("wide", tag, workers=3, annotations={"kai.scheduler/batch-min-member": "3"})
    kai_cluster.create(job, namespace=namespace)
    wait_for(
        "3 Job pods annotated",
        _grouped(cp, namespace, f"kai-e2e={tag['kai-e2e']}", 3),
        timeout=60,
        logs=grouper,
    )
    sched = start_scheduler()

    def all_unschedulable() -> bool:
        pods = _pods(cp, namespace)
        conditions = [
            c
            for p in pods
            for c in (p.get("status") or {}).get("conditions") or []
            if c.get("type") == "PodScheduled" and c.get("status") == "False"
        ]
        return len(conditions) == 3

    wait_for("the 3 pods marked Unschedulable", all_unschedulable, timeout=60, logs=sched)

    def cycles() -> int:
        return sum(1 for r in sched.log_records() if r.get("event") == "cycle")

    # Ten more cycles (300 ms each): still none bound - room for 2 is not room for 3.
    seen = cycles()
    wait_for("10 more cycles", lambda: cycles() >= seen + 10, timeout=30, logs=sched)
    assert bound_nodes(_pods(cp, namespace)) == {}
    assert grouper.running()


def test_deployment_gets_one_inference_podgroup_per_replica(
    kai_cluster: KaiCluster,
    start_podgrouper: StartGrouper,
    namespace: str,
) -> None:
    cp = kai_cluster.cp
    tag = run_tag()
    grouper = start_podgrouper()
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "serve", "labels": {"kai.scheduler/queue": "default-queue"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": tag},
            "template": _template(tag),
        },
    }
    kai_cluster.create(deployment, namespace=namespace)
    grouped = wait_for(
        "2 replicas annotated",
        _grouped(cp, namespace, f"kai-e2e={tag['kai-e2e']}", 2),
        timeout=60,
        logs=grouper,
    )
    pods = {p["metadata"]["name"]: p for p in _pods(cp, namespace)}
    groups = {g["metadata"]["name"]: g for g in _podgroups(cp, namespace)}
    assert len(groups) == 2
    for pod_name, pg_name in grouped.items():
        uid = pods[pod_name]["metadata"]["uid"]
        assert pg_name == f"pg-{pod_name}-{uid}"
        pg = groups[pg_name]
        assert pg["spec"]["priorityClassName"] == "inference"
        assert pg["spec"]["minMember"] == 1
        (owner,) = pg["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("Pod", uid)
    # Scaling down removes a replica and, with it, its PodGroup.
    cp.kubectl("scale", "deployment", "serve", "-n", namespace, "--replicas=1")
    wait_for(
        "1 PodGroup left", lambda: len(_podgroups(cp, namespace)) == 1, timeout=60, logs=grouper
    )


def test_missing_queue_label_creates_the_podgroup_and_tells_the_workload(
    kai_cluster: KaiCluster,
    start_podgrouper: StartGrouper,
    namespace: str,
) -> None:
    cp = kai_cluster.cp
    tag = run_tag()
    grouper = start_podgrouper()
    queue = f"no-such-queue-{uuid.uuid4().hex[:5]}"
    job = _job("lost", tag, workers=1, gpus=0, labels={"kai.scheduler/queue": queue})
    kai_cluster.create(job, namespace=namespace)
    wait_for(
        "pod annotated",
        _grouped(cp, namespace, f"kai-e2e={tag['kai-e2e']}", 1),
        timeout=60,
        logs=grouper,
    )
    (pg,) = _podgroups(cp, namespace)
    assert pg["spec"]["queue"] == queue, "as KAI: the PodGroup names it and waits"
    events = wait_for(
        "QueueNotFound Event",
        lambda: _events(cp, namespace, "QueueNotFound"),
        timeout=15,
        logs=grouper,
    )
    assert events[0]["involvedObject"]["kind"] == "Job"
    assert events[0]["involvedObject"]["name"] == "lost"
    assert events[0]["type"] == "Warning"
    assert queue in events[0]["message"] and "kai.scheduler/queue" in events[0]["message"]


def test_owner_deleted_midway_leaves_nothing_behind(
    kai_cluster: KaiCluster,
    start_podgrouper: StartGrouper,
    namespace: str,
) -> None:
    cp = kai_cluster.cp
    tag = run_tag()
    grouper = start_podgrouper()
    # Jobs deleted right after creation: the grouper meets pods whose Job is gone, or makes a
    # PodGroup for a Job being deleted. Either way nothing may stay behind.
    for i in range(3):
        kai_cluster.create(
            _job(
                f"gone-{i}",
                tag,
                workers=2,
                gpus=0,
                annotations={"kai.scheduler/batch-min-member": "2"},
            ),
            namespace=namespace,
        )
        cp.kubectl("delete", "job", f"gone-{i}", "-n", namespace, "--wait=false")
    # A pod whose owner never existed (deleted before anyone looked).
    ghost = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "orphan",
            "labels": dict(tag),
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "ghost",
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                }
            ],
        },
        "spec": _template(tag)["spec"],
    }
    kai_cluster.create(ghost, namespace=namespace)
    wait_for(
        "pods and PodGroups garbage-collected",
        lambda: not _pods(cp, namespace) and not _podgroups(cp, namespace),
        timeout=90,
        logs=grouper,
    )
    assert grouper.running()
    assert not [r for r in grouper.log_records() if r.get("level") in ("error", "critical")]
    # Whenever the grouper met a pod whose owner was gone, the pod was told (a Normal Event).
    gone = {
        r["pod"].split("/", 1)[1] for r in grouper.log_records() if r.get("event") == "owner_gone"
    }
    told = {e["involvedObject"]["name"] for e in _events(cp, namespace, "OwnerDeleted")}
    assert gone <= told, (gone, told)
    # Still grouping.
    kai_cluster.create(_job("after", tag, workers=1, gpus=0), namespace=namespace)
    wait_for(
        "a new Job grouped",
        _grouped(cp, namespace, f"kai-e2e={tag['kai-e2e']}", 1),
        timeout=60,
        logs=grouper,
    )


def test_explicit_and_skipped_pods_are_left_alone(
    kai_cluster: KaiCluster,
    start_podgrouper: StartGrouper,
    namespace: str,
) -> None:
    cp = kai_cluster.cp
    tag = run_tag()
    grouper = start_podgrouper()
    explicit = _job("explicit", tag, workers=1, gpus=0)
    explicit["spec"]["template"]["metadata"]["annotations"] = {"pod-group-name": "mine"}
    skipped = _job(
        "skipped", tag, workers=1, gpus=0, annotations={"kai.scheduler/skip-podgrouper": "true"}
    )
    marker = _job("marker", tag, workers=1, gpus=0)
    kai_cluster.create(explicit, skipped, namespace=namespace)
    # Grouped after the other two were seen (events are handled in order per pod, and the
    # other pods were created first).
    kai_cluster.create(marker, namespace=namespace)
    wait_for(
        "the marker Job grouped",
        lambda: any(
            p["metadata"]["name"].startswith("pg-marker-") for p in _podgroups(cp, namespace)
        ),
        timeout=60,
        logs=grouper,
    )
    wait_for("3 pods", lambda: len(_pods(cp, namespace)) == 3, timeout=30)
    names = {p["metadata"]["name"] for p in _podgroups(cp, namespace)}
    assert len(names) == 1
    by_job = {
        p["metadata"]["labels"]["job-name"]: (p["metadata"].get("annotations") or {})
        for p in _pods(cp, namespace)
    }
    assert by_job["explicit"]["pod-group-name"] == "mine"
    assert "pod-group-name" not in by_job["skipped"]


def _can_i(cp: ControlPlane, kubeconfig: Path, verb: str, resource: str, ns: str | None) -> bool:
    name, _, subresource = resource.partition("/")
    plural, _, group = name.partition(".")
    attributes = {"verb": verb, "resource": plural, "group": group, "subresource": subresource}
    if ns:
        attributes["namespace"] = ns
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    result = cp.kubectl(
        "create", "--validate=false", "-f", "-", "-o", "json",
        input=json.dumps(review), kubeconfig=kubeconfig,
    )  # fmt: skip
    allowed: bool = json.loads(result.stdout)["status"]["allowed"]
    return allowed


def test_podgrouper_service_account_has_least_privilege(
    kai_cluster: KaiCluster, grouper_kubeconfig: Path, namespace: str
) -> None:
    cp = kai_cluster.cp
    allowed = [
        ("watch", "pods", None), ("get", "pods", namespace), ("patch", "pods", namespace),
        ("get", "jobs.batch", namespace), ("get", "cronjobs.batch", namespace),
        ("get", "replicasets.apps", namespace), ("get", "deployments.apps", namespace),
        ("get", "statefulsets.apps", namespace),
        ("get", "leaderworkersets.leaderworkerset.x-k8s.io", namespace),
        ("watch", "podgroups.scheduling.run.ai", None),
        ("create", "podgroups.scheduling.run.ai", namespace),
        ("patch", "podgroups.scheduling.run.ai", namespace),
        ("get", "queues.scheduling.run.ai", None),
        ("get", "priorityclasses.scheduling.k8s.io", None),
        ("create", "events", namespace),
    ]  # fmt: skip
    denied = [
        ("create", "pods/binding", namespace), ("delete", "pods", namespace),
        ("create", "pods", namespace), ("update", "pods", namespace),
        ("get", "secrets", namespace), ("get", "configmaps", namespace),
        ("list", "jobs.batch", None), ("watch", "deployments.apps", None),
        ("patch", "jobs.batch", namespace), ("delete", "podgroups.scheduling.run.ai", namespace),
        ("update", "podgroups.scheduling.run.ai/status", namespace),
        ("create", "queues.scheduling.run.ai", None), ("list", "queues.scheduling.run.ai", None),
        ("patch", "nodes", None), ("create", "clusterrolebindings", None),
    ]  # fmt: skip
    wrong = [a for a in allowed if not _can_i(cp, grouper_kubeconfig, *a)]
    wrong += [d for d in denied if _can_i(cp, grouper_kubeconfig, *d)]
    assert not wrong, f"unexpected permissions (expected allowed then denied): {wrong}"


def test_chart_renders_the_podgrouper_with_a_switch(kai_cluster: KaiCluster) -> None:
    cp = kai_cluster.cp

    def render(*sets: str) -> list[dict[str, Any]]:
        args = ["template", "kai-scheduler", str(CHART), "-n", NS]
        for s in sets:
            args += ["--set", s]
        return [d for d in yaml.safe_load_all(cp.helm(*args).stdout) if d]

    docs = render()
    grouper = [d for d in docs if "podgrouper" in d["metadata"]["name"]]
    assert sorted(d["kind"] for d in grouper) == [
        "ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount",
    ]  # fmt: skip
    (deploy,) = [d for d in grouper if d["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "kai-scheduler-podgrouper"
    args = pod["containers"][0]["args"]
    assert args[0] == "podgrouper" and "--scheduler-name=kai-scheduler" in args
    assert "--default-queue=default-queue" in args
    (role,) = [d for d in grouper if d["kind"] == "ClusterRole"]
    plain = [
        d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == "ClusterRole"
    ]
    assert role["rules"] == plain[0]["rules"]
    assert not [
        d for d in render("podgrouper.enabled=false") if "podgrouper" in d["metadata"]["name"]
    ]
    other = render(
        "schedulerName=gpu-sched", "defaultQueues.childName=q", "podgrouper.logLevel=debug"
    )
    (deploy,) = [
        d for d in other if d["kind"] == "Deployment" and "podgrouper" in d["metadata"]["name"]
    ]
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--scheduler-name=gpu-sched", "--default-queue=q", "--log-level=debug"} <= set(args)
