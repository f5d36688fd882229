"""Reading pod affinity, anti-affinity and topology spread constraints from a pod spec
(:func:`scheduler.cluster.podaffinity.parse_pod_rules`): the API's defaults, label keys folded
into selectors, and bad input listed as unsupported - never an exception."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cluster import Snapshot
from scheduler.cluster.pod import Pod
from scheduler.cluster.podaffinity import (
    LabelSelector,
    PodAffinityTerm,
    PodRules,
    SpreadConstraint,
    parse_pod_rules,
)
from scheduler.cluster.selectors import NodeSelectorRequirement
from scheduler.cluster.unsupported import unsupported_fields

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
AFF = f"spec.affinity.podAffinity.{REQUIRED}"
ANTI = f"spec.affinity.podAntiAffinity.{REQUIRED}"
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
WEB = {"matchLabels": {"app": "web"}}
LABELS = {"app": "web", "rev": "3", "tier": "front"}


def parse(spec: Any, namespace: str = "ns", labels: dict[str, str] | None = None) -> PodRules:
    return parse_pod_rules(spec, namespace, LABELS if labels is None else labels)


def affinity(*terms: Any, kind: str = "podAffinity") -> dict[str, Any]:
    return {"affinity": {kind: {REQUIRED: list(terms)}}}


def anti(*terms: Any) -> dict[str, Any]:
    return affinity(*terms, kind="podAntiAffinity")


def one_term(spec: dict[str, Any], labels: dict[str, str] | None = None) -> PodAffinityTerm:
    rules = parse(spec, labels=labels)
    assert rules.unsupported == ()
    (term,) = rules.affinity or rules.anti_affinity
    return term


def one_spread(raw: dict[str, Any], labels: dict[str, str] | None = None) -> SpreadConstraint:
    rules = parse({"topologySpreadConstraints": [raw]}, labels=labels)
    assert rules.unsupported == ()
    (c,) = rules.spread
    return c


# --- pod (anti-)affinity terms ---------------------------------------------------------


def test_a_term_reads_its_key_and_selector() -> None:
    term = one_term(affinity({"labelSelector": WEB, "topologyKey": ZONE}))
    assert term == PodAffinityTerm(ZONE, LabelSelector((("app", "web"),)), ("ns",))
    rules = parse(anti({"labelSelector": WEB, "topologyKey": HOST}))
    assert rules.affinity == () and rules.spread == ()
    assert rules.anti_affinity == (
        PodAffinityTerm(HOST, LabelSelector((("app", "web"),)), ("ns",)),
    )


def test_namespaces_default_to_the_pods_own() -> None:
    term = one_term(anti({"labelSelector": WEB, "topologyKey": HOST}))
    assert term.namespaces == ("ns",)
    assert term.matches("ns", {"app": "web"})
    assert not term.matches("other", {"app": "web"})
    assert not term.matches("ns", {"app": "db"})
    # null namespaceSelector and an empty list are the same default
    defaults: list[dict[str, Any]] = [
        {"namespaceSelector": None},
        {"namespaces": []},
        {"namespaces": None},
    ]
    for extra in defaults:
        raw = {"labelSelector": WEB, "topologyKey": HOST, **extra}
        assert one_term(anti(raw)).namespaces == ("ns",), extra


def test_a_namespaces_list_replaces_the_default() -> None:
    raw = {"labelSelector": WEB, "topologyKey": HOST, "namespaces": ["b", "a", "b"]}
    term = one_term(anti(raw))
    assert term.namespaces == ("a", "b")
    assert term.matches("a", {"app": "web"}) and term.matches("b", {"app": "web"})
    assert not term.matches("ns", {"app": "web"})  # the pod's own only when listed


@pytest.mark.parametrize("selector", [{}, {"matchLabels": {}}, {"matchExpressions": []}])
def test_an_empty_namespace_selector_means_every_namespace(selector: dict[str, Any]) -> None:
    raw = {"labelSelector": WEB, "topologyKey": HOST, "namespaceSelector": selector}
    term = one_term(anti(raw))
    assert term.namespaces is None
    assert term.matches("ns", {"app": "web"}) and term.matches("kube-system", {"app": "web"})
    # with a list too: the union of "every namespace" and the list is every namespace
    term = one_term(anti({**raw, "namespaces": ["a"]}))
    assert term.namespaces is None and term.matches("z", {"app": "web"})


@pytest.mark.parametrize(
    "selector",
    [{"matchLabels": {"team": "a"}}, {"matchExpressions": [{"key": "t", "operator": "Exists"}]}],
)
def test_a_namespace_selector_by_labels_is_unsupported(selector: dict[str, Any]) -> None:
    good = {"labelSelector": WEB, "topologyKey": HOST}
    rules = parse(anti(good, {**good, "namespaceSelector": selector}))
    assert rules.unsupported == (f"{ANTI}[1].namespaceSelector",)
    assert len(rules.anti_affinity) == 1  # the readable term is still read


def test_a_missing_label_selector_matches_no_pod_and_an_empty_one_every_pod() -> None:
    missing = one_term(affinity({"topologyKey": ZONE}))
    assert missing.selector is None
    assert not missing.matches("ns", {})
    assert not missing.matches("ns", LABELS)
    empty = one_term(affinity({"topologyKey": ZONE, "labelSelector": {}}))
    assert empty.selector == LabelSelector()
    assert empty.matches("ns", {}) and empty.matches("ns", LABELS)
    assert not empty.matches("other", {})  # still only the pod's namespace
    # null is missing
    assert one_term(affinity({"topologyKey": ZONE, "labelSelector": None})).selector is None


def test_match_expressions_follow_label_selector_semantics() -> None:
    raw = {
        "topologyKey": ZONE,
        "labelSelector": {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["front", "back"]},
                {"key": "env", "operator": "NotIn", "values": ["prod"]},
                {"key": "gpu", "operator": "Exists"},
                {"key": "debug", "operator": "DoesNotExist"},
            ],
        },
    }
    term = one_term(affinity(raw))
    base = {"app": "web", "tier": "back", "gpu": "1"}
    assert term.matches("ns", base)
    assert term.matches("ns", {**base, "env": "dev"})
    assert not term.matches("ns", {**base, "env": "prod"})  # NotIn; absent passes
    assert not term.matches("ns", {**base, "tier": "db"})
    assert not term.matches("ns", {k: v for k, v in base.items() if k != "gpu"})
    assert not term.matches("ns", {**base, "debug": ""})
    assert not term.matches("ns", {**base, "app": "db"})
    assert term.selector is not None
    assert (
        term.selector.describe() == "app=web, tier in (front,back), env notin (prod), gpu, !debug"
    )
    assert LabelSelector().describe() == "every pod"


def test_match_label_keys_fold_the_pods_own_values_in() -> None:
    """matchLabelKeys: ``key In (own value)``; mismatchLabelKeys: ``key NotIn (own value)``;
    keys the pod does not carry are ignored (as the API server does)."""
    raw = {
        "labelSelector": WEB,
        "topologyKey": HOST,
        "matchLabelKeys": ["rev", "absent"],
        "mismatchLabelKeys": ["tier", "also-absent"],
    }
    term = one_term(anti(raw))
    assert term.selector == LabelSelector(
        (("app", "web"),),
        (
            NodeSelectorRequirement("rev", "In", ("3",)),
            NodeSelectorRequirement("tier", "NotIn", ("front",)),
        ),
    )
    assert term.matches("ns", {"app": "web", "rev": "3", "tier": "back"})
    assert term.matches("ns", {"app": "web", "rev": "3"})  # NotIn passes an absent key
    assert not term.matches("ns", {"app": "web", "rev": "4", "tier": "back"})
    assert not term.matches("ns", {"app": "web", "rev": "3", "tier": "front"})
    # a pod without those labels reads the plain selector
    assert one_term(anti(raw), labels={}).selector == LabelSelector((("app", "web"),))


def test_match_label_keys_do_not_make_a_missing_selector_match() -> None:
    raw = {"topologyKey": HOST, "matchLabelKeys": ["rev"]}
    term = one_term(anti(raw))
    assert term.selector is None and not term.matches("ns", LABELS)


def test_preferred_terms_and_empty_lists_are_not_read() -> None:
    spec = {
        "affinity": {
            "podAffinity": {
                PREFERRED: [{"weight": 1, "podAffinityTerm": {"topologyKey": ZONE}}],
                REQUIRED: [],
            },
            "podAntiAffinity": {PREFERRED: [{"weight": 5, "podAffinityTerm": {}}]},
            "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": []}},
        }
    }
    assert parse(spec) == PodRules()
    assert parse({}) == PodRules()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"labelSelector": WEB}, "topologyKey"),
        ({"labelSelector": WEB, "topologyKey": ""}, "topologyKey"),
        ({"labelSelector": WEB, "topologyKey": None}, "topologyKey"),
        ("not a term", "topologyKey"),
        (None, "topologyKey"),
        (
            {
                "topologyKey": HOST,
                "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]},
            },
            "labelSelector",
        ),
        (
            {
                "topologyKey": HOST,
                "labelSelector": {"matchExpressions": [{"key": "a"}]},  # no operator
            },
            "labelSelector",
        ),
        (
            {"topologyKey": HOST, "namespaceSelector": {"matchLabels": {"a": "b"}}},
            "namespaceSelector",
        ),
    ],
)
def test_an_unreadable_term_is_listed_by_path(raw: Any, field: str) -> None:
    good = {"labelSelector": WEB, "topologyKey": ZONE}
    for kind, path in (("podAffinity", AFF), ("podAntiAffinity", ANTI)):
        rules = parse(affinity(good, raw, good, kind=kind))
        assert rules.unsupported == (f"{path}[1].{field}",), kind
        read = rules.affinity if kind == "podAffinity" else rules.anti_affinity
        assert len(read) == 2  # the other terms are read


# --- topology spread constraints -------------------------------------------------------


def test_spread_defaults() -> None:
    c = one_spread({"maxSkew": 1, "topologyKey": ZONE, "labelSelector": WEB})
    assert c == SpreadConstraint(
        max_skew=1,
        topology_key=ZONE,
        selector=LabelSelector((("app", "web"),)),
        min_domains=1,
        honor_affinity=True,  # nodeAffinityPolicy: Honor
        honor_taints=False,  # nodeTaintsPolicy: Ignore
    )
    assert one_spread({"maxSkew": 1, "topologyKey": ZONE, "minDomains": None}).min_domains == 1


def test_spread_policies_and_min_domains_are_read() -> None:
    c = one_spread(
        {
            "maxSkew": 2,
            "topologyKey": ZONE,
            "labelSelector": WEB,
            "minDomains": 3,
            "nodeAffinityPolicy": "Ignore",
            "nodeTaintsPolicy": "Honor",
        }
    )
    assert (c.max_skew, c.min_domains, c.honor_affinity, c.honor_taints) == (2, 3, False, True)
    explicit = {"nodeAffinityPolicy": "Honor", "nodeTaintsPolicy": "Ignore"}
    c = one_spread({"maxSkew": 1, "topologyKey": ZONE, **explicit})
    assert (c.honor_affinity, c.honor_taints) == (True, False)


@pytest.mark.parametrize("when", [None, "DoNotSchedule"])
def test_do_not_schedule_is_read_and_schedule_anyway_is_not(when: str | None) -> None:
    raw: dict[str, Any] = {"maxSkew": 1, "topologyKey": ZONE, "labelSelector": WEB}
    if when is not None:
        raw["whenUnsatisfiable"] = when
    anyway = {"whenUnsatisfiable": "ScheduleAnyway"}  # a preference: not read, not listed
    rules = parse({"topologySpreadConstraints": [{**raw, **anyway}, raw, anyway]})
    assert rules.unsupported == ()
    assert len(rules.spread) == 1 and rules.spread[0].topology_key == ZONE


def test_spread_selector_and_match_label_keys() -> None:
    c = one_spread(
        {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "labelSelector": WEB,
            "matchLabelKeys": ["rev", "absent"],
            "mismatchLabelKeys": ["tier"],  # not a spread field: ignored
        }
    )
    assert c.selector == LabelSelector(
        (("app", "web"),), (NodeSelectorRequirement("rev", "In", ("3",)),)
    )
    assert c.matches({"app": "web", "rev": "3", "tier": "front"})
    assert not c.matches({"app": "web", "rev": "2"})
    # no labelSelector: counts no pod
    bare = one_spread({"maxSkew": 1, "topologyKey": ZONE})
    assert bare.selector is None and not bare.matches({}) and not bare.matches(LABELS)
    assert one_spread({"maxSkew": 1, "topologyKey": ZONE, "labelSelector": {}}).matches({})


@pytest.mark.parametrize(
    ("raw", "suffix"),
    [
        ({"topologyKey": ZONE}, " (maxSkew and topologyKey are required)"),
        ({"maxSkew": 1}, " (maxSkew and topologyKey are required)"),
        ({"maxSkew": 0, "topologyKey": ZONE}, " (maxSkew and topologyKey are required)"),
        ({"maxSkew": -1, "topologyKey": ZONE}, " (maxSkew and topologyKey are required)"),
        ({"maxSkew": True, "topologyKey": ZONE}, " (maxSkew and topologyKey are required)"),
        ({"maxSkew": "1", "topologyKey": ZONE}, " (maxSkew and topologyKey are required)"),
        ({"maxSkew": 1.5, "topologyKey": ZONE}, " (maxSkew and topologyKey are required)"),
        ("x", " (maxSkew and topologyKey are required)"),
        ({"maxSkew": 1, "topologyKey": ZONE, "minDomains": 0}, ".minDomains"),
        ({"maxSkew": 1, "topologyKey": ZONE, "minDomains": False}, ".minDomains"),
        ({"maxSkew": 1, "topologyKey": ZONE, "minDomains": "2"}, ".minDomains"),
        (
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Lt"}]},
            },
            ".labelSelector",
        ),
    ],
)
def test_an_unreadable_constraint_is_listed_by_path(raw: Any, suffix: str) -> None:
    good = {"maxSkew": 1, "topologyKey": HOST, "labelSelector": WEB}
    rules = parse({"topologySpreadConstraints": [good, raw]})
    assert rules.unsupported == (f"spec.topologySpreadConstraints[1]{suffix}",)
    assert len(rules.spread) == 1 and rules.spread[0].topology_key == HOST


def test_everything_together_in_order() -> None:
    spec = {
        **affinity({"labelSelector": WEB, "topologyKey": ZONE}, {"labelSelector": WEB}),
        "topologySpreadConstraints": [{"maxSkew": 1}, {"maxSkew": 1, "topologyKey": ZONE}],
    }
    spec["affinity"]["podAntiAffinity"] = {REQUIRED: [{"topologyKey": HOST, "labelSelector": {}}]}
    rules = parse(spec)
    assert (len(rules.affinity), len(rules.anti_affinity), len(rules.spread)) == (1, 1, 1)
    assert rules.unsupported == (
        f"{AFF}[1].topologyKey",
        "spec.topologySpreadConstraints[0] (maxSkew and topologyKey are required)",
    )
    # unsupported_fields lists the same paths, and nothing for the readable rules
    assert unsupported_fields(spec, "ns", LABELS) == rules.unsupported


# --- never raises ----------------------------------------------------------------------

FIELDS = [
    "affinity",
    "podAffinity",
    "podAntiAffinity",
    REQUIRED,
    PREFERRED,
    "labelSelector",
    "matchLabels",
    "matchExpressions",
    "key",
    "operator",
    "values",
    "topologyKey",
    "namespaces",
    "namespaceSelector",
    "matchLabelKeys",
    "mismatchLabelKeys",
    "topologySpreadConstraints",
    "maxSkew",
    "minDomains",
    "whenUnsatisfiable",
    "nodeAffinityPolicy",
    "nodeTaintsPolicy",
]
WORDS = st.sampled_from(
    [
        *("In", "NotIn", "Exists", "DoesNotExist", "Gt", "", "app", "web", "rev", "zone", "ns"),
        *("ScheduleAnyway", "DoNotSchedule", "Honor", "Ignore"),
    ]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-2, 4)
    | st.floats(allow_nan=True)
    | st.text(max_size=4)
    | WORDS
)
JUNK = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=3), inner, max_size=5)
    ),
    max_leaves=25,
)


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return value | JUNK


SELECTOR = _maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "matchLabels": _maybe(st.dictionaries(WORDS, WORDS, max_size=2)),
            "matchExpressions": _maybe(
                st.lists(
                    _maybe(
                        st.fixed_dictionaries(
                            {"key": WORDS, "operator": WORDS},
                            optional={"values": _maybe(st.lists(WORDS, max_size=2))},
                        )
                    ),
                    max_size=3,
                )
            ),
        },
    )
)
TERM = _maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "topologyKey": _maybe(WORDS),
            "labelSelector": SELECTOR,
            "namespaces": _maybe(st.lists(WORDS, max_size=2)),
            "namespaceSelector": SELECTOR,
            "matchLabelKeys": _maybe(st.lists(WORDS, max_size=2)),
            "mismatchLabelKeys": _maybe(st.lists(WORDS, max_size=2)),
        },
    )
)
CONSTRAINT = _maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "maxSkew": _maybe(st.integers(-1, 3)),
            "topologyKey": _maybe(WORDS),
            "whenUnsatisfiable": _maybe(WORDS),
            "labelSelector": SELECTOR,
            "minDomains": _maybe(st.integers(-1, 3)),
            "nodeAffinityPolicy": _maybe(WORDS),
            "nodeTaintsPolicy": _maybe(WORDS),
            "matchLabelKeys": _maybe(st.lists(WORDS, max_size=2)),
        },
    )
)
SPEC = _maybe(
    st.fixed_dictionaries(
        {},
        optional={
            "affinity": _maybe(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "podAffinity": _maybe(
                            st.fixed_dictionaries({REQUIRED: _maybe(st.lists(TERM, max_size=3))})
                        ),
                        "podAntiAffinity": _maybe(
                            st.fixed_dictionaries({REQUIRED: _maybe(st.lists(TERM, max_size=3))})
                        ),
                    },
                )
            ),
            "topologySpreadConstraints": _maybe(st.lists(CONSTRAINT, max_size=3)),
        },
    )
)
POD_LABELS = st.dictionaries(WORDS, WORDS, max_size=3)


def _entries(spec: Any, kind: str) -> int:
    """How many required terms of ``kind`` a spec lists (each is read or listed)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("affinity"), dict):
        return 0
    block = spec["affinity"].get(kind)
    if not isinstance(block, dict) or not isinstance(block.get(REQUIRED), list):
        return 0
    return len(block[REQUIRED])


