"""Taking-back facts through the cache: gangs resolved from pods and PodGroups carry
preemptibility (spec, label, priority), the preemption delay and may_preempt; bad values
become problems that keep only the affected gang out; pods keep their start time."""

from __future__ import annotations

from typing import Any

from scheduler.cache import Cache
from scheduler.cache.resolve import resolve
from scheduler.cluster.podspec import PREEMPTIBILITY_LABEL, PREEMPTION_DELAY_ANNOTATION

SCHED = "kai-scheduler"
LABEL_FIELD = f"metadata.labels[{PREEMPTIBILITY_LABEL}]"
ANNOTATION_FIELD = f"metadata.annotations[{PREEMPTION_DELAY_ANNOTATION}]"
NON_PREEMPTIBLE = {"preemptibility": "non-preemptible"}


def pod(
    name: str,
    *,
    group: str | None = None,
    priority: int = 0,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    policy: str | None = None,
    node: str | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    ann = dict(annotations or {})
    if group:
        ann["pod-group-name"] = group
    spec: dict[str, Any] = {
        "schedulerName": SCHED,
        "priority": priority,
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
    }
    if policy:
        spec["preemptionPolicy"] = policy
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "labels": labels or {},
            "annotations": ann,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": spec,
        "status": status or {"phase": "Running" if node else "Pending"},
    }


def podgroup(
    name: str,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-pg-{name}",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {"minMember": 1, **spec},
    }


def new_cache(*objs: tuple[str, dict[str, Any]]) -> Cache:
    cache = Cache(SCHED, "default-queue", lambda: 1000.0)
    for kind, obj in objs:
        cache.apply(kind, "ADDED", obj)
    return cache


def agrees_with_a_fresh_resolution(cache: Cache) -> bool:
    snap = cache.snapshot()
    fresh = resolve(
        cache._pods.values(),
        cache._raw["PodGroup"],
        default_queue=cache.default_queue,
        priorities=cache._priorities,
    )
    return snap.pods == fresh.pods and snap.gangs == fresh.gangs


# --- implicit gangs ------------------------------------------------------------------------


def test_implicit_gang_reads_label_annotation_and_policy_of_its_pod() -> None:
    cache = new_cache(
        ("Pod", pod("low", priority=10, labels={PREEMPTIBILITY_LABEL: "non-preemptible"})),
        ("Pod", pod("high", priority=500, labels={PREEMPTIBILITY_LABEL: "preemptible"})),
        ("Pod", pod("plain-low", priority=10)),
        ("Pod", pod("plain-high", priority=100)),
        ("Pod", pod("patient", annotations={PREEMPTION_DELAY_ANNOTATION: "2m"})),
        ("Pod", pod("meek", priority=500, policy="Never")),
    )
    gangs = cache.snapshot().gang_by_key
    assert not gangs["ns/low"].preemptible
    assert gangs["ns/high"].preemptible
    assert gangs["ns/plain-low"].preemptible and not gangs["ns/plain-high"].preemptible
    assert gangs["ns/patient"].preemption_delay_seconds == 120.0
    assert gangs["ns/plain-low"].preemption_delay_seconds == 0.0
    assert not gangs["ns/meek"].may_preempt and gangs["ns/high"].may_preempt
    assert agrees_with_a_fresh_resolution(cache)


def test_invalid_label_on_a_pending_pod_keeps_only_that_pod_out() -> None:
    cache = new_cache(
        ("Pod", pod("bad", labels={PREEMPTIBILITY_LABEL: "sometimes"})),
        ("Pod", pod("bad-delay", annotations={PREEMPTION_DELAY_ANNOTATION: "soon"})),
        ("Pod", pod("good")),
    )
    snap = cache.snapshot()
    assert [p.name for p in snap.pods] == ["good"]
    assert [g.key for g in snap.gangs] == ["ns/good"]
    problems = {(p.name, p.field): p for p in cache.problems()}
    assert set(problems) == {("bad", LABEL_FIELD), ("bad-delay", ANNOTATION_FIELD)}
    assert "preemptible or non-preemptible" in problems[("bad", LABEL_FIELD)].message
    assert problems[("bad", LABEL_FIELD)].kind == "Pod"


def test_invalid_label_on_a_bound_pod_is_reported_but_it_holds_its_node() -> None:
    cache = new_cache(("Pod", pod("run", node="n1", labels={PREEMPTIBILITY_LABEL: "x"})))
    (p,) = cache.snapshot().pods
    assert p.node_name == "n1"
    assert [pr.field for pr in cache.problems()] == [LABEL_FIELD]
    # the label is ignored: the priority decides
    assert cache.snapshot().gang_by_key["ns/run"].preemptible


def test_pod_start_time_reaches_the_snapshot() -> None:
    status = {"phase": "Running", "startTime": "2026-01-01T00:01:00Z"}
    cache = new_cache(("Pod", pod("r", node="n1", status=status)))
    (p,) = cache.snapshot().pods
    assert p.start_time == p.creation_time + 60


# --- PodGroup gangs ------------------------------------------------------------------------


