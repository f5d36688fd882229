"""Queue status bodies written by the scheduler (pure: built from the fair-share report)."""

from __future__ import annotations

from scheduler.cluster import Node, Queue, QueueResource, Resources, Snapshot
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
