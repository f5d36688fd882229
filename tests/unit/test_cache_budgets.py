"""PodDisruptionBudgets resolved by the cache into Snapshot.budgets: selectors, namespaces,
pods that count, incremental upkeep (checked against a from-scratch resolution)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from scheduler.cache import Cache
from scheduler.cache.budgets import BudgetIndex, parse_label_selector
from scheduler.cluster.disruption import DisruptionBudget

SCHED = "kai-scheduler"


def pod(
    name: str,
    ns: str = "ns",
    labels: dict[str, str] | None = None,
    *,
    phase: str = "Running",
    deleting: bool = False,
    node: str | None = "n1",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": f"uid-{ns}-{name}",
        "labels": labels or {},
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    spec: dict[str, Any] = {
        "schedulerName": SCHED,
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def pdb(
    name: str,
    ns: str = "ns",
    selector: Any = None,
    *,
    allowed: int = 1,
    generation: int = 1,
    observed: int | None = 1,
) -> dict[str, Any]:
    status: dict[str, Any] = {"disruptionsAllowed": allowed}
    if observed is not None:
        status["observedGeneration"] = observed
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": ns, "generation": generation},
        "spec": {"selector": selector, "minAvailable": 1},
        "status": status,
    }


def labels(**kv: str) -> dict[str, Any]:
    return {"matchLabels": kv}


@pytest.fixture
def cache() -> Cache:
    return Cache(SCHED, "default-queue", lambda: 1000.0)


# --- selectors ---------------------------------------------------------------------------


def test_label_selector_semantics() -> None:
    sel = parse_label_selector(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "NotIn", "values": ["x"]},
                {"key": "team", "operator": "Exists"},
            ],
        }
    )
    assert sel is not None
    ok = {"app": "web", "tier": "a", "team": "t"}
    assert sel.matches(ok)
    assert sel.matches({**ok, "zone": "y"})
    assert not sel.matches({**ok, "zone": "x"})
    assert not sel.matches({**ok, "canary": "1"})
    assert not sel.matches({**ok, "tier": "c"})
    assert not sel.matches({k: v for k, v in ok.items() if k != "team"})
    assert not sel.matches({**ok, "app": "db"})


def test_empty_selector_matches_all_missing_or_bad_matches_none() -> None:
    empty = parse_label_selector({})
    assert empty is not None and empty.matches({}) and empty.matches({"a": "b"})
    assert parse_label_selector(None) is None
    assert parse_label_selector({"matchExpressions": [{"key": "a", "operator": "Gt"}]}) is None
    assert parse_label_selector({"matchLabels": ["a"]}) is None


# --- the cache ---------------------------------------------------------------------------


def test_budget_covers_matching_pods_of_its_namespace_only(cache: Cache) -> None:
    cache.apply("Pod", "ADDED", pod("a1", labels={"app": "a"}))
    cache.apply("Pod", "ADDED", pod("a2", labels={"app": "a", "x": "y"}))
    cache.apply("Pod", "ADDED", pod("b1", labels={"app": "b"}))
    cache.apply("Pod", "ADDED", pod("a3", ns="other", labels={"app": "a"}))
    cache.apply("PodDisruptionBudget", "ADDED", pdb("pdb-a", selector=labels(app="a"), allowed=1))
    (budget,) = cache.snapshot().budgets
    assert budget == DisruptionBudget("ns", "pdb-a", ("uid-ns-a1", "uid-ns-a2"), 1)
    assert budget.key == "ns/pdb-a"


def test_budget_without_pods_is_left_out_and_appears_with_its_first_pod(cache: Cache) -> None:
    cache.apply("PodDisruptionBudget", "ADDED", pdb("p", selector=labels(app="a")))
    assert cache.snapshot().budgets == ()
    cache.apply("Pod", "ADDED", pod("a1", labels={"app": "a"}))
    assert [b.pod_uids for b in cache.snapshot().budgets] == [("uid-ns-a1",)]


def test_finished_and_terminating_pods_do_not_count(cache: Cache) -> None:
    cache.apply("PodDisruptionBudget", "ADDED", pdb("p", selector=labels(app="a")))
    cache.apply("Pod", "ADDED", pod("run", labels={"app": "a"}))
    cache.apply("Pod", "ADDED", pod("done", labels={"app": "a"}, phase="Succeeded"))
    cache.apply("Pod", "ADDED", pod("dying", labels={"app": "a"}, deleting=True))
    assert cache.snapshot().budgets[0].pod_uids == ("uid-ns-run",)
    cache.apply("Pod", "MODIFIED", pod("run", labels={"app": "a"}, phase="Failed"))
    assert cache.snapshot().budgets == ()


def test_allowed_is_zero_until_the_controller_observed_the_spec(cache: Cache) -> None:
    cache.apply("Pod", "ADDED", pod("a1", labels={"app": "a"}))
    cache.apply(
        "PodDisruptionBudget",
        "ADDED",
        pdb("p", selector=labels(app="a"), allowed=3, generation=2, observed=1),
    )
    assert cache.snapshot().budgets[0].allowed == 0
    cache.apply(
        "PodDisruptionBudget",
        "MODIFIED",
        pdb("p", selector=labels(app="a"), allowed=3, generation=2, observed=2),
    )
    assert cache.snapshot().budgets[0].allowed == 3
    no_status = pdb("p", selector=labels(app="a"))
    del no_status["status"]
    cache.apply("PodDisruptionBudget", "MODIFIED", no_status)
    assert cache.snapshot().budgets[0].allowed == 0


def test_label_changes_move_pods_in_and_out(cache: Cache) -> None:
    cache.apply("PodDisruptionBudget", "ADDED", pdb("p", selector=labels(app="a")))
    cache.apply("Pod", "ADDED", pod("x", labels={"app": "b"}))
    assert cache.snapshot().budgets == ()
    cache.apply("Pod", "MODIFIED", pod("x", labels={"app": "a"}))
    assert cache.snapshot().budgets[0].pod_uids == ("uid-ns-x",)
    cache.apply("Pod", "MODIFIED", pod("x", labels={}))
    assert cache.snapshot().budgets == ()
    cache.apply("Pod", "MODIFIED", pod("x", labels={"app": "a"}))
    cache.apply("Pod", "DELETED", pod("x", labels={"app": "a"}))
    assert cache.snapshot().budgets == ()


def test_selector_change_and_deletion(cache: Cache) -> None:
    cache.apply("Pod", "ADDED", pod("a1", labels={"app": "a"}))
    cache.apply("Pod", "ADDED", pod("b1", labels={"app": "b"}))
    cache.apply("PodDisruptionBudget", "ADDED", pdb("p", selector=labels(app="a")))
    assert cache.snapshot().budgets[0].pod_uids == ("uid-ns-a1",)
    cache.apply("PodDisruptionBudget", "MODIFIED", pdb("p", selector=labels(app="b")))
    assert cache.snapshot().budgets[0].pod_uids == ("uid-ns-b1",)
    cache.apply("PodDisruptionBudget", "MODIFIED", pdb("p", selector={}))
    assert cache.snapshot().budgets[0].pod_uids == ("uid-ns-a1", "uid-ns-b1")
    cache.apply("PodDisruptionBudget", "DELETED", pdb("p"))
    assert cache.snapshot().budgets == ()
    assert cache.raw("PodDisruptionBudget", "ns", "p") is None


def test_a_loosened_budget_wakes_the_cycle_loop_a_tightened_one_does_not(cache: Cache) -> None:
    cache.apply("Pod", "ADDED", pod("a1", labels={"app": "a"}))
    cache.apply("PodDisruptionBudget", "ADDED", pdb("p", selector=labels(app="a"), allowed=0))
    cache.snapshot()
    cache.pending_changed.clear()
    cache.apply("PodDisruptionBudget", "MODIFIED", pdb("p", selector=labels(app="a"), allowed=1))
    assert cache.pending_changed.is_set()
    cache.pending_changed.clear()
    cache.apply("PodDisruptionBudget", "MODIFIED", pdb("p", selector=labels(app="a"), allowed=0))
    assert not cache.pending_changed.is_set()
    cache.apply("PodDisruptionBudget", "DELETED", pdb("p"))
    assert cache.pending_changed.is_set()


def test_relist_order_does_not_matter() -> None:
    pods = [pod(f"p{i}", labels={"app": "a" if i % 2 else "b"}) for i in range(6)]
    budgets = [pdb("pa", selector=labels(app="a")), pdb("pb", selector=labels(app="b"))]
    first = Cache(SCHED, "q", lambda: 0.0)
    first.relisted("Pod", pods)
    first.relisted("PodDisruptionBudget", budgets)
    second = Cache(SCHED, "q", lambda: 0.0)
    second.relisted("PodDisruptionBudget", budgets)
    second.relisted("Pod", pods)
    assert _facts(first.snapshot().budgets) == _facts(second.snapshot().budgets)
    assert [len(b.pod_uids) for b in first.snapshot().budgets] == [3, 3]


def test_unchanged_budgets_are_reused_and_survive_json(cache: Cache) -> None:
    cache.apply("Pod", "ADDED", pod("a1", labels={"app": "a"}))
    cache.apply("PodDisruptionBudget", "ADDED", pdb("p", selector=labels(app="a")))
    one = cache.snapshot()
    cache.apply("Pod", "ADDED", pod("z", ns="elsewhere", labels={"app": "a"}))
    two = cache.snapshot()
    assert one.budgets is two.budgets
    assert type(one).from_json(one.to_json()).budgets == one.budgets


class CountingPods:
    """An iterable of pods that counts how often it was walked."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.walks = 0

    def __call__(self) -> Iterable[Mapping[str, Any]]:
        self.walks += 1
        return iter(self.pods)


