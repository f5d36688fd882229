"""Lint rules for the Grafana dashboard and the alert rules, each returning findings as text.

Grafana's dashboard-linter (a Go module) is not served by the module proxy this project can
reach, so its main rules are written here against the parsed JSON and the PromQL ASTs of
promql-parser: the JSON schema of :data:`~tests.monitoring.assets.DASHBOARD_SCHEMA`, unique
panel ids and refIds, a layout inside Grafana's 24 columns without overlaps, one datasource
variable used by every panel and target, defined template variables, ``rate``-style functions
over counters with ``$__rate_interval``, ``histogram_quantile`` over buckets aggregated by
``le``, and every expression parsing as PromQL. Metric names are checked against a real scrape
by :func:`unknown_metrics`.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import promql_parser

from tests.monitoring.assets import (
    DASHBOARD_SCHEMA,
    Query,
    aggregations,
    calls,
    panels,
    queries,
    selectors,
    variables_used,
)

__all__ = ["lint_dashboard", "lint_rules", "unknown_metrics"]

#: Functions whose argument must be a counter (or histogram bucket) range.
_COUNTER_FUNCTIONS = {"rate", "irate", "increase"}
_BUILTIN_VARIABLES = {"datasource"}


def _schema_findings(dashboard: dict[str, Any]) -> list[str]:
    schema = json.loads(DASHBOARD_SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    return [
        f"schema: {'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
        for e in sorted(validator.iter_errors(dashboard), key=lambda e: list(e.absolute_path))
    ]


def _layout_findings(dashboard: dict[str, Any]) -> list[str]:
    out: list[str] = []
    ids: set[int] = set()
    cells: dict[tuple[int, int], int] = {}
    for panel in panels(dashboard):
        pid = int(panel.get("id") or 0)
        if pid in ids:
            out.append(f"panel id {pid} is used twice")
        ids.add(pid)
        pos = panel.get("gridPos") or {}
        x, y, w, h = (pos.get(k, 0) for k in ("x", "y", "w", "h"))
        if x + w > 24:
            out.append(f"panel {pid}: x {x} + w {w} passes Grafana's 24 columns")
        for cx in range(x, min(x + w, 24)):
            for cy in range(y, y + h):
                other = cells.setdefault((cx, cy), pid)
                if other != pid:
                    out.append(f"panel {pid} overlaps panel {other} at x={cx}, y={cy}")
                    break
            else:
                continue
            break
        refs = [t.get("refId") for t in panel.get("targets", [])]
        if len(refs) != len(set(refs)):
            out.append(f"panel {pid}: refIds {refs} are not unique")
    return out


def _datasource_findings(dashboard: dict[str, Any]) -> list[str]:
    out: list[str] = []
    variables = dashboard.get("templating", {}).get("list", [])
    if not any(v.get("type") == "datasource" and v.get("name") == "datasource" for v in variables):
        out.append("no datasource variable named 'datasource' (every panel refers to it)")
    wanted = "${datasource}"
    for panel in panels(dashboard):
        if panel.get("type") == "row":
            continue
        if (panel.get("datasource") or {}).get("uid") != wanted:
            out.append(f"panel {panel.get('id')}: datasource uid is not {wanted}")
        for t in panel.get("targets", []):
            if (t.get("datasource") or {}).get("uid") != wanted:
                out.append(f"panel {panel.get('id')} target {t.get('refId')}: uid not {wanted}")
    for v in variables:
        if v.get("type") == "query" and (v.get("datasource") or {}).get("uid") != wanted:
            out.append(f"variable {v.get('name')}: datasource uid is not {wanted}")
    return out


def _promql_findings(found: list[Query], defined: set[str] | None) -> list[str]:
    out: list[str] = []
    for q in found:
        try:
            promql_parser.parse(q.promql)
        except ValueError as e:
            out.append(f"{q.where}: not PromQL ({e}): {q.raw}")
            continue
        if defined is not None:
            for name in sorted(variables_used(q.raw) - defined):
                out.append(f"{q.where}: uses ${name}, which no template variable defines")
        for fn, args in calls(q.promql):
            if fn in _COUNTER_FUNCTIONS:
                names = {s.metric for a in args for s in selectors(str(a))}
                bad = sorted(n for n in names if not n.endswith(("_total", "_bucket")))
                if bad:
                    out.append(f"{q.where}: {fn}() of {bad}, which are not counters")
                if defined is not None and "$__rate_interval" not in q.raw:
                    out.append(f"{q.where}: {fn}() should use [$__rate_interval]")
            if fn == "histogram_quantile":
                inner = aggregations(str(args[1]))
                by = inner[0].modifier.labels if inner and inner[0].modifier else []
                if not inner or "le" not in by:
                    out.append(f"{q.where}: histogram_quantile needs an aggregation by (le)")
                if not all(s.metric.endswith("_bucket") for s in selectors(str(args[1]))):
                    out.append(f"{q.where}: histogram_quantile over a non-bucket series")
    return out


def lint_dashboard(dashboard: dict[str, Any]) -> list[str]:
    """Every finding for a Grafana dashboard (empty when it passes)."""
    schema = _schema_findings(dashboard)
    if schema:
        return schema  # the other rules assume the shape the schema guarantees
    defined = _BUILTIN_VARIABLES | {v["name"] for v in dashboard["templating"]["list"]}
    return [
        *_layout_findings(dashboard),
        *_datasource_findings(dashboard),
        *_promql_findings(queries(dashboard=dashboard), defined),
    ]


def lint_rules(rules: dict[str, Any]) -> list[str]:
    """Findings for a rules file beyond what promtool checks: PromQL use, labels, annotations."""
    out: list[str] = []
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            name = rule.get("alert")
            if not name:
                out.append(f"group {group.get('name')}: a rule without an alert name")
                continue
            if rule.get("labels", {}).get("severity") not in ("critical", "warning", "info"):
                out.append(f"rule {name}: labels.severity must be critical, warning or info")
            for key in ("summary", "description"):
                if not rule.get("annotations", {}).get(key):
                    out.append(f"rule {name}: no annotations.{key}")
    return [*out, *_promql_findings(queries(rules=rules), None)]


def unknown_metrics(found: list[Query], exported: dict[str, set[str] | None]) -> list[str]:
    """Selectors naming a series the scrape does not have, or a label its samples lack."""
    out: list[str] = []
    scrape_labels = {"job", "instance", "namespace", "pod"}  # added by the scraper
    for q in found:
        for s in selectors(q.promql):
            if s.metric not in exported:
                out.append(f"{q.where}: {s.metric} is not exported by the scheduler")
                continue
            labels = exported[s.metric]
            if labels is None:
                continue  # labelled, no sample yet: the name is known, its labels are not
            missing = sorted(s.labels - labels - scrape_labels)
            if missing:
                out.append(f"{q.where}: {s.metric} has no label {missing} (has {sorted(labels)})")
    return out
