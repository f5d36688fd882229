"""The cache: watch events in, Snapshot out; assume/confirm/forget; problems as data."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from scheduler.cache import (
    GPU_GRANT_ANNOTATION,
    Cache,
    GrantError,
    Problem,
    format_gpu_grant,
    node_from_k8s,
    parse_gpu_grant,
)
from scheduler.cluster import GPU, Pod, Snapshot

SCHED = "kai-scheduler"


class Clock:
    """A settable wall clock."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def node(
    name: str,
    gpus: int = 8,
    cpu: str = "64",
    ready: bool = True,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels or {}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "512Gi", "pods": "110", GPU: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    name: str,
    ns: str = "ns",
    *,
    gpus: int = 0,
    cpu: str = "1",
    node_name: str | None = None,
    group: str | None = None,
    group_key: str = "pod-group-name",
    queue: str | None = None,
    scheduler: str = SCHED,
    annotations: dict[str, str] | None = None,
    priority: int | None = None,
    phase: str = "Pending",
    uid: str | None = None,
) -> dict[str, Any]:
    ann = dict(annotations or {})
    if group:
        ann[group_key] = group
    requests: dict[str, str] = {"cpu": cpu}
    if gpus:
        requests[GPU] = str(gpus)
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "c", "resources": {"requests": requests, "limits": {}}}],
    }
    if node_name:
        spec["nodeName"] = node_name
    if priority is not None:
        spec["priority"] = priority
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{ns}-{name}",
            "annotations": ann,
            "labels": {"kai.scheduler/queue": queue} if queue else {},
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def podgroup(name: str, ns: str = "ns", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-pg-{ns}-{name}"},
        "spec": {"minMember": 1, **spec},
    }


