"""The chaos invariant checker fires on hand-made violations and stays quiet on a clean run.

A checker that never fires would make the chaos test pass on any scheduler, so each
invariant is shown to trip on the smallest cluster that breaks it.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.invariants import Invariant, InvariantChecker
from tests.chaos.plan import FaultKind, estimated_length, plan_faults
from tests.chaos.podview import parse_duration, parse_pod, parse_quantity

NS = "chaos"


def node(name: str, *, gpus: int = 2, cpu: str = "8", memory: str = "16Gi", pods: int = 10) -> Any:
    alloc = {"cpu": cpu, "memory": memory, "pods": str(pods), "nvidia.com/gpu": str(gpus)}
    return {"metadata": {"name": name}, "status": {"allocatable": alloc, "capacity": alloc}}


def pod(
    name: str,
    *,
    uid: str | None = None,
    node_name: str | None = None,
    gpus: int = 0,
    fraction: str | None = None,
    grant: Mapping[int, int] | None = None,
    cpu: str = "1",
    memory: str = "1Gi",
    gang: str | None = None,
    phase: str = "Running",
    deleting: bool = False,
    unschedulable: str = "",
    namespace: str = NS,
) -> Any:
    annotations: dict[str, str] = {}
    if fraction is not None:
        annotations["gpu-fraction"] = fraction
    if grant is not None:
        annotations["kai.scheduler/gpu-grant"] = json.dumps({str(k): v for k, v in grant.items()})
    if gang is not None:
        annotations["pod-group-name"] = gang
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{name}",
        "annotations": annotations,
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    conditions = []
    if unschedulable:
        conditions.append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": unschedulable}
        )  # fmt: skip
    spec: dict[str, Any] = {
        "schedulerName": "kai-scheduler",
        "containers": [{"name": "c", "resources": resources}],
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase if node_name else "Pending", "conditions": conditions},
    }


def podgroup(name: str, min_member: int, grace: str = "2s") -> Any:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {"minMember": min_member, "stalenessGracePeriod": grace},
    }


def checker(**kwargs: Any) -> InvariantChecker:
    c = InvariantChecker(namespaces=[NS], gang_slack=3.0, wall_clock=lambda: 0.0, **kwargs)
    c.node_upsert(node("n1"), 0.0)
    c.node_upsert(node("n2"), 0.0)
    return c


def kinds(c: InvariantChecker) -> list[Invariant]:
    return [v.invariant for v in c.violations]


def test_a_clean_history_reports_nothing() -> None:
    c = checker()
    c.podgroup_upsert(podgroup("g", 2), 0.0)
    c.pod_upsert(pod("a", gang="g"), 1.0)
    c.pod_upsert(pod("b", gang="g"), 1.0)
    c.pod_upsert(pod("a", gang="g", node_name="n1", gpus=1, grant={0: 1000}), 2.0)
    c.pod_upsert(pod("b", gang="g", node_name="n1", gpus=1, grant={1: 1000}), 2.5)
    c.pod_upsert(pod("h1", node_name="n2", fraction="0.5", grant={0: 500}), 3.0)
    c.pod_upsert(pod("h2", node_name="n2", fraction="0.5", grant={0: 500}), 3.0)
    c.pod_upsert(pod("wait", unschedulable="no GPU left"), 3.0)
    # The test deletes the gang; a freed device is granted again.
    c.retire_gang(f"{NS}/g")
    for name in ("a", "b"):
        c.mark_deleted_by_test(f"uid-{name}")
        c.pod_deleted(pod(name), 4.0)
    c.pod_upsert(pod("c", node_name="n1", gpus=2, grant={0: 1000, 1: 1000}), 5.0)
    c.tick(100.0)
    assert c.finish(100.0) == []
    assert c.outcomes() == {"bound": 3, "deleted_by_test": 2, "reported": 1}
    assert c.bound_count() == 5


def test_a_double_booked_device_is_reported() -> None:
    c = checker()
    c.pod_upsert(pod("a", node_name="n1", fraction="0.5", grant={0: 500}), 1.0)
    c.pod_upsert(pod("b", node_name="n1", gpus=1, grant={0: 1000}), 2.0)
    assert kinds(c) == [Invariant.GPU_DEVICE]
    v = c.violations[0]
    assert v.at == 2.0 and v.subject == "node/n1/gpu/0"
    assert v.evidence["total"] == 1500
    assert v.evidence["grants"] == [(f"{NS}/a", 500), (f"{NS}/b", 1000)]
    # The same overbooking seen again is one episode, not a new violation.
    c.pod_upsert(pod("b", node_name="n1", gpus=1, grant={0: 1000}), 3.0)
    assert len(c.violations) == 1


def test_a_finished_pod_frees_its_device() -> None:
    c = checker()
    c.pod_upsert(pod("a", node_name="n1", gpus=1, grant={0: 1000}), 1.0)
    c.pod_upsert(pod("a", node_name="n1", gpus=1, grant={0: 1000}, phase="Succeeded"), 2.0)
    c.pod_upsert(pod("b", node_name="n1", gpus=1, grant={0: 1000}), 3.0)
    assert c.violations == []


def test_a_terminating_pod_still_holds_its_device() -> None:
    c = checker()
    c.pod_upsert(pod("a", node_name="n1", gpus=1, grant={1: 1000}, deleting=True), 1.0)
    c.pod_upsert(pod("b", node_name="n1", gpus=1, grant={1: 1000}), 2.0)
    assert kinds(c) == [Invariant.GPU_DEVICE]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"gpus": 1}, "no grant annotation"),
        ({"gpus": 2, "grant": {0: 1000}}, "2 device(s)"),
        ({"gpus": 1, "grant": {5: 1000}}, "device 5 but the node has 2 GPUs"),
        ({"fraction": "0.5", "grant": {0: 250}}, "500 thousandths per device"),
        ({"grant": {0: 300}}, "asks for no GPU"),
    ],
)
def test_a_grant_that_does_not_match_the_request_is_reported(
    kwargs: dict[str, Any], fragment: str
) -> None:
    c = checker()
    c.pod_upsert(pod("a", node_name="n1", **kwargs), 1.0)
    assert kinds(c) == [Invariant.GPU_DEVICE]
    assert fragment in c.violations[0].message


def test_an_over_capacity_node_is_reported_per_resource() -> None:
    c = checker()
    c.pod_upsert(pod("a", node_name="n2", cpu="6", memory="8Gi"), 1.0)
    c.pod_upsert(pod("b", node_name="n2", cpu="2500m", memory="8Gi"), 2.0)
    assert kinds(c) == [Invariant.NODE_CAPACITY]
    v = c.violations[0]
    assert v.evidence["resource"] == "cpu" and v.evidence["used"] == "8.500"
    # One more byte of memory than the node has.
    c.pod_upsert(pod("c", node_name="n1", memory="16Gi"), 3.0)
    c.pod_upsert(pod("d", node_name="n1", cpu="0", memory="1"), 3.0)
    assert kinds(c)[-1] == Invariant.NODE_CAPACITY
    assert c.violations[-1].evidence["resource"] == "memory"


def test_too_many_pods_and_whole_gpus_are_reported() -> None:
    c = checker()
    for i in range(11):
        c.pod_upsert(pod(f"p{i}", node_name="n1", cpu="100m", memory="1Mi"), 1.0)
    assert [v.evidence["resource"] for v in c.violations] == ["pods"]
    c2 = checker()
    c2.pod_upsert(pod("a", node_name="n1", gpus=2, grant={0: 1000, 1: 1000}), 1.0)
    c2.pod_upsert(pod("b", node_name="n1", gpus=1, grant={1: 1000}), 1.0)
    assert sorted(str(v.invariant) for v in c2.violations) == ["gpu_device", "node_capacity"]


def test_a_rebinding_is_reported() -> None:
    c = checker()
    c.pod_upsert(pod("a", node_name="n1"), 1.0)
    c.pod_upsert(pod("a", node_name="n2"), 2.0)
    assert kinds(c) == [Invariant.BOUND_ONCE]
    assert c.violations[0].evidence == {"uid": "uid-a", "first_node": "n1", "node": "n2"}


def test_a_pod_recreated_under_the_same_name_may_bind_elsewhere() -> None:
    c = checker()
    c.pod_upsert(pod("a", uid="u1", node_name="n1"), 1.0)
    c.mark_deleted_by_test("u1")
    c.pod_deleted(pod("a", uid="u1"), 2.0)
    c.pod_upsert(pod("a", uid="u2", node_name="n2"), 3.0)
    assert c.violations == []


def test_a_partial_gang_past_grace_and_slack_is_reported() -> None:
    c = checker()
    c.podgroup_upsert(podgroup("g", 3, grace="2s"), 0.0)
    c.pod_upsert(pod("a", gang="g", node_name="n1"), 10.0)
    c.pod_upsert(pod("b", gang="g"), 10.0)
    c.pod_upsert(pod("c", gang="g"), 10.0)
    c.tick(14.9)  # within grace 2 s + slack 3 s
    assert c.violations == []
    c.tick(15.1)
    assert kinds(c) == [Invariant.GANG_MIN_MEMBER]
    v = c.violations[0]
    assert v.evidence["gang"] == f"{NS}/g" and v.evidence["partial_since"] == 10.0
    c.tick(30.0)  # one episode, one violation
    assert len(c.violations) == 1


def test_a_gang_that_completes_or_is_retired_in_time_is_fine() -> None:
    c = checker()
    c.podgroup_upsert(podgroup("g", 2), 0.0)
    c.pod_upsert(pod("a", gang="g", node_name="n1"), 1.0)
    c.pod_upsert(pod("b", gang="g", node_name="n2"), 4.0)
    c.podgroup_upsert(podgroup("h", 2), 0.0)
    c.pod_upsert(pod("x", gang="h", node_name="n1"), 1.0)
    c.retire_gang(f"{NS}/h")
    c.tick(60.0)
    assert c.violations == []


def test_a_partial_gang_clock_restarts_after_it_recovers() -> None:
    c = checker()
    c.podgroup_upsert(podgroup("g", 2), 0.0)
    c.pod_upsert(pod("a", gang="g", node_name="n1"), 1.0)
    c.pod_upsert(pod("b", gang="g", node_name="n1"), 4.0)
    c.pod_upsert(pod("b", gang="g", node_name="n1", deleting=True), 5.0)
    c.tick(9.0)
    assert c.violations == []
    c.tick(10.1)
    assert kinds(c) == [Invariant.GANG_MIN_MEMBER]


def test_lost_pods_are_reported_at_the_end() -> None:
    c = checker()
    c.pod_upsert(pod("silent"), 1.0)  # pending, never told why
    c.pod_upsert(pod("vanished", node_name="n1"), 1.0)
    c.pod_deleted(pod("vanished"), 2.0)  # nobody we know deleted it
    c.pod_upsert(pod("evicted", node_name="n1"), 1.0)
    c.mark_evicted(NS, "evicted")
    c.pod_deleted(pod("evicted"), 2.0)
    c.pod_upsert(pod("done", node_name="n2", phase="Succeeded"), 1.0)
    c.pod_upsert(pod("other", namespace="elsewhere"), 1.0)  # not part of the stream
    violations = c.finish(10.0)
    assert [(v.invariant, v.subject) for v in violations] == [
        (Invariant.POD_LOST, f"pod/{NS}/silent"),
        (Invariant.POD_LOST, f"pod/{NS}/vanished"),
    ]
    assert c.outcomes() == {"lost": 2, "evicted": 1, "finished": 1}


def test_a_relist_deletes_what_it_no_longer_holds() -> None:
    c = checker()
    c.pod_upsert(pod("a", node_name="n1", gpus=1, grant={0: 1000}), 1.0)
    c.mark_deleted_by_test("uid-a")
    c.relisted("Pod", [pod("b", node_name="n1", gpus=1, grant={0: 1000})], 2.0)
    assert c.violations == []
    assert c.pod(NS, "a") is None and c.pod(NS, "b") is not None


def test_parsers() -> None:
    assert parse_quantity("500m") == Fraction(1, 2)
    assert parse_quantity("64Gi") == 64 * 2**30
    assert parse_quantity("1e3") == 1000
    assert parse_quantity("1.5k") == 1500
    assert parse_quantity(8) == 8
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity("eight")
    assert parse_duration("1m30s") == 90.0
    assert parse_duration("500ms") == 0.5
    assert parse_duration("-1") == float("inf")
    view = parse_pod(pod("f", fraction="0.3", cpu="250m"))
    assert view.gpu is not None and (view.gpu.devices, view.gpu.milli) == (1, 300)
    assert view.requests["cpu"] == Fraction(1, 4) and view.requests["pods"] == 1
    init = pod("i", cpu="1")
    init["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "3"}}}]
    assert parse_pod(init).requests["cpu"] == 3


def test_fault_plans_are_seeded_and_cover_every_kind() -> None:
    a = plan_faults(7, 75.0, warmup=8.0, mean_gap=6.0)
    assert a == plan_faults(7, 75.0, warmup=8.0, mean_gap=6.0)
    assert a != plan_faults(8, 75.0, warmup=8.0, mean_gap=6.0)
    for seed in range(50):
        plan = plan_faults(seed, 75.0, warmup=8.0, mean_gap=6.0)
        assert {f.kind for f in plan} == set(FaultKind)
        assert plan[0].after == 8.0 and all(3.0 <= f.after <= 9.0 for f in plan[1:])
    long = plan_faults(1, 600.0, mean_gap=15.0)
    assert len(long) > 10 and estimated_length(long) <= 595.0


def test_the_chaos_harness_shares_no_code_with_the_scheduler() -> None:
    root = Path(__file__).resolve().parents[2]
    sources = [*sorted((root / "tests" / "chaos").glob("*.py")), root / "testenv" / "chaos.py"]
    offenders = []
    for path in sources:
        for n in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                names = [n.module]
            offenders += [f"{path.name}: {m}" for m in names if m.split(".")[0] == "scheduler"]
    assert len(sources) >= 7 and not offenders, offenders
