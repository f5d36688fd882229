"""The cache's incremental resolution equals a resolution from scratch when pods and PodGroups
change their taking-back fields: preemption policy, the preemptibility label (valid or not),
the preemption-delay annotation, spec.preemptibility and spec.preemptionDelay."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cache import Cache
from scheduler.cache.resolve import resolve
from scheduler.cluster.podspec import PREEMPTIBILITY_LABEL, PREEMPTION_DELAY_ANNOTATION

SCHED = "kai-scheduler"
NAMES = ["a", "b", "g1"]
GROUPS = ["g1", "g2"]
LABELS = ["", "", "preemptible", "non-preemptible", "bogus"]
DELAYS = ["", "", "30s", "2m", "soon"]


def _pod(name: str, v: dict[str, Any], rv: int) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if v["group"]:
        ann["pod-group-name"] = v["group"]
    if v["delay"]:
        ann[PREEMPTION_DELAY_ANNOTATION] = v["delay"]
    labels = {PREEMPTIBILITY_LABEL: v["label"]} if v["label"] else {}
    spec: dict[str, Any] = {
        "schedulerName": SCHED,
        "priority": v["priority"],
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
    }
    if v["policy"]:
        spec["preemptionPolicy"] = v["policy"]
    if v["node"]:
        spec["nodeName"] = v["node"]
    status: dict[str, Any] = {"phase": "Running" if v["node"] else "Pending"}
    if v["node"] and v["started"]:
        status["startTime"] = f"2026-01-01T00:0{v['started']}:00Z"
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"{name}-{v['gen']}",
            "resourceVersion": str(rv),
            "annotations": ann,
            "labels": labels,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": spec,
        "status": status,
    }


pod_values = st.fixed_dictionaries(
    {
        "group": st.sampled_from(["", "", *GROUPS]),
        "node": st.sampled_from([None, "n1"]),
        "priority": st.sampled_from([0, 150]),
        "policy": st.sampled_from(["", "Never", "PreemptLowerPriority"]),
        "label": st.sampled_from(LABELS),
        "delay": st.sampled_from(DELAYS),
        "started": st.integers(0, 9),
        "gen": st.integers(0, 1),
    }
)

podgroup_values = st.fixed_dictionaries(
    {
        "preemptibility": st.sampled_from(["", "preemptible", "non-preemptible"]),
        "preemptionDelay": st.sampled_from(DELAYS),
        "label": st.sampled_from(LABELS),
        "delay": st.sampled_from(DELAYS),
    }
)

ops = st.one_of(
    st.tuples(st.just("pod"), st.sampled_from(NAMES), pod_values),
    st.tuples(st.just("delete_pod"), st.sampled_from(NAMES), st.none()),
    st.tuples(st.just("podgroup"), st.sampled_from(GROUPS), podgroup_values),
    st.tuples(st.just("delete_podgroup"), st.sampled_from(GROUPS), st.none()),
)


def _podgroup(name: str, v: dict[str, Any]) -> dict[str, Any]:
    spec = {k: v[k] for k in ("preemptibility", "preemptionDelay") if v[k]}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"pg-{name}",
            "labels": {PREEMPTIBILITY_LABEL: v["label"]} if v["label"] else {},
            "annotations": {PREEMPTION_DELAY_ANNOTATION: v["delay"]} if v["delay"] else {},
        },
        "spec": {"minMember": 1, **spec},
    }


def _check(sequence: list[Any]) -> None:
    cache = Cache(SCHED, "default-queue")
    uids: dict[str, str] = {}
    for rv, (op, name, value) in enumerate(sequence, start=1):
        if op == "pod":
            obj = _pod(name, value, rv)
            uids[name] = obj["metadata"]["uid"]
            cache.apply("Pod", "MODIFIED", obj)
        elif op == "delete_pod" and name in uids:
            cache.apply(
                "Pod", "DELETED", {"metadata": {"name": name, "namespace": "ns", "uid": uids[name]}}
            )
        elif op == "podgroup":
            cache.apply("PodGroup", "MODIFIED", _podgroup(name, value))
        elif op == "delete_podgroup":
            cache.apply("PodGroup", "DELETED", {"metadata": {"name": name, "namespace": "ns"}})
        snap = cache.snapshot()
        fresh = resolve(
            cache._pods.values(),
            cache._raw["PodGroup"],
            default_queue=cache.default_queue,
            priorities=cache._priorities,
        )
        assert snap.pods == fresh.pods
        assert snap.gangs == fresh.gangs
        assert tuple(cache.problems()) == fresh.problems


@settings(max_examples=150, deadline=None)
@given(st.lists(ops, min_size=1, max_size=30))
def test_incremental_resolution_of_takeback_fields_equals_a_fresh_one(sequence: list[Any]) -> None:
    _check(sequence)


def test_a_podgroup_label_change_alone_is_resolved_again() -> None:
    member = {
        "group": "g1", "node": None, "priority": 150, "policy": "", "label": "", "delay": "",
        "started": 0, "gen": 0,
    }  # fmt: skip
    plain = {"preemptibility": "", "preemptionDelay": "", "label": "", "delay": ""}
    _check(
        [
            ("podgroup", "g1", plain),
            ("pod", "g1", member),
            ("podgroup", "g1", {**plain, "label": "preemptible"}),
            ("podgroup", "g1", {**plain, "label": "bogus"}),
            ("podgroup", "g1", {**plain, "delay": "2m"}),
        ]
    )