def queue(name: str, parent: str = "", **resources: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": resources}
    if parent:
        spec["parentQueue"] = parent
    return {"metadata": {"name": name, "uid": f"uid-q-{name}"}, "spec": spec}


def by_name(snap: Snapshot) -> dict[str, Pod]:
    return {p.name: p for p in snap.pods}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(clock: Clock) -> Cache:
    return Cache(SCHED, "default-queue", clock)


def test_snapshot_holds_nodes_queues_and_pods(cache: Cache) -> None:
    cache.apply("Node", "ADDED", node("n1", gpus=4))
    cache.apply("Node", "ADDED", node("n0", gpus=2, ready=False))
    cache.apply("Queue", "ADDED", queue("team-a", gpu={"quota": 2}))
    cache.apply("Pod", "ADDED", pod("p1", gpus=1))
    snap = cache.snapshot()
    assert [n.name for n in snap.nodes] == ["n0", "n1"]
    assert snap.node_by_name["n1"].gpu_count == 4
    assert not snap.node_by_name["n0"].ready
    assert [q.name for q in snap.queues] == ["team-a"]
    assert snap.queues[0].resource("gpu").quota == 2000
    (p1,) = snap.pods
    assert p1.pending and p1.requests[GPU] == 1 and p1.managed
    assert snap.now == 1000.0
    # The snapshot survives a JSON round trip (cycles can be replayed).
    assert Snapshot.from_json(snap.to_json()) == snap


def test_implicit_gang_follows_the_contract(cache: Cache) -> None:
    cache.apply("Pod", "ADDED", pod("solo", priority=50, queue="team-a"))
    snap = cache.snapshot()
    (p,) = snap.pods
    gang = snap.gang_by_key[p.gang]
    assert p.gang == "ns/solo" == gang.key
    assert (gang.min_member, gang.queue, gang.priority) == (1, "team-a", 50)
    assert gang.implicit and gang.preemptible
    cache.apply("Pod", "ADDED", pod("vip", priority=1000))
    vip = cache.snapshot().gang_by_key["ns/vip"]
    assert vip.queue == "default-queue" and not vip.preemptible


def test_with_a_pod_grouper_pods_wait_for_their_podgroup(clock: Clock) -> None:
    """Without this, a workload's first pods could be bound alone in the moment before the
    grouper annotates them."""
    cache = Cache("kai-scheduler", "default-queue", clock, wait_for_pod_grouper=True)
    cache.apply("Pod", "ADDED", pod("w0"))
    snap = cache.snapshot()
    assert snap.pods == () and snap.gangs == ()
    (problem,) = list(cache.problems())
    assert problem.reason == "WaitingForPodGroup" and "pod grouper" in problem.message
    # The grouper annotates it (and made the PodGroup): it is scheduled as a member.
    cache.apply("PodGroup", "ADDED", podgroup("wl", minMember=1))
    cache.apply("Pod", "MODIFIED", pod("w0", group="wl"))
    assert [p.gang for p in cache.snapshot().pods] == ["ns/wl"]
    assert list(cache.problems()) == []
    # Opting out: a gang of one at once.
    skipped = pod("solo", annotations={"kai.scheduler/skip-podgrouper": "true"})
    cache.apply("Pod", "ADDED", skipped)
    assert "ns/solo" in cache.snapshot().gang_by_key
    # Bound pods without a group still count where they run.
    bound = pod("old", node_name="n1", phase="Running")
    cache.apply("Pod", "ADDED", bound)
    assert "ns/old" in {p.key for p in cache.snapshot().pods}


@pytest.mark.parametrize("annotation", ["pod-group-name", "scheduling.k8s.io/group-name"])
def test_pods_join_their_podgroup_by_either_annotation(cache: Cache, annotation: str) -> None:
    cache.apply("PodGroup", "ADDED", podgroup("train", minMember=2, queue="team-a"))
    for i in range(2):
        cache.apply("Pod", "ADDED", pod(f"w{i}", group="train", group_key=annotation))
    snap = cache.snapshot()
    assert {p.gang for p in snap.pods} == {"ns/train"}
    assert [g.key for g in snap.gangs] == ["ns/train"]
    gang = snap.gang_by_key["ns/train"]
    assert gang.min_member == 2 and not gang.implicit
    assert len(snap.pods_by_gang["ns/train"]) == 2


def test_queue_resolution_order(cache: Cache) -> None:
    # PodGroup spec.queue beats the pod label.
    cache.apply("PodGroup", "ADDED", podgroup("a", queue="from-pg"))
    cache.apply("Pod", "ADDED", pod("pa", group="a", queue="from-label"))
    # Without spec.queue, the members' label decides.
    cache.apply("PodGroup", "ADDED", podgroup("b"))
    cache.apply("Pod", "ADDED", pod("pb", group="b", queue="from-label"))
    # Neither: the configured default.
    cache.apply("PodGroup", "ADDED", podgroup("c"))
    cache.apply("Pod", "ADDED", pod("pc", group="c"))
    cache.apply("Pod", "ADDED", pod("solo"))
    snap = cache.snapshot()
    pods = by_name(snap)
    assert {n: pods[n].queue for n in pods} == {
        "pa": "from-pg",
        "pb": "from-label",
        "pc": "default-queue",
        "solo": "default-queue",
    }
    assert snap.gang_by_key["ns/a"].queue == "from-pg"
    assert snap.gang_by_key["ns/b"].queue == "from-label"
    assert Cache(SCHED, "other-default").default_queue == "other-default"


def test_podgroup_priority_class_sets_gang_and_pod_priority(cache: Cache) -> None:
    cache.apply("PriorityClass", "ADDED", {"metadata": {"name": "train"}, "value": 50})
    cache.apply("PriorityClass", "ADDED", {"metadata": {"name": "infer"}, "value": 200})
    cache.apply("PodGroup", "ADDED", podgroup("g", priorityClassName="infer"))
    cache.apply("Pod", "ADDED", pod("p", group="g", priority=0))
    snap = cache.snapshot()
    assert snap.gang_by_key["ns/g"].priority == 200
    assert not snap.gang_by_key["ns/g"].preemptible
    assert by_name(snap)["p"].priority == 200
    # Without a class on the PodGroup the members' priority decides.
    cache.apply("PodGroup", "ADDED", podgroup("h"))
    cache.apply("Pod", "ADDED", pod("q", group="h", priority=150))
    assert cache.snapshot().gang_by_key["ns/h"].priority == 150


def test_missing_podgroup_is_a_problem_and_pending_pod_is_left_out(cache: Cache) -> None:
    cache.apply("Node", "ADDED", node("n1"))
    cache.apply("Pod", "ADDED", pod("lost", group="nope"))
    cache.apply("Pod", "ADDED", pod("running", group="gone", node_name="n1", gpus=2))
    cache.apply("Pod", "ADDED", pod("fine"))
    snap = cache.snapshot()
    pods = by_name(snap)
    assert "lost" not in pods and "fine" in pods
    # A bound pod whose PodGroup vanished still holds its GPUs.
    assert snap.node_states()["n1"].whole_free_gpus == 6
    assert snap.gang_by_key[pods["running"].gang].min_member == 1
    (problem,) = list(cache.problems())
    assert (problem.kind, problem.namespace, problem.name) == ("Pod", "ns", "lost")
    assert problem.reason == "PodGroupNotFound"
    assert problem.field == "metadata.annotations[pod-group-name]"
    assert "nope" in problem.message and problem.uid == "uid-ns-lost"
    assert problem.api_version == "v1"
    # Creating the PodGroup fixes it.
    cache.apply("PodGroup", "ADDED", podgroup("nope"))
    assert "lost" in by_name(cache.snapshot())
    assert cache.problems() == []


def test_malformed_objects_become_problems_and_the_rest_is_scheduled(cache: Cache) -> None:
    cache.apply("Node", "ADDED", node("n1"))
    bad_node = node("bad")
    bad_node["status"]["allocatable"]["cpu"] = "lots"
    cache.apply("Node", "ADDED", bad_node)
    cache.apply("Queue", "ADDED", queue("q-bad", gpu={"quota": 4, "limit": 2}))
    cache.apply("Queue", "ADDED", queue("q-ok"))
    cache.apply("PodGroup", "ADDED", podgroup("pg-bad", minMember=-3))
    cache.apply("Pod", "ADDED", pod("member", group="pg-bad"))
    cache.apply("Pod", "ADDED", pod("frac", annotations={"gpu-fraction": "1.7"}))
    cache.apply("Pod", "ADDED", pod("ok"))
    snap = cache.snapshot()
    assert [n.name for n in snap.nodes] == ["n1"]
    assert [q.name for q in snap.queues] == ["q-ok"]
    assert sorted(by_name(snap)) == ["ok"]
    problems = {(p.kind, p.name): p for p in cache.problems()}
    assert set(problems) == {
        ("Node", "bad"),
        ("Queue", "q-bad"),
        ("PodGroup", "pg-bad"),
        ("Pod", "member"),
        ("Pod", "frac"),
    }
    assert problems[("Pod", "frac")].field == "metadata.annotations[gpu-fraction]"
    assert "1.7" in problems[("Pod", "frac")].message
    assert problems[("Queue", "q-bad")].field == "spec.resources.gpu.limit"
    assert problems[("PodGroup", "pg-bad")].field == "spec.minMember"
    assert problems[("PodGroup", "pg-bad")].api_version == "scheduling.run.ai/v2alpha2"
    assert problems[("Pod", "member")].reason == "PodGroupInvalid"
    assert problems[("Node", "bad")].field == "status.allocatable"
    # Fixing the pod clears its problem.
    cache.apply("Pod", "MODIFIED", pod("frac", annotations={"gpu-fraction": "0.5"}))
    assert ("Pod", "frac") not in {(p.kind, p.name) for p in cache.problems()}
    assert by_name(cache.snapshot())["frac"].gpu is not None


def test_bound_malformed_pod_still_occupies_its_node(cache: Cache) -> None:
    cache.apply("Node", "ADDED", node("n1", cpu="8"))
    bad = pod("bad", cpu="3", node_name="n1", annotations={"gpu-fraction": "zero"})
    cache.apply("Pod", "ADDED", bad)
    snap = cache.snapshot()
    assert by_name(snap)["bad"].node_name == "n1"
    assert snap.node_states()["n1"].used["cpu"] == 3000
    assert [p.name for p in cache.problems()] == ["bad"]


def test_pods_of_other_schedulers_only_use_capacity(cache: Cache) -> None:
    cache.apply("Node", "ADDED", node("n1", gpus=8))
    cache.apply(
        "Pod", "ADDED", pod("theirs", gpus=3, node_name="n1", scheduler="default-scheduler")
    )
    cache.apply("Pod", "ADDED", pod("waiting", scheduler="default-scheduler"))
    bad = pod("their-bad", scheduler="default-scheduler", annotations={"gpu-fraction": "x"})
    cache.apply("Pod", "ADDED", bad)
    snap = cache.snapshot()
    pods = by_name(snap)
    assert not pods["theirs"].managed and pods["theirs"].gang == ""
    assert "waiting" not in pods  # not ours to place, and it holds nothing
    assert snap.gangs == ()
    assert snap.node_states()["n1"].whole_free_gpus == 5
    assert cache.problems() == []  # not ours to complain about


def test_finished_pods_are_left_out(cache: Cache) -> None:
    cache.apply("Node", "ADDED", node("n1", gpus=8))
    cache.apply("Pod", "ADDED", pod("done", gpus=8, node_name="n1", phase="Succeeded"))
    snap = cache.snapshot()
    assert snap.pods == () and snap.node_states()["n1"].whole_free_gpus == 8


def test_ungrouped_pod_named_like_a_podgroup_stays_on_its_own(cache: Cache) -> None:
    cache.apply("Node", "ADDED", node("n1", gpus=8))
    cache.apply("PodGroup", "ADDED", podgroup("train", minMember=2))
    cache.apply("Pod", "ADDED", pod("w0", gpus=1, group="train"))
    cache.apply("Pod", "ADDED", pod("w1", gpus=1, group="train"))
    cache.apply("Pod", "ADDED", pod("train", gpus=1))  # no annotation, same name as the group
    snap = cache.snapshot()
    assert {p.name for p in snap.pods_by_gang["ns/train"]} == {"w0", "w1"}
    alone = by_name(snap)["train"]
    assert alone.gang != "ns/train" and [p.name for p in snap.pods_by_gang[alone.gang]] == ["train"]
    assert len({g.key for g in snap.gangs}) == len(snap.gangs)


def test_finished_gang_members_stay_inactive(cache: Cache) -> None:
    cache.apply("Node", "ADDED", node("n1", gpus=8))
    cache.apply("PodGroup", "ADDED", podgroup("train", minMember=2))
    done = pod("w0", gpus=4, node_name="n1", phase="Succeeded", group="train")
    running = pod("w1", gpus=4, node_name="n1", phase="Running", group="train")
    cache.apply("Pod", "ADDED", done)
    cache.apply("Pod", "ADDED", running)
    snap = cache.snapshot()
    members = {p.name: p for p in snap.pods_by_gang["ns/train"]}
    assert set(members) == {"w0", "w1"}
    assert not members["w0"].active and members["w1"].active
    assert snap.node_states()["n1"].whole_free_gpus == 4  # only the running member holds GPUs


def test_assume_counts_the_pod_as_bound_until_forgotten(cache: Cache) -> None:
    cache.apply("Node", "ADDED", node("n1", gpus=2))
    cache.apply("Pod", "ADDED", pod("frac", annotations={"gpu-fraction": "0.5"}))
    cache.pending_changed.clear()
    cache.assume("uid-ns-frac", "n1", {1: 500})
    snap = cache.snapshot()
    p = by_name(snap)["frac"]
    assert p.node_name == "n1" and not p.pending and p.gpu_grant == ((1, 500),)
    assert snap.node_states()["n1"].gpu_free == (1000, 500)
    assert cache.assumed() == {"uid-ns-frac": "n1"}
    assert not cache.pending_changed.is_set()  # assuming frees nothing
    cache.forget("uid-ns-frac")
    snap = cache.snapshot()
    assert by_name(snap)["frac"].pending
    assert snap.node_states()["n1"].gpu_free == (1000, 1000)
    assert cache.pending_changed.is_set()


def with_rv(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = str(rv)
    return out


def test_assumption_never_expires_on_a_timer(clock: Clock) -> None:
    # A slow watch must not make a bound pod look pending: it would be placed again and its
    # devices granted twice. Only a read-back that shows it unbound makes it pending.
    cache = Cache(SCHED, "default-queue", clock, assume_ttl=30.0)
    cache.apply("Node", "ADDED", node("n1", gpus=2))
    cache.apply("Pod", "ADDED", with_rv(pod("p", gpus=1), 5))
    cache.assume("uid-ns-p", "n1", {1: 1000})
    clock.now += 3600
    assert cache.due_checks() == []  # bind still in flight: nothing to read back
    cache.bind_finished("uid-ns-p")
    clock.now += 29.0
    assert cache.due_checks() == []
    clock.now += 2.0
    assert cache.due_checks() == [("uid-ns-p", "ns", "p")]
    assert cache.due_checks() == []  # named once per wait
    clock.now += 3600
    snap = cache.snapshot()
    assert not by_name(snap)["p"].pending
    assert snap.node_states()["n1"].gpu_free == (1000, 0)
    # The read-back shows it bound (newer than the watch): confirmed, with its grant.
    bound = pod("p", gpus=1, node_name="n1", annotations={GPU_GRANT_ANNOTATION: '{"1":1000}'})
    cache.observe_pod(with_rv(bound, 9))
    assert cache.assumed() == {}
    # The slow watch now delivers the pre-bind state: older, ignored.
    cache.apply("Pod", "MODIFIED", with_rv(pod("p", gpus=1), 7))
    snap = cache.snapshot()
    assert by_name(snap)["p"].node_name == "n1"
    assert snap.node_states()["n1"].gpu_free == (1000, 0)


def test_read_back_unbound_makes_the_pod_pending_again(clock: Clock) -> None:
    cache = Cache(SCHED, "default-queue", clock, assume_ttl=30.0, uncertain_recheck=2.0)
    cache.apply("Pod", "ADDED", with_rv(pod("p"), 5))
    cache.assume("uid-ns-p", "n1")
    cache.bind_finished("uid-ns-p", uncertain=True)
    clock.now += 1.0
    assert cache.due_checks() == []
    clock.now += 1.5
    assert cache.due_checks() == [("uid-ns-p", "ns", "p")]
    cache.pending_changed.clear()
    cache.observe_pod(with_rv(pod("p"), 6))
    assert cache.assumed() == {}
    assert by_name(cache.snapshot())["p"].pending
    assert cache.pending_changed.is_set()


def test_read_back_during_a_bind_keeps_the_assumption(clock: Clock) -> None:
    cache = Cache(SCHED, "default-queue", clock)
    cache.apply("Pod", "ADDED", with_rv(pod("p"), 5))
    cache.assume("uid-ns-p", "n1")
    cache.observe_pod(with_rv(pod("p"), 6))  # e.g. a 409's answer for another attempt
    assert cache.assumed() == {"uid-ns-p": "n1"}


def test_pending_pods_leftover_grant_never_beats_the_assumption(cache: Cache) -> None:
    cache.apply("Node", "ADDED", node("n1", gpus=2))
    stale = pod("frac", annotations={"gpu-fraction": "0.5", GPU_GRANT_ANNOTATION: '{"0":500}'})
    cache.apply("Pod", "ADDED", stale)
    assert by_name(cache.snapshot())["frac"].gpu_grant == ()
    cache.assume("uid-ns-frac", "n1", {1: 500})
    snap = cache.snapshot()
    assert by_name(snap)["frac"].gpu_grant == ((1, 500),)
    assert snap.node_states()["n1"].gpu_free == (1000, 500)


def test_bound_pods_grant_annotation_is_the_truth_after_a_restart(clock: Clock) -> None:
    annotated = pod(
        "frac",
        node_name="n1",
        phase="Running",
        annotations={"gpu-fraction": "0.5", GPU_GRANT_ANNOTATION: format_gpu_grant({1: 500})},
    )
    fresh = Cache(SCHED, "default-queue", clock)
    fresh.apply("Node", "ADDED", node("n1", gpus=2))
    fresh.apply("Pod", "ADDED", annotated)
    assert fresh.snapshot().node_states()["n1"].gpu_free == (1000, 500)


def test_without_the_queue_crd_every_named_queue_is_an_open_leaf(cache: Cache) -> None:
    cache.apply("Pod", "ADDED", pod("a"))
    cache.apply("Pod", "ADDED", pod("b", queue="team-a"))
    assert cache.snapshot().queues == ()
    cache.set_absent("Queue", True)
    queues = cache.snapshot().queues
    assert [q.name for q in queues] == ["default-queue", "team-a"]
    assert all(not q.resources and not q.parent for q in queues)


def test_only_changes_a_cycle_can_act_on_wake_it(cache: Cache) -> None:
    # While a backlog binds, every confirmation and kubelet status update is a watch event;
    # none of them can let a pending pod in, so none may start a cycle.
    cache.apply("Node", "ADDED", node("n1", gpus=2))
    cache.pending_changed.clear()
    cache.apply("Pod", "ADDED", with_rv(pod("p", gpus=1), 5))
    assert cache.pending_changed.is_set()  # new pending work
    cache.assume("uid-ns-p", "n1", {0: 1000})
    cache.pending_changed.clear()
    bound = pod("p", gpus=1, node_name="n1", annotations={GPU_GRANT_ANNOTATION: '{"0":1000}'})
    cache.apply("Pod", "MODIFIED", with_rv(bound, 6))  # the bind, confirmed
    running = pod("p", gpus=1, node_name="n1", phase="Running",
                  annotations={GPU_GRANT_ANNOTATION: '{"0":1000}'})  # fmt: skip
    cache.apply("Pod", "MODIFIED", with_rv(running, 7))  # kubelet reports it running
    assert not cache.pending_changed.is_set()
    done = pod("p", gpus=1, node_name="n1", phase="Succeeded",
               annotations={GPU_GRANT_ANNOTATION: '{"0":1000}'})  # fmt: skip
    cache.apply("Pod", "MODIFIED", with_rv(done, 8))  # its GPU is free again
    assert cache.pending_changed.is_set()


def test_missing_podgroup_crd_is_named_in_the_reason(cache: Cache) -> None:
    cache.apply("Pod", "ADDED", pod("w0", group="train"))
    cache.set_absent("PodGroup", True)
    (problem,) = list(cache.problems())
    assert "PodGroup CRD" in problem.message and "not installed" in problem.message
    cache.set_absent("PodGroup", False)
    (problem,) = list(cache.problems())
    assert "does not exist" in problem.message


def test_bad_grant_annotation_is_a_problem_but_pod_still_counts(cache: Cache) -> None:
    cache.apply("Node", "ADDED", node("n1", gpus=2))
    p = pod("p", gpus=1, node_name="n1", annotations={GPU_GRANT_ANNOTATION: "{oops"})
    cache.apply("Pod", "ADDED", p)
    snap = cache.snapshot()
    assert snap.node_states()["n1"].whole_free_gpus == 1
    (problem,) = list(cache.problems())
    assert problem.field == f"metadata.annotations[{GPU_GRANT_ANNOTATION}]"


def test_grant_annotation_round_trip() -> None:
    assert parse_gpu_grant(format_gpu_grant({3: 250, 0: 1000})) == ((0, 1000), (3, 250))
    assert json.loads(format_gpu_grant([(2, 500)])) == {"2": 500}
    for bad in ("[1]", '{"a": 1}', '{"0": 1001}', '{"-1": 5}', '{"0": true}', "nope"):
        with pytest.raises(GrantError):
            parse_gpu_grant(bad)


def test_relist_replaces_kind_and_deletes_vanished_objects(cache: Cache) -> None:
    cache.apply("Pod", "ADDED", pod("a"))
    cache.apply("Pod", "ADDED", pod("b"))
    cache.assume("uid-ns-b", "n1")
    cache.relisted("Pod", [pod("a"), pod("c")])
    assert sorted(by_name(cache.snapshot())) == ["a", "c"]
    assert cache.assumed() == {}  # b is gone, its assumption too
    assert cache.raw("Pod", "ns", "b") is None


def test_delete_and_recreate_under_same_name(cache: Cache) -> None:
    cache.apply("Pod", "ADDED", pod("p", uid="old", cpu="1"))
    cache.apply("Pod", "ADDED", pod("p", uid="new", cpu="2"))  # missed the DELETED
    (p,) = cache.snapshot().pods
    assert p.uid == "new" and p.requests["cpu"] == 2000
    cache.apply("Pod", "DELETED", pod("p", uid="new"))
    assert cache.snapshot().pods == ()
    cache.apply("Node", "ADDED", node("n1"))
    cache.apply("Node", "DELETED", node("n1"))
    assert cache.snapshot().nodes == ()


def test_pending_changed_ignores_status_only_updates(cache: Cache) -> None:
    cache.apply("Pod", "ADDED", pod("p"))
    assert cache.pending_changed.is_set()
    cache.pending_changed.clear()
    generation = cache.generation
    noisy = pod("p")
    noisy["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    cache.apply("Pod", "MODIFIED", noisy)
    pg = podgroup("g", minMember=2)
    cache.apply("PodGroup", "ADDED", pg)
    cache.pending_changed.clear()
    pg_status = copy.deepcopy(pg)
    pg_status["status"] = {"phase": "Pending"}
    cache.apply("PodGroup", "MODIFIED", pg_status)
    hb = node("n1")
    cache.apply("Node", "ADDED", hb)
    cache.pending_changed.clear()
    hb2 = copy.deepcopy(hb)
    hb2["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:01:00Z"
    cache.apply("Node", "MODIFIED", hb2)
    assert not cache.pending_changed.is_set()
    assert cache.generation == generation + 2  # only the PodGroup and the node were new
    cache.apply("Pod", "DELETED", pod("p"))
    assert cache.pending_changed.is_set()


def test_raw_returns_latest_object_without_managed_fields(cache: Cache) -> None:
    cache.apply("Pod", "ADDED", pod("p"))
    raw = cache.raw("Pod", "ns", "p")
    assert raw is not None and raw["metadata"]["uid"] == "uid-ns-p"
    assert "managedFields" not in raw["metadata"]
    assert raw["kind"] == "Pod" and raw["apiVersion"] == "v1"
    cache.apply("Queue", "ADDED", queue("q"))
    q = cache.raw("Queue", "", "q")
    assert q is not None and q["apiVersion"] == "scheduling.run.ai/v2"
    assert cache.raw("PodGroup", "ns", "missing") is None
    assert cache.raw("Nonsense", "", "x") is None
    assert cache.counts()["Pod"] == 1


def test_garbage_events_never_raise(cache: Cache) -> None:
    cache.apply("Pod", "ADDED", {})
    cache.apply("Pod", "ADDED", {"metadata": {"name": "x", "namespace": "ns"}, "spec": None})
    cache.apply("Node", "ADDED", {"metadata": {"name": "n"}, "status": {"allocatable": None}})
    cache.apply("Queue", "ADDED", {"metadata": {"name": "q"}, "spec": {"priority": "high"}})
    cache.apply("Widget", "ADDED", {"metadata": {"name": "w"}})
    cache.apply("Pod", "BOOKMARK", {"metadata": {"resourceVersion": "5"}})
    cache.apply("PriorityClass", "ADDED", {"metadata": {"name": "pc"}, "value": "high"})
    snap = cache.snapshot()
    assert [q for q in snap.queues] == []
    assert any(p.kind == "Queue" and p.field == "spec.priority" for p in cache.problems())
    assert all(isinstance(p, Problem) for p in cache.problems())


def test_node_from_k8s_reads_taints_and_gpu_memory() -> None:
    raw = node("n", gpus=4, labels={"nvidia.com/gpu.memory": "81920"})
    raw["spec"] = {
        "unschedulable": True,
        "taints": [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}],
    }
    n = node_from_k8s(raw)
    assert n.unschedulable and not n.schedulable
    assert n.gpu_memory_mib == 81920 and n.gpu_count == 4
    assert n.taints[0].key == "gpu" and n.taints[0].effect == "NoSchedule"


def test_moved_gangs_are_restoring_until_bound_again_or_the_window_ends(
    cache: Cache, clock: Clock
) -> None:
    cache.note_moved(["ns/a", "ns/b"])
    assert cache.snapshot().restoring == {"ns/a", "ns/b"}
    cache.restored("ns/a")
    assert cache.snapshot().restoring == {"ns/b"}
    clock.now += 601  # a controller that never recreates its pods loses the head start
    assert cache.snapshot().restoring == frozenset()
