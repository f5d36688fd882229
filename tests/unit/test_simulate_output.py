"""The simulator's output for big runs: one Gangs row per job, natural sort, ``--summary``,
subtree lines on a parent queue's plot, the time axis unit, byte-identical reruns.

Every run is the real cycle on the in-memory backend; plots are inspected through the
matplotlib figures the plot code builds (captured when it closes them).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from matplotlib.figure import Figure
from rich.console import Console

from scheduler.simulate import plots
from scheduler.simulate.__main__ import main
from scheduler.simulate.engine import SimulationResult, simulate
from scheduler.simulate.ordering import natural_key, natural_sorted
from scheduler.simulate.plots import time_axis, write_plots
from scheduler.simulate.report import gang_summaries, print_report, summary
from scheduler.simulate.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The CLI quiets structlog globally; give other tests their configuration back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _scenario(tmp_path: Path, *, end: str = "5m", at: str = "2m") -> Path:
    """Four 1-GPU nodes under a two-level queue tree named so text sort is wrong:
    ``first`` (2 pods, 1 minute) and ``wide`` (6 pods) have no PodGroup, so wide's pods start
    at 0s and at 1m and two still wait at the end; jobs ``l-1`` .. ``l-13`` wait too."""
    jobs = "\n".join(
        f"  - {{name: l-{i}, namespace: ns, queue: q-{2 if i % 2 else 13}, at: {at},"
        f" pods: {{count: 1, resources: {{nvidia.com/gpu: 1}}}}}}"
        for i in (13, 2, 1, 10, 3)
    )
    text = f"""
name: output
settings: {{cyclePeriod: 10s, end: {end}, takeBack: false, solver: greedy}}
nodes:
  - {{name: n, count: 4, gpus: 1, cpu: 8, memory: 64Gi}}
queues:
  - metadata: {{name: org}}
    spec: {{resources: {{gpu: {{quota: 4, limit: -1}}}}}}
  - metadata: {{name: q-13}}
    spec: {{parentQueue: org, resources: {{gpu: {{quota: 2}}}}}}
  - metadata: {{name: q-2}}
    spec: {{parentQueue: org, resources: {{gpu: {{quota: 2}}}}}}
jobs:
  - {{name: first, namespace: ns, queue: q-2, at: 0s, duration: 1m,
      pods: {{count: 2, resources: {{nvidia.com/gpu: 1}}}}}}
  - {{name: wide, namespace: ns, queue: q-13, at: 0s, duration: 1h,
      pods: {{count: 6, resources: {{nvidia.com/gpu: 1}}}}}}
{jobs}
"""
    path = tmp_path / "output.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> SimulationResult:
    return simulate(load_scenario(_scenario(tmp_path_factory.mktemp("output"))))


def _report(result: SimulationResult, **kwargs: Any) -> str:
    out = io.StringIO()
    print_report(result, Console(file=out, width=220), **kwargs)
    return out.getvalue()


def test_natural_key_orders_numbers_by_value_and_is_total() -> None:
    names = ["l-13", "l-2", "l-1", "l-10", "a-01", "a-1", "b"]
    assert natural_sorted(names) == ["a-01", "a-1", "b", "l-1", "l-2", "l-10", "l-13"]
    assert natural_key("a-01") != natural_key("a-1")
    assert natural_sorted(["x10y2", "x10y10", "x9"]) == ["x9", "x10y2", "x10y10"]


def test_a_job_without_podgroup_is_one_row_with_counts(result: SimulationResult) -> None:
    wide = [g for g in gang_summaries(result) if g.job == "wide"]
    # The precondition that made several rows before: its pods started at different times
    # and some still wait.
    assert len({g.placed_at for g in wide if g.placed_at is not None}) == 2
    assert Counter(g.status for g in wide) == {"running": 4, "waiting": 2}
    lines = [line for line in _report(result).splitlines() if line.startswith("│ ns/wide")]
    assert len(lines) == 1, lines
    assert "ns/wide (6 pods, no PodGroup)" in lines[0]
    assert "4 running, 2 waiting" in lines[0]
    assert "0s..1m" in lines[0], "the Placed column spans the first and last placement"


def test_names_are_listed_in_natural_order(result: SimulationResult) -> None:
    text = _report(result)
    rows = [m.group(1) for m in re.finditer(r"ns/(l-\d+) \(", text)]
    assert rows == ["l-1", "l-2", "l-3", "l-10", "l-13"], "same arrival: natural order of names"
    queue_rows = [m.group(1) for m in re.finditer(r"^│\s+(q-\d+)\s", text, re.M)]
    assert queue_rows[:2] == ["q-2", "q-13"]
    data = summary(result)
    assert [q["name"] for q in data["queues"]] == ["org", "q-2", "q-13"]
    assert list(data["outcomes"]["by_queue"]) == ["q-2", "q-13"]
    assert list(data["timeline"][-1]["allocated_gpu"]) == ["q-2", "q-13"]


def test_summary_prints_only_totals(
    result: SimulationResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _report(result, summary_only=True)
    assert "Gangs (pods) by queue and outcome" in text
    assert "Gangs by outcome and reason" in text
    assert "ns/wide" not in text and "ns/l-1" not in text, "no row per gang"
    assert main([str(_scenario(tmp_path)), "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert main([str(_scenario(tmp_path)), "--json", "--summary"]) == 0
    short = json.loads(capsys.readouterr().out)
    assert not {"gangs", "evictions", "timeline"} & set(short)
    assert short["queues"] == full["queues"]
    # Totals recomputed from the per-gang list of the full run.
    want: dict[str, Counter[str]] = {}
    for g in full["gangs"]:
        want.setdefault(g["queue"], Counter())[g["status"]] += 1
    got = {
        q: Counter({s: c["gangs"] for s, c in row.items()})
        for q, row in short["outcomes"]["by_queue"].items()
    }
    assert got == want
    waiting = [o for o in short["outcomes"]["by_outcome"] if o["status"] == "waiting"]
    assert sum(o["pods"] for o in waiting) == sum(
        g["pods"]["total"] for g in full["gangs"] if g["status"] == "waiting"
    )
    assert short["outcomes"]["total"]["jobs"] == 7  # first, wide, l-1 .. l-13 (5 jobs)


def _figures(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Figures the plot code closes, kept for inspection."""
    seen: list[Figure] = []
    close = plots.plt.close

    def keep(fig: Any = None) -> None:
        if isinstance(fig, Figure):
            seen.append(fig)
        close(fig)

    monkeypatch.setattr(plots.plt, "close", keep)
    return seen


