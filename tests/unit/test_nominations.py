"""Nomination and eviction bookkeeping: the cache's holds (nominated pods keep their place,
evicted pods show as terminating), the book of waiting gangs, victim-gang grouping and the
PodGroup status of a waiting gang."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.cache import Cache
from scheduler.cluster import GPU
from scheduler.cluster.gang import Gang
from scheduler.commit.evict import VictimGang, eviction_message, group_by_victim_gang
from scheduler.commit.nominations import Nominations
from scheduler.commit.status import _podgroup_body
from scheduler.solver.placement import Eviction, GangOutcome, PodAssignment

SCHED = "kai-scheduler"


def node(name: str, gpus: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(
    name: str,
    *,
    node_name: str | None = None,
    phase: str = "Pending",
    deleting: bool = False,
    rv: int | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:05:00Z"
    if rv is not None:
        meta["resourceVersion"] = str(rv)
    spec: dict[str, Any] = {
        "schedulerName": SCHED,
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", GPU: "1"}}}],
    }
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


@pytest.fixture
def cache() -> Cache:
    c = Cache(SCHED, "default-queue", lambda: 1000.0)
    c.apply("Node", "ADDED", node("n1"))
    c.apply("Pod", "ADDED", pod("victim", node_name="n1", phase="Running"))
    c.apply("Pod", "ADDED", pod("other", node_name="n1", phase="Running"))
    c.apply("Pod", "ADDED", pod("waiter"))
    return c


def by_name(cache: Cache) -> dict[str, Any]:
    return {p.name: p for p in cache.snapshot().pods}


# --- the cache's holds ---------------------------------------------------------------------


def test_a_nominated_pod_holds_its_place_until_unnominated(cache: Cache) -> None:
    cache.apply("Pod", "DELETED", pod("other", node_name="n1", phase="Running"))
    assert cache.snapshot().node_states()["n1"].gpu_free == (0, 1000)
    cache.nominate("uid-waiter", "n1", {1: 1000})
    waiter = by_name(cache)["waiter"]
    assert waiter.node_name == "n1" and waiter.nominated and not waiter.pending
    assert waiter.gpu_grant == ((1, 1000),)
    # The held device is taken: nobody else may be given it.
    assert cache.snapshot().node_states()["n1"].gpu_free == (0, 0)
    assert cache.nominated() == {"uid-waiter": "n1"}
    cache.pending_changed.clear()
    cache.unnominate("uid-waiter")
    assert cache.pending_changed.is_set()  # pending again: re-plan
    waiter = by_name(cache)["waiter"]
    assert waiter.pending and not waiter.nominated and waiter.node_name is None
    assert cache.nominated() == {}


def test_unnominate_before_a_bind_does_not_wake_the_loop(cache: Cache) -> None:
    cache.nominate("uid-waiter", "n1")
    cache.pending_changed.clear()
    cache.unnominate("uid-waiter", wake=False)
    assert not cache.pending_changed.is_set()
    assert cache.nominated() == {}


def test_a_nomination_ends_when_the_pod_is_bound_or_deleted(cache: Cache) -> None:
    cache.nominate("uid-waiter", "n1")
    cache.apply("Pod", "MODIFIED", pod("waiter", node_name="n1", phase="Running"))
    waiter = by_name(cache)["waiter"]
    assert waiter.node_name == "n1" and not waiter.nominated
    assert cache.nominated() == {}
    cache.apply("Pod", "ADDED", pod("late"))
    cache.nominate("uid-late", "n1")
    cache.apply("Pod", "DELETED", pod("late"))
    assert cache.nominated() == {}
    assert "late" not in by_name(cache)
    cache.nominate("uid-never-seen", "n1")  # unknown pods are not held
    assert cache.nominated() == {}


def test_an_assumption_wins_over_a_nomination(cache: Cache) -> None:
    cache.nominate("uid-waiter", "n1", {0: 1000})
    cache.unnominate("uid-waiter", wake=False)
    cache.assume("uid-waiter", "n1", {1: 1000})
    waiter = by_name(cache)["waiter"]
    assert waiter.node_name == "n1" and not waiter.nominated and waiter.gpu_grant == ((1, 1000),)


def test_an_evicted_pod_shows_terminating_until_the_watch_does(cache: Cache) -> None:
    cache.evicted("uid-victim")
    victim = by_name(cache)["victim"]
    assert victim.deleting and victim.node_name == "n1"
    # It still holds its node while it terminates.
    assert cache.snapshot().node_states()["n1"].gpu_free == (0, 0)
    cache.unevict("uid-victim")
    assert not by_name(cache)["victim"].deleting
    cache.evicted("uid-victim")
    cache.apply("Pod", "MODIFIED", pod("victim", node_name="n1", phase="Running", deleting=True))
    assert by_name(cache)["victim"].deleting
    cache.unevict("uid-victim")  # the mark is gone; the watch's word stays
    assert by_name(cache)["victim"].deleting


def test_gone_means_deleted_or_finished(cache: Cache) -> None:
    assert not cache.gone("uid-victim")
    assert cache.gone("uid-nobody")
    cache.apply("Pod", "MODIFIED", pod("victim", node_name="n1", phase="Succeeded"))
    assert cache.gone("uid-victim")
    assert not cache.gone("uid-other")
    cache.apply("Pod", "DELETED", pod("other", node_name="n1", phase="Running"))
    assert cache.gone("uid-other")


def test_held_pods_are_reused_while_nothing_changes(cache: Cache) -> None:
    cache.nominate("uid-waiter", "n1")
    one = cache.snapshot()
    two = cache.snapshot()
    assert one.pods is two.pods
    cache.evicted("uid-victim")
    assert cache.snapshot().pods is not one.pods


# --- the book of nominated gangs -------------------------------------------------------------


def outcome(gang: str = "ns/job", nodes: tuple[str, ...] = ("n1",)) -> GangOutcome:
    pods = tuple(
        PodAssignment(f"uid-{gang}-{i}", f"ns/{gang}-{i}", gang, n) for i, n in enumerate(nodes)
    )
    return GangOutcome(gang, "team-a", True, pods)


def test_review_reports_ready_and_expired_gangs() -> None:
    book = Nominations(timeout=120.0)
    gone: set[str] = set()
    book.add(outcome("ns/a"), ["v1", "v2"], now=0.0)
    book.add(outcome("ns/b"), ["v3"], now=50.0)
    assert book.review(gone.__contains__, now=10.0) == ([], [])
    gone |= {"v1", "v2"}
    ready, expired = book.review(gone.__contains__, now=10.0)
    assert [g.gang for g in ready] == ["ns/a"] and expired == []
    ready, expired = book.review(gone.__contains__, now=170.0)
    assert [g.gang for g in expired[0][:1]] == ["ns/b"]
    assert "1 evicted pod still not gone after 120s" in expired[0][1]
    assert "ns/a" in book and len(book) == 2  # review decides, pop forgets
    assert book.pop("ns/a") is not None and "ns/a" not in book
    assert [g.gang for g in book.waiting_on({"v3", "zz"})] == ["ns/b"]
    assert book.waiting_on({"v1"}) == []


def test_waiting_message_names_victim_gangs_and_nodes() -> None:
    book = Nominations()
    where = {
        "v1": ("team-a/job-7", "node-4"),
        "v2": ("team-a/job-7", "node-5"),
        "v3": ("team-a/job-7", "node-5"),
    }
    g = book.add(outcome("ns/big", ("n1", "n2")), ["v1", "v2", "v3", "v1"], 0.0, where)
    assert g.victims == ("v1", "v2", "v3")
    assert g.nodes == ("n1", "n2")
    assert g.waiting_message(lambda uid: False) == (
        "waiting for 3 evicted pods of team-a/job-7 to terminate on node-4, node-5"
    )
    assert g.waiting_message(lambda uid: uid != "v2") == (
        "waiting for 1 evicted pod of team-a/job-7 to terminate on node-5"
    )
    assert book.messages(lambda uid: False)["ns/big"].startswith("waiting for 3")


# --- victims -------------------------------------------------------------------------------


def eviction(uid: str, gang: str, action: str = "reclaim", for_gang: str = "ns/w") -> Eviction:
    return Eviction(uid, f"ns/{uid}", gang, "q", "n1", action, for_gang)  # type: ignore[arg-type]


def test_victims_are_grouped_by_gang_in_plan_order_each_pod_once() -> None:
    plan = [eviction("a1", "ns/a"), eviction("b1", "ns/b"), eviction("a2", "ns/a")]
    plan.append(eviction("a1", "ns/a", for_gang="ns/other"))
    groups = group_by_victim_gang(plan)
    assert list(groups) == ["ns/a", "ns/b"]
    assert [e.pod_uid for e in groups["ns/a"]] == ["a1", "a2"]


def test_victim_gang_result_says_what_is_left_and_why() -> None:
    a1, a2, a3 = (eviction(f"a{i}", "ns/a") for i in (1, 2, 3))
    result = VictimGang("ns/a", "q", done=[a1], refused=[(a2, "refused by budget x")])
    result.skipped = [a3]
    assert not result.complete
    assert result.not_done == {"a2", "a3"}
    assert result.problem == "eviction of ns/a2 (ns/a) refused by budget x"
    assert VictimGang("ns/a", "q", done=[a1]).complete


def test_eviction_message_falls_back_to_a_plain_sentence() -> None:
    e = eviction("a1", "ns/a", action="preempt", for_gang="ns/urgent")
    assert eviction_message(e) == "preempted by the scheduler to make room for ns/urgent"
    assert eviction_message(Eviction("u", "ns/u", "g", "q", "n", "shrink", "f", "why")) == "why"


# --- status --------------------------------------------------------------------------------


def test_a_waiting_gang_is_pending_with_waiting_for_evictions(cache: Cache) -> None:
    cache.nominate("uid-waiter", "n1")
    snap = cache.snapshot()
    waiter = next(p for p in snap.pods if p.name == "waiter")
    gang = Gang("ns", "waiter", min_member=1)
    message = "waiting for 1 evicted pod of ns/victim to terminate on n1"
    body = _podgroup_body(gang, [waiter], None, message)
    assert body["phase"] == "Pending"
    assert body["running"] == 0 and body["pending"] == 1
    (condition,) = body["conditions"]
    assert condition["reason"] == "WaitingForEvictions"
    assert message in condition["message"]
    # Once no longer waiting, a held-but-unbound gang is not reported as running.
    assert _podgroup_body(gang, [waiter], None)["phase"] == "Pending"
