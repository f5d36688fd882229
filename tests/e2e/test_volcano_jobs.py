"""Volcano Jobs end to end: Volcano's real job controller (volcano.sh/volcano, pinned in
testenv/versions.env) with our scheduler in place of volcano-scheduler.

Nothing is made by hand but the Job (and the ``default`` Volcano Queue, which a Volcano install's
scheduler would create): the controller makes the Job's PodGroup (Pending); our scheduler
must enqueue it (Inqueue) before the controller creates any pod; then it binds the workers as
one gang. Evicting a worker (Eviction API) fires Volcano's ``PodEvicted`` event; the Job's
``PodEvicted -> RestartJob`` policy makes the controller kill and recreate every pod, and the
new pods must be scheduled again.

The workers run on nodes of the second kwok (``make_long_running_gpu_nodes``): the control
plane's kwok completes any pod owned by a kind ``Job`` as soon as it runs, which would finish
the Volcano Job before anything could be evicted.
"""

from __future__ import annotations

import calendar
import json
import time
from collections.abc import Mapping
from typing import Any

import pytest

from testenv.controllers import VolcanoControllerManager, ensure_volcano_queue
from testenv.controlplane import ControlPlane
from tests.e2e.scheduler_process import (
    KaiCluster,
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
JOB_NAME_LABEL = "volcano.sh/job-name"


@pytest.fixture(scope="module")
def volcano(
    volcano_controller: VolcanoControllerManager, control_plane: ControlPlane
) -> VolcanoControllerManager:
    """The running controller-manager, with Volcano's ``default`` Queue present."""
    ensure_volcano_queue(control_plane, "default")
    return volcano_controller


def volcano_job(
    name: str,
    *,
    workers: int,
    min_available: int,
    gpus: int,
    node_selector: Mapping[str, str],
    queue: str = "default",
) -> dict[str, Any]:
    """A ``batch.volcano.sh/v1alpha1`` Job: one task of ``workers`` pods; every field the
    (absent) Volcano admission webhook would default is spelled out."""
    pod = {
        "metadata": {"labels": {"app": name}},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "restartPolicy": "Never",
            "nodeSelector": dict(node_selector),
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "containers": [
                {
                    "name": "worker",
                    "image": "registry.invalid/trainer:1",
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": str(gpus)},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ],
        },
    }
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "queue": queue,
            "minAvailable": min_available,
            "maxRetry": 3,
            "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
            "tasks": [{"name": "worker", "replicas": workers, "template": pod}],
        },
    }


def _job_pods(cp: ControlPlane, namespace: str, job: str) -> list[dict[str, Any]]:
    out = kubectl_json(cp, "get", "pods", "-n", namespace, "-l", f"{JOB_NAME_LABEL}={job}")
    return list(out["items"])


def _live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _bound(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p["spec"].get("nodeName")]


def _scheduled_at(pod: dict[str, Any]) -> float | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            stamp = c.get("lastTransitionTime")
            if stamp:
                return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))
    return None


def _podgroups(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    out = kubectl_json(cp, "get", "podgroups.scheduling.volcano.sh", "-n", namespace)
    return list(out["items"])


def _job(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    return dict(kubectl_json(cp, "get", "jobs.batch.volcano.sh", name, "-n", namespace))


def _assert_bound_together(pods: list[dict[str, Any]], within: float = 5.0) -> None:
    times = [_scheduled_at(p) for p in pods]
    assert all(t is not None for t in times), f"PodScheduled times {times}"
    known = [t for t in times if t is not None]
    assert max(known) - min(known) <= within, f"members bound {max(known) - min(known)}s apart"


def test_volcano_job_runs_as_gang_and_restarts_whole_after_eviction(
    volcano: VolcanoControllerManager,
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_long_running_gpu_nodes: Any,
) -> None:
    cp = kai_cluster.cp
    tag = run_tag()
    make_long_running_gpu_nodes(2, gpus=2, labels=tag)  # 4 GPUs for 3 one-GPU workers
    sched = start_scheduler()
    job = volcano_job("train", workers=3, min_available=3, gpus=1, node_selector=tag)
    cp.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(job))

    # The controller makes the PodGroup; our scheduler must take it out of Pending.
    def podgroup_enqueued() -> dict[str, Any] | None:
        for pg in _podgroups(cp, namespace):
            owners = pg["metadata"].get("ownerReferences") or []
            if any(o.get("kind") == "Job" and o.get("name") == "train" for o in owners):
                phase = (pg.get("status") or {}).get("phase")
                return pg if phase in ("Inqueue", "Running") else None
        return None

    pg = wait_for("the Job's PodGroup to leave Pending", podgroup_enqueued, timeout=60, logs=sched)
    assert pg["spec"]["minMember"] == 3, pg["spec"]
    assert pg["spec"].get("queue") == "default", pg["spec"]

    # Then the controller creates the pods and we bind all three.
    first = wait_for(
        "3 workers bound",
        lambda: (b := _bound(_live(_job_pods(cp, namespace, "train")))) and len(b) == 3 and b,
        timeout=60,
        logs=sched,
    )
    _assert_bound_together(first)
    assert len({p["spec"]["nodeName"] for p in first}) >= 2  # 2 GPUs a node: spread over both
    wait_for(
        "the Job to be Running",
        lambda: (
            (_job(cp, namespace, "train").get("status") or {}).get("state", {}).get("phase")
            == "Running"
        ),
        timeout=30,
        logs=sched,
    )
    first_uids = {p["metadata"]["uid"] for p in first}

    # Evict one worker: Volcano's PodEvicted -> RestartJob kills and recreates all three.
    victim = sorted(p["metadata"]["name"] for p in first)[0]
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": victim, "namespace": namespace},
    }
    cp.kubectl(
        "create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{victim}/eviction",
        "-f", "-", input=json.dumps(eviction),
    )  # fmt: skip

    def restarted() -> list[dict[str, Any]] | None:
        pods = _job_pods(cp, namespace, "train")
        if any(p["metadata"]["uid"] in first_uids for p in pods):
            return None  # the whole job restarts: every old pod goes
        bound = _bound(_live(pods))
        return bound if len(bound) == 3 else None

    second = wait_for("3 new workers bound after the restart", restarted, timeout=90, logs=sched)
    _assert_bound_together(second)
    status = _job(cp, namespace, "train").get("status") or {}
    assert status.get("retryCount", 0) >= 1, status
    assert len(_podgroups(cp, namespace)) == 1  # the same PodGroup, no new one
