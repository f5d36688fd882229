"""The rows of the report's Gangs table: one row per gang, and one per job without a PodGroup.

A job without a PodGroup makes every pod its own gang; listing those one by one buries a big
run (a 1,000-replica job would take 1,000 rows). Its pods are collapsed into one row with
counts per outcome (``13 running, 7 waiting``) and, per outcome, the reason of its first pod
(their messages differ only in the pod they name).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape

from scheduler.simulate.summaries import GangSummary, format_time

__all__ = ["STATUS_ORDER", "gang_rows", "job_label"]

#: Outcomes in the order counts are listed (what holds GPUs first, then what waits).
STATUS_ORDER = ("running", "partly placed", "nominated", "waiting", "finished")

_STATUS_STYLE = {
    "running": "green",
    "partly placed": "yellow",
    "nominated": "yellow",
    "waiting": "yellow",
    "finished": "blue",
}


def job_label(g: GangSummary) -> str:
    """What the table names a gang by: the gang, or ``namespace/job`` for a job's own pods."""
    return f"{g.gang.split('/', 1)[0]}/{g.job}" if g.implicit else g.gang


def _reason(g: GangSummary) -> str:
    return f"[bold]{escape(g.reason_code)}[/]" + (f": {escape(g.reason)}" if g.reason else "")


def _placed_why(g: GangSummary, *, up_to: bool) -> str:
    """Why a placed gang started when it did (and what it took back to start)."""
    waited = g.waited or 0.0
    why = (
        f"waited {'up to ' if up_to else ''}{format_time(waited)} "
        f"([bold]{escape(g.waited_code)}[/]): {escape(g.waited_because)}"
        if g.waited_because and waited > 0
        else "placed when it arrived"
    )
    if g.made_room:
        took = sum(e.pods for e in g.made_room)
        actions = ", ".join(sorted({e.action for e in g.made_room}))
        if g.waited_because:
            why += f"; then took back {took} pod(s) ({actions})"
        else:
            why = f"took back {took} pod(s) ({actions})" + (
                f"; bound {format_time(waited)} later, once they were gone" if waited > 0 else ""
            )
    return why


def _why(members: Sequence[GangSummary]) -> str:
    """The Why text of gangs that share one outcome (and, if waiting, one reason code)."""
    g = members[0]
    if g.status in ("waiting", "nominated"):
        return _reason(g)
    if g.status == "partly placed":
        return f"{sum(m.pending for m in members)} extra pod(s) wait: {_reason(g)}"
    # Placed: tell the longest wait (the first gang with it), "up to" when the waits differ.
    longest = max(members, key=lambda m: m.waited or 0.0)
    waits = {m.waited or 0.0 for m in members if m.waited_because}
    took = [e for m in members for e in m.made_room]
    if len(members) > 1 and took and not longest.made_room:
        longest = next(m for m in members if m.made_room)
    return _placed_why(longest, up_to=len(waits) > 1)


def _evicted_suffix(members: Sequence[GangSummary]) -> str:
    lost = sorted({e.action for m in members for e in m.evictions})
    if not lost:
        return ""
    restarts = sum(m.restarts for m in members)
    times = f"{restarts}x restarted" if restarts else f"{sum(m.evicted for m in members)} pod(s)"
    return f" [red](evicted: {', '.join(lost)}; {times})[/]"


def _span(values: Sequence[float]) -> str:
    """One time, or the first and last of several (``30s..21m``)."""
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return format_time(lo) if lo == hi else f"{format_time(lo)}..{format_time(hi)}"


def _status(status: str, count: int | None = None) -> str:
    text = status if count is None else f"{count} {status}"
    return f"[{_STATUS_STYLE.get(status, 'white')}]{text}[/]"


def _row(members: Sequence[GangSummary]) -> tuple[str, ...]:
    g = members[0]
    # Members that share an outcome (and, while waiting, a reason code) share one Why part.
    parts: dict[tuple[str, str], list[GangSummary]] = {}
    for m in sorted(members, key=lambda m: STATUS_ORDER.index(m.status)):
        code = m.reason_code if m.status != "running" and m.status != "finished" else ""
        parts.setdefault((m.status, code), []).append(m)
    if len(parts) == 1:
        status, why = _status(g.status), _why(members)
    else:
        counts: dict[str, int] = {}
        for m in members:
            counts[m.status] = counts.get(m.status, 0) + m.pods
        status = ", ".join(_status(s, counts[s]) for s in STATUS_ORDER if s in counts)
        why = "; ".join(
            f"{sum(m.pods for m in part)} {st}: {_why(part)}" for (st, _), part in parts.items()
        )
    why += _evicted_suffix(members)
    name = escape(job_label(g))
    if g.implicit:
        n = sum(m.pods for m in members)
        label = f"{name} [dim]({n} pod{'s' if n != 1 else ''}, no PodGroup)[/]"
        pods = str(n)
    else:
        label = name
        pods = f"{g.pods} (min {g.min_member})" if g.pods != g.min_member else str(g.pods)
    placed = [m.placed_at for m in members if m.placed_at is not None]
    arrived = _span([m.arrived_at for m in members])
    return (label, escape(g.queue), pods, arrived, _span(placed), status, why)


def gang_rows(gangs: Sequence[GangSummary]) -> list[tuple[str, ...]]:
    """Table rows (rich markup) in the order of ``gangs``: one per gang with a PodGroup, one
    per job for the pods of a job without one (placed at any time, with any outcome)."""
    grouped: dict[tuple[bool, str, str], list[GangSummary]] = {}
    for g in gangs:
        grouped.setdefault((g.implicit, job_label(g), g.queue), []).append(g)
    return [_row(members) for members in grouped.values()]
