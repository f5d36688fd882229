"""Printing an :class:`~scheduler.inspect.model.Explanation`: rich on a terminal, plain text
otherwise (one fact per line, never wrapped, so ``grep`` finds a reason whole), or JSON.

The JSON document is the explanation's fields in camelCase (``verdict``, ``summary``,
``reason``, ``message``, ``gang.members[].node``, ``queue.resources[].fairShare``,
``events[].lastSeen``, ``takeBack.nominated`` ...), stable for scripts.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, TextIO

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from scheduler.inspect.views import Explanation, GangView, QueueResource, QueueView, TakeBack

__all__ = ["MAX_MEMBERS", "OUTPUTS", "render", "render_json", "render_plain", "render_rich",
           "to_json"]  # fmt: skip

OUTPUTS = ("text", "json")
#: Member pods listed (a 1,000-pod gang would bury the reason); the counts cover them all.
MAX_MEMBERS = 20
_VERDICT_STYLE = {
    "placed": "bold green",
    "finished": "green",
    "pending": "yellow",
    "held": "yellow",
    "waiting": "bold red",
    "evicting": "bold magenta",
    "undecided": "yellow",
    "not-ours": "cyan",
}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _camelise(value: Any) -> Any:
    if isinstance(value, dict):
        return {(_camel(k) if isinstance(k, str) and "_" in k else k): _camelise(v)
                for k, v in value.items()}  # fmt: skip
    if isinstance(value, list | tuple):
        return [_camelise(v) for v in value]
    return value


def to_json(explanation: Explanation) -> dict[str, Any]:
    """The JSON document (see the module docstring)."""
    data: dict[str, Any] = _camelise(dataclasses.asdict(explanation))
    return data


def render_json(explanation: Explanation, out: TextIO) -> None:
    """Write the JSON document."""
    json.dump(to_json(explanation), out, indent=2)
    out.write("\n")


def _title(e: Explanation) -> str:
    where = f"{e.namespace}/{e.name}" if e.namespace else e.name
    return f"{e.kind} {where}" + (f" (schedulerName {e.scheduler_name})" if e.kind == "Pod" else "")


def _gang_line(g: GangView) -> str:
    what = "no PodGroup: a gang of one" if g.implicit else f"PodGroup {g.name}"
    counts = f"{g.bound} bound, {g.waiting} waiting, {g.finished} finished"
    phase = f"; phase {g.phase}" if g.phase else ""
    api = f" ({g.api_version})" if g.api_version else ""
    return f"{what}{api}, minMember {g.min_member}: {counts}{phase}"


def _nodes_line(g: GangView) -> str:
    return ", ".join(f"{n} ({c} pod{'s' if c != 1 else ''})" for n, c in sorted(g.nodes.items()))


def _cell(value: str) -> str:
    return value if value != "" else "-"


_QUEUE_HEAD = ("resource", "unit", "allocated", "non-preemptible", "requested", "fair share",
               "quota", "limit", "weight")  # fmt: skip


def _queue_cells(r: QueueResource) -> list[str]:
    values = (r.allocated, r.allocated_non_preemptible, r.requested, r.fair_share, r.quota,
              r.limit, r.over_quota_weight)  # fmt: skip
    return [r.resource, r.unit, *(_cell(v) for v in values)]


def _queue_title(q: QueueView) -> str:
    parent = f", parent {q.parent}" if q.parent else ""
    return f"{q.name} (from {q.source}){parent}" + ("" if q.found else ": does not exist")


def _usage(q: QueueView) -> str:
    parts = [f"{r.resource} {_cell(r.allocated)}/{_cell(r.fair_share)}" for r in q.resources]
    return f"{q.name}: allocated/fair share " + ", ".join(parts)


def _take_back_lines(t: TakeBack) -> list[str]:
    lines = [f"pod {pod}: node {node} is held for it (nominatedNodeName)"
             for pod, node in sorted(t.nominated.items())]  # fmt: skip
    for pod, c in sorted(t.disruption.items()):
        lines.append(f"pod {pod}: DisruptionTarget={c.status} {c.reason}: {c.message}".rstrip(": "))
    lines += [f"queue {c.type} ({c.reason}, {c.since}): {c.message}" for c in t.queue]
    return lines


def _table(rows: Sequence[Sequence[str]], indent: str) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]  # fmt: skip


def _headline(e: Explanation) -> str:
    """``waiting (Unschedulable): <the scheduler's reason>``, ``placed: bound to node n``."""
    tag = f" ({e.reason})" if e.verdict in ("waiting", "evicting") and e.reason else ""
    return f"{e.verdict}{tag}: {e.summary}"


