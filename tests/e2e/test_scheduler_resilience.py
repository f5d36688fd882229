"""Crashes and failover: kill -9 and restart, two replicas with leader election.

"Bound exactly once" is checked three ways: every pod ends up with one node, each pod's
``bound`` log line appears at most once across all scheduler processes, and no GPU device on
any node is granted more than once (device grants from the ``kai.scheduler/gpu-grant``
annotations never add up past 1000 thousandths).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

import pytest

from tests.e2e.scheduler_process import (
    KaiCluster,
    SchedulerProcess,
    StartScheduler,
    bound_nodes,
    kai_cluster,
    pod_manifest,
    podgroup_manifest,
    run_tag,
    start_scheduler,
    wait_for,
)

pytestmark = pytest.mark.e2e
__all__ = ["kai_cluster", "start_scheduler"]  # fixtures used by this module

#: Short Lease timings so failover tests take seconds.
FAST_LEASE = {"leaseDuration": "3s", "renewDeadline": "2s", "retryPeriod": "500ms"}


def _bind_logs(*procs: SchedulerProcess) -> Counter[str]:
    return Counter(
        r["pod"].split("/", 1)[1]
        for p in procs
        for r in p.log_records()
        if r.get("event") == "bound"
    )


def _assert_devices_not_shared(pods: list[dict[str, Any]]) -> None:
    used: dict[tuple[str, str], int] = defaultdict(int)
    for p in pods:
        node = p["spec"].get("nodeName")
        raw = (p["metadata"].get("annotations") or {}).get("kai.scheduler/gpu-grant")
        if node and raw:
            for device, milli in json.loads(raw).items():
                used[(node, device)] += milli
    over = {k: v for k, v in used.items() if v > 1000}
    assert not over, f"GPU devices granted more than once: {over}"


def _workload(tag: dict[str, str], gangs: int, members: int, singles: int) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    for g in range(gangs):
        objs.append(podgroup_manifest(f"g{g}", members))
        objs += [
            pod_manifest(
                f"g{g}-{i}", gpus=1, node_selector=tag, annotations={"pod-group-name": f"g{g}"}
            )
            for i in range(members)
        ]
    objs += [pod_manifest(f"s-{i}", gpus=1, node_selector=tag) for i in range(singles)]
    return objs


def test_kill_9_mid_run_then_restart_binds_each_pod_once(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    make_gpu_nodes(6, gpus=8, labels=tag)
    first = start_scheduler(name="first")
    objs = _workload(tag, gangs=4, members=4, singles=24)
    total = sum(1 for o in objs if o["kind"] == "Pod")
    kai_cluster.create(*objs, namespace=namespace)
    wait_for(
        "some binds", lambda: bound_nodes(kai_cluster.pods(namespace)), interval=0.05, logs=first
    )
    first.kill()
    after_kill = len(bound_nodes(kai_cluster.pods(namespace)))
    second = start_scheduler(name="second")

    def all_bound() -> list[dict[str, Any]] | None:
        pods = kai_cluster.pods(namespace)
        return pods if len(bound_nodes(pods)) == total else None

    pods = wait_for(f"all {total} pods bound", all_bound, timeout=60, logs=[first, second])
    counts = _bind_logs(first, second)
    assert max(counts.values()) == 1, counts.most_common(3)
    assert sum(counts.values()) <= total
    _assert_devices_not_shared(pods)
    for g in range(4):
        members = [p for p in pods if p["metadata"]["name"].startswith(f"g{g}-")]
        assert len(members) == 4 and all(p["spec"].get("nodeName") for p in members)
    firsts, seconds = sum(_bind_logs(first).values()), sum(_bind_logs(second).values())
    print(f"bound before kill: {after_kill}/{total}; logged {firsts} + {seconds}")


def _leader(proc: SchedulerProcess) -> bool:
    status, body = proc.get("/metrics")
    return status == 200 and "\nkai_leader 1.0" in body


def test_two_replicas_only_leader_binds_and_standby_takes_over(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    make_gpu_nodes(2, gpus=8, labels=tag)
    lease = {"leaseName": f"kai-e2e-{uuid.uuid4().hex[:6]}", **FAST_LEASE}
    config = {"leaderElection": lease}
    a = start_scheduler(config=config, args=["--leader-elect"], name="replica-a")
    wait_for("replica-a leads", lambda: _leader(a), logs=a)
    b = start_scheduler(config=config, args=["--leader-elect=true"], name="replica-b")
    assert b.get("/readyz")[0] == 200  # a standby is ready, just not leading
    kai_cluster.create(
        *(pod_manifest(f"one-{i}", gpus=1, node_selector=tag) for i in range(4)),
        namespace=namespace,
    )
    wait_for(
        "first 4 bound", lambda: len(bound_nodes(kai_cluster.pods(namespace))) == 4, logs=[a, b]
    )
    assert not _leader(b)
    # The API server shows a pod bound a moment before the scheduler logs the answer.
    wait_for("4 binds logged by a", lambda: sum(_bind_logs(a).values()) == 4, logs=[a, b])
    assert sum(_bind_logs(b).values()) == 0

    a.kill()
    kai_cluster.create(
        *(pod_manifest(f"two-{i}", gpus=1, node_selector=tag) for i in range(4)),
        namespace=namespace,
    )
    wait_for("replica-b takes over", lambda: _leader(b), timeout=20, logs=[a, b])
    wait_for(
        "all 8 bound",
        lambda: len(bound_nodes(kai_cluster.pods(namespace))) == 8,
        timeout=30,
        logs=[a, b],
    )
    want = {f"two-{i}" for i in range(4)}
    wait_for("4 binds logged by b", lambda: set(_bind_logs(b)) >= want, logs=[a, b])
    counts = _bind_logs(a, b)
    assert max(counts.values()) == 1
    assert set(_bind_logs(b)) == want
    _assert_devices_not_shared(kai_cluster.pods(namespace))


def test_a_leader_that_loses_its_lease_stops_and_writes_nothing_more(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    make_gpu_nodes(1, gpus=8, labels=tag)
    lease_name = f"kai-e2e-{uuid.uuid4().hex[:6]}"
    lease = {"leaseName": lease_name, **FAST_LEASE}
    a = start_scheduler(config={"leaderElection": lease}, args=["--leader-elect"], name="a")
    wait_for("a leads", lambda: _leader(a), logs=a)
    # Another holder takes the Lease (as after a partition: our renewals did not land).
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    patch = {"spec": {"holderIdentity": "thief", "renewTime": now, "leaseDurationSeconds": 60}}
    kai_cluster.cp.kubectl(
        "patch", "lease", lease_name, "-n", "kai-scheduler", "--type=merge", "-p",
        json.dumps(patch),
    )  # fmt: skip
    wait_for("a exits", lambda: a.proc is not None and a.proc.poll() is not None, timeout=15)
    assert a.proc is not None and a.proc.returncode == 1, a.log_tail()
    assert any(r.get("event") == "leader_lost_exiting" for r in a.log_records())
    # Nobody leads now: a pod created afterwards is not bound by the old leader.
    kai_cluster.create(pod_manifest("late", gpus=1, node_selector=tag), namespace=namespace)
    time.sleep(2)
    assert not bound_nodes(kai_cluster.pods(namespace))
    assert sum(_bind_logs(a).values()) == 0


def test_sigterm_releases_the_lease_for_a_fast_handover(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    make_gpu_nodes(1, gpus=4, labels=tag)
    # A long lease: only an explicit release lets the standby lead within the wait below.
    lease = {
        "leaseName": f"kai-e2e-{uuid.uuid4().hex[:6]}",
        "leaseDuration": "30s",
        "renewDeadline": "20s",
        "retryPeriod": "500ms",
    }
    a = start_scheduler(config={"leaderElection": lease}, args=["--leader-elect"], name="a")
    wait_for("a leads", lambda: _leader(a), logs=a)
    b = start_scheduler(config={"leaderElection": lease}, args=["--leader-elect"], name="b")
    assert a.stop() == 0
    wait_for("b leads soon after a's SIGTERM", lambda: _leader(b), timeout=8, logs=[a, b])
    kai_cluster.create(pod_manifest("after", gpus=1, node_selector=tag), namespace=namespace)
    wait_for("b binds", lambda: bound_nodes(kai_cluster.pods(namespace)), logs=b)


def test_gang_left_partial_is_evicted_after_its_grace_period(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    make_gpu_nodes(1, gpus=4, labels=tag)
    sched = start_scheduler()
    kai_cluster.create(
        podgroup_manifest("pair", 2, stalenessGracePeriod="2s"),
        *(
            pod_manifest(
                f"pair-{i}", gpus=1, node_selector=tag, annotations={"pod-group-name": "pair"}
            )
            for i in range(2)
        ),
        namespace=namespace,
    )
    wait_for("pair bound", lambda: len(bound_nodes(kai_cluster.pods(namespace))) == 2, logs=sched)
    # A member disappears: the gang is partial and holds a GPU it cannot use.
    kai_cluster.cp.kubectl(
        "delete", "pod", "pair-0", "-n", namespace, "--grace-period=0", "--force"
    )

    def survivor_evicted() -> bool:
        pods = {p["metadata"]["name"]: p for p in kai_cluster.pods(namespace)}
        left = pods.get("pair-1")
        return left is None or bool(left["metadata"].get("deletionTimestamp"))

    wait_for("the partial gang's member evicted", survivor_evicted, timeout=20, logs=sched)
    evicted = [
        e
        for e in kai_cluster.events(namespace)
        if e["reason"] == "Evicted" and e["involvedObject"]["name"] == "pair-1"
    ]
    assert evicted and "pair" in evicted[0]["message"], evicted
    assert 'kai_evictions_total{action="stale_gang",queue="default-queue"} 1.0' in sched.metrics()


def test_api_server_restart_while_pods_pend(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    sched = start_scheduler()
    # No node matches yet: the pods pend, and the scheduler says so.
    kai_cluster.create(
        *(pod_manifest(f"w-{i}", gpus=1, node_selector=tag) for i in range(3)), namespace=namespace
    )

    def waiting() -> bool:
        pods = kai_cluster.pods(namespace)
        return len(pods) == 3 and all(
            any(
                c["type"] == "PodScheduled" and c["status"] == "False"
                for c in p["status"].get("conditions") or []
            )
            for p in pods
        )

    wait_for("3 pods reported unschedulable", waiting, logs=sched)
    kai_cluster.cp.restart_apiserver(down_seconds=3)
    assert sched.running(), sched.log_tail()
    # New capacity arrives only after the restart: the scheduler sees it through new watches.
    make_gpu_nodes(1, gpus=4, labels=tag)
    wait_for(
        "all 3 bound after the restart",
        lambda: len(bound_nodes(kai_cluster.pods(namespace))) == 3,
        timeout=60,
        logs=sched,
    )
    assert sched.running()
    assert sched.get("/readyz")[0] == 200


def test_fractional_grants_survive_a_restart(
    kai_cluster: KaiCluster,
    start_scheduler: StartScheduler,
    namespace: str,
    make_gpu_nodes: Any,
) -> None:
    tag = run_tag()
    make_gpu_nodes(1, gpus=2, labels=tag)
    first = start_scheduler(name="first")
    halves = [
        pod_manifest(f"h-{i}", node_selector=tag, annotations={"gpu-fraction": "0.5"})
        for i in range(3)
    ]
    kai_cluster.create(*halves, namespace=namespace)
    wait_for(
        "3 halves bound", lambda: len(bound_nodes(kai_cluster.pods(namespace))) == 3, logs=first
    )
    first.kill()
    # The restarted scheduler knows the devices only from the grant annotations: 1.5 of 2
    # GPUs are taken, so one more half fits and a whole GPU does not.
    second = start_scheduler(name="second")
    kai_cluster.create(
        pod_manifest("h-3", node_selector=tag, annotations={"gpu-fraction": "0.5"}),
        pod_manifest("whole", gpus=1, node_selector=tag),
        namespace=namespace,
    )
    wait_for(
        "the 4th half bound",
        lambda: "h-3" in bound_nodes(kai_cluster.pods(namespace)),
        logs=[first, second],
    )
    pods = kai_cluster.pods(namespace)
    assert "whole" not in bound_nodes(pods)
    _assert_devices_not_shared(pods)
    grants = [
        json.loads(p["metadata"]["annotations"]["kai.scheduler/gpu-grant"])
        for p in pods
        if p["metadata"]["name"].startswith("h-")
    ]
    assert sorted(m for g in grants for m in g.values()) == [500, 500, 500, 500]
