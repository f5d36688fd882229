"""Volcano Jobs end to end: Volcano's real job controller (volcano.sh/volcano, pinned in
testenv/versions.env) with our scheduler in place of volcano-scheduler.

Nothing is made by hand but the Job (and the ``default`` Volcano Queue, which a Volcano install's
scheduler would create): the controller makes the Job's PodGroup (Pending); our scheduler
must enqueue it (Inqueue) before the controller creates any pod; then it binds the workers as
one gang. Evicting a worker (Eviction API) fires Volcano's ``PodEvicted`` event; the Job's
``PodEvicted -> RestartJob`` policy makes the controller kill and recreate every pod (and the
PodGroup, deleted and made again under the same name, to be enqueued again), and the new pods
must be scheduled again.

A Volcano Queue with a ``capability`` (the issue's ``ml-team``, ``capability: {nvidia.com/gpu:
2}``, ``reclaimable: false``; named ``ml-team-<tag>`` here, as Queues are cluster-scoped) lets
a 2-GPU Job in and keeps 3-GPU ones out, whatever the order they come in: the 3-GPU Jobs (one
gang of 3 one-GPU workers, one worker of 3 GPUs) are submitted first and their PodGroups stay
``Pending`` - the controller never creates their pods - with an ``Unschedulable`` condition
(reason ``QueueCapability``) and a Warning Event naming the queue's capability, while the
2-GPU Job submitted after them is enqueued, its pods are created and bound, and it runs.

The workers run on nodes of the second kwok (``make_long_running_gpu_nodes``): the control
plane's kwok completes any pod owned by a kind ``Job`` as soon as it runs, which would finish
the Volcano Job before anything could be evicted.
"""

from __future__ import annotations

import calendar
import functools
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
GPU = "nvidia.com/gpu"


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