def _constraints(spec: Any) -> int:
    if not isinstance(spec, dict) or not isinstance(spec.get("topologySpreadConstraints"), list):
        return 0
    return sum(
        1
        for c in spec["topologySpreadConstraints"]
        if not (isinstance(c, dict) and c.get("whenUnsatisfiable") == "ScheduleAnyway")
    )


@settings(max_examples=400, deadline=None)
@given(spec=SPEC, namespace=st.text(max_size=4), labels=POD_LABELS)
def test_never_raises_and_accounts_for_every_rule(
    spec: Any, namespace: str, labels: dict[str, str]
) -> None:
    rules = parse_pod_rules(spec, namespace, labels)
    assert rules == parse_pod_rules(spec, namespace, labels)  # deterministic
    hash(rules)  # the topology index keys counters by terms
    # Every required term / DoNotSchedule constraint is either read or listed, never dropped.
    listed_aff = sum(1 for u in rules.unsupported if u.startswith(AFF))
    listed_anti = sum(1 for u in rules.unsupported if u.startswith(ANTI))
    listed_spread = sum(1 for u in rules.unsupported if u.startswith("spec.topologySpread"))
    assert len(rules.unsupported) == listed_aff + listed_anti + listed_spread
    assert len(rules.affinity) + listed_aff == _entries(spec, "podAffinity")
    assert len(rules.anti_affinity) + listed_anti == _entries(spec, "podAntiAffinity")
    assert len(rules.spread) + listed_spread == _constraints(spec)
    for term in (*rules.affinity, *rules.anti_affinity):
        assert term.topology_key
        assert term.namespaces is None or term.namespaces
        term.matches(namespace, labels)
    for c in rules.spread:
        assert c.topology_key and c.max_skew >= 1 and c.min_domains >= 1
        c.matches(labels)
    fields = unsupported_fields(spec, namespace, labels)
    assert fields[: len(rules.unsupported)] == rules.unsupported


@settings(max_examples=300, deadline=None)
@given(spec=JUNK, namespace=st.text(max_size=3), labels=POD_LABELS)
def test_never_raises_on_arbitrary_values(
    spec: Any, namespace: str, labels: dict[str, str]
) -> None:
    rules = parse_pod_rules(spec, namespace, labels)
    assert isinstance(rules, PodRules)
    assert all(isinstance(u, str) and u.startswith("spec.") for u in rules.unsupported)
    assert isinstance(unsupported_fields(spec, namespace, labels), tuple)


@settings(max_examples=100, deadline=None)
@given(spec=SPEC, labels=POD_LABELS)
def test_what_is_read_survives_a_snapshot_file(spec: Any, labels: dict[str, str]) -> None:
    rules = parse_pod_rules(spec, "ns", labels)
    pod = Pod(
        uid="u",
        namespace="ns",
        name="p",
        labels=tuple(sorted(labels.items())),
        pod_affinity=rules.affinity,
        pod_anti_affinity=rules.anti_affinity,
        spread=rules.spread,
        unsupported=rules.unsupported,
    )
    assert Snapshot.from_json(Snapshot(pods=(pod,)).to_json()).pods == (pod,)
