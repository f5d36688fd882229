"""Live what-if: a snapshot of the real control plane, replayed offline, decides what the live
scheduler decides; a quota change flips it as predicted; ``GET /debug/snapshot`` is admin only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.cli import main
from scheduler.snapshotfile import read_snapshot
from tests.e2e.scheduler_process import (
    REPO,
    TEST_CONFIG,
    KaiCluster,
    SchedulerProcess,
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
__all__ = ["kai_cluster", "start_scheduler"]  # fixtures used by this module


def _queue(name: str, gpus: int) -> dict[str, Any]:
    """A root queue whose GPU quota and limit are ``gpus``."""
    open_ = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {
            "resources": {
                "gpu": {"quota": gpus, "limit": gpus, "overQuotaWeight": 1},
                "cpu": open_,
                "memory": open_,
            }
        },
    }


def _gang(name: str, pods: int, queue: str, tag: dict[str, str]) -> list[dict[str, Any]]:
    return [
        podgroup_manifest(name, pods, queue),
        *(
            pod_manifest(f"{name}-{i}", gpus=1, node_selector=tag,
                         annotations={"pod-group-name": name})
            for i in range(pods)
        ),
    ]  # fmt: skip


def _snapshot_cli(kubeconfig: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "scheduler", "snapshot", "--out", str(out),
            f"--kube-config={kubeconfig}", *extra]  # fmt: skip
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


def _replay(capsys: pytest.CaptureFixture[str], path: Path, *sets: str) -> dict[str, Any]:
    """``kai-scheduler simulate --snapshot path --json --cycles 1 --set ...`` as data."""
    argv = ["simulate", "--snapshot", str(path), "--json", "--cycles", "1"]
    for s in sets:
        argv += ["--set", s]
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def _mine(decision: dict[str, Any], namespace: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(placed gang -> pod -> node, waiting gang -> reason code) of ``namespace``'s gangs."""
    placed = {
        k.split("/", 1)[1]: {p.split("/", 1)[1]: n for p, n in pods.items()}
        for k, pods in decision["placed"].items()
        if k.startswith(f"{namespace}/")
    }
    waiting = {
        k.split("/", 1)[1]: w["code"]
        for k, w in decision["waiting"].items()
        if k.startswith(f"{namespace}/")
    }
    return placed, waiting


def _podgroup_reason(cluster: KaiCluster, namespace: str, name: str) -> str | None:
    obj = kubectl_json(cluster.cp, "get", "podgroups.scheduling.run.ai", name, "-n", namespace)
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Unschedulable" and c.get("status") == "True":
            return str(c.get("reason"))
    return None


