"""LeaderWorkerSets end to end: the real LWS controller (sigs.k8s.io/lws, pinned in
testenv/versions.env, with its admission webhooks) makes the pods; our scheduler must bind each
group (a leader and its workers) as one gang.

Two ways the groups reach the scheduler, same expected result:

- ``volcano``: LWS configured with ``gangSchedulingManagement.schedulerProvider: volcano`` makes
  a Volcano PodGroup per group (minMember = size) and annotates the group's pods with it;
- ``podgrouper``: LWS without any gang provider, and our pod grouper (``python -m scheduler
  podgrouper``) makes one PodGroup per group.

A LeaderWorkerSet with ``size: 2``, ``replicas: 2``, 1 GPU per pod, on 3 GPUs: exactly one group
runs and the other waits whole (the spare GPU must stay free - a pod-by-pod scheduler would
take it); one more GPU and the waiting group's two pods bind together.
"""

from __future__ import annotations

import calendar
import json
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from testenv.controllers import LwsController
from testenv.controllers_plugin import StartLws
from testenv.controlplane import ControlPlane
from tests.e2e.scheduler_process import (
    REPO,
    KaiCluster,
    SchedulerProcess,
    StartScheduler,
    kai_cluster,
    kubectl_json,
    run_tag,
    start_scheduler,
    wait_for,
)

pytestmark = pytest.mark.e2e
__all__ = ["kai_cluster", "start_scheduler"]  # fixtures used by this module

SCHEDULER_NAME = "kai-scheduler"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
KAI_GROUP_ANNOTATION = "pod-group-name"
PODGROUPER_MANIFEST = "70-podgrouper.yaml"
PODGROUPER_RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
#: How long the second group must stay wholly unbound while the first runs (~20 cycles).
HOLD_SECONDS = 6.0


class PodGrouperProcess(SchedulerProcess):
    """``python -m scheduler podgrouper`` as a child process (the scheduler's lifecycle, log
    handling and /readyz probe)."""

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "scheduler",
            "podgrouper",
            f"--kube-config={self.kubeconfig}",
            f"--metrics-address=127.0.0.1:{self.port}",
            f"--scheduler-name={SCHEDULER_NAME}",
            "--log-format=json",
            "--log-level=debug",
            *self.extra_args,
        ]


@pytest.fixture(scope="module")
def podgrouper_kubeconfig(kai_cluster: KaiCluster) -> Path:
    """The pod grouper's ServiceAccount, ClusterRole and binding as shipped in
    ``manifests/70-podgrouper.yaml`` (not its Deployment); a kubeconfig with that SA's token."""
    cp = kai_cluster.cp
    path = REPO / "manifests" / PODGROUPER_MANIFEST
    assert path.exists(), f"{path} missing: the pod grouper ships its RBAC there"
    rbac = [
        d
        for d in yaml.safe_load_all(path.read_text())
        if isinstance(d, dict) and d.get("kind") in PODGROUPER_RBAC_KINDS
    ]
    assert {d["kind"] for d in rbac} == PODGROUPER_RBAC_KINDS, [d["kind"] for d in rbac]
    kai_cluster.apply(*rbac)
    sa = next(d for d in rbac if d["kind"] == "ServiceAccount")["metadata"]
    token = cp.service_account_token(sa["namespace"], sa["name"])
    return cp.kubeconfig_for_token(token, f"{sa['name']}-{uuid.uuid4().hex[:6]}")


@pytest.fixture
def start_podgrouper(
    kai_cluster: KaiCluster, podgrouper_kubeconfig: Path, tmp_path: Path
) -> Generator[Callable[[], PodGrouperProcess], None, None]:
    """``start_podgrouper() -> PodGrouperProcess`` (ready), stopped after the test with its log
    tail printed."""
    procs: list[PodGrouperProcess] = []

    def start() -> PodGrouperProcess:
        proc = PodGrouperProcess(podgrouper_kubeconfig, name="podgrouper", workdir=tmp_path)
        procs.append(proc)
        proc.start()
        proc.wait_ready()
        return proc

    yield start
    for proc in procs:
        code = proc.stop()
        print(f"\n===== podgrouper (exit {code}) log tail =====\n{proc.log_tail(120)}")


def leaderworkerset(
    name: str, *, replicas: int, size: int, gpus: int, node_selector: Mapping[str, str]
) -> dict[str, Any]:
    """A LeaderWorkerSet whose leader and workers share one template."""
    template = {
        "metadata": {"labels": {"app": name}},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "nodeSelector": dict(node_selector),
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "containers": [
                {
                    "name": "server",
                    "image": "registry.invalid/server:1",
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": str(gpus)},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ],
        },
    }
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {"size": size, "workerTemplate": template},
        },
    }


def _pods(cp: ControlPlane, namespace: str, lws: str) -> list[dict[str, Any]]:
    out = kubectl_json(cp, "get", "pods", "-n", namespace, "-l", f"{LWS_NAME_LABEL}={lws}")
    return [p for p in out["items"] if not p["metadata"].get("deletionTimestamp")]


