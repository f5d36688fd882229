"""The end-to-end bench (``python -m scheduler.bench e2e``) at CI scale, on the bench's own
control plane (it needs an audit log and kube-scheduler's static identity, which the session
control plane does not have): its JSON must be complete, with every pod of the backlog bound
exactly once, for single pods and for gangs.

kube-scheduler is among the test binaries (testenv/build.sh), so the single-pod case also runs
it once with its default client limits: that checks the peer plumbing (identity, config, audit
counting, ratios) on every CI run. KAI is built on demand only, so CI never runs it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.bench import e2e
from scheduler.bench.e2e_cluster import Backlog
from scheduler.bench.e2e_report import ratios as ratios_of
from testenv import ControlPlane, find_bin_dir

pytestmark = pytest.mark.e2e

NODES = 20
#: Keys every result must carry with a positive number.
POSITIVE = (
    "seconds_to_first_bind",
    "seconds_to_last_bind",
    "pods_per_second_overall",
    "bind_latency_p50",
    "bind_latency_p99",
    "cpu_seconds",
    "peak_rss_mb",
    "api_requests",
)


def _spec(pods: int, gang_size: int = 1, pod_gpus: int = 0) -> e2e.BenchSpec:
    return e2e.BenchSpec(
        nodes=NODES,
        gpus_per_node=8,
        backlog=Backlog(pods=pods, gang_size=gang_size, pod_gpus=pod_gpus),
        timeout=60,
        settle=0.5,
    )


@pytest.fixture(scope="module")
def bench_plane() -> Iterator[ControlPlane]:
    """The bench's control plane with its nodes, shared by this module's cases."""
    cp = e2e.bench_control_plane()
    try:
        cp.start()
        e2e.prepare_cluster(cp, _spec(300))
        yield cp
    finally:
        cp.stop()


def _log_tails(result: dict[str, Any]) -> str:
    parts = []
    for log in result.get("logs", []):
        lines = Path(log).read_text(errors="replace").splitlines()[-40:]
        parts.append(f"--- {log} ---\n" + "\n".join(lines))
    return "\n".join(parts)


def _check(result: dict[str, Any], pods: int) -> None:
    name = result["scheduler"]
    assert result["complete"], f"{name} incomplete: {result}\n{_log_tails(result)}"
    assert result["bound"] == pods, f"{name}: {result['bound']} of {pods} bound"
    assert result["rebound"] == 0 and result["deleted_during_run"] == 0, result
    assert result["api"]["bindings_ok"] == pods, f"{name}: {result['api']}"
    assert result["bound_exactly_once"], result
    for key in POSITIVE:
        value = result[key]
        assert isinstance(value, int | float) and value > 0, f"{name}: {key}={value!r}"
    assert result["seconds_to_first_bind"] <= result["seconds_to_last_bind"]
    assert result["bind_latency_p50"] <= result["bind_latency_p99"]
    assert result["processes"] >= 1
    assert result["timed_out"] is False and result["error"] is None


def _run(cp: ControlPlane, spec: e2e.BenchSpec, names: list[str], tag: str) -> dict[str, Any]:
    factories = e2e.contenders(names, throttle="default")
    results = e2e.run_bench(cp, spec, factories, cp.log_dir / tag)
    doc = e2e.document(spec, results, cp.log_dir)
    # What the CLI prints: it must survive a JSON round trip unchanged.
    assert json.loads(json.dumps(doc)) == doc
    assert [r["scheduler"] for r in doc["results"]] == names
    return doc


def test_single_pods_all_bound_once(bench_plane: ControlPlane) -> None:
    assert (find_bin_dir() / "kube-scheduler").is_file(), "testenv/build.sh builds kube-scheduler"
    doc = _run(bench_plane, _spec(300), ["ours", "kube-scheduler"], "bench-singles")
    for result in doc["results"]:
        _check(result, 300)
    ours, kube = doc["results"]
    assert ours["podgroups"] is False
    # Each contender's requests are its own identity's, nobody else's.
    assert set(ours["api"]["by_user"]) == {"system:serviceaccount:kai-scheduler:kai-scheduler"}
    assert set(kube["api"]["by_user"]) == {"system:kube-scheduler"}
    ratios = doc["ratios"]["ours_vs_kube-scheduler"]
    assert ratios == ratios_of([ours, kube])["ours_vs_kube-scheduler"]
    assert all(isinstance(v, float) and v > 0 for v in ratios.values()), ratios


def test_gangs_all_bound_once(bench_plane: ControlPlane) -> None:
    # 30 gangs of 4 one-GPU pods: 120 of the 160 GPUs.
    doc = _run(bench_plane, _spec(120, gang_size=4, pod_gpus=1), ["ours"], "bench-gangs")
    (result,) = doc["results"]
    assert result["podgroups"] is True
    _check(result, 120)
