"""The chart's monitoring assets and the facts the tests check them against.

- :data:`DASHBOARD` (Grafana JSON), :data:`RULES` (plain Prometheus rules file) and the
  templates that ship them; :data:`RULES_TEST` (``promtool test rules``) and
  :data:`DASHBOARD_SCHEMA` (the JSON schema of the Grafana fields the dashboard must have).
- :func:`queries`: every PromQL expression in the dashboard (panel targets and template
  variables) or the rules, made parseable (Grafana's ``$__rate_interval`` & co. replaced).
- :func:`selectors`: the metric names and matcher labels of an expression, walked from the
  AST of promql-parser (the Rust ``promql-parser`` crate behind a Python binding) — no regex.
- :func:`simulated_scrape`: the ``/metrics`` text of a real :class:`SchedulerMetrics` after a
  cycle of the simulator (the same ``run_cycle`` the scheduler runs, then
  :meth:`SchedulerMetrics.observe_report`, which the runner calls after every cycle), and
  :func:`exported`: the series names (and labels seen) that text offers.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import yaml
from prometheus_client.parser import text_string_to_metric_families

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import Queue, QueueResource
from scheduler.cluster.resources import CPU, GPU, PODS, Resources
from scheduler.cycle import CycleReport, run_cycle
from scheduler.metrics import SchedulerMetrics
from scheduler.simulate.backend import SimulatedCluster
from scheduler.solver.placement import PlacementSettings

__all__ = [
    "CHART",
    "DASHBOARD",
    "DASHBOARD_SCHEMA",
    "RULES",
    "RULES_TEST",
    "Query",
    "Selector",
    "exported",
    "load_dashboard",
    "load_rules",
    "queries",
    "selectors",
    "simulated_cycle",
    "simulated_scrape",
    "to_promql",
]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "manifests" / "chart"
DASHBOARD = CHART / "dashboards" / "kai-scheduler.json"
RULES = CHART / "rules" / "kai-scheduler.rules.yaml"
HERE = Path(__file__).resolve().parent
RULES_TEST = HERE / "rules_test.yaml"
DASHBOARD_SCHEMA = HERE / "grafana_dashboard.schema.json"

#: Grafana's built-in variables that stand for a duration inside PromQL, and a value of the
#: same kind that PromQL accepts (the server substitutes them before Prometheus sees them).
GRAFANA_DURATIONS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
_VARIABLE = re.compile(r"\$\{?(\w+)\}?")
#: ``label_values(<selector>, <label>)`` of a template variable (Grafana's syntax, not PromQL).
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.+),\s*(?P<label>\w+)\s*\)\s*$")


@dataclass(frozen=True)
class Query:
    """One PromQL expression, where it was found, and the parseable form of it."""

    where: str
    raw: str
    promql: str


@dataclass(frozen=True)
class Selector:
    """A vector selector of an expression: the metric name and the labels it matches on."""

    metric: str
    labels: frozenset[str]


def load_dashboard() -> dict[str, Any]:
    """The dashboard JSON shipped with the chart."""
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def load_rules(path: Path = RULES) -> dict[str, Any]:
    """A Prometheus rules file."""
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def to_promql(expr: str) -> str:
    """Grafana's duration variables replaced by durations; other ``$var`` references stay
    (the dashboard uses them only inside label-matcher strings, where PromQL takes them)."""
    for name, value in GRAFANA_DURATIONS.items():
        expr = expr.replace(name, value)
    return expr


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' collapsed panels included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def queries(
    dashboard: dict[str, Any] | None = None, rules: dict[str, Any] | None = None
) -> list[Query]:
    """Every PromQL expression of the dashboard (targets, query variables) and the rules."""
    out: list[Query] = []
    if dashboard is not None:
        for panel in panels(dashboard):
            for target in panel.get("targets", []):
                where = (
                    f"panel {panel.get('id')} {panel.get('title')!r} target {target.get('refId')}"
                )
                out.append(Query(where, target["expr"], to_promql(target["expr"])))
        for var in dashboard.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = _LABEL_VALUES.match(query)
            assert m, f"variable {var['name']}: only label_values(selector, label) is used: {query}"
            out.append(Query(f"variable {var['name']}", query, to_promql(m["selector"])))
    if rules is not None:
        for group in rules["groups"]:
            for rule in group["rules"]:
                name = rule.get("alert") or rule.get("record")
                out.append(Query(f"rule {name}", rule["expr"], rule["expr"]))
    return out


def variables_used(expr: str) -> set[str]:
    """Names of the template variables an expression refers to (``$job``, ``${queue}``)."""
    return {m[1] for m in _VARIABLE.finditer(expr) if not m[1].startswith("__")}


def selectors(promql: str) -> list[Selector]:
    """The vector selectors of a PromQL expression (raises ValueError if it does not parse)."""
    found: list[Selector] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            matchers = node.matchers.matchers
            name = node.name or next((m.value for m in matchers if m.name == "__name__"), None)
            assert name, f"selector without a metric name in {promql!r}"
            labels = frozenset(m.name for m in matchers if m.name != "__name__")
            found.append(Selector(name, labels))

    promql_parser.walk(promql_parser.parse(promql), pre_visit=visit)
    return found


def calls(promql: str) -> list[tuple[str, list[Any]]]:
    """Every function call of an expression: (name, argument nodes)."""
    found: list[tuple[str, list[Any]]] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.Call):
            found.append((node.func.name, list(node.args)))

    promql_parser.walk(promql_parser.parse(promql), pre_visit=visit)
    return found


def aggregations(promql: str) -> list[Any]:
    """Every aggregation node (``sum by (le) (...)``) of an expression."""
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.AggregateExpr):
            found.append(node)

    promql_parser.walk(promql_parser.parse(promql), pre_visit=visit)
    return found


def simulated_cycle() -> tuple[SchedulerMetrics, CycleReport]:
    """One cycle of the simulator on a small cluster, observed as the runner observes it.

    Three gangs: one that fits (team-a), one larger than any node (team-b, NodeTooSmall) and
    one with fewer pods than its minMember (team-b, GangIncomplete), waiting 100 s."""
    node = Node("n1", Resources({GPU: 4, CPU: 16000, PODS: 110}))
    gpu = (("gpu", QueueResource(quota=2000)),)
    queues = [
        Queue("dept"),
        Queue("team-a", parent="dept", resources=gpu),
        Queue("team-b", parent="dept", resources=gpu),
    ]
    cluster = SimulatedCluster([node], queues)
    fits = Gang("ns", "fits", min_member=2, queue="team-a")
    big = Gang("ns", "big", min_member=1, queue="team-b")
    short = Gang("ns", "short", min_member=3, queue="team-b")
    pods = [
        *(Pod(f"ns/f{i}", "ns", f"f{i}", Resources({GPU: 1}), gang=fits.key) for i in range(2)),
        Pod("ns/b0", "ns", "b0", Resources({GPU: 8}), gang=big.key),
        *(Pod(f"ns/s{i}", "ns", f"s{i}", Resources({GPU: 1}), gang=short.key) for i in range(2)),
    ]
    cluster.add_pods(pods, [fits, big, short], duration=600.0)
    cluster.advance(100.0)
    report = asyncio.run(run_cycle(cluster, PlacementSettings(time_limit_seconds=0.2), 1))
    metrics = SchedulerMetrics()
    metrics.observe_report(report)
    return metrics, report


def simulated_scrape() -> str:
    """The ``/metrics`` text of :func:`simulated_cycle`'s metrics."""
    metrics, _ = simulated_cycle()
    return metrics.render().decode()


#: Series names of each metric type beyond the family name (prometheus-client's exposition).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}


def exported(text: str) -> dict[str, set[str] | None]:
    """Series name -> label names seen on its samples (None when it has no sample yet, as a
    labelled metric before its first observation: its name is exported, its labels are not
    visible in the text)."""
    out: dict[str, set[str] | None] = {}
    for family in text_string_to_metric_families(text):
        for suffix in _SUFFIXES[family.type]:
            out.setdefault(family.name + suffix, None)
        for sample in family.samples:
            seen = out.get(sample.name) or set()
            out[sample.name] = seen | set(sample.labels)
    return out
