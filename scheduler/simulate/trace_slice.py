"""``--slice START:END``: replay only part of a trace's pod list.

Two ways to name the part, both on the rows of the pod list (which the openb file keeps in
arrival order, i.e. by ``creation_time``):

- arrival indices: ``--slice 1000:2000`` takes rows 1000..1999 (0-based, end excluded);
  either side may be left out (``:500``, ``7000:``) and negative numbers count from the end
  (``-1000:`` = the last 1000 pods), as in a Python slice;
- creation times: a side with a unit (``s``, ``m``, ``h``, ``d``, combinable as ``1d12h``)
  takes the pods created in ``[START, END)`` (``--slice 10d:20d``, ``:36h``; a bare ``0``
  also counts as a time here). Rows without a ``creation_time`` are not in any time slice.

The slice is taken first; ``--mix``, ``--shuffle-seed`` and ``--inflate`` then apply to it as
they would to a whole file (so ``--inflate 1.3`` fills the cluster with re-sampled copies of
the slice's pods).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from scheduler.simulate.trace import TraceError, TracePod

__all__ = ["TraceSlice", "format_duration", "parse_slice", "slice_pods"]

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[smhd])+")
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_INDEX = re.compile(r"-?\d+")

_HELP = (
    "use arrival indices (e.g. --slice 0:1000, --slice -500:) or creation times with a unit "
    "(e.g. --slice 0:7d, --slice 12h:1d12h)"
)


@dataclass(frozen=True)
class TraceSlice:
    """A part of the pod list: by arrival index (``end`` excluded) or creation time
    (seconds, ``[start, end)``); None = open on that side."""

    by: Literal["index", "time"]
    start: float | None
    end: float | None
    text: str

    def to_json(self) -> dict[str, object]:
        """Plain JSON data (what the replay summary reports)."""
        return {"slice": self.text, "by": self.by, "start": self.start, "end": self.end}


def _seconds(text: str) -> float:
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(text))


def parse_slice(text: str) -> TraceSlice:
    """Parse ``--slice``; raises :class:`TraceError` naming the flag and the fix."""
    raw = text.strip()
    start_text, sep, end_text = raw.partition(":")
    start_text, end_text = start_text.strip(), end_text.strip()
    if not sep or ":" in end_text:
        raise TraceError(f"--slice {text!r} is not START:END; {_HELP}")
    if not start_text and not end_text:
        raise TraceError(f"--slice {text!r} selects the whole list; give START, END or both")
    sides = (start_text, end_text)
    if any(_DURATION.fullmatch(s) for s in sides):
        bad = [s for s in sides if s and s != "0" and not _DURATION.fullmatch(s)]
        if bad:
            raise TraceError(
                f"--slice {text!r}: {bad[0]!r} is not a time with a unit; both sides of a "
                f"time slice need one (s, m, h, d); {_HELP}"
            )
        start = _seconds(start_text) if start_text else None
        end = _seconds(end_text) if end_text else None
        by: Literal["index", "time"] = "time"
    else:
        bad = [s for s in sides if s and not _INDEX.fullmatch(s)]
        if bad:
            raise TraceError(f"--slice {text!r}: {bad[0]!r} is not a whole number; {_HELP}")
        start = int(start_text) if start_text else None
        end = int(end_text) if end_text else None
        by = "index"
    if start is not None and end is not None and (start >= 0) == (end >= 0) and end <= start:
        raise TraceError(f"--slice {text!r}: END must come after START; {_HELP}")
    return TraceSlice(by, start, end, raw)


def format_duration(seconds: float) -> str:
    """Trace seconds in the units ``--slice`` takes: ``149d8h``, ``2h30m``, ``45s``."""
    left = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    if left or not parts:
        parts.append(f"{left}s")
    return "".join(parts[:2])  # two units are enough to pick a slice


def _span(pods: Sequence[TracePod]) -> str:
    times = [p.created for p in pods if p.created is not None]
    if not times:
        return ""
    return f", created {format_duration(min(times))} to {format_duration(max(times))}"


def slice_pods(pods: Sequence[TracePod], part: TraceSlice) -> list[TracePod]:
    """The pods of the pod list that ``part`` names (in list order). Raises
    :class:`TraceError` when it names none, or names times the list does not have."""
    if part.by == "index":
        lo = None if part.start is None else int(part.start)
        hi = None if part.end is None else int(part.end)
        out = list(pods[lo:hi])
    else:
        if all(p.created is None for p in pods):
            raise TraceError(
                f"--slice {part.text}: selects by creation time, but the pod list has no "
                "creation_time column; use arrival indices, e.g. --slice 0:1000"
            )
        lo_t = float("-inf") if part.start is None else part.start
        hi_t = float("inf") if part.end is None else part.end
        out = [p for p in pods if p.created is not None and lo_t <= p.created < hi_t]
    if not out:
        raise TraceError(
            f"--slice {part.text} selects no pods; the pod list has {len(pods)} "
            f"(indices 0..{len(pods) - 1}{_span(pods)})"
        )
    return out
