"""Turning one contender's observations into the bench's JSON result, the ours-versus-peer
ratios, and the short human table printed on stderr."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.bench.e2e_stats import AuditCount, ProcessTreeMeter, percentile

__all__ = ["RunObservation", "ratios", "result_of", "table"]

#: Metrics compared in ``ratios``: ours divided by the peer's value.
RATIO_METRICS = (
    "seconds_to_first_bind",
    "seconds_to_last_bind",
    "pods_per_second_overall",
    "pods_per_second_first_to_last",
    "bind_latency_p99",
    "cpu_seconds",
    "peak_rss_mb",
    "api_requests",
)


@dataclass
class RunObservation:
    """Everything the bench saw during one contender's run (times on the monotonic clock)."""

    key: str
    pods: int
    with_gangs: bool
    started: float
    ended: float
    timed_out: bool
    added: Mapping[str, float]
    bound: Mapping[str, float]
    rebound: int
    deleted: int
    meter: ProcessTreeMeter
    cpu_at_last_bind: float
    audit: AuditCount | None
    backlog_seconds: float
    exited: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    notes: Sequence[str] = ()
    logs: Sequence[str] = ()


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def result_of(obs: RunObservation) -> dict[str, Any]:
    """The JSON result of one run. ``bound_exactly_once`` holds when every pod was seen bound,
    none moved or vanished, and the API server accepted exactly ``pods`` Bindings from it."""
    times = sorted(obs.bound.values())
    first = times[0] - obs.started if times else None
    last = times[-1] - obs.started if times else None
    n = len(times)
    from_creation = [t - obs.added[p] for p, t in obs.bound.items() if p in obs.added]
    from_start = [t - obs.started for t in times]
    span = (times[-1] - times[0]) if n > 1 else None
    bindings_ok = obs.audit.bindings_ok if obs.audit else None
    exactly_once = (
        n == obs.pods and obs.rebound == 0 and obs.deleted == 0 and bindings_ok == obs.pods
    )
    return {
        "scheduler": obs.key,
        "complete": n == obs.pods and not obs.timed_out and obs.error is None,
        "bound_exactly_once": exactly_once,
        "pods": obs.pods,
        "bound": n,
        "rebound": obs.rebound,
        "deleted_during_run": obs.deleted,
        "podgroups": obs.with_gangs,
        "seconds_to_first_bind": _r(first),
        "seconds_to_last_bind": _r(last),
        "pods_per_second_first_to_last": _r((n - 1) / span, 1) if span else None,
        "pods_per_second_overall": _r(n / last, 1) if last else None,
        "bind_latency_p50": _r(percentile(from_creation, 0.50)),
        "bind_latency_p99": _r(percentile(from_creation, 0.99)),
        "bind_time_from_start_p50": _r(percentile(from_start, 0.50)),
        "bind_time_from_start_p99": _r(percentile(from_start, 0.99)),
        "cpu_seconds": _r(obs.meter.cpu_seconds, 2),
        "cpu_seconds_at_last_bind": _r(obs.cpu_at_last_bind, 2),
        "peak_rss_mb": _r(obs.meter.peak_rss_mb, 1),
        "peak_rss_sampled_sum_mb": _r(obs.meter.peak_rss_sum_kb / 1024, 1),
        "processes": len(obs.meter.pids),
        "api_requests": obs.audit.requests if obs.audit else None,
        "api": obs.audit.as_json() if obs.audit else None,
        "backlog_create_seconds": _r(obs.backlog_seconds, 2),
        "run_seconds": _r(obs.ended - obs.started, 2),
        "timed_out": obs.timed_out,
        "exited_early": obs.exited,
        "error": obs.error,
        "notes": list(obs.notes),
        "logs": list(obs.logs),
    }


def ratios(results: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """``ours_vs_<peer>``: for each metric, ours divided by the peer's value. Below 1 is better
    for times, CPU, memory and requests; above 1 is better for pods per second."""
    ours = next((r for r in results if r["scheduler"] == "ours"), None)
    if ours is None:
        return {}
    out: dict[str, dict[str, float | None]] = {}
    for peer in results:
        if peer is ours:
            continue
        row: dict[str, float | None] = {}
        for metric in RATIO_METRICS:
            a, b = ours.get(metric), peer.get(metric)
            row[metric] = round(a / b, 3) if a is not None and b else None
        out[f"ours_vs_{peer['scheduler']}"] = row
    return out


def table(results: Sequence[Mapping[str, Any]]) -> str:
    """A fixed-width summary, one line per contender."""
    cols = [
        ("scheduler", "scheduler", "{}"),
        ("bound", "bound", "{}"),
        ("first s", "seconds_to_first_bind", "{:.2f}"),
        ("last s", "seconds_to_last_bind", "{:.2f}"),
        ("pods/s", "pods_per_second_overall", "{:.1f}"),
        ("p50 s", "bind_latency_p50", "{:.2f}"),
        ("p99 s", "bind_latency_p99", "{:.2f}"),
        ("CPU s", "cpu_seconds", "{:.1f}"),
        ("RSS MB", "peak_rss_mb", "{:.0f}"),
        ("API req", "api_requests", "{}"),
    ]
    rows = [[h for h, _, _ in cols]]
    for r in results:
        row = []
        for _, key, fmt in cols:
            value = r.get(key)
            row.append("-" if value is None else fmt.format(value))
        if r.get("scheduler") and not r.get("complete"):
            row[0] += " (INCOMPLETE)"
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    return "\n".join(
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )
