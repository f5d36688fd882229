"""The Events of an object, as ``explain`` lists them: newest first, repeats merged."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from scheduler.inspect.views import EventView

__all__ = ["event_time", "merge_events"]


def _parse_time(text: str) -> dt.datetime:
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return dt.datetime.min.replace(tzinfo=dt.UTC)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def event_time(event: Mapping[str, Any]) -> str:
    series = event.get("series") or {}
    for value in (
        series.get("lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("eventTime"),
        event.get("firstTimestamp"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ):
        if value:
            return str(value)
    return ""


def merge_events(events: Iterable[Mapping[str, Any]], limit: int = 10) -> tuple[EventView, ...]:
    """core/v1 Events newest first, one row per (type, reason, message): the scheduler posts a
    new Event each time it repeats a reason, so without merging one cause fills the screen."""
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for e in events:
        key = (str(e.get("type") or ""), str(e.get("reason") or ""), str(e.get("message") or ""))
        involved = e.get("involvedObject") or {}
        obj = f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}"
        when = event_time(e)
        source = str((e.get("source") or {}).get("component") or e.get("reportingComponent") or "")
        count = int(e.get("count") or (e.get("series") or {}).get("count") or 1)
        row = merged.get(key)
        if row is None:
            merged[key] = {"when": when, "count": count, "objects": [obj], "source": source}
            continue
        row["count"] += count
        if obj not in row["objects"]:
            row["objects"].append(obj)
        if _parse_time(when) > _parse_time(row["when"]):
            row["when"], row["source"] = when, source or row["source"]
    ordered = sorted(merged.items(), key=lambda kv: _parse_time(kv[1]["when"]), reverse=True)
    return tuple(
        EventView(t, reason, message, row["when"], row["count"], tuple(sorted(row["objects"])),
                  row["source"])
        for (t, reason, message), row in ordered[: max(limit, 0)]
    )  # fmt: skip
