"""The chart's Grafana dashboard and alert rules: JSON schema, lint rules, PromQL parsed by
promql-parser, and every metric they use checked against a real scrape of the scheduler's
registry after a simulated cycle. (promtool and helm run in tests/e2e/test_monitoring_tools.py.)
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from tests.monitoring.assets import (
    DASHBOARD_SCHEMA,
    exported,
    load_dashboard,
    load_rules,
    panels,
    queries,
    selectors,
    simulated_scrape,
)
from tests.monitoring.lint import lint_dashboard, lint_rules, unknown_metrics

__all__: list[str] = []


@pytest.fixture(scope="module")
def scrape() -> dict[str, set[str] | None]:
    return exported(simulated_scrape())


def _first_target(d: dict[str, Any]) -> dict[str, Any]:
    target: dict[str, Any] = next(p for p in panels(d) if p["type"] != "row")["targets"][0]
    return target


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(json.loads(DASHBOARD_SCHEMA.read_text()))


def test_the_dashboard_passes_every_lint_rule() -> None:
    assert lint_dashboard(load_dashboard()) == []


def test_the_rules_pass_every_lint_rule() -> None:
    assert lint_rules(load_rules()) == []


def test_every_metric_in_dashboard_and_rules_is_exported(
    scrape: dict[str, set[str] | None],
) -> None:
    found = queries(load_dashboard(), load_rules())
    assert len(found) > 30  # every target, variable and rule was read
    assert unknown_metrics(found, scrape) == []


def test_the_dashboard_shows_what_operators_ask_for() -> None:
    by_metric: dict[str, list[str]] = {}
    for q in queries(dashboard=load_dashboard()):
        for s in selectors(q.promql):
            by_metric.setdefault(s.metric, []).append(q.raw)
    for metric in (
        "kai_queue_allocated",
        "kai_queue_fair_share",
        "kai_pending_gangs_by_reason",
        "kai_cycle_duration_seconds_bucket",
        "kai_solve_duration_seconds_bucket",
        "kai_binds_total",
        "kai_evictions_total",
        "kai_leader",
        "kai_leader_lease_transitions",
    ):
        assert metric in by_metric, f"no panel shows {metric}"
    # Allocation vs fair share for each resource the queues have.
    for resource in ("gpu", "cpu", "memory"):
        assert any(f'resource="{resource}"' in e for e in by_metric["kai_queue_fair_share"])
    quantiles = [e for e in by_metric["kai_cycle_duration_seconds_bucket"] if "0.99" in e]
    assert quantiles and all("histogram_quantile" in e for e in quantiles)


def test_the_rules_name_the_three_alerts() -> None:
    names = [r["alert"] for g in load_rules()["groups"] for r in g["rules"]]
    assert names == ["KaiSchedulerNoCycle", "KaiSchedulerLeaderFlapping", "KaiGangPendingTooLong"]


# --- each lint rule can fail ---------------------------------------------------------------


def _broken(change: str) -> dict[str, Any]:
    d = copy.deepcopy(load_dashboard())
    data = [p for p in panels(d) if p["type"] != "row"]
    if change == "no title":
        del d["title"]
    elif change == "long uid":
        d["uid"] = "x" * 41
    elif change == "wide":
        data[0]["gridPos"].update(x=20, w=8)
    elif change == "duplicate id":
        data[1]["id"] = data[0]["id"]
    elif change == "overlap":
        data[1]["gridPos"] = dict(data[0]["gridPos"])
    elif change == "datasource":
        _first_target(d)["datasource"] = {"type": "prometheus", "uid": "prometheus"}
    elif change == "syntax":
        _first_target(d)["expr"] = "sum(rate(kai_binds_total[$__rate_interval])"
    elif change == "variable":
        _first_target(d)["expr"] = 'kai_leader{job=~"$cluster"}'
    elif change == "rate of a gauge":
        _first_target(d)["expr"] = "rate(kai_leader[$__rate_interval])"
    elif change == "fixed rate range":
        _first_target(d)["expr"] = "rate(kai_binds_total[5m])"
    elif change == "quantile without le":
        _first_target(d)["expr"] = (
            "histogram_quantile(0.9, sum(rate(kai_cycle_duration_seconds_bucket"
            "[$__rate_interval])))"
        )
    elif change == "missing refId":
        del _first_target(d)["refId"]
    else:
        raise AssertionError(change)
    return d


@pytest.mark.parametrize(
    ("change", "finding"),
    [
        ("no title", "'title' is a required property"),
        ("long uid", "does not match"),
        ("wide", "passes Grafana's 24 columns"),
        ("duplicate id", "is used twice"),
        ("overlap", "overlaps panel"),
        ("datasource", "uid not ${datasource}"),
        ("syntax", "not PromQL"),
        ("variable", "uses $cluster"),
        ("rate of a gauge", "not counters"),
        ("fixed rate range", "should use [$__rate_interval]"),
        ("quantile without le", "aggregation by (le)"),
        ("missing refId", "'refId' is a required property"),
    ],
)
def test_lint_finds_a_broken_dashboard(change: str, finding: str) -> None:
    findings = lint_dashboard(_broken(change))
    assert any(finding in f for f in findings), findings


def test_lint_finds_broken_rules() -> None:
    rules = copy.deepcopy(load_rules())
    first, second = rules["groups"][0]["rules"][:2]
    del first["labels"]["severity"]
    second["expr"] = "max_over_time(kai_leader_lease_transitions[15m]"
    findings = lint_rules(rules)
    assert any("KaiSchedulerNoCycle: labels.severity" in f for f in findings), findings
    assert any("KaiSchedulerLeaderFlapping" in f and "not PromQL" in f for f in findings)


def test_unknown_metrics_and_labels_are_found(scrape: dict[str, set[str] | None]) -> None:
    d = copy.deepcopy(load_dashboard())
    _first_target(d)["expr"] = 'sum(kai_bogus) + max(kai_queue_allocated{flavour="x"})'
    found = unknown_metrics(queries(dashboard=d), scrape)
    assert any("kai_bogus is not exported" in f for f in found), found
    assert any("kai_queue_allocated has no label ['flavour']" in f for f in found), found
