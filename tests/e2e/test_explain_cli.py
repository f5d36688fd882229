"""``kai-scheduler explain`` on the real control plane, against what the scheduler wrote.

One scheduler process, one queue (4 GPUs, limit 4), one gang that fits (2 pods x 1 GPU) and
one that cannot (2 pods x 4 GPUs: above the queue's limit and larger than the node). Once the
scheduler has decided, the installed ``kai-scheduler`` console script explains both, and the
output must carry the node the placed gang is on, the exact reason the waiting pods' condition
carries, and the queue's usage as its status says - read back independently with kubectl.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.scheduler_process import (
    REPO,
    KaiCluster,
    StartScheduler,
    bound_nodes,
    kai_cluster,
    kubectl_json,
    pod_manifest,
    podgroup_manifest,
    run_tag,
    start_scheduler,
    wait_for,
)

pytestmark = pytest.mark.e2e
_QUEUES = "queues.scheduling.run.ai"
_PODGROUPS = "podgroups.scheduling.run.ai"
__all__ = ["kai_cluster", "start_scheduler"]  # fixtures used by this module


def _explain(cluster: KaiCluster, *args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "kai-scheduler"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "scheduler"]
    return subprocess.run(
        [*argv, "explain", f"--kube-config={cluster.cp.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def _unschedulable(pod: dict[str, Any]) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message", ""))
    return None


def test_explain_placed_and_waiting_gangs(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    (node,) = make_gpu_nodes(1, gpus=4, labels=tag)
    queue = f"explain-{uuid.uuid4().hex[:6]}"
    kai_cluster.apply(
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": queue},
            "spec": {"resources": {"gpu": {"quota": 4, "limit": 4}}},
        }
    )
    try:
        sched = start_scheduler()
        objects: list[dict[str, Any]] = [
            podgroup_manifest("fits", 2, queue=queue),
            podgroup_manifest("waits", 2, queue=queue),
        ]
        for group, gpus in (("fits", 1), ("waits", 4)):
            objects += [
                pod_manifest(f"{group}-{i}", gpus=gpus, node_selector=tag,
                             annotations={"pod-group-name": group})
                for i in range(2)
            ]  # fmt: skip
        # Not ours: no kube-scheduler runs here, so it stays pending, and explain must say why.
        objects.append(pod_manifest("other", scheduler_name="default-scheduler"))
        kai_cluster.create(*objects, namespace=namespace)

        def decided() -> tuple[dict[str, str], dict[str, str]] | None:
            pods = kai_cluster.pods(namespace)
            bound = bound_nodes(pods)
            waiting = {p["metadata"]["name"]: m for p in pods if (m := _unschedulable(p))}
            status = kubectl_json(kai_cluster.cp, "get", _QUEUES, queue).get("status") or {}
            used = str((status.get("allocated") or {}).get("gpu"))
            ok = set(bound) == {"fits-0", "fits-1"} and {"waits-0", "waits-1"} <= set(waiting)
            return (bound, waiting) if ok and used == "2" else None

        bound, waiting = wait_for("the scheduler's decision", decided, timeout=60, logs=sched)
        assert set(bound.values()) == {node}
        status = kubectl_json(kai_cluster.cp, "get", _QUEUES, queue)["status"]

        placed = _explain(kai_cluster, "-n", namespace, "pod/fits-0")
        assert placed.returncode == 0, placed.stderr
        assert "Decision: placed: bound to node " + node in placed.stdout, placed.stdout
        assert "PodGroup fits" in placed.stdout and "minMember 2: 2 bound" in placed.stdout
        assert f"Queue: {queue} (from PodGroup spec.queue)" in placed.stdout

        group = _explain(kai_cluster, "-n", namespace, "podgroup/fits")
        assert group.returncode == 0, group.stderr
        assert f"Decision: placed: 2/2 pods bound on {node} (2)" in group.stdout, group.stdout

        stuck = _explain(kai_cluster, "-n", namespace, "waits-1")  # a bare NAME: the pod
        assert stuck.returncode == 0, stuck.stderr
        assert f"Decision: waiting (Unschedulable): {waiting['waits-1']}" in stuck.stdout, (
            stuck.stdout
        )
        # The queue's usage as its status says: gpu allocated 2 of fair share ..., quota 4.
        gpu_row = next(line for line in stuck.stdout.splitlines() if line.strip().startswith("gpu"))
        cells = gpu_row.split()
        assert cells[:4] == ["gpu", "devices", "2", str(status["allocatedNonPreemptible"]["gpu"])]
        assert cells[5] == str(status["fairShare"]["gpu"]) and cells[6:8] == ["4", "4"], gpu_row
        assert "FailedScheduling" in stuck.stdout  # the Event, merged

        as_json = _explain(kai_cluster, "-n", namespace, "podgroup/waits", "--output", "json")
        assert as_json.returncode == 0, as_json.stderr
        doc = json.loads(as_json.stdout)
        pg = kubectl_json(kai_cluster.cp, "get", _PODGROUPS, "waits", "-n", namespace)
        condition = next(c for c in pg["status"]["conditions"] if c["type"] == "Unschedulable")
        assert doc["verdict"] == "waiting"
        assert doc["message"] == condition["message"] and doc["reason"] == condition["reason"]
        assert condition["message"] in waiting["waits-0"]  # the pods carry the gang's reason
        assert doc["gang"]["bound"] == 0 and doc["gang"]["waiting"] == 2
        gpu = next(r for r in doc["queue"]["resources"] if r["resource"] == "gpu")
        assert gpu["allocated"] == "2" and gpu["fairShare"] == str(status["fairShare"]["gpu"])
        assert any(e["reason"] == "Unschedulable" for e in doc["events"]), doc["events"]

        other = _explain(kai_cluster, "-n", namespace, "pod/other")
        assert other.returncode == 0, other.stderr
        assert "not-ours" in other.stdout and "schedulerName default-scheduler" in other.stdout

        missing = _explain(kai_cluster, "-n", namespace, "podgroup/nope")
        assert missing.returncode == 1
        assert f"PodGroup nope not found in namespace {namespace}" in missing.stderr
        bad = _explain(kai_cluster, "-n", namespace, "deployment/fits")
        assert bad.returncode == 2 and "pod/NAME, podgroup/NAME or NAME" in bad.stderr
    finally:
        kai_cluster.cp.kubectl("delete", _QUEUES, queue, "--wait=false", check=False)
