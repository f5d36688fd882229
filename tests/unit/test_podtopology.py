"""Where other pods run decides where a pod may go: required pod affinity, anti-affinity and
DoNotSchedule topology spread, as kube-scheduler's InterPodAffinity and PodTopologySpread
filters define them.

The scenarios follow the examples of the Kubernetes documentation ("Pod Topology Spread
Constraints", "Assigning Pods to Nodes"). They run at three levels: the filter itself
(:class:`~scheduler.plugins.podtopology.PodTopology`), the greedy placement
(:func:`~scheduler.solver.place_gangs` on a :class:`~scheduler.solver.ClusterState`), and a
whole cycle (:func:`~scheduler.solver.solve`, whose answer goes through the validator and
whose outcomes say why a gang waits).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.bench.synthetic import make_node, make_pod, make_queue
from scheduler.cluster import Gang, Node, Pod, Snapshot, Taint, Toleration
from scheduler.cluster.podaffinity import LabelSelector, PodAffinityTerm, SpreadConstraint
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm
from scheduler.explain.codes import POD_AFFINITY, POD_ANTI_AFFINITY, TOPOLOGY_SPREAD
from scheduler.plugins.podtopology import (
    AFFINITY,
    ANTI_AFFINITY,
    EXISTING_ANTI_AFFINITY,
    SPREAD,
    SPREAD_LABEL,
    PodTopology,
)
from scheduler.solver import (
    ClusterState,
    GangRequest,
    Placement,
    PlacementSettings,
    place_gangs,
    solve,
    validate,
)

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
NS = "default"
FOO = {"foo": "bar"}


# --- building blocks ---------------------------------------------------------------------


def node(
    name: str,
    zone: str | None = None,
    *,
    host: bool = True,
    labels: dict[str, str] | None = None,
    **kw: Any,
) -> Node:
    """A node labelled with its hostname (unless ``host`` is False) and ``zone``."""
    all_labels = {HOST: name} if host else {}
    if zone is not None:
        all_labels[ZONE] = zone
    all_labels.update(labels or {})
    return make_node(name, labels=all_labels, **kw)


def selector(**labels: str) -> LabelSelector:
    return LabelSelector(tuple(sorted(labels.items())))


def term(key: str, namespaces: tuple[str, ...] | None = (NS,), **labels: str) -> PodAffinityTerm:
    """A required (anti-)affinity term on ``key`` selecting pods with ``labels``."""
    return PodAffinityTerm(key, selector(**labels), namespaces)


def spread(key: str = ZONE, max_skew: int = 1, **kw: Any) -> SpreadConstraint:
    """A DoNotSchedule constraint counting pods labelled foo=bar."""
    kw.setdefault("selector", selector(**FOO))
    return SpreadConstraint(max_skew, key, **kw)


def pod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    on: str | None = None,
    anti: Sequence[PodAffinityTerm] = (),
    affinity: Sequence[PodAffinityTerm] = (),
    constraints: Sequence[SpreadConstraint] = (),
    deleting: bool = False,
    namespace: str = NS,
    **kw: Any,
) -> Pod:
    """A pod labelled foo=bar by default; running on ``on`` when given."""
    kw.setdefault("queue", "a")
    base = make_pod(name, namespace=namespace, node=on, **kw)
    return replace(
        base,
        labels=tuple(sorted((FOO if labels is None else labels).items())),
        pod_anti_affinity=tuple(anti),
        pod_affinity=tuple(affinity),
        spread=tuple(constraints),
        deleting=deleting,
    )


def topology(nodes: Iterable[Node], running: Iterable[Pod] = ()) -> PodTopology:
    by_name = {n.name: n for n in nodes}
    return PodTopology(by_name, [(p, p.node_name or "") for p in running])


def verdicts(top: PodTopology, p: Pod) -> dict[str, str | None]:
    """Node -> None (allowed) or the reason, for every node."""
    check = top.check(p)
    assert check is not None
    return {n: check(n) for n in top._nodes}


def allowed(top: PodTopology, p: Pod) -> set[str]:
    return {n for n, why in verdicts(top, p).items() if why is None}


def running_on(*nodes: str, labels: dict[str, str] | None = None, **kw: Any) -> list[Pod]:
    """One running pod per entry of ``nodes`` (a node may repeat)."""
    return [pod(f"r{i}-{n}", on=n, labels=labels, **kw) for i, n in enumerate(nodes)]


# --- PodTopology: spread ------------------------------------------------------------------


def test_zone_spread_only_the_least_loaded_zone_when_skew_is_reached() -> None:
    """Zones with 2, 1 and 0 matching pods, maxSkew 1: only the empty zone is allowed."""
    nodes = [node("a1", "a"), node("a2", "a"), node("b1", "b"), node("c1", "c"), node("c2", "c")]
    top = topology(nodes, running_on("a1", "a2", "b1"))
    p = pod("new", constraints=[spread()])
    got = verdicts(top, p)
    assert {n for n, why in got.items() if why is None} == {"c1", "c2"}
    assert got["a1"] == got["b1"] == SPREAD
    # maxSkew 2 also lets zone b in (1 + 1 - 0 = 2); zone a would make 3
    assert allowed(top, pod("new", constraints=[spread(max_skew=2)])) == {"b1", "c1", "c2"}


def test_documented_example_one_constraint() -> None:
    """The docs' 4-node cluster: node1, node2 in zoneA and node3, node4 in zoneB; foo=bar
    pods on node1, node2 and node3. A zone spread (maxSkew 1) pod may only go to zoneB."""
    nodes = [node("node1", "zoneA"), node("node2", "zoneA")]
    nodes += [node("node3", "zoneB"), node("node4", "zoneB")]
    top = topology(nodes, running_on("node1", "node2", "node3"))
    assert allowed(top, pod("mypod", constraints=[spread()])) == {"node3", "node4"}


def test_documented_example_two_constraints() -> None:
    """Same cluster, zone and node spread (maxSkew 1 each): only node4."""
    nodes = [node("node1", "zoneA"), node("node2", "zoneA")]
    nodes += [node("node3", "zoneB"), node("node4", "zoneB")]
    top = topology(nodes, running_on("node1", "node2", "node3"))
    p = pod("mypod", constraints=[spread(ZONE), spread(HOST)])
    assert allowed(top, p) == {"node4"}


def test_documented_example_conflicting_constraints() -> None:
    """The docs' conflict: zoneA (node1 with 2 pods, node2 with none), zoneB (node3 with 1).
    The zone constraint wants zoneB, the node constraint wants node2: the pod stays Pending."""
    nodes = [node("node1", "zoneA"), node("node2", "zoneA"), node("node3", "zoneB")]
    top = topology(nodes, running_on("node1", "node1", "node3"))
    assert allowed(top, pod("z", constraints=[spread(ZONE)])) == {"node3"}
    assert allowed(top, pod("h", constraints=[spread(HOST)])) == {"node2"}
    assert allowed(top, pod("both", constraints=[spread(ZONE), spread(HOST)])) == set()


def test_only_pods_matching_the_selector_in_the_pods_namespace_count() -> None:
    nodes = [node("a1", "a"), node("b1", "b")]
    others = [
        pod("other-label", on="a1", labels={"foo": "baz"}),
        pod("other-ns", on="a1", namespace="elsewhere"),
        pod("no-labels", on="a1", labels={}),
    ]
    top = topology(nodes, [*others, *running_on("b1")])
    # a1 holds no pod that counts: 0 in zone a, 1 in zone b
    assert allowed(top, pod("new", constraints=[spread()])) == {"a1"}


def test_a_pod_not_matching_its_own_selector_does_not_count_itself() -> None:
    """skew = count + (1 if the pod matches) - min: a pod outside the selector may go where
    the count is exactly maxSkew above the minimum."""
    nodes = [node("a1", "a"), node("b1", "b")]
    top = topology(nodes, running_on("a1"))
    assert allowed(top, pod("self", constraints=[spread()])) == {"b1"}
    assert allowed(top, pod("outsider", labels={}, constraints=[spread()])) == {"a1", "b1"}


def test_min_domains_above_the_number_of_domains_treats_the_minimum_as_zero() -> None:
    nodes = [node("a1", "a"), node("b1", "b")]
    top = topology(nodes, running_on("a1", "b1"))
    # 1 and 1: the minimum is 1, either zone may take the next pod
    assert allowed(top, pod("p", constraints=[spread()])) == {"a1", "b1"}
    assert allowed(top, pod("p", constraints=[spread(min_domains=2)])) == {"a1", "b1"}
    # 3 domains wanted, 2 exist: the minimum is 0 and 1 + 1 - 0 > 1 everywhere
    got = verdicts(top, pod("p", constraints=[spread(min_domains=3)]))
    assert got == {"a1": SPREAD, "b1": SPREAD}
    # ... until a third zone appears
    top = topology([*nodes, node("c1", "c")], running_on("a1", "b1"))
    assert allowed(top, pod("p", constraints=[spread(min_domains=3)])) == {"c1"}
    # 1 and 0 with minDomains 3: the empty zone is still allowed
    top = topology(nodes, running_on("a1"))
    assert allowed(top, pod("p", constraints=[spread(min_domains=3)])) == {"b1"}


def test_node_affinity_policy_honor_counts_only_nodes_the_pod_may_use() -> None:
    """Zones a and b (pool=x) hold one pod each, zone c (pool=y) none. A pod selecting
    pool=x: Honor (the default) leaves zone c out of the domains, so the minimum is 1 and
    zone a is allowed; Ignore counts zone c's 0, so zones a and b are refused."""
    nodes = [
        node("a1", "a", labels={"pool": "x"}),
        node("b1", "b", labels={"pool": "x"}),
        node("c1", "c", labels={"pool": "y"}),
    ]
    top = topology(nodes, running_on("a1", "b1"))
    honor = pod("honor", selector={"pool": "x"}, constraints=[spread()])
    assert allowed(top, honor) >= {"a1", "b1"}
    ignore = pod("ignore", selector={"pool": "x"}, constraints=[spread(honor_affinity=False)])
    got = verdicts(top, ignore)
    assert (got["a1"], got["b1"]) == (SPREAD, SPREAD)
    # the same through required node affinity instead of a nodeSelector
    terms = (NodeSelectorTerm((NodeSelectorRequirement("pool", "In", ("x",)),)),)
    honor_terms = replace(pod("aff", constraints=[spread()]), affinity=terms)
    assert {"a1", "b1"} <= allowed(top, honor_terms)
    ignore_terms = replace(pod("aff", constraints=[spread(honor_affinity=False)]), affinity=terms)
    assert allowed(top, ignore_terms) == {"c1"}