def _line(ax: Any, label: str) -> list[float]:
    return [float(y) for y in next(li for li in ax.lines if li.get_label() == label).get_ydata()]


def test_parent_queue_panel_shows_its_subtree(
    result: SimulationResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = _figures(monkeypatch)
    write_plots(result, tmp_path)
    per_queue = figures[0]
    axes = {ax.get_ylabel().split("\n")[0]: ax for ax in per_queue.axes}
    assert list(axes) == ["org", "q-2", "q-13"], "every queue, in tree order"
    assert "subtree" in axes["org"].get_ylabel()
    org = _line(axes["org"], "allocated")
    kids = [
        a + b
        for a, b in zip(
            _line(axes["q-2"], "allocated"), _line(axes["q-13"], "allocated"), strict=True
        )
    ]
    assert max(org) == 4, "the parent's line is what its subtree holds (org has no pods)"
    assert org == kids
    asked = _line(axes["org"], "allocated + waiting")
    assert max(asked) > max(org), "its subtree's waiting pods count too"


@pytest.mark.parametrize(
    ("span", "unit"),
    [(90, "seconds"), (180, "seconds"), (600, "minutes"), (3 * 3600, "minutes"),
     (10 * 3600, "hours"), (10 * 86400, "days")],
)  # fmt: skip
def test_time_axis_unit_follows_the_span(span: float, unit: str) -> None:
    axis = time_axis(span)
    per_unit = {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86400}[unit]
    assert (axis.unit, axis.seconds, axis.label) == (unit, per_unit, f"simulated time ({unit})")
    assert axis.scale([span]) == [pytest.approx(span / per_unit)]


def test_plots_label_the_unit_of_a_long_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    long_run = simulate(load_scenario(_scenario(tmp_path, end="10h")))
    figures = _figures(monkeypatch)
    write_plots(long_run, tmp_path / "plots")
    labels = {ax.get_xlabel() for fig in figures for ax in fig.axes if ax.get_xlabel()}
    assert labels == {"simulated time (hours)"}
    x = figures[1].axes[0].lines[0].get_xdata()
    assert max(x) == pytest.approx(10.0)


_WALL = re.compile(r"\(\d+\.\d+s\)")


def _masked(text: str) -> str:
    """The only wall-clock figure in the report: the run time in the header line."""
    first, _, rest = text.partition("\n")
    return _WALL.sub("(WALL)", first, count=1) + "\n" + rest


def test_same_scenario_prints_the_same_bytes(tmp_path: Path) -> None:
    path = _scenario(tmp_path, at="90s")
    reports = [_masked(_report(simulate(load_scenario(path)))) for _ in range(2)]
    assert reports[0] == reports[1]

    def run(seed: str, *extra: str) -> bytes:
        env = {**os.environ, "PYTHONHASHSEED": seed, "COLUMNS": "200"}
        done = subprocess.run(
            [sys.executable, "-m", "scheduler.simulate", str(path), "--no-progress", *extra],
            capture_output=True,
            env=env,
            cwd=ROOT,
            timeout=120,
            check=True,
        )
        return done.stdout

    first, second = run("0"), run("4242")
    assert _masked(first.decode()) == _masked(second.decode())
    assert b"ns/l-13" in first
    as_json = [json.loads(run(seed, "--json")) for seed in ("1", "977")]
    for data in as_json:
        data.pop("wall_seconds")
    assert as_json[0] == as_json[1]
    assert json.dumps(as_json[0]) == json.dumps(as_json[1]), "same key order too"
