"""Showing the doctor's results: a rich table on a terminal, plain lines when the output is a
pipe or a file (``--output table``), or one JSON document (``--output json``).

The JSON shape (stable, for scripts)::

    {"status": "ok|warn|fail", "exitCode": 0|1,
     "counts": {"ok": N, "warn": N, "fail": N},
     "checks": [{"name", "title", "status", "message", "fix", "details": [...],
                 "source"?}, ...]}
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from scheduler.doctor.result import CheckResult, Status, exit_code, worst

__all__ = ["OUTPUTS", "render", "render_json", "render_plain", "render_table", "to_json"]

OUTPUTS = ("table", "json")

_STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}


def to_json(results: Sequence[CheckResult]) -> dict[str, Any]:
    """The JSON document of a run (see the module docstring)."""
    counts = Counter(str(r.status) for r in results)
    return {
        "status": str(worst(results)),
        "exitCode": exit_code(results),
        "counts": {str(s): counts.get(str(s), 0) for s in Status},
        "checks": [r.to_json() for r in results],
    }


def render_json(results: Sequence[CheckResult], out: TextIO) -> None:
    """Write the JSON document."""
    json.dump(to_json(results), out, indent=2)
    out.write("\n")


def _summary(results: Sequence[CheckResult]) -> str:
    counts = Counter(r.status for r in results)
    parts = ", ".join(f"{counts.get(s, 0)} {s}" for s in Status)
    return f"kai-scheduler doctor: {worst(results)} ({parts})"


def render_plain(results: Sequence[CheckResult], out: TextIO) -> None:
    """One line per check (``[fail] crds: ...``), its fix and details indented below."""
    width = max((len(r.name) for r in results), default=0)
    for r in results:
        out.write(f"[{r.status}]{' ' * (4 - len(r.status))} {r.name:<{width}}  {r.message}\n")
        pad = " " * (8 + width)
        if r.fix:
            out.write(f"{pad}fix: {r.fix}\n")
        for line in r.details:
            out.write(f"{pad}- {line}\n")
    out.write(_summary(results) + "\n")


def render_table(results: Sequence[CheckResult], console: Console) -> None:
    """A rich table: status, check, finding (details below it), fix."""
    table = Table(title="kai-scheduler doctor", show_lines=True, expand=True)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("finding", ratio=3)
    table.add_column("fix", ratio=2)
    for r in results:
        finding = Text(r.message)
        for line in r.details:
            finding.append(f"\n• {line}", style="dim")
        table.add_row(Text(str(r.status), style=_STYLE[r.status]), r.title, finding, r.fix)
    console.print(table)
    console.print(Text(_summary(results), style=_STYLE[worst(results)]))


def render(results: Sequence[CheckResult], output: str, out: TextIO) -> None:
    """``output`` is ``json`` or ``table`` (rich on a terminal, plain lines otherwise)."""
    if output == "json":
        render_json(results, out)
    elif out.isatty():
        render_table(results, Console(file=out))
    else:
        render_plain(results, out)