def test_volume_node_affinity_does_not_narrow_the_spread_domains() -> None:
    """nodeAffinityPolicy Honor reads the pod's own nodeSelector and required node affinity
    (kube-scheduler's ``GetRequiredNodeAffinity(pod)``), not its volumes' node affinity: a
    pod whose local volume pins it to zone a still counts zone b's 0 as the minimum, so zone
    a (1 + 1 - 0 > 1) is refused and the pod waits, as kube-scheduler would keep it."""
    nodes = [node("a1", "a"), node("b1", "b")]
    top = topology(nodes, running_on("a1"))
    pinned = (NodeSelectorTerm((NodeSelectorRequirement(HOST, "In", ("a1",)),)),)
    by_volume = replace(pod("p", constraints=[spread()]), affinity=pinned, volume_affinity=True)
    assert verdicts(top, by_volume)["a1"] == SPREAD
    # the same restriction written in the pod's own spec does narrow the domains
    by_spec = replace(pod("p", constraints=[spread()]), affinity=pinned)
    assert verdicts(top, by_spec)["a1"] is None


def test_node_taints_policy_honor_leaves_untolerated_nodes_out() -> None:
    """Zone c's only node is tainted. Honor: zone c is no domain (minimum 1, zone a
    allowed); Ignore (the default): zone c's 0 is the minimum, zone a refused."""
    taint = Taint("dedicated", "infer")
    nodes = [node("a1", "a"), node("b1", "b"), node("c1", "c", taints=(taint,))]
    top = topology(nodes, running_on("a1", "b1"))
    assert verdicts(top, pod("ignore", constraints=[spread()]))["a1"] == SPREAD
    honor = pod("honor", constraints=[spread(honor_taints=True)])
    assert {"a1", "b1"} <= allowed(top, honor)
    # a pod that tolerates the taint counts the node again
    tolerant = pod(
        "tolerant",
        tolerations=(Toleration("dedicated", "Equal", "infer", "NoSchedule"),),
        constraints=[spread(honor_taints=True)],
    )
    assert verdicts(top, tolerant)["a1"] == SPREAD