def _groups(pods: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in pods:
        out[p["metadata"]["labels"].get(GROUP_INDEX_LABEL, "?")].append(p)
    return dict(out)


def _bound_count(pods: list[dict[str, Any]]) -> int:
    return sum(1 for p in pods if p["spec"].get("nodeName"))


def _scheduled_at(pod: dict[str, Any]) -> float | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            stamp = c.get("lastTransitionTime")
            if stamp:
                return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))
    return None


def _assert_bound_together(pods: list[dict[str, Any]], within: float = 5.0) -> None:
    times = [_scheduled_at(p) for p in pods]
    known = [t for t in times if t is not None]
    assert len(known) == len(times), f"PodScheduled times {times}"
    assert max(known) - min(known) <= within, f"members bound {max(known) - min(known)}s apart"


def _check_grouping(cp: ControlPlane, namespace: str, grouping: str, pods: list[Any]) -> None:
    """One PodGroup per LWS group, minMember = size, naming exactly that group's pods."""
    annotation = VOLCANO_GROUP_ANNOTATION if grouping == "volcano" else KAI_GROUP_ANNOTATION
    resource = (
        "podgroups.scheduling.volcano.sh"
        if grouping == "volcano"
        else "podgroups.scheduling.run.ai"
    )
    by_group: dict[str, set[str]] = defaultdict(set)
    for p in pods:
        name = (p["metadata"].get("annotations") or {}).get(annotation)
        assert name, f"pod {p['metadata']['name']} has no {annotation} annotation"
        by_group[p["metadata"]["labels"][GROUP_INDEX_LABEL]].add(name)
    assert all(len(v) == 1 for v in by_group.values()), dict(by_group)
    names = {next(iter(v)) for v in by_group.values()}
    assert len(names) == len(by_group) == 2, dict(by_group)
    pgs = {
        pg["metadata"]["name"]: pg
        for pg in kubectl_json(cp, "get", resource, "-n", namespace)["items"]
    }
    for name in names:
        assert name in pgs, f"PodGroup {name} ({resource}) missing; have {sorted(pgs)}"
        assert pgs[name]["spec"]["minMember"] == 2, pgs[name]["spec"]


@pytest.mark.parametrize("grouping", ["volcano", "podgrouper"])
def test_leaderworkerset_groups_are_gangs(
    grouping: str,
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    lws_controller: StartLws,
    request: pytest.FixtureRequest,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    cp = kai_cluster.cp
    tag = run_tag()
    make_gpu_nodes(1, gpus=3, labels=tag)  # room for one 2-GPU group, plus one spare GPU
    ctrl: LwsController = lws_controller("volcano" if grouping == "volcano" else None)
    # With the pod grouper, pods wait for their PodGroup instead of running alone.
    config = {"podGrouper": True} if grouping == "podgrouper" else None
    procs: list[SchedulerProcess] = [start_scheduler(config=config)]
    if grouping == "podgrouper":
        start_podgrouper: Callable[[], PodGrouperProcess]
        start_podgrouper = request.getfixturevalue("start_podgrouper")
        procs.append(start_podgrouper())
    lws = leaderworkerset("serve", replicas=2, size=2, gpus=1, node_selector=tag)
    cp.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(lws))

    def all_pods() -> list[dict[str, Any]] | None:
        pods = _pods(cp, namespace, "serve")
        return pods if len(pods) == 4 else None

    pods = wait_for("the LWS controller to make 4 pods", all_pods, timeout=60, logs=procs)
    assert all(p["spec"]["schedulerName"] == SCHEDULER_NAME for p in pods)

    # Exactly one group runs; the other waits whole, though one GPU is free.
    bound_per_group: dict[str, int] = {}

    def one_group_bound() -> dict[str, list[dict[str, Any]]] | None:
        groups = _groups(_pods(cp, namespace, "serve"))
        bound_per_group.clear()
        bound_per_group.update({k: _bound_count(g) for k, g in groups.items()})
        return groups if sorted(bound_per_group.values()) == [0, 2] else None

    try:
        groups = wait_for("one whole group bound", one_group_bound, timeout=60, logs=procs)
    except AssertionError as exc:
        raise AssertionError(f"bound pods per group {bound_per_group}: {exc}") from None
    _check_grouping(cp, namespace, grouping, [p for g in groups.values() for p in g])
    running = next(k for k, g in groups.items() if _bound_count(g) == 2)
    waiting = next(k for k in groups if k != running)
    _assert_bound_together(groups[running])
    deadline = time.monotonic() + HOLD_SECONDS
    while time.monotonic() < deadline:
        now = _groups(_pods(cp, namespace, "serve"))
        assert _bound_count(now[waiting]) == 0, f"group {waiting} partly bound: {now[waiting]}"
        assert _bound_count(now[running]) == 2, f"group {running} lost a pod"
        time.sleep(0.5)
    assert ctrl.proc is not None and ctrl.proc.running()

    # Room for the second group: both its pods bind, together.
    make_gpu_nodes(1, gpus=1, labels=tag)

    def second_bound() -> list[dict[str, Any]] | None:
        g = _groups(_pods(cp, namespace, "serve")).get(waiting, [])
        return g if len(g) == 2 and _bound_count(g) == 2 else None

    second = wait_for("the waiting group bound", second_bound, timeout=60, logs=procs)
    _assert_bound_together(second)
