"""Volcano's Queue and PodGroup read natively: translation, the cache's view (queue names,
``root``/``default``, collisions), the enqueue step and the PodGroup phases, ``reclaimable``,
and several scheduler names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from scheduler.cache import Cache
from scheduler.cache.volcano import (
    k8s_resource_list,
    min_resources,
    volcano_gang_from_k8s,
    volcano_queue_from_k8s,
)
from scheduler.cli import build_parser, settings_from_args
from scheduler.cluster import GPU, Snapshot
from scheduler.cluster.queue import UNLIMITED
from scheduler.cluster.queuespec import SpecError
from scheduler.commit.volcanophase import podgroup_statuses
from scheduler.config import ConfigError, SchedulerConfig, parse_config
from scheduler.fairness import compute_fair_shares
from scheduler.solver.placement import GangOutcome
from tests.unit.test_cache_store import node, pod
from tests.unit.test_takeback import (
    NODES,
    NOW,
    full_of_a,
    make_gang,
    placed,
    run,
    snap,
    two_queues,
)

SCHED = "kai-scheduler"
API = "scheduling.volcano.sh/v1beta1"


@pytest.fixture(autouse=True)
def default_logging() -> Iterator[None]:
    """structlog's defaults here: some earlier tests leave a half-replaced configuration
    (stdlib processors with a print logger) that breaks any warning logged after them."""
    saved = structlog.get_config()
    structlog.reset_defaults()
    yield
    structlog.configure(**saved)


def vqueue(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Queue",
        "metadata": {"name": name, "uid": f"uid-vq-{name}"},
        "spec": spec,
    }


def vpodgroup(
    name: str, ns: str = "ns", *, phase: str | None = None, created: str = "", **spec: Any
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": API,
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-vpg-{ns}-{name}",
            "creationTimestamp": created or "2026-01-01T00:00:00Z",
        },
        "spec": spec,
    }
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def volcano_cache(*queues: dict[str, Any]) -> Cache:
    """A cache whose Volcano APIs are installed (listed), KAI's Queue API too."""
    cache = Cache([SCHED, "volcano"], "default-queue")
    cache.relisted("VolcanoQueue", list(queues))
    cache.relisted("VolcanoPodGroup", [])
    return cache


# --- translation ---------------------------------------------------------------------------


def test_queue_fields_map_to_limit_quota_weight_reclaimable_and_parent() -> None:
    q = volcano_queue_from_k8s(
        vqueue(
            "ml-team",
            weight=3,
            capability={GPU: 4, "cpu": "16", "memory": "64Gi", "pods": 100},
            deserved={GPU: 2},
            guarantee={"resource": {"cpu": "4", GPU: 1}},
            reclaimable=False,
            priority=5,
        )
    )
    gpu, cpu, memory = q.resource("gpu"), q.resource("cpu"), q.resource("memory")
    assert (gpu.limit, gpu.quota, gpu.over_quota_weight) == (4000, 2000, 3)  # deserved wins
    assert (cpu.limit, cpu.quota) == (16000, 4000)  # guarantee where deserved is silent
    assert (memory.limit, memory.quota) == (64 * 2**30, 0)
    assert q.parent == "root" and not q.reclaimable and q.priority == 105