def test_terminating_pods_do_not_count_for_spread() -> None:
    """Zone a holds 2 terminating pods, zone b 1 running: a counts 0, so only a is allowed."""
    nodes = [node("a1", "a"), node("b1", "b")]
    gone = running_on("a1", "a1", deleting=True)
    top = topology(nodes, [*gone, *running_on("b1")])
    assert verdicts(top, pod("p", constraints=[spread()])) == {"a1": None, "b1": SPREAD}
    # removing and adding pods keeps the counts up to date
    for p in gone:
        top.remove(p.uid)
    top.add(pod("x", on="b1"), "b1")
    assert verdicts(top, pod("p", constraints=[spread()])) == {"a1": None, "b1": SPREAD}
    top.add(pod("y", on="a1"), "a1")
    top.add(pod("z", on="a1"), "a1")
    assert verdicts(top, pod("p", constraints=[spread()])) == {"a1": None, "b1": None}


def test_a_node_without_the_topology_key_is_refused_for_spread() -> None:
    nodes = [node("a1", "a"), node("nozone")]
    top = topology(nodes)
    assert verdicts(top, pod("p", constraints=[spread()])) == {"a1": None, "nozone": SPREAD_LABEL}
    # with two constraints, a node missing either key is refused (and counts for neither)
    nodes = [node("a1", "a"), node("b1", "b", host=False)]
    top = topology(nodes, running_on("a1"))
    got = verdicts(top, pod("p", constraints=[spread(ZONE), spread(HOST)]))
    # b1 is no eligible node: zone b is no domain, so zone a's 1 is the minimum
    assert got == {"a1": None, "b1": SPREAD_LABEL}


