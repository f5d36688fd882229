"""The metrics behind the dashboard and alerts, scraped from real scheduler processes on the
real control plane: gangs waiting by reason and for how long, the last cycle's time, and the
leader Lease's transitions as a standby takes over; and every metric the chart's dashboard
and rules use is in a live ``/metrics``."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.scheduler_process import (
    KaiCluster,
    SchedulerProcess,
    StartScheduler,
    kai_cluster,
    pod_manifest,
    run_tag,
    start_scheduler,
    wait_for,
)
from tests.monitoring.assets import exported, load_dashboard, load_rules, queries
from tests.monitoring.lint import unknown_metrics

pytestmark = pytest.mark.e2e
__all__ = ["kai_cluster", "start_scheduler"]  # fixtures used by this module

FAST_LEASE = {"leaseDuration": "3s", "renewDeadline": "2s", "retryPeriod": "500ms"}


def _samples(proc: SchedulerProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, body = proc.get("/metrics")
    if status != 200:
        return {}
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(body)
        for s in f.samples
    }


def _value(proc: SchedulerProcess, name: str, **labels: str) -> float | None:
    return _samples(proc).get((name, frozenset(labels.items())))


def test_waiting_gangs_cycles_and_lease_transitions_are_scraped(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    make_gpu_nodes(1, gpus=8, labels=tag)
    # 64 GPUs on the only node that matches, which has 8: NodeTooSmall, for good.
    kai_cluster.create(pod_manifest("too-big", gpus=64, node_selector=tag), namespace=namespace)
    lease_name = f"kai-e2e-{uuid.uuid4().hex[:6]}"
    lease = f"kai-scheduler/{lease_name}"
    config = {"leaderElection": {"leaseName": lease_name, **FAST_LEASE}}
    a = start_scheduler(config=config, args=["--leader-elect"], name="monitor-a")
    wait_for("a leads", lambda: _value(a, "kai_leader") == 1, logs=a)

    def waiting() -> bool:
        count = _value(
            a, "kai_pending_gangs_by_reason", queue="default-queue", reason="NodeTooSmall"
        )
        wait = _value(a, "kai_pending_gang_max_wait_seconds", queue="default-queue")
        return bool(count and count >= 1 and wait and wait > 0)

    wait_for("the waiting gang is counted by reason", waiting, logs=a)
    last = _value(a, "kai_last_cycle_timestamp_seconds")
    assert last is not None and abs(time.time() - last) < 30
    assert _value(a, "kai_leader_lease_transitions", lease=lease) == 0  # a made the Lease

    b = start_scheduler(config=config, args=["--leader-elect"], name="monitor-b")
    wait_for(
        "b read the Lease",
        lambda: _value(b, "kai_leader_lease_transitions", lease=lease) == 0,
        logs=[a, b],
    )
    assert _value(b, "kai_leader") == 0
    assert _value(b, "kai_last_cycle_timestamp_seconds") == 0  # a standby never cycles

    a.kill()
    wait_for("b takes over", lambda: _value(b, "kai_leader") == 1, timeout=20, logs=b)
    wait_for(
        "b counts the transition",
        lambda: _value(b, "kai_leader_lease_transitions", lease=lease) == 1,
        logs=b,
    )
    wait_for("b cycles", lambda: (_value(b, "kai_last_cycle_timestamp_seconds") or 0) > 0, logs=b)

    status, body = b.get("/metrics")
    assert status == 200
    found = queries(load_dashboard(), load_rules())
    assert unknown_metrics(found, exported(body)) == []
