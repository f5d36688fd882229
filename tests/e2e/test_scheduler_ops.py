"""Operations of the scheduler process: bad input becomes Events, /metrics, JSON logs,
binpack versus spread."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from typing import Any

import pytest
import yaml

from tests.e2e.scheduler_process import (
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
__all__ = ["kai_cluster", "start_scheduler"]  # fixtures used by this module


def _events_for(cluster: KaiCluster, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in cluster.events(namespace)
        if e["involvedObject"].get("kind") == kind and e["involvedObject"].get("name") == name
    ]


def test_malformed_input_becomes_events_and_others_still_run(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    nodes = make_gpu_nodes(1, gpus=4, labels={**tag, "nvidia.com/gpu.memory": "lots"})
    sched = start_scheduler()
    missing_queue = f"no-such-queue-{uuid.uuid4().hex[:6]}"
    kai_cluster.create(
        pod_manifest("bad-fraction", node_selector=tag, annotations={"gpu-fraction": "half"}),
        podgroup_manifest("lost", 1, missing_queue),
        pod_manifest("lost-0", gpus=1, node_selector=tag, annotations={"pod-group-name": "lost"}),
        pod_manifest("good", gpus=1, node_selector=tag),
        namespace=namespace,
    )

    bound = wait_for("good pod bound", lambda: bound_nodes(kai_cluster.pods(namespace)), logs=sched)
    assert bound == {"good": nodes[0]}

    def event(kind: str, name: str, ns: str = namespace) -> list[dict[str, Any]]:
        return [e for e in _events_for(kai_cluster, ns, kind, name) if e["type"] == "Warning"]

    bad = wait_for("Event on the bad pod", lambda: event("Pod", "bad-fraction"), logs=sched)
    assert any("gpu-fraction" in e["message"] and "'half'" in e["message"] for e in bad), bad
    lost = wait_for("Event on the PodGroup", lambda: event("PodGroup", "lost"), logs=sched)
    assert any(missing_queue in e["message"] for e in lost), lost
    node_events = wait_for(
        "Event on the node", lambda: event("Node", nodes[0], "default"), logs=sched
    )
    assert any("nvidia.com/gpu.memory" in e["message"] for e in node_events), node_events

    def lost_condition() -> list[dict[str, Any]]:
        # Events and pod status are separate writes of one commit: wait for the condition
        # itself rather than assume it landed with the PodGroup's Event.
        (pod,) = [p for p in kai_cluster.pods(namespace) if p["metadata"]["name"] == "lost-0"]
        conditions = pod["status"].get("conditions") or []
        return [
            c
            for c in conditions
            if c["type"] == "PodScheduled"
            and c["status"] == "False"
            and missing_queue in c.get("message", "")
        ]

    wait_for("PodScheduled=False naming the queue on lost-0", lost_condition, logs=sched)
    pods = {p["metadata"]["name"]: p for p in kai_cluster.pods(namespace)}
    assert not pods["bad-fraction"]["spec"].get("nodeName")
    assert not pods["lost-0"]["spec"].get("nodeName")
    # The process survived all of it and keeps scheduling.
    kai_cluster.create(pod_manifest("later", gpus=1, node_selector=tag), namespace=namespace)
    wait_for(
        "later pod bound", lambda: "later" in bound_nodes(kai_cluster.pods(namespace)), logs=sched
    )
    assert sched.running()


def _sample(metrics: str, name: str, **labels: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None


def test_metrics_probes_and_json_logs(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    make_gpu_nodes(1, gpus=2, labels=tag)
    sched = start_scheduler()
    assert sched.get("/healthz")[0] == 200
    assert sched.get("/readyz")[0] == 200
    kai_cluster.create(
        *(pod_manifest(f"m-{i}", gpus=1, node_selector=tag) for i in range(3)),
        namespace=namespace,
    )
    wait_for("2 bound", lambda: len(bound_nodes(kai_cluster.pods(namespace))) == 2, logs=sched)

    def scraped() -> str | None:
        text = sched.metrics()
        pending = _sample(text, "kai_pending_pods", queue="default-queue")
        return text if pending == 1 and _sample(text, "kai_binds_total") == 2 else None

    text = wait_for("metrics show 2 binds and 1 pending pod", scraped, logs=sched)
    assert (_sample(text, "kai_cycle_duration_seconds_count") or 0) >= 1
    assert (_sample(text, "kai_solve_duration_seconds_count") or 0) >= 1
    assert _sample(text, "kai_pending_gangs", queue="default-queue") == 1
    assert _sample(text, "kai_bind_failures_total") == 0
    assert not _sample(text, "kai_evictions_total")  # nothing evicted
    assert _sample(text, "kai_eviction_failures_total", reason="pdb") == 0
    assert _sample(text, "kai_nominated_pods") == 0
    assert (_sample(text, "kai_queue_allocated", queue="default-queue", resource="gpu") or 0) >= 2
    assert _sample(text, "kai_queue_fair_share", queue="default-queue", resource="gpu") is not None
    assert _sample(text, "kai_leader") == 1
    assert (_sample(text, "kai_event_loop_lag_seconds_count") or 0) >= 1
    records = sched.log_records()  # raises if any line is not JSON
    bound = [r for r in records if r.get("event") == "bound"]
    assert len(bound) == 2
    assert all({"pod", "gang", "queue", "node", "cycle"} <= set(r) for r in bound)
    assert {r["queue"] for r in bound} == {"default-queue"}
    assert any(r.get("event") == "cycle" and "cycle" in r for r in records)
    assert sched.stop() == 0  # SIGTERM is a clean shutdown
    assert sched.log_records()[-1]["event"] == "exiting"


@pytest.mark.parametrize("strategy", ["binpack", "spread"])
def test_binpack_fills_a_node_spread_spreads(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    strategy: str,
) -> None:
    tag = run_tag()
    nodes = make_gpu_nodes(3, gpus=4, labels=tag)
    sched = start_scheduler(config={"placement": {"gpu": strategy, "cpu": strategy}})
    for i in range(3):  # one at a time, so each decision sees the previous ones
        kai_cluster.create(pod_manifest(f"s-{i}", gpus=1, node_selector=tag), namespace=namespace)
        wait_for(
            f"s-{i} bound",
            lambda i=i: f"s-{i}" in bound_nodes(kai_cluster.pods(namespace)),
            logs=sched,
        )
    per_node = Counter(bound_nodes(kai_cluster.pods(namespace)).values())
    assert set(per_node) <= set(nodes)
    if strategy == "binpack":
        assert sorted(per_node.values()) == [3], per_node
    else:
        assert sorted(per_node.values()) == [1, 1, 1], per_node
    grants = kubectl_json(kai_cluster.cp, "get", "pods", "-n", namespace)["items"]
    assert all("kai.scheduler/gpu-grant" in p["metadata"]["annotations"] for p in grants)


@pytest.mark.parametrize(("scoring", "expected"), [("packing", "gpu"), ("fragmentation", "cpu")])
def test_fragmentation_scoring_keeps_idle_gpus_usable(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    scoring: str,
    expected: str,
) -> None:
    """``placement.scoring`` reaches the live solver. A CPU-only pod taking the last 4 cores
    of a node with 4 idle GPUs strands them for the GPU pods waiting in the cluster (4 cores
    each): binpack puts it there (least CPU left), fragmentation on the CPU-only node."""
    tag = run_tag()
    (gpu_node,) = make_gpu_nodes(1, gpus=4, cpu="4", labels=tag, name_prefix="frag-gpu")
    (cpu_node,) = make_gpu_nodes(1, gpus=0, cpu="16", labels=tag, name_prefix="frag-cpu")
    sched = start_scheduler(config={"placement": {"scoring": scoring, "solverWorkers": 1}})
    # A 2-pod gang that cannot fit (8 cores wanted on a 4-core GPU node): it only makes
    # "GPU pods asking 4 cores" the workload the cluster holds.
    podgroup = podgroup_manifest("train", 2)
    members = [
        pod_manifest(
            f"train-{i}",
            gpus=1,
            cpu="4",
            node_selector=tag,
            annotations={"pod-group-name": "train"},
        )
        for i in range(2)
    ]
    kai_cluster.create(podgroup, *members, namespace=namespace)
    kai_cluster.create(pod_manifest("etl", cpu="4", node_selector=tag), namespace=namespace)
    wait_for("etl bound", lambda: "etl" in bound_nodes(kai_cluster.pods(namespace)), logs=sched)
    where = bound_nodes(kai_cluster.pods(namespace))
    assert where == {"etl": gpu_node if expected == "gpu" else cpu_node}, where


def test_kube_api_server_flag_overrides_the_kubeconfig(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
    tmp_path: Any,
) -> None:
    tag = run_tag()
    make_gpu_nodes(1, gpus=1, labels=tag)
    config = yaml.safe_load(kai_cluster.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"  # nothing listens here
    wrong = tmp_path / "wrong-server.kubeconfig"
    wrong.write_text(yaml.safe_dump(config))
    sched = start_scheduler(
        args=[
            f"--kube-config={wrong}",
            f"--kube-api-server={kai_cluster.cp.server}",
            "--kube-api-secure=false",
        ],
    )
    kai_cluster.create(pod_manifest("p", gpus=1, node_selector=tag), namespace=namespace)
    wait_for(
        "bound through the overriding server",
        lambda: bound_nodes(kai_cluster.pods(namespace)),
        logs=sched,
    )
    assert any(
        r.get("event") == "api_client" and r.get("verify_tls") is False for r in sched.log_records()
    )