def render_plain(e: Explanation, out: TextIO) -> None:
    """Plain text, one fact per line (for pipes, files and tests)."""
    lines = [_title(e), f"Decision: {_headline(e)}"]
    for label, value in (("reason", e.reason), ("message", e.message), ("since", e.since)):
        if value:
            lines.append(f"  {label}: {value}")
    g = e.gang
    if g is not None:
        lines.append(f"Gang: {_gang_line(g)}")
        if g.condition is not None:
            c = g.condition
            lines.append(f"  condition {c.type}={c.status} {c.reason}: {c.message}".rstrip(": "))
        if g.nodes:
            lines.append(f"  bound on: {_nodes_line(g)}")
        rows = [("pod", "phase", "state", "node")]
        rows += [(m.name, m.phase, m.state, m.node or (f"(held: {m.nominated_node})"
                  if m.nominated_node else "-")) for m in g.members[:MAX_MEMBERS]]  # fmt: skip
        if len(rows) > 1:
            lines += _table(rows, "  ")
        if len(g.members) > MAX_MEMBERS:
            lines.append(f"  ... and {len(g.members) - MAX_MEMBERS} more pods")
    q = e.queue
    if q is not None:
        lines.append(f"Queue: {_queue_title(q)}")
        if q.resources:
            lines += _table([_QUEUE_HEAD, *(_queue_cells(r) for r in q.resources)], "  ")
        for c in q.conditions:
            if c.type == "Valid":
                lines.append(f"  condition Valid={c.status} {c.reason}: {c.message}".rstrip(": "))
        lines += [f"  parent {_usage(p)}" for p in q.parents if p.found]
    take_back = _take_back_lines(e.take_back)
    if take_back:
        lines.append("Take-back:")
        lines += [f"  {line}" for line in take_back]
    if e.events:
        lines.append("Events (newest first, repeats merged):")
        for ev in e.events:
            objects = ",".join(ev.objects)
            lines.append(
                f"  {ev.last_seen}  {ev.type:<7}  {ev.reason}  x{ev.count}  {objects}  {ev.message}"
            )
    else:
        lines.append("Events: none")
    if e.notes:
        lines.append("Notes:")
        lines += [f"  - {n}" for n in e.notes]
    out.write("\n".join(lines) + "\n")


def render_rich(e: Explanation, console: Console) -> None:
    """Panels and tables for a terminal."""
    parts: list[Any] = []
    head = Text("Decision: ", style="bold")
    verdict, _, rest = _headline(e).partition(": ")
    head.append(verdict, style=_VERDICT_STYLE.get(e.verdict, "bold"))
    head.append(f": {rest}")
    parts.append(head)
    if e.message and e.message not in e.summary:
        parts.append(Text(f"{e.reason}: {e.message}", style="dim"))
    g = e.gang
    if g is not None:
        parts.append(Text(f"\nGang: {_gang_line(g)}", style="bold"))
        if g.condition is not None:
            c = g.condition
            parts.append(Text(f"{c.type}={c.status} {c.reason}: {c.message}", style="dim"))
        if g.members:
            table = Table(box=None, pad_edge=False)
            for col in ("pod", "phase", "state", "node"):
                table.add_column(col)
            for m in g.members[:MAX_MEMBERS]:
                node = m.node or (f"held: {m.nominated_node}" if m.nominated_node else "-")
                table.add_row(m.name, m.phase, m.state, node)
            parts.append(table)
            if len(g.members) > MAX_MEMBERS:
                parts.append(Text(f"... and {len(g.members) - MAX_MEMBERS} more pods"))
    q = e.queue
    if q is not None:
        parts.append(Text(f"\nQueue: {_queue_title(q)}", style="bold"))
        if q.resources:
            table = Table(box=None, pad_edge=False)
            for col in _QUEUE_HEAD:
                table.add_column(col, justify="left" if col in ("resource", "unit") else "right")
            for r in q.resources:
                table.add_row(*_queue_cells(r))
            parts.append(table)
        parts += [Text(f"parent {_usage(p)}", style="dim") for p in q.parents if p.found]
    take_back = _take_back_lines(e.take_back)
    if take_back:
        parts.append(Text("\nTake-back:", style="bold"))
        parts += [Text(f"• {line}") for line in take_back]
    parts.append(Text("\nEvents (newest first, repeats merged):", style="bold"))
    if e.events:
        table = Table(box=None, pad_edge=False)
        for col in ("last seen", "type", "reason", "count", "object", "message"):
            table.add_column(col, overflow="fold")
        for ev in e.events:
            style = "yellow" if ev.type == "Warning" else ""
            table.add_row(ev.last_seen, Text(ev.type, style=style), ev.reason, str(ev.count),
                          ", ".join(ev.objects), ev.message)  # fmt: skip
        parts.append(table)
    else:
        parts.append(Text("none", style="dim"))
    if e.notes:
        parts.append(Text("\nNotes:", style="bold"))
        parts += [Text(f"• {n}", style="yellow") for n in e.notes]
    console.print(Panel(Group(*parts), title=_title(e), title_align="left"))


def render(e: Explanation, output: str, out: TextIO) -> None:
    """``--output``: ``json``, or ``text`` (rich when ``out`` is a terminal)."""
    if output == "json":
        render_json(e, out)
    elif out.isatty():
        render_rich(e, Console(file=out))
    else:
        render_plain(e, out)