# --- PodTopology: affinity and anti-affinity ---------------------------------------------


def test_anti_affinity_one_per_node() -> None:
    nodes = [node("n1"), node("n2"), node("n3")]
    top = topology(nodes, running_on("n1"))
    p = pod("p", anti=[term(HOST, foo="bar")])
    assert verdicts(top, p) == {"n1": ANTI_AFFINITY, "n2": None, "n3": None}


def test_anti_affinity_passes_a_node_without_the_key() -> None:
    nodes = [node("a1", "a"), node("nozone")]
    top = topology(nodes, running_on("a1", "nozone"))
    p = pod("p", anti=[term(ZONE, foo="bar")])
    assert verdicts(top, p) == {"a1": ANTI_AFFINITY, "nozone": None}


def test_anti_affinity_of_a_running_pod_keeps_matching_pods_out_of_its_zone() -> None:
    """Symmetry: the running pod's term matches the new pod, which has no rules itself."""
    nodes = [node("a1", "a"), node("a2", "a"), node("b1", "b")]
    guard = pod("guard", on="a1", labels={"app": "db"}, anti=[term(ZONE, app="web")])
    top = topology(nodes, [guard])
    web = pod("web", labels={"app": "web"})
    assert top.constrained(web)
    assert verdicts(top, web) == {
        "a1": EXISTING_ANTI_AFFINITY,
        "a2": EXISTING_ANTI_AFFINITY,
        "b1": None,
    }
    # a pod it does not select, or one of another namespace, is not concerned
    assert top.check(pod("db", labels={"app": "db"})) is None
    assert top.check(pod("web", labels={"app": "web"}, namespace="other")) is None
    # once the guard leaves, the zone is open again
    top.remove(guard.uid)
    assert top.check(web) is None


def test_affinity_to_a_running_pod() -> None:
    nodes = [node("a1", "a"), node("a2", "a"), node("b1", "b"), node("b2", "b")]
    cache = pod("cache", on="b2", labels={"app": "cache"})
    top = topology(nodes, [cache])
    by_zone = pod("app", labels={"app": "web"}, affinity=[term(ZONE, app="cache")])
    assert allowed(top, by_zone) == {"b1", "b2"}
    assert verdicts(top, by_zone)["a1"] == AFFINITY
    by_host = pod("app", labels={"app": "web"}, affinity=[term(HOST, app="cache")])
    assert allowed(top, by_host) == {"b2"}
    # no such pod anywhere, and the pod is not one itself: nowhere
    lonely = pod("app", labels={"app": "web"}, affinity=[term(ZONE, app="redis")])
    assert allowed(top, lonely) == set()


