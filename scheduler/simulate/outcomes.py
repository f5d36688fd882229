"""Totals of a run per queue and per outcome: what ``simulate --summary`` prints.

For runs too big to read gang by gang (tens of thousands of one-pod jobs): how many gangs,
jobs and pods ended running, finished, nominated, partly placed or waiting, per queue, and
for the ones that wait, per reason code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table

from scheduler.simulate.gang_rows import STATUS_ORDER
from scheduler.simulate.ordering import natural_key
from scheduler.simulate.summaries import GangSummary

__all__ = ["outcome_tables", "outcome_totals"]


def _count() -> dict[str, Any]:
    return {"gangs": 0, "jobs": set(), "pods": 0}


def _add(row: dict[str, Any], g: GangSummary) -> None:
    row["gangs"] += 1
    row["jobs"].add(f"{g.gang.split('/', 1)[0]}/{g.job}")
    row["pods"] += g.pods


def _plain(row: dict[str, Any]) -> dict[str, int]:
    return {"gangs": row["gangs"], "jobs": len(row["jobs"]), "pods": row["pods"]}


def outcome_totals(gangs: Sequence[GangSummary], queues: Sequence[str]) -> dict[str, Any]:
    """``{"by_outcome": [...], "by_queue": {queue: {status: counts}}, "total": counts}``.

    ``by_outcome`` has one entry per status (in :data:`STATUS_ORDER`) and, for gangs that
    wait, per reason code (most gangs first); counts are gangs, distinct jobs and pods.
    ``queues`` gives the queue order (the report's tree order); other queues follow in
    natural order.
    """
    by_outcome: dict[tuple[str, str], dict[str, Any]] = {}
    by_queue: dict[str, dict[str, dict[str, Any]]] = {}
    total = _count()
    for g in gangs:
        code = g.reason_code if g.status not in ("running", "finished") else ""
        _add(by_outcome.setdefault((g.status, code), _count()), g)
        _add(by_queue.setdefault(g.queue, {}).setdefault(g.status, _count()), g)
        _add(total, g)
    outcome_rows = sorted(
        by_outcome.items(),
        key=lambda kv: (STATUS_ORDER.index(kv[0][0]), -kv[1]["gangs"], natural_key(kv[0][1])),
    )
    order = [q for q in queues if q in by_queue]
    order += sorted(set(by_queue) - set(order), key=natural_key)
    return {
        "total": _plain(total),
        "by_outcome": [
            {"status": status, "reason_code": code, **_plain(row)}
            for (status, code), row in outcome_rows
        ],
        "by_queue": {
            q: {s: _plain(by_queue[q][s]) for s in STATUS_ORDER if s in by_queue[q]} for q in order
        },
    }


def _cell(counts: dict[str, int] | None) -> str:
    if not counts:
        return "-"
    return f"{counts['gangs']} ({counts['pods']})"


def outcome_tables(totals: dict[str, Any]) -> list[Table]:
    """Two rich tables: gangs (pods) per queue and outcome, and per outcome and reason."""
    used = [s for s in STATUS_ORDER if any(s in row for row in totals["by_queue"].values())]
    title = "Gangs (pods) by queue and outcome"
    per_queue = Table(title=title, title_justify="left", min_width=len(title))
    per_queue.add_column("Queue")
    for s in (*used, "total"):
        per_queue.add_column(s, justify="right")
    for queue, row in totals["by_queue"].items():
        all_of = {
            "gangs": sum(c["gangs"] for c in row.values()),
            "pods": sum(c["pods"] for c in row.values()),
        }
        per_queue.add_row(escape(queue), *(_cell(row.get(s)) for s in used), _cell(all_of))
    per_status: dict[str, dict[str, int]] = {}
    for entry in totals["by_outcome"]:
        row = per_status.setdefault(entry["status"], {"gangs": 0, "pods": 0})
        row["gangs"] += entry["gangs"]
        row["pods"] += entry["pods"]
    per_queue.add_row(
        "[bold]all[/]", *(_cell(per_status.get(s)) for s in used), _cell(totals["total"])
    )
    by_reason = Table(title="Gangs by outcome and reason", title_justify="left")
    for col in ("Outcome", "Reason", "Gangs", "Jobs", "Pods"):
        by_reason.add_column(col, justify="right" if col in ("Gangs", "Jobs", "Pods") else "left")
    for entry in totals["by_outcome"]:
        by_reason.add_row(
            entry["status"],
            escape(entry["reason_code"]) or "-",
            str(entry["gangs"]),
            str(entry["jobs"]),
            str(entry["pods"]),
        )
    return [per_queue, by_reason]