def test_snapshot_replayed_offline_decides_what_the_live_scheduler_does(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cp = kai_cluster.cp
    tag = run_tag()
    queue = f"whatif-{uuid.uuid4().hex[:6]}"
    make_gpu_nodes(2, gpus=4, labels=tag)
    kai_cluster.apply(_queue(queue, 4))
    try:
        # Two gangs of one queue whose GPU limit (4) fits only one of them; no scheduler runs.
        kai_cluster.create(*_gang("big", 4, queue, tag), namespace=namespace)
        kai_cluster.create(*_gang("small", 2, queue, tag), namespace=namespace)
        config = {**TEST_CONFIG}
        cp.kubectl("create", "configmap", "sched-config", "-n", namespace,
                   f"--from-literal=config.yaml={yaml.safe_dump(config)}")  # fmt: skip

        # As an admin, with the config read from a ConfigMap ...
        snap = tmp_path / "before.json.gz"
        done = _snapshot_cli(cp.kubeconfig, snap, f"--config-map={namespace}/sched-config")
        assert done.returncode == 0, done.stderr
        # Other tests' namespaces may still be going away, so the cluster-wide count is a floor.
        pending = re.search(r"\((\d+) pending\)", done.stdout)
        assert "wrote" in done.stdout and pending and int(pending[1]) >= 6, done
        # ... and with exactly the scheduler's shipped permissions, config from a file.
        config_file = tmp_path / "config.yaml"
        config_file.write_text(yaml.safe_dump(config))
        as_sa = tmp_path / "as-sa.json"
        done = _snapshot_cli(kai_cluster.kubeconfig, as_sa, f"--config={config_file}")
        assert done.returncode == 0, done.stderr
        a, b = read_snapshot(snap), read_snapshot(as_sa)

        # Compare what this test owns: pods and nodes of other tests may vanish between the two.
        def own_pods(s: Any) -> list[Any]:
            return [p for p in s.snapshot.pods if p.namespace == namespace]

        def own_nodes(s: Any) -> list[Any]:
            return [n for n in s.snapshot.nodes if set(tag.items()) <= set(n.labels)]

        assert len(own_nodes(a)) == 2 and own_nodes(a) == own_nodes(b)
        assert own_pods(a) == own_pods(b)
        assert a.config is not None and a.config["solverTimeLimit"] == "0.3s"
        mine = [p for p in a.snapshot.pods if p.namespace == namespace]
        assert len(mine) == 6 and all(p.pending and p.queue == queue for p in mine)

        predicted = _replay(capsys, snap)
        placed, waiting = _mine(predicted["decisions"][0], namespace)
        assert len(placed) == 1 and len(waiting) == 1, predicted["decisions"]
        (winner,) = placed
        (loser,) = waiting

        # The live scheduler, started on that same state, makes the same decision.
        sched = start_scheduler()
        live = wait_for(
            f"gang {winner} bound",
            lambda: (
                (b := bound_nodes(kai_cluster.pods(namespace)))
                and len(b) == len(placed[winner])
                and b
            ),
            logs=sched,
        )
        assert live == placed[winner]  # same pods on the same nodes
        reason = wait_for(
            f"{loser} reported waiting",
            lambda: _podgroup_reason(kai_cluster, namespace, loser),
            logs=sched,
        )
        assert reason == waiting[loser]
        assert set(bound_nodes(kai_cluster.pods(namespace))) == set(placed[winner])

        # What if the queue had 6 GPUs? The replay says: both gangs placed ...
        flipped = _replay(capsys, snap, f"queue.{queue}.gpu.quota=6", f"queue.{queue}.gpu.limit=6")
        assert flipped["changes"] == [f"queue.{queue}.gpu.quota=6", f"queue.{queue}.gpu.limit=6"]
        placed_if, waiting_if = _mine(flipped["decisions"][0], namespace)
        assert set(placed_if) == {"big", "small"} and not waiting_if
        # ... and so does the live scheduler once the change is made for real.
        kai_cluster.apply(_queue(queue, 6))
        wait_for(
            "both gangs bound after the quota change",
            lambda: len(bound_nodes(kai_cluster.pods(namespace))) == 6,
            logs=sched,
        )
        assert sched.get("/debug/snapshot")[0] == 404  # off unless debugSnapshot: true
    finally:
        cp.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=false", check=False)
        cp.kubectl("delete", "queues.scheduling.run.ai", queue, "--wait=false", check=False)


def _get(url: str, token: str | None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()


def test_debug_snapshot_endpoint_is_for_admins_only(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cp = kai_cluster.cp
    tag = run_tag()
    (node,) = make_gpu_nodes(1, gpus=2, labels=tag)
    sched: SchedulerProcess = start_scheduler(config={"debugSnapshot": True})
    kai_cluster.create(pod_manifest("p", gpus=4, node_selector=tag), namespace=namespace)
    url = sched.url + "/debug/snapshot"

    status, body = _get(url, None)
    assert status == 401 and b"Bearer" in body
    assert _get(url, "not-a-token")[0] == 401
    # A real user the API server knows, without the permission: 403.
    nobody = cp.service_account_token(namespace, "default")
    status, body = _get(url, nobody)
    assert status == 403 and b"/debug/snapshot" in body, body

    # A cluster admin gets the last cycle's snapshot (once a cycle has seen our pod).
    def fetched() -> bytes | None:
        status, body = _get(url, cp.admin_token)
        assert status in (200, 503), (status, body)
        return body if status == 200 and f"{namespace}/p".encode() in body else None

    body = wait_for("a snapshot with our pod", fetched, logs=sched)
    doc = json.loads(body)
    assert doc["source"]["by"] == "/debug/snapshot" and doc["source"]["cycle"] >= 1
    assert node in {n["name"] for n in doc["nodes"]}
    assert doc["config"]["solverTimeLimit"] == 0.3
    saved = tmp_path / "dumped.json"
    saved.write_bytes(body)
    # Replayed offline, the cycle decides what it did live: the 4-GPU pod waits.
    replay = _replay(capsys, saved)
    _, waiting = _mine(replay["decisions"][0], namespace)
    assert list(waiting) == ["p"]  # the pod's implicit gang of one
    assert not bound_nodes(kai_cluster.pods(namespace))