def test_affinity_needs_every_term_and_the_key_on_the_node() -> None:
    nodes = [node("a1", "a"), node("a2", "a"), node("nozone")]
    running = [pod("cache", on="a1", labels={"app": "cache", "tier": "hot"})]
    top = topology(nodes, running)
    both = pod("p", labels={}, affinity=[term(ZONE, app="cache"), term(HOST, tier="hot")])
    assert allowed(top, both) == {"a1"}
    # the pod matching all terms must be the same pod: two pods matching one term each do not
    split = [pod("c", on="a1", labels={"app": "cache"}), pod("h", on="a2", labels={"tier": "hot"})]
    top = topology(nodes, split)
    assert allowed(top, both) == set()
    # a node without the key is refused even for the first pod of a self-affine group
    first = pod("first", labels={"app": "x"}, affinity=[term(ZONE, app="x")])
    assert verdicts(topology(nodes), first) == {"a1": None, "a2": None, "nozone": AFFINITY}


def test_the_first_pod_of_a_self_affine_group_may_go_anywhere() -> None:
    nodes = [node("a1", "a"), node("b1", "b")]
    top = topology(nodes)
    first = pod("g-0", labels={"app": "g"}, affinity=[term(ZONE, app="g")])
    assert allowed(top, first) == {"a1", "b1"}
    top.add(first, "b1")
    assert allowed(top, replace(first, uid="g-1", name="g-1")) == {"b1"}


# Counters are built lazily and then kept up to date on every add/remove: whatever the
# order, a long-lived PodTopology must answer as one built from scratch.
APPS = st.sampled_from(["web", "db", "cache"])
TERMS = st.builds(
    lambda key, app, ns: term(key, ns, app=app),
    st.sampled_from([HOST, ZONE]),
    APPS,
    st.sampled_from([(NS,), ("other",), None]),
)
CONSTRAINTS = st.builds(
    lambda key, skew, app, min_domains, honor_affinity, honor_taints: SpreadConstraint(
        skew, key, selector(app=app), min_domains, honor_affinity, honor_taints
    ),
    st.sampled_from([HOST, ZONE]),
    st.integers(1, 2),
    APPS,
    st.integers(1, 4),
    st.booleans(),
    st.booleans(),
)
PODS = st.builds(
    lambda app, ns, anti, aff, spr, deleting, pool: replace(
        pod(
            "p",
            labels={"app": app},
            namespace=ns,
            anti=anti,
            affinity=aff,
            constraints=spr,
            deleting=deleting,
        ),
        node_selector=(("pool", "x"),) if pool else (),
    ),
    APPS,
    st.sampled_from([NS, "other"]),
    st.lists(TERMS, max_size=1),
    st.lists(TERMS, max_size=1),
    st.lists(CONSTRAINTS, max_size=2),
    st.booleans(),
    st.booleans(),
)
CLUSTER = [
    node("a1", "a", labels={"pool": "x"}),
    node("a2", "a", taints=(Taint("dedicated", "infer"),)),
    node("b1", "b", labels={"pool": "x"}),
    node("c1", "c"),
    node("nozone"),
]


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(PODS, st.sampled_from([n.name for n in CLUSTER]), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    probes=st.lists(PODS, min_size=1, max_size=4),
)
def test_counters_kept_up_to_date_answer_as_built_from_scratch(
    ops: list[tuple[Pod, str, bool]], probes: list[Pod]
) -> None:
    kept = topology(CLUSTER)
    located: dict[str, tuple[Pod, str]] = {}
    probes = [replace(p, uid=f"probe-{i}", name=f"probe-{i}") for i, p in enumerate(probes)]
    for i, (p, where, remove_one) in enumerate(ops):
        p = replace(p, uid=f"u{i}", name=f"u{i}", node_name=where)
        for probe in probes:  # build counters between changes
            kept.check(probe)
        kept.add(p, where)
        located[p.uid] = (p, where)
        if remove_one and len(located) > 1:
            uid = next(iter(located))
            kept.remove(uid)
            del located[uid]
    fresh = PodTopology({n.name: n for n in CLUSTER}, located.values())
    for probe in probes:
        got, want = kept.check(probe), fresh.check(probe)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert {n.name: got(n.name) for n in CLUSTER} == {n.name: want(n.name) for n in CLUSTER}


