"""Chaos: a stream of gangs while the scheduler is killed, the API server restarts, the
scheduler's connections are cut and stalled, and 5 % of binds are denied - and an invariant
checker that shares no code with the scheduler watches the API the whole time.

The short CI version of ``python -m tests.chaos`` (same code, see ``tests/chaos/run.py``):
about 90 s with every fault kind once, then a drain. The seed comes from
``KAI_CHAOS_SEED`` (default 1), and the fault plan and summary are printed, so a failing run
is repeated with ``KAI_CHAOS_SEED=<seed> scripts/test.sh tests/e2e/test_chaos.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.api import KubeApi
from tests.chaos.invariants import Invariant, InvariantChecker
from tests.chaos.observer import Observer
from tests.chaos.plan import FaultKind
from tests.chaos.run import ChaosEnv, ChaosSettings, run_chaos_sync
from tests.chaos.workload import PodShape, pod_body
from tests.e2e.scheduler_process import KaiCluster, kai_cluster, run_tag

pytestmark = pytest.mark.e2e
__all__ = ["kai_cluster"]  # fixture used by this module

#: The CI run: every fault kind once (about 90 s with recoveries), then a drain.
CI_SETTINGS = ChaosSettings(duration=75.0, drain_timeout=45.0, mean_fault_gap=6.0, warmup=8.0)


@pytest.mark.timeout(290)
def test_invariants_hold_under_chaos(
    kai_cluster: KaiCluster, namespace: str, make_gpu_nodes: Any, tmp_path: Path
) -> None:
    seed = int(os.environ.get("KAI_CHAOS_SEED", "1"))
    tag = run_tag()
    nodes = make_gpu_nodes(4, gpus=8, cpu="16", memory="64Gi", pods=12, labels=tag)
    env = ChaosEnv(
        cp=kai_cluster.cp,
        scheduler_kubeconfig=kai_cluster.kubeconfig,
        namespace=namespace,
        nodes=tuple(nodes),
        node_selector=tag,
        workdir=tmp_path,
        log_dir=kai_cluster.cp.log_dir / "chaos",
    )
    report = run_chaos_sync(env, CI_SETTINGS.with_seed(seed), echo=sys.stdout)
    print(report.to_json())
    summary = report.summary
    by_kind = summary["faults"]["by_kind"]
    assert set(by_kind) == {str(k) for k in FaultKind}, f"a fault kind never ran: {by_kind}"
    assert summary["binds"]["denied"] >= 1, "the webhook denied no bind: bind failures untested"
    assert summary["pods"]["bound"] >= 20, f"too little got scheduled to judge: {summary['pods']}"
    assert not summary["scheduler"]["unexpected_exits"], summary["scheduler"]["unexpected_exits"]
    assert report.ok, (
        f"{len(report.violations)} invariant violation(s) (seed {seed}):\n"
        + json.dumps(summary["violations"], indent=2)
    )


def test_the_live_checker_catches_a_double_booked_gpu(
    kai_cluster: KaiCluster, namespace: str, make_gpu_nodes: Any
) -> None:
    """The chaos test passing means something only if its checker, fed by its own watch of
    the real API server, fires: two pods created already bound to the same device of one
    node (no scheduler involved) must be reported, with both pods as evidence."""
    cp = kai_cluster.cp
    (node,) = make_gpu_nodes(1, gpus=2, cpu="4", memory="8Gi", pods=4)

    def bound_pod(name: str, cpu: str) -> dict[str, Any]:
        body = pod_body(name, PodShape(cpu=cpu, memory="1Gi", gpus=1), None, {})
        body["metadata"]["annotations"]["kai.scheduler/gpu-grant"] = '{"1":1000}'
        body["spec"]["nodeName"] = node
        return body

    async def run() -> InvariantChecker:
        checker = InvariantChecker(namespaces=[namespace], nodes=[node])
        async with KubeApi(cp.server, cp.admin_token, cp.ca_file) as api:
            observer = Observer(api, checker)
            observer.start()
            try:
                await asyncio.wait_for(observer.synced.wait(), timeout=30)
                for name, cpu in (("first", "3"), ("second", "2")):
                    await api.request(
                        "POST", f"/api/v1/namespaces/{namespace}/pods", body=bound_pod(name, cpu)
                    )
                deadline = time.monotonic() + 30
                while len(checker.violations) < 2 and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
            finally:
                await observer.stop()
        return checker

    checker = asyncio.run(run())
    found = {v.invariant: v for v in checker.violations}
    assert set(found) == {Invariant.GPU_DEVICE, Invariant.NODE_CAPACITY}, checker.violations
    assert found[Invariant.GPU_DEVICE].evidence["grants"] == [
        (f"{namespace}/first", 1000),
        (f"{namespace}/second", 1000),
    ]
    assert found[Invariant.NODE_CAPACITY].evidence["resource"] == "cpu"