def test_index_walks_all_pods_only_for_new_selectors_once_per_batch() -> None:
    index = BudgetIndex()
    pods = CountingPods([pod(f"p{i}", ns=f"ns{i % 5}", labels={"app": "a"}) for i in range(50)])
    for p in pods.pods:
        index.pod_changed(p)
    for n in range(5):
        index.budget_changed(f"ns{n}/p", pdb("p", ns=f"ns{n}", selector=labels(app="a")))
    assert [len(b.pod_uids) for b in index.budgets(pods)] == [10] * 5
    assert pods.walks == 1  # five new budgets, one pass
    # Pod churn and status changes never walk the pods again.
    index.pod_changed(pod("new", ns="ns0", labels={"app": "a"}))
    index.pod_removed("uid-ns1-p1")
    index.budget_changed("ns2/p", pdb("p", ns="ns2", selector=labels(app="a"), allowed=5))
    got = {b.key: b for b in index.budgets(pods)}
    assert pods.walks == 1
    assert len(got["ns0/p"].pod_uids) == 11 and len(got["ns1/p"].pod_uids) == 9
    assert got["ns2/p"].allowed == 5


# --- incremental == from scratch -----------------------------------------------------------


def _facts(budgets: Iterable[DisruptionBudget]) -> list[tuple[str, frozenset[str], int]]:
    """Budgets as comparable facts (pod uids are a set in meaning)."""
    out = []
    for b in budgets:
        assert len(set(b.pod_uids)) == len(b.pod_uids), b
        out.append((b.key, frozenset(b.pod_uids), b.allowed))
    return out