def test_podgroup_label_beats_member_priority() -> None:
    # Without a priorityClassName the members' priority becomes the gang's; the label still
    # decides preemptibility over it.
    cache = new_cache(
        ("PodGroup", podgroup("g", {PREEMPTIBILITY_LABEL: "preemptible"})),
        ("Pod", pod("g-0", group="g", priority=500)),
        ("PodGroup", podgroup("h", {PREEMPTIBILITY_LABEL: "non-preemptible"})),
        ("Pod", pod("h-0", group="h", priority=0)),
        ("PodGroup", podgroup("s", {PREEMPTIBILITY_LABEL: "preemptible"}, **NON_PREEMPTIBLE)),
        ("Pod", pod("s-0", group="s", priority=0)),
        ("PodGroup", podgroup("p")),
        ("Pod", pod("p-0", group="p", priority=500)),
    )
    gangs = cache.snapshot().gang_by_key
    assert gangs["ns/g"].priority == 500 and gangs["ns/g"].preemptible
    assert not gangs["ns/h"].preemptible
    assert not gangs["ns/s"].preemptible  # spec beats label
    assert not gangs["ns/p"].preemptible  # neither: priority 500 >= 100
    assert agrees_with_a_fresh_resolution(cache)


def test_podgroup_preemption_delay_spec_then_annotation() -> None:
    cache = new_cache(
        ("PodGroup", podgroup("a", preemptionDelay="30s")),
        ("PodGroup", podgroup("b", annotations={PREEMPTION_DELAY_ANNOTATION: "1m"})),
        ("Pod", pod("a-0", group="a")),
        ("Pod", pod("b-0", group="b", annotations={PREEMPTION_DELAY_ANNOTATION: "9m"})),
    )
    gangs = cache.snapshot().gang_by_key
    assert gangs["ns/a"].preemption_delay_seconds == 30.0
    assert gangs["ns/b"].preemption_delay_seconds == 60.0  # the member's annotation is not read


def test_a_gang_may_preempt_only_if_every_member_may() -> None:
    cache = new_cache(
        ("PodGroup", podgroup("g", minMember=2)),
        ("Pod", pod("g-0", group="g")),
        ("Pod", pod("g-1", group="g", policy="Never")),
        ("PodGroup", podgroup("h", minMember=2)),
        ("Pod", pod("h-0", group="h")),
        ("Pod", pod("h-1", group="h", policy="PreemptLowerPriority")),
    )
    gangs = cache.snapshot().gang_by_key
    assert not gangs["ns/g"].may_preempt
    assert gangs["ns/h"].may_preempt
    assert agrees_with_a_fresh_resolution(cache)
    # The Never member goes away: the gang may preempt again.
    cache.apply("Pod", "DELETED", pod("g-1", group="g"))
    assert cache.snapshot().gang_by_key["ns/g"].may_preempt
    assert agrees_with_a_fresh_resolution(cache)


def test_invalid_podgroup_label_keeps_only_that_gang_out() -> None:
    cache = new_cache(
        ("PodGroup", podgroup("bad", {PREEMPTIBILITY_LABEL: "sometimes"})),
        ("Pod", pod("bad-0", group="bad")),
        ("PodGroup", podgroup("late", annotations={PREEMPTION_DELAY_ANNOTATION: "later"})),
        ("Pod", pod("late-0", group="late")),
        ("PodGroup", podgroup("ok")),
        ("Pod", pod("ok-0", group="ok")),
    )
    snap = cache.snapshot()
    assert [g.key for g in snap.gangs] == ["ns/ok"]
    assert [p.name for p in snap.pods] == ["ok-0"]
    problems = {(p.kind, p.name): p for p in cache.problems()}
    assert problems[("PodGroup", "bad")].field == LABEL_FIELD
    assert "preemptible or non-preemptible" in problems[("PodGroup", "bad")].message
    assert problems[("PodGroup", "late")].field == ANNOTATION_FIELD
    assert problems[("Pod", "bad-0")].reason == "PodGroupInvalid"
    assert problems[("Pod", "late-0")].reason == "PodGroupInvalid"


def test_changing_only_the_podgroup_label_is_seen_at_once() -> None:
    cache = new_cache(("PodGroup", podgroup("g")), ("Pod", pod("g-0", group="g", priority=500)))
    assert not cache.snapshot().gang_by_key["ns/g"].preemptible
    before = cache.generation
    cache.apply("PodGroup", "MODIFIED", podgroup("g", {PREEMPTIBILITY_LABEL: "preemptible"}))
    assert cache.generation > before
    assert cache.snapshot().gang_by_key["ns/g"].preemptible
    before = cache.generation
    cache.apply(
        "PodGroup",
        "MODIFIED",
        podgroup("g", {PREEMPTIBILITY_LABEL: "preemptible"}, {PREEMPTION_DELAY_ANNOTATION: "5m"}),
    )
    assert cache.generation > before
    assert cache.snapshot().gang_by_key["ns/g"].preemption_delay_seconds == 300.0
    assert agrees_with_a_fresh_resolution(cache)
