"""Queue status bodies written by the scheduler (pure: built from the fair-share report)."""

from __future__ import annotations

from dataclasses import replace

from scheduler.bench.synthetic import make_gang, make_node, make_queue
from scheduler.cluster import Node, PodPhase, Queue, QueueResource, Resources, Snapshot
from scheduler.commit.status import queue_status_body
from scheduler.fairness import FairShareReport, compute_fair_shares


def _report(queues: tuple[Queue, ...]) -> FairShareReport:
    node = Node("n0", Resources.from_k8s({"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 8}))
    return compute_fair_shares(Snapshot(nodes=(node,), queues=queues))


def test_healthy_queue_reports_valid_and_crd_units() -> None:
    gpu = (("gpu", QueueResource(quota=2000, limit=4000)),)
    report = _report((Queue("root"), Queue("team", parent="root", resources=gpu)))
    body = queue_status_body(report, "team")
    assert body["conditions"] == [
        {"type": "Valid", "status": "True", "reason": "Valid", "message": ""}
    ]
    assert body["allocated"] == {"gpu": 0, "cpu": 0, "memory": 0}
    assert queue_status_body(report, "root")["childQueues"] == ["team"]


def test_queue_with_missing_parent_says_why() -> None:
    report = _report((Queue("orphan", parent="nowhere"),))
    (condition,) = queue_status_body(report, "orphan")["conditions"]
    assert condition["status"] == "False" and condition["reason"] == "InvalidQueueTree"
    assert "spec.parentQueue" in condition["message"] and "nowhere" in condition["message"]


def test_non_preemptible_part_of_allocated_is_reported() -> None:
    queues = (make_queue("root"), make_queue("team", "root", gpu_quota=8))
    gangs = [
        make_gang("serve", 2, queue="team", gpus=1, priority=125),  # non-preemptible
        make_gang("train", 1, queue="team", gpus=3),
    ]
    pods = tuple(replace(p, node_name="n0", phase=PodPhase.RUNNING) for _, ps in gangs for p in ps)
    snap = Snapshot((make_node("n0", gpus=8),), pods, tuple(g for g, _ in gangs), queues)
    body = queue_status_body(compute_fair_shares(snap), "team")
    assert body["allocated"]["gpu"] == 5
    assert body["allocatedNonPreemptible"]["gpu"] == 2
    assert (
        queue_status_body(compute_fair_shares(snap), "root")["allocatedNonPreemptible"]["gpu"] == 2
    )