def _scratch(pods: dict[str, dict[str, Any]], pdbs: dict[str, dict[str, Any]]) -> list[Any]:
    """The budgets by brute force: every budget against every pod, nothing indexed."""
    out = []
    for key in sorted(pdbs):
        obj = pdbs[key]
        selector = parse_label_selector(obj["spec"]["selector"])
        uids = frozenset(
            p["metadata"]["uid"]
            for p in pods.values()
            if selector is not None
            and p["metadata"]["namespace"] == obj["metadata"]["namespace"]
            and selector.matches(p["metadata"]["labels"])
            and p["status"]["phase"] not in ("Succeeded", "Failed")
            and not p["metadata"].get("deletionTimestamp")
        )
        if uids:
            out.append((key, uids, obj["status"]["disruptionsAllowed"]))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_incremental_upkeep_matches_a_fresh_resolution(seed: int) -> None:
    rng = random.Random(seed)
    cache = Cache(SCHED, "q", lambda: 0.0)
    pods: dict[str, dict[str, Any]] = {}
    pdbs: dict[str, dict[str, Any]] = {}
    namespaces = ["a", "b", "c"]
    values = ["x", "y", "z"]
    for step in range(120):
        op = rng.random()
        ns = rng.choice(namespaces)
        if op < 0.5:
            name = f"p{rng.randrange(12)}"
            obj = pod(
                name,
                ns=ns,
                labels={k: rng.choice(values) for k in ("app", "tier") if rng.random() < 0.8},
                phase=rng.choice(["Running", "Running", "Succeeded"]),
                deleting=rng.random() < 0.1,
            )
            cache.apply("Pod", "MODIFIED", obj)
            pods[f"{ns}/{name}"] = obj
        elif op < 0.65 and pods:
            key = rng.choice(sorted(pods))
            cache.apply("Pod", "DELETED", pods.pop(key))
        elif op < 0.9:
            name = f"b{rng.randrange(3)}"
            selector: Any = rng.choice(
                [labels(app=rng.choice(values)), {}, None, {"matchExpressions": [
                    {"key": "app", "operator": "NotIn", "values": [rng.choice(values)]}]},
                 {"matchLabels": {"app": rng.choice(values), "tier": rng.choice(values)}},
                 {"matchLabels": {"tier": rng.choice(values)}, "matchExpressions": [
                    {"key": "app", "operator": "Exists"}]}]
            )  # fmt: skip
            obj = pdb(name, ns=ns, selector=selector, allowed=rng.randrange(3))
            cache.apply("PodDisruptionBudget", "MODIFIED", obj)
            pdbs[f"{ns}/{name}"] = obj
        elif pdbs:
            key = rng.choice(sorted(pdbs))
            cache.apply("PodDisruptionBudget", "DELETED", pdbs.pop(key))
        if step % 7 == 0:
            # Snapshots in between, so cached pieces are reused and must stay right.
            assert _facts(cache.snapshot().budgets) == _scratch(pods, pdbs), step
    assert _facts(cache.snapshot().budgets) == _scratch(pods, pdbs)