def test_no_rules_no_check() -> None:
    top = topology([node("n1")], running_on("n1"))
    assert top.check(pod("plain")) is None
    assert not top.constrained(pod("plain"))


# --- place_gangs on a ClusterState --------------------------------------------------------


def snapshot(nodes: Sequence[Node], pods: Sequence[Pod], gangs: Sequence[Gang] = ()) -> Snapshot:
    known = {g.key for g in gangs}
    extra = [Gang(p.namespace, p.gang.split("/")[1], 1, p.queue) for p in pods]
    all_gangs = [*gangs, *(g for g in extra if g.key not in known)]
    unique = {g.key: g for g in all_gangs}
    queues = (make_queue("root"), make_queue("a", "root"))
    return Snapshot(tuple(nodes), tuple(pods), tuple(unique.values()), queues)


def gang(name: str, size: int, **kw: Any) -> tuple[Gang, list[Pod]]:
    """A gang of ``size`` pods (``kw`` go to :func:`pod`), named ``name-i``."""
    members = [pod(f"{name}-{i}", gang=name, **kw) for i in range(size)]
    return Gang(NS, name, size, "a"), members


def place(
    nodes: Sequence[Node], gangs: Sequence[tuple[Gang, list[Pod]]], running: Sequence[Pod] = ()
) -> tuple[ClusterState, dict[str, list[str]], dict[str, tuple[str, str]]]:
    """place_gangs on a fresh state: (state, gang -> nodes of its pods, failed)."""
    pods = [p for _, ps in gangs for p in ps]
    snap = snapshot(nodes, [*pods, *running], [g for g, _ in gangs])
    state = ClusterState.from_snapshot(snap)
    requests = [GangRequest(g.key, "a", required=tuple(ps)) for g, ps in gangs]
    result = place_gangs(state, requests)
    where = {k: [a.node for a in v] for k, v in result.placed.items()}
    return state, where, result.failed


def test_gang_with_hostname_anti_affinity_among_itself_fails_whole_on_too_few_nodes() -> None:
    members = {"anti": [term(HOST, app="ss")], "labels": {"app": "ss"}}
    nodes = [node(f"n{i}") for i in range(3)]
    state, where, failed = place(nodes, [gang("ss", 4, **members)])
    assert where == {}
    code, message = failed["default/ss"]
    assert code == POD_ANTI_AFFINITY
    assert message == (
        "pod default/ss-3: 0/3 nodes are available: 3 node(s) didn't match pod anti-affinity "
        "rules (after 3 of the gang's 4 pods were placed)"
    )
    assert state.placed == {}  # all or nothing: the 3 placed pods were released
    # four nodes: one pod on each (binpack alone would stack them on one node)
    _, where, failed = place([*nodes, node("n3")], [gang("ss", 4, **members)])
    assert failed == {}
    assert sorted(where["default/ss"]) == ["n0", "n1", "n2", "n3"]


def test_running_pods_anti_affinity_keeps_a_new_pod_out_of_its_zone() -> None:
    nodes = [node("a1", "a", gpus=8), node("b1", "b", gpus=2)]
    guard = pod("guard", on="a1", labels={"app": "db"}, anti=[term(ZONE, app="web")])
    # binpack would pick a1 (fuller); the guard's rule sends the pod to zone b
    web = gang("web", 1, labels={"app": "web"}, gpus=1)
    _, where, failed = place(nodes, [web], [guard])
    assert (where, failed) == ({"default/web": ["b1"]}, {})
    # zone a only: the pod waits, and the code says why
    _, where, failed = place(nodes[:1], [gang("web", 1, labels={"app": "web"})], [guard])
    assert where == {}
    assert failed["default/web"] == (
        POD_ANTI_AFFINITY,
        "pod default/web-0: 0/1 nodes are available: 1 node(s) didn't satisfy existing pods "
        "anti-affinity rules",
    )


