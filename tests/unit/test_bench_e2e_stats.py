"""The e2e bench's measuring code without a cluster: percentiles, audit-log counting, /proc
sampling and the result/ratio arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.bench.__main__ import main
from scheduler.bench.e2e_report import RunObservation, ratios, result_of, table
from scheduler.bench.e2e_stats import AuditCount, ProcessTreeMeter, count_audit, percentile


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile([3.0], 0.99) == 3
    assert percentile([], 0.5) is None


def _event(audit_id: str, user: str, verb: str, resource: str, **kw: Any) -> str:
    ref: dict[str, Any] = {"resource": resource.split("/")[0]}
    if "/" in resource:
        ref["subresource"] = resource.split("/")[1]
    return json.dumps(
        {
            "auditID": audit_id,
            "stage": kw.get("stage", "ResponseComplete"),
            "user": {"username": user},
            "verb": verb,
            "objectRef": ref,
            "responseStatus": {"code": kw.get("code", 200)},
            "requestReceivedTimestamp": kw.get("at", "2030-01-01T00:00:10.000000Z"),
        }
    )


def test_count_audit_counts_each_request_once_per_user(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    before = _event("old", "sched", "create", "pods/binding", code=201)
    lines = [
        _event("w1", "sched", "watch", "pods", stage="ResponseStarted"),
        _event("b1", "sched", "create", "pods/binding", code=201),
        _event("b2", "sched", "create", "pods/binding", code=409),
        _event("w1", "sched", "watch", "pods"),  # the same watch, completed: still one request
        _event("x1", "someone-else", "create", "pods/binding", code=201),
        _event("early", "sched", "list", "pods", at="2029-12-31T23:59:00Z"),
        _event("t1", "binder", "patch", "pods", code=429),
    ]
    log.write_text(before + "\n")
    offset = log.stat().st_size
    with log.open("a") as f:
        f.write("\n".join(lines) + "\n" + '{"torn')
    since = 1893456000.0  # 2030-01-01T00:00:00Z
    got = count_audit(log, offset, {"sched", "binder"}, since)
    assert got.requests == 4
    assert got.by_user == {"sched": 3, "binder": 1}
    assert got.by_kind == {"watch pods": 1, "create pods/binding": 2, "patch pods": 1}
    assert (got.bindings_ok, got.binding_conflicts, got.throttled) == (1, 1, 1)


def test_process_tree_meter_sees_children() -> None:
    # The child burns 0.6 s of CPU time (not wall time: a loaded machine may give it less).
    code = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'x = bytearray(64 << 20); "
        "import time\\nwhile time.process_time() < 0.6: pass\\ntime.sleep(20)'])\n"
        "time.sleep(20)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        meter = ProcessTreeMeter([parent.pid])
        for _ in range(150):
            meter.sample()
            if len(meter.pids) == 2 and meter.cpu_seconds > 0.3:
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert len(meter.pids) == 2
        assert meter.cpu_seconds > 0.3
        assert meter.peak_rss_mb > 64  # the child's 64 MiB buffer, counted in the sum
        assert meter.peak_rss_sum_kb / 1024 > 64
    finally:
        parent.kill()
        parent.wait()


def _obs(key: str, bound_at: list[float], requests: int) -> RunObservation:
    meter = ProcessTreeMeter([])
    meter.cpu = {1: 2.0}
    meter.hwm_kb = {1: 100 * 1024}
    names = [f"p{i}" for i in range(len(bound_at))]
    return RunObservation(
        key=key,
        pods=len(bound_at),
        with_gangs=False,
        started=100.0,
        ended=100.0 + max(bound_at),
        timed_out=False,
        added=dict.fromkeys(names, 90.0),
        bound={n: 100.0 + t for n, t in zip(names, bound_at, strict=True)},
        rebound=0,
        deleted=0,
        meter=meter,
        cpu_at_last_bind=2.0,
        audit=AuditCount(requests=requests, bindings_ok=len(bound_at)),
        backlog_seconds=1.0,
    )


def test_result_and_ratios() -> None:
    ours = result_of(_obs("ours", [1.0, 2.0, 3.0, 5.0], 10))
    peer = result_of(_obs("peer", [2.0, 4.0, 6.0, 10.0], 20))
    assert ours["complete"] and ours["bound_exactly_once"]
    assert ours["seconds_to_first_bind"] == 1.0 and ours["seconds_to_last_bind"] == 5.0
    assert ours["pods_per_second_first_to_last"] == 0.8  # 3 more pods in 4 s
    assert ours["pods_per_second_overall"] == 0.8  # 4 pods in 5 s
    assert ours["bind_latency_p99"] == 15.0  # created at 90, bound at 105
    (row,) = ratios([ours, peer]).values()
    assert row["seconds_to_last_bind"] == 0.5
    assert row["api_requests"] == 0.5
    assert row["pods_per_second_overall"] == 2.0
    assert "ours" in table([ours, peer]).splitlines()[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pods", "10", "--gang-size", "3"], "not a multiple"),
        (["--nodes", "1", "--pods", "9", "--pod-gpus", "1"], "do not fit"),
        (["--scheduler", "volcano"], "--scheduler 'volcano'"),
    ],
)
def test_cli_refuses_bad_arguments_before_starting_anything(args: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        main(["e2e", *args])