def test_queue_defaults_follow_volcano() -> None:
    q = volcano_queue_from_k8s(vqueue("team"))
    assert q.parent == "root" and q.reclaimable and q.priority == 100
    assert all(q.resource(r).limit == UNLIMITED for r in ("gpu", "cpu", "memory"))
    assert all(q.resource(r).over_quota_weight == 1 for r in ("gpu", "cpu", "memory"))
    assert volcano_queue_from_k8s(vqueue("root", parent="x")).parent == ""
    assert volcano_queue_from_k8s(vqueue("sub", parent="team")).parent == "team"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"capability": {GPU: "-1"}}, "spec.capability[nvidia.com/gpu]"),
        ({"deserved": {"cpu": "lots"}}, "spec.deserved[cpu]"),
        ({"weight": -2}, "spec.weight"),
        ({"reclaimable": "no"}, "spec.reclaimable"),
    ],
)
def test_bad_queue_fields_are_named(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as e:
        volcano_queue_from_k8s(vqueue("bad", **spec))
    assert e.value.field == field


def test_podgroup_fields() -> None:
    raw = vpodgroup(
        "job",
        minMember=3,
        minTaskMember={"ps": 1, "worker": 2},
        minResources={GPU: 3, "cpu": "1500m", "memory": "1Gi", "pods": 3, "requests.cpu": "2"},
        queue="ml-team",
        priorityClassName="high",
    )
    gang = volcano_gang_from_k8s(raw, priorities={"high": 1000})
    assert (gang.key, gang.min_member, gang.queue, gang.priority) == ("ns/job", 3, "ml-team", 1000)
    assert gang.preemptible  # Volcano's default
    assert min_resources(raw) == {"gpu": 3000, "cpu": 1500, "memory": 2**30}
    plain = volcano_gang_from_k8s(vpodgroup("p", priorityClassName="gone"), priorities={})
    assert (plain.queue, plain.min_member, plain.priority) == ("default", 1, 0)


@pytest.mark.parametrize(
    ("annotations", "labels", "preemptible"),
    [
        ({"volcano.sh/preemptable": "false"}, {}, False),
        ({}, {"volcano.sh/preemptable": "false"}, False),
        ({"volcano.sh/preemptable": "true"}, {"volcano.sh/preemptable": "false"}, True),
        ({"volcano.sh/preemptable": "maybe"}, {}, False),  # Volcano reads junk as false
        ({}, {"kai.scheduler/preemptibility": "non-preemptible"}, False),
    ],
)
def test_podgroup_preemptable(
    annotations: dict[str, str], labels: dict[str, str], preemptible: bool
) -> None:
    raw = vpodgroup("p")
    raw["metadata"].update(annotations=annotations, labels=labels)
    assert volcano_gang_from_k8s(raw, priorities={}).preemptible is preemptible


def test_status_resource_list_uses_kubernetes_names_and_units() -> None:
    amounts = {"gpu": 2500, "cpu": 1500, "memory": 3 * 2**30}
    assert k8s_resource_list(amounts) == {"nvidia.com/gpu": "2.5", "cpu": "1500m", "memory": "3Gi"}


# --- the cache -----------------------------------------------------------------------------


def test_root_and_default_exist_while_volcano_queues_are_in_use() -> None:
    cache = volcano_cache(vqueue("ml-team", capability={GPU: 2}))
    queues = {q.name: q for q in cache.snapshot().queues}
    assert {"root", "default", "ml-team"} <= set(queues)
    assert queues["default"].parent == "root" and queues["ml-team"].parent == "root"
    assert queues["root"].parent == ""


def test_nothing_of_volcano_without_its_crds() -> None:
    cache = Cache(SCHED, "default-queue")
    cache.relisted("VolcanoQueue", [])
    cache.set_absent("VolcanoQueue", True)
    cache.relisted("VolcanoPodGroup", [])
    cache.set_absent("VolcanoPodGroup", True)
    cache.apply("Pod", "ADDED", pod("p", group="job", group_key="scheduling.k8s.io/group-name"))
    snapshot = cache.snapshot()
    assert {q.name for q in snapshot.queues} == set()
    (problem,) = cache.problems()
    assert problem.reason == "PodGroupNotFound"
    # A cache never told about Volcano's kinds (a watcher without them) shows none either.
    assert not Cache(SCHED).snapshot().queues


def test_pods_join_volcano_podgroup_in_its_queue() -> None:
    cache = volcano_cache(vqueue("ml-team"))
    cache.apply("Node", "ADDED", node("n1"))
    cache.apply("VolcanoPodGroup", "ADDED", vpodgroup("job", minMember=2, queue="ml-team"))
    cache.apply("VolcanoPodGroup", "ADDED", vpodgroup("nq"))
    for name, group in (("w0", "job"), ("w1", "job"), ("x", "nq")):
        cache.apply(
            "Pod",
            "ADDED",
            pod(name, gpus=1, group=group, group_key="scheduling.k8s.io/group-name", queue="kai"),
        )
    snapshot = cache.snapshot()
    gangs = snapshot.gang_by_key
    assert gangs["ns/job"].min_member == 2 and gangs["ns/job"].queue == "ml-team"
    assert gangs["ns/nq"].queue == "default"  # not the pods' kai.scheduler/queue label
    assert {p.queue for p in snapshot.pods_by_gang["ns/job"]} == {"ml-team"}
    assert cache.problems() == []


def test_kai_objects_win_name_collisions_and_the_volcano_ones_are_reported() -> None:
    cache = volcano_cache(vqueue("shared", capability={GPU: 1}))
    cache.apply("Queue", "ADDED", {"metadata": {"name": "shared"}, "spec": {}})
    cache.apply("PodGroup", "ADDED", {"metadata": {"name": "g", "namespace": "ns"}, "spec": {}})
    cache.apply("VolcanoPodGroup", "ADDED", vpodgroup("g", minMember=5, queue="shared"))
    cache.apply("Pod", "ADDED", pod("p", group="g", group_key="scheduling.k8s.io/group-name"))
    snapshot = cache.snapshot()
    shared = next(q for q in snapshot.queues if q.name == "shared")
    assert shared.resource("gpu").limit == UNLIMITED  # KAI's queue
    assert snapshot.gang_by_key["ns/g"].min_member == 1  # KAI's PodGroup
    conflicts = [p for p in cache.problems() if p.reason == "NameConflict"]
    assert {(p.api_version, p.kind, p.name) for p in conflicts} == {
        (API, "Queue", "shared"),
        (API, "PodGroup", "g"),
    }
    assert cache.volcano_podgroups() == {} and "shared" not in cache.volcano_queues()


def test_invalid_volcano_queue_is_a_problem_on_that_queue() -> None:
    cache = volcano_cache(vqueue("bad", weight=-1))
    (problem,) = cache.problems()
    assert (problem.kind, problem.api_version, problem.field) == ("Queue", API, "spec.weight")
    assert "bad" not in {q.name for q in cache.snapshot().queues}


def test_several_scheduler_names_and_volcano_queue_annotation() -> None:
    cache = Cache([SCHED, "volcano"], "default-queue")
    cache.apply("Pod", "ADDED", pod("a", scheduler="volcano"))
    cache.apply("Pod", "ADDED", pod("b", scheduler=SCHED))
    cache.apply("Pod", "ADDED", pod("c", scheduler="default-scheduler"))
    annotated = pod("d", scheduler="volcano")
    annotated["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] = "ml-team"
    cache.apply("Pod", "ADDED", annotated)
    pods = {p.name: p for p in cache.snapshot().pods}
    assert set(pods) == {"a", "b", "d"} and all(p.managed for p in pods.values())
    assert pods["d"].queue == "ml-team" and pods["a"].queue == "default-queue"


# --- enqueue and phases --------------------------------------------------------------------


def statuses(
    cache: Cache, outcomes: dict[str, GangOutcome] | None = None
) -> tuple[Snapshot, dict[str, Any]]:
    snapshot = cache.snapshot()
    report = compute_fair_shares(snapshot)
    out = podgroup_statuses(
        snapshot, report, cache.volcano_podgroups(), cache.volcano_queues(), outcomes or {}
    )
    return snapshot, out


def gpu_job(name: str, gpus: int, **extra: Any) -> dict[str, Any]:
    spec = {"minMember": 1, "queue": "ml-team", "minResources": {GPU: gpus}, **extra}
    return vpodgroup(name, **spec)


def test_capability_keeps_a_3_gpu_job_pending_and_lets_a_2_gpu_job_in() -> None:
    cache = volcano_cache(vqueue("ml-team", capability={GPU: 2}, reclaimable=False))
    cache.apply("Node", "ADDED", node("n1", gpus=8))
    cache.apply("VolcanoPodGroup", "ADDED", gpu_job("big", 3))
    cache.apply("VolcanoPodGroup", "ADDED", gpu_job("small", 2))
    _, out = statuses(cache)
    assert out["ns/small"].phase == "Inqueue" and out["ns/small"].condition is None
    big = out["ns/big"]
    assert big.phase == "Pending"
    assert big.condition is not None and big.condition[:2] == ("Unschedulable", "QueueCapability")
    assert "queue ml-team capability: nvidia.com/gpu 2" in big.condition[2]
    assert big.event == big.condition[2]


def test_enqueued_podgroups_reserve_capability_in_priority_order() -> None:
    cache = volcano_cache(vqueue("ml-team", capability={GPU: 2}))
    cache.apply("Node", "ADDED", node("n1", gpus=8))
    cache.apply("PriorityClass", "ADDED", {"metadata": {"name": "hi"}, "value": 500})
    cache.apply("VolcanoPodGroup", "ADDED", gpu_job("old", 2, created="2026-01-01T00:00:00Z"))
    cache.apply(
        "VolcanoPodGroup",
        "ADDED",
        gpu_job("urgent", 2, created="2026-01-02T00:00:00Z", priorityClassName="hi"),
    )
    _, out = statuses(cache)
    assert out["ns/urgent"].phase == "Inqueue" and out["ns/old"].phase == "Pending"
    # Once urgent is Inqueue (no pods yet), its 2 GPUs stay reserved.
    cache.apply("VolcanoPodGroup", "MODIFIED", gpu_job("urgent", 2, phase="Inqueue"))
    _, out = statuses(cache)
    assert out["ns/urgent"].phase == "Inqueue" and out["ns/old"].phase == "Pending"
    assert "2 reserved by enqueued PodGroups" in (out["ns/old"].condition or ("", "", ""))[2]


def test_cluster_capacity_with_volcano_overcommit() -> None:
    cache = volcano_cache(vqueue("ml-team"))
    cache.apply("Node", "ADDED", node("n1", gpus=4))
    cache.apply("VolcanoPodGroup", "ADDED", gpu_job("fits", 4))  # 4 <= 1.2 x 4
    cache.apply("VolcanoPodGroup", "ADDED", gpu_job("also", 1, created="2026-01-03T00:00:00Z"))
    cache.apply("VolcanoPodGroup", "ADDED", gpu_job("late", 1, created="2026-01-04T00:00:00Z"))
    _, out = statuses(cache)
    assert out["ns/fits"].phase == "Inqueue" and out["ns/late"].phase == "Pending"
    assert out["ns/late"].condition is not None
    assert out["ns/late"].condition[1] == "ClusterCapacity"


@pytest.mark.parametrize(
    ("queue", "state", "reason"),
    [("ml-team", "Closed", "QueueClosed"), ("nope", "Open", "QueueMissing")],
)
def test_closed_or_missing_queue_keeps_podgroups_pending(
    queue: str, state: str, reason: str
) -> None:
    q = vqueue("ml-team")
    q["status"] = {"state": state}
    cache = volcano_cache(q)
    cache.apply("VolcanoPodGroup", "ADDED", vpodgroup("j", queue=queue))
    _, out = statuses(cache)
    assert out["ns/j"].phase == "Pending"
    assert out["ns/j"].condition is not None and out["ns/j"].condition[1] == reason


def test_phases_follow_the_pods() -> None:
    cache = volcano_cache(vqueue("ml-team"))
    cache.apply("Node", "ADDED", node("n1", gpus=8))
    cache.apply("VolcanoPodGroup", "ADDED", gpu_job("j", 2, phase="Inqueue", minMember=2))
    member = {"group": "j", "group_key": "scheduling.k8s.io/group-name", "gpus": 1}
    cache.apply("Pod", "ADDED", pod("w0", node_name="n1", phase="Running", **member))
    cache.apply("Pod", "ADDED", pod("w1", **member))
    stuck = GangOutcome("ns/j", "ml-team", False, reason="no node has 1 free GPU")
    _, out = statuses(cache, {"ns/j": stuck})
    assert out["ns/j"].phase == "Unknown" and out["ns/j"].counts.running == 1
    assert out["ns/j"].condition is not None
    assert out["ns/j"].condition[:2] == ("Unschedulable", "NotEnoughResources")
    assert "no node has 1 free GPU" in out["ns/j"].condition[2]
    _, out = statuses(cache)
    assert out["ns/j"].phase == "Inqueue" and out["ns/j"].condition is None
    cache.apply("Pod", "MODIFIED", pod("w1", node_name="n1", phase="Running", **member))
    _, out = statuses(cache)
    assert out["ns/j"].phase == "Running" and out["ns/j"].condition is not None
    assert out["ns/j"].condition[0] == "Scheduled"
    for name in ("w0", "w1"):
        cache.apply("Pod", "MODIFIED", pod(name, node_name="n1", phase="Succeeded", **member))
    _, out = statuses(cache)
    assert out["ns/j"].phase == "Completed" and out["ns/j"].counts.succeeded == 2


def test_running_podgroup_below_min_member_goes_back_to_pending() -> None:
    cache = volcano_cache(vqueue("ml-team"))
    cache.apply("VolcanoPodGroup", "ADDED", gpu_job("j", 1, phase="Running", minMember=2))
    _, out = statuses(cache)
    assert out["ns/j"].phase == "Pending"


def test_podgroups_of_another_scheduler_are_left_alone() -> None:
    cache = volcano_cache(vqueue("ml-team"))
    cache.apply("Node", "ADDED", node("n1", gpus=8))
    cache.apply("VolcanoPodGroup", "ADDED", gpu_job("theirs", 1, phase="Running"))
    cache.apply("VolcanoPodGroup", "ADDED", gpu_job("fresh", 1))
    member = {"group_key": "scheduling.k8s.io/group-name", "gpus": 1, "scheduler": "other"}
    cache.apply("Pod", "ADDED", pod("t0", group="theirs", node_name="n1", **member))
    assert cache.foreign_podgroups() == {"ns/theirs"}
    snapshot = cache.snapshot()
    out = podgroup_statuses(
        snapshot,
        compute_fair_shares(snapshot),
        cache.volcano_podgroups(),
        cache.volcano_queues(),
        {},
        foreign=cache.foreign_podgroups(),
    )
    assert "ns/theirs" not in out and out["ns/fresh"].phase == "Inqueue"
    cache.apply("Pod", "DELETED", pod("t0", group="theirs", **member))
    assert cache.foreign_podgroups() == frozenset()


# --- reclaimable ---------------------------------------------------------------------------


def test_no_reclaim_from_a_queue_that_is_not_reclaimable() -> None:
    pending = [make_gang(f"b{i}", 1, queue="b", gpus=4, created=NOW - 10) for i in range(2)]
    reclaimable = run(snap(NODES, two_queues(), *full_of_a(), *pending))
    assert reclaimable.evictions and placed(reclaimable) >= {"b0", "b1"}
    closed = run(snap(NODES, two_queues(reclaimable=False), *full_of_a(), *pending))
    assert closed.evictions == () and not placed(closed) & {"b0", "b1"}


@pytest.mark.parametrize("parent_reclaimable", [True, False])
def test_a_parent_that_is_not_reclaimable_protects_its_branch(parent_reclaimable: bool) -> None:
    from dataclasses import replace

    from scheduler.bench.synthetic import make_queue

    queues = [
        make_queue("root"),
        replace(make_queue("x", "root", gpu_quota=4), reclaimable=parent_reclaimable),
        make_queue("x1", "x", gpu_quota=4),
        make_queue("y", "root", gpu_quota=12),
    ]
    held = [(replace(g, queue="x1"), [replace(p, queue="x1") for p in ps]) for g, ps in full_of_a()]
    y = make_gang("y", 1, queue="y", gpus=4, created=NOW - 1)
    p = run(snap(NODES, queues, *held, y))
    assert bool(p.evictions) is parent_reclaimable
    assert ("y" in placed(p)) is parent_reclaimable


def test_validator_flags_a_reclaim_from_a_queue_that_is_not_reclaimable() -> None:
    from dataclasses import replace

    from scheduler.solver.validate_evictions import validate_evictions
    from tests.unit.test_takeback import CPSAT

    pending = [make_gang(f"b{i}", 1, queue="b", gpus=4, created=NOW - 10) for i in range(2)]
    allowed = snap(NODES, two_queues(), *full_of_a(), *pending)
    plan = run(allowed)
    assert plan.evictions
    closed = replace(allowed, queues=tuple(two_queues(reclaimable=False)))
    nominated = [a for a in plan.assignments if a.gang in plan.waits_for]
    plain = [a for a in plan.assignments if a.gang not in plan.waits_for]
    errors = validate_evictions(
        closed,
        compute_fair_shares(closed),
        plain,
        nominated,
        plan.evictions,
        plan.waits_for,
        CPSAT,
    )
    assert any("not reclaimable queue a" in e for e in errors), errors


# --- scheduler names -----------------------------------------------------------------------


def test_scheduler_name_flag_repeats_and_splits_on_commas() -> None:
    parser = build_parser(with_simulate=False)
    args = parser.parse_args(
        ["run", "--scheduler-name", "kai-scheduler", "--scheduler-name=volcano,kai-scheduler"]
    )
    config, _, _ = settings_from_args(args)
    assert config.scheduler_name == "kai-scheduler"
    assert config.scheduler_names_served == ("kai-scheduler", "volcano")
    args = parser.parse_args(["run", "--scheduler-name", "mine"])
    assert settings_from_args(args)[0].scheduler_names_served == ("mine",)
    with pytest.raises(ConfigError):
        settings_from_args(parser.parse_args(["run", "--scheduler-name", "a,"]))


def test_scheduler_names_in_the_config_file() -> None:
    cfg = parse_config({"schedulerNames": ["volcano", "kai-scheduler", "volcano"]})
    assert cfg.scheduler_name == "volcano"
    assert cfg.scheduler_names_served == ("volcano", "kai-scheduler")
    assert parse_config({"schedulerName": "x"}).scheduler_names_served == ("x",)
    assert SchedulerConfig().scheduler_names_served == ("kai-scheduler",)
    for bad in ({"schedulerNames": "volcano"}, {"schedulerNames": []}, {"schedulerNames": [""]}):
        with pytest.raises(ConfigError):
            parse_config(bad)
    with pytest.raises(ConfigError) as e:
        parse_config({"schedulerName": "a", "schedulerNames": ["b"]})
    assert e.value.key == "schedulerNames"