def test_pod_lands_next_to_the_cache_pod() -> None:
    nodes = [node(f"{z}{i}", z) for z in "abc" for i in range(2)]
    cache = pod("cache", on="c1", labels={"app": "cache"})
    zone = gang("zone", 1, labels={"app": "web"}, affinity=[term(ZONE, app="cache")])
    host = gang("host", 1, labels={"app": "web"}, affinity=[term(HOST, app="cache")])
    _, where, failed = place(nodes, [zone, host], [cache])
    assert failed == {}
    assert where["default/zone"][0] in {"c0", "c1"}
    assert where["default/host"] == ["c1"]
    # no cache pod: the pod waits, with the affinity named
    alone = gang("zone", 1, labels={"app": "web"}, affinity=[term(ZONE, app="cache")])
    _, where, failed = place(nodes, [alone])
    assert where == {}
    assert failed["default/zone"] == (
        POD_AFFINITY,
        "pod default/zone-0: 0/6 nodes are available: 6 node(s) didn't match pod affinity rules",
    )


def test_a_self_affine_gang_lands_in_one_zone() -> None:
    nodes = [node(f"{z}{i}", z, gpus=2) for z in "ab" for i in range(3)]
    g = gang("g", 5, labels={"app": "g"}, affinity=[term(ZONE, app="g")], gpus=1)
    _, where, failed = place(nodes, [g])
    assert failed == {}
    zones = {n[0] for n in where["default/g"]}
    assert len(zones) == 1 and len(where["default/g"]) == 5


def test_gang_members_are_counted_as_they_are_placed() -> None:
    """A StatefulSet-like gang spread over zones by its own labels: 6 pods on 3 zones end
    2/2/2 and 4 pods on 2 zones 2/2, though binpack alone would fill one node."""
    nodes = [node(f"{z}{i}", z) for z in "abc" for i in range(2)]
    _, where, failed = place(nodes, [gang("ss", 6, constraints=[spread()], gpus=1)])
    assert failed == {}
    assert sorted(Counter(n[0] for n in where["default/ss"]).values()) == [2, 2, 2]
    two = [n for n in nodes if n.name[0] in "ab"]
    _, where, _ = place(two, [gang("ss", 4, constraints=[spread()], gpus=1)])
    assert sorted(Counter(n[0] for n in where["default/ss"]).values()) == [2, 2]
    # a second gang with the same labels is counted with the first
    first = gang("first", 3, constraints=[spread()], gpus=1)
    second = gang("second", 1, constraints=[spread()], gpus=1)
    _, where, _ = place(two, [first, second])
    zones = Counter(n[0] for k in where for n in where[k])
    assert sorted(zones.values()) == [2, 2]


def test_spread_that_cannot_be_met_names_the_constraint() -> None:
    """Zone b's only node takes one pod: after 2 in zone a and 1 in zone b, a fourth cannot
    go to zone a (3 - 1 > maxSkew) and does not fit in zone b."""
    nodes = [node("a1", "a"), node("b1", "b", gpus=1)]
    _, where, failed = place(nodes, [gang("ss", 4, constraints=[spread()], gpus=1)])
    assert where == {}
    code, message = failed["default/ss"]
    assert code == TOPOLOGY_SPREAD
    assert message == (
        "pod default/ss-3: 0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) "
        "didn't match pod topology spread constraints (after 3 of the gang's 4 pods were placed)"
    )


def test_terminating_pods_do_not_count_when_placing() -> None:
    nodes = [node("a1", "a"), node("b1", "b")]
    gone = running_on("a1", "a1", deleting=True)
    _, where, failed = place(
        nodes, [gang("p", 1, constraints=[spread()])], [*gone, *running_on("b1")]
    )
    assert (where, failed) == ({"default/p": ["a1"]}, {})


# --- a whole cycle: solve ----------------------------------------------------------------

GREEDY = PlacementSettings(greedy_only=True)
CPSAT = PlacementSettings(time_limit_seconds=2.0, workers=1)
BOTH = pytest.mark.parametrize("settings", [GREEDY, CPSAT], ids=["greedy", "cpsat"])


def cycle(
    nodes: Sequence[Node],
    gangs: Sequence[tuple[Gang, list[Pod]]],
    running: Sequence[Pod] = (),
    settings: PlacementSettings = GREEDY,
) -> tuple[Snapshot, Placement]:
    pods = [p for _, ps in gangs for p in ps]
    snap = snapshot(nodes, [*pods, *running], [g for g, _ in gangs])
    placement = solve(snap, settings)
    assert validate(snap, placement.assignments) == []
    return snap, placement


def nodes_of(placement: Placement, key: str) -> list[str]:
    return [a.node for a in placement.outcomes[key].pods]