def _podgroup_of(cp: ControlPlane, namespace: str, job: str) -> dict[str, Any] | None:
    """The PodGroup Volcano's controller made for Job ``job`` (None: not yet)."""
    for pg in _podgroups(cp, namespace):
        owners = pg["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "Job" and o.get("name") == job for o in owners):
            return pg
    return None


def _phase(obj: Mapping[str, Any]) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


def _condition(pg: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    conditions = (pg.get("status") or {}).get("conditions") or []
    return next((dict(c) for c in conditions if c.get("type") == kind), None)


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
        pg = _podgroup_of(cp, namespace, "train")
        return pg if pg is not None and _phase(pg) in ("Inqueue", "Running") else None

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


def test_volcano_queue_capability_keeps_3_gpu_jobs_pending_and_2_gpu_job_runs(
    volcano: VolcanoControllerManager,
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_long_running_gpu_nodes: Any,
) -> None:
    cp = kai_cluster.cp
    tag = run_tag()
    queue = f"ml-team-{tag['kai-e2e'][:6]}"
    # 8 GPUs, 4 a node: every Job below fits the nodes (all three at once, too); only the
    # queue's capability keeps the 3-GPU ones out.
    make_long_running_gpu_nodes(2, gpus=4, labels=tag)
    ml_team = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": queue},
        "spec": {"weight": 1, "capability": {GPU: 2}, "reclaimable": False},
    }
    cp.kubectl("create", "-f", "-", input=json.dumps(ml_team))
    try:
        sched = start_scheduler()
        # The 3-GPU Jobs first, in both shapes: a gang of 3 one-GPU workers, one 3-GPU worker.
        big = ("big-gang", "big-single")
        in_ml_team = functools.partial(volcano_job, node_selector=tag, queue=queue)
        kai_cluster.create(
            in_ml_team("big-gang", workers=3, min_available=3, gpus=1),
            in_ml_team("big-single", workers=1, min_available=1, gpus=3),
            namespace=namespace,
        )

        def refused(job: str) -> dict[str, Any] | None:
            pg = _podgroup_of(cp, namespace, job)
            waiting = _condition(pg, "Unschedulable") if pg is not None else None
            return pg if waiting and waiting.get("reason") == "QueueCapability" else None

        for name in big:
            pg = wait_for(
                f"{name}'s PodGroup refused by the queue's capability",
                functools.partial(refused, name),
                timeout=60,
                logs=sched,
            )
            assert _phase(pg) == "Pending", pg.get("status")
            assert pg["spec"].get("queue") == queue, pg["spec"]
            assert (pg["spec"].get("minResources") or {}).get(GPU) == "3", pg["spec"]

        # The 2-GPU Job, submitted after them, is not blocked by them.
        kai_cluster.create(
            in_ml_team("small", workers=2, min_available=2, gpus=1), namespace=namespace
        )
        pg = wait_for(
            "the 2-GPU Job's PodGroup to leave Pending",
            lambda: (
                (pg := _podgroup_of(cp, namespace, "small"))
                and _phase(pg) in ("Inqueue", "Running")
                and pg
            ),
            timeout=60,
            logs=sched,
        )
        assert (pg["spec"].get("minResources") or {}).get(GPU) == "2", pg["spec"]
        workers = wait_for(
            "the 2-GPU Job's 2 workers bound",
            lambda: (b := _bound(_live(_job_pods(cp, namespace, "small")))) and len(b) == 2 and b,
            timeout=60,
            logs=sched,
        )
        _assert_bound_together(workers)
        wait_for(
            "the 2-GPU Job to be Running",
            lambda: (
                (_job(cp, namespace, "small").get("status") or {}).get("state", {}).get("phase")
                == "Running"
            ),
            timeout=30,
            logs=sched,
        )
        pg = wait_for(
            "the 2-GPU Job's PodGroup Running",
            lambda: (pg := _podgroup_of(cp, namespace, "small")) and _phase(pg) == "Running" and pg,
            timeout=30,
            logs=sched,
        )
        scheduled = _condition(pg, "Scheduled")
        assert scheduled is not None and scheduled["status"] == "True", pg["status"]
        assert _condition(pg, "Unschedulable") is None, pg["status"]

        # While it runs, the 3-GPU Jobs stay Pending: no pod is ever created for them.
        until = time.monotonic() + 5
        while time.monotonic() < until:
            for name in big:
                pg = _podgroup_of(cp, namespace, name)
                assert pg is not None and _phase(pg) == "Pending", pg and pg.get("status")
                assert _job_pods(cp, namespace, name) == [], f"{name} has pods"
            assert len(_bound(_live(_job_pods(cp, namespace, "small")))) == 2
            time.sleep(0.5)

        # The reason, as a user sees it: the PodGroup's condition and a Warning Event name the
        # queue's capability (now held by the 2-GPU Job).
        capability = f"queue {queue} capability: {GPU} 2"

        def refused_while_full(job: str) -> dict[str, Any] | None:
            pg = refused(job)
            waiting = _condition(pg, "Unschedulable") if pg is not None else None
            return pg if waiting and "of which 2 in use" in waiting.get("message", "") else None

        for name in big:
            pg = wait_for(
                f"{name}'s condition to count the 2 GPUs in use",
                functools.partial(refused_while_full, name),
                timeout=30,
                logs=sched,
            )
            waiting = _condition(pg, "Unschedulable")
            assert waiting is not None and waiting["status"] == "True", pg["status"]
            assert capability in waiting["message"], waiting
            assert f"minResources {GPU} 3 does not fit" in waiting["message"], waiting
            events = kubectl_json(
                cp, "get", "events", "-n", namespace,
                "--field-selector", f"involvedObject.name={pg['metadata']['name']}",
            )["items"]  # fmt: skip
            assert any(
                e.get("type") == "Warning"
                and e.get("reason") == "Unschedulable"
                and capability in e.get("message", "")
                for e in events
            ), events
            state = (_job(cp, namespace, name).get("status") or {}).get("state") or {}
            assert state.get("phase") == "Pending", state

        # The queue: what it holds (our scheduler) and its PodGroups by phase (Volcano's
        # queue controller).
        def queue_status() -> dict[str, Any] | None:
            status = kubectl_json(cp, "get", "queues.scheduling.volcano.sh", queue).get("status")
            status = status or {}
            held = (status.get("allocated") or {}).get(GPU)
            counts = (status.get("pending"), status.get("running"))
            return status if held == "2" and counts == (2, 1) else None

        wait_for("the queue's status", queue_status, timeout=30, logs=sched)
    finally:
        cp.kubectl("delete", "queues.scheduling.volcano.sh", queue, "--wait=false", check=False)