@BOTH
def test_solve_anti_affinity_one_per_node(settings: PlacementSettings) -> None:
    members = {"anti": [term(HOST, app="ss")], "labels": {"app": "ss"}, "gpus": 1}
    nodes = [node(f"n{i}") for i in range(4)]
    _, placement = cycle(nodes, [gang("ss", 4, **members)], settings=settings)
    assert placement.outcomes["default/ss"].placed
    assert sorted(nodes_of(placement, "default/ss")) == ["n0", "n1", "n2", "n3"]
    # three nodes: the gang waits, saying so
    _, placement = cycle(nodes[:3], [gang("ss", 4, **members)], settings=settings)
    outcome = placement.outcomes["default/ss"]
    assert not outcome.placed and placement.assignments == ()
    assert outcome.reason_code == POD_ANTI_AFFINITY
    assert "3 node(s) didn't match pod anti-affinity rules" in outcome.reason


@BOTH
def test_solve_zone_spread(settings: PlacementSettings) -> None:
    nodes = [node(f"{z}{i}", z) for z in "ab" for i in range(2)]
    _, placement = cycle(nodes, [gang("web", 4, constraints=[spread()], gpus=1)], settings=settings)
    assert placement.outcomes["default/web"].placed
    assert sorted(Counter(n[0] for n in nodes_of(placement, "default/web")).values()) == [2, 2]


@BOTH
def test_solve_zone_spread_with_lone_pods(settings: PlacementSettings) -> None:
    """Deployment-like: each replica its own gang, spread together."""
    nodes = [node(f"{z}{i}", z) for z in "ab" for i in range(2)]
    replicas = [gang(f"web{i}", 1, constraints=[spread()], gpus=1) for i in range(4)]
    _, placement = cycle(nodes, replicas, settings=settings)
    assert all(o.placed for o in placement.outcomes.values())
    zones = Counter(a.node[0] for a in placement.assignments)
    assert sorted(zones.values()) == [2, 2]


@BOTH
def test_solve_symmetric_anti_affinity_and_cache_affinity(settings: PlacementSettings) -> None:
    nodes = [node(f"{z}{i}", z) for z in "abc" for i in range(2)]
    guard = pod("guard", on="a0", labels={"app": "db"}, anti=[term(ZONE, app="web")])
    cache = pod("cache", on="c1", labels={"app": "cache"})
    plain = gang("plain", 3, labels={"app": "web"}, gpus=1)
    near = gang("near", 1, labels={"app": "near"}, affinity=[term(HOST, app="cache")], gpus=1)
    _, placement = cycle(nodes, [plain, near], [guard, cache], settings=settings)
    assert placement.outcomes["default/plain"].placed
    assert not {n[0] for n in nodes_of(placement, "default/plain")} & {"a"}
    assert nodes_of(placement, "default/near") == ["c1"]


def test_validate_catches_a_placement_that_breaks_the_rules() -> None:
    """The validator replays assignments in order: two anti-affine pods on one host, a pod
    away from its cache, a spread beyond maxSkew are all named."""
    from scheduler.solver.placement import PodAssignment

    nodes = [node(f"{z}{i}", z) for z in "ab" for i in range(2)]
    ss, members = gang("ss", 2, anti=[term(HOST, app="ss")], labels={"app": "ss"})
    web, spreaders = gang("web", 2, constraints=[spread()])
    near, (follower,) = gang("near", 1, labels={}, affinity=[term(HOST, app="cache")])
    cache = pod("cache", on="b1", labels={"app": "cache"})
    snap = snapshot(nodes, [*members, *spreaders, follower, cache], [ss, web, near])

    def at(p: Pod, n: str) -> PodAssignment:
        return PodAssignment(p.uid, p.key, p.gang, n)

    good = [at(members[0], "a0"), at(members[1], "a1"), at(spreaders[0], "a0")]
    good += [at(spreaders[1], "b0"), at(follower, "b1")]
    assert validate(snap, good) == []
    bad = [at(members[0], "a0"), at(members[1], "a0"), at(spreaders[0], "a0")]
    bad += [at(spreaders[1], "a1"), at(follower, "a1")]
    problems = validate(snap, bad)
    named = {p.split(":")[0] for p in problems}
    assert named == {
        "pod default/ss-1 on node a0",
        "pod default/web-1 on node a1",
        "pod default/near-0 on node a1",
    }, problems
