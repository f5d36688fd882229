"""Trace replay: ``--slice START:END`` (by arrival index or creation time) and ``--out`` plots.

Pod lists are small CSVs written here (creation times one hour apart), plus one slice of the
real openb list counted independently with the csv module.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from scheduler.simulate import replay_plots
from scheduler.simulate.replay import ReplaySettings, add_trace_arguments, replay, run_trace
from scheduler.simulate.trace import TraceError, load_nodes, load_pods, openb_dir
from scheduler.simulate.trace_slice import parse_slice, slice_pods

HOUR = 3600


def _files(tmp_path: Path, pods: int = 40, *, times: bool = True) -> tuple[Path, Path]:
    """Four nodes (2 x 2 GPUs, 2 x 4 GPUs) and ``pods`` pods created an hour apart: whole,
    fractional and CPU-only in turn, named p-0 .. p-N."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "a-0,32000,131072,2,T4\na-1,32000,131072,2,T4\n"
        "b-0,64000,262144,4,V100M32\nb-1,64000,262144,4,V100M32\n"
    )
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase"
    rows = [header + (",creation_time" if times else "")]
    shapes = [(1, 1000), (1, 300), (0, 0), (1, 600)]
    for i in range(pods):
        n, milli = shapes[i % len(shapes)]
        row = f"p-{i},2000,4096,{n},{milli},,LS,Running"
        rows.append(row + (f",{i * HOUR}" if times else ""))
    pod_list = tmp_path / "pods.csv"
    pod_list.write_text("\n".join(rows) + "\n")
    return nodes, pod_list


def _args(nodes: Path, pods: Path, **extra: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_trace_arguments(parser)
    argv = ["--trace", "openb", "--nodes", str(nodes), "--pods", str(pods), "--engine", "arrays"]
    for k, v in extra.items():
        flag = "--" + k.replace("_", "-")
        argv += [flag] if v is True else [flag, str(v)]
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("text", "by", "start", "end"),
    [
        ("10:20", "index", 10, 20),
        (":5", "index", None, 5),
        ("7:", "index", 7, None),
        ("-5:", "index", -5, None),
        ("0:7d", "time", 0, 7 * 86400),
        ("12h:1d12h", "time", 12 * HOUR, 36 * HOUR),
        (":90m", "time", None, 90 * 60),
        ("1.5h:", "time", 1.5 * HOUR, None),
    ],
)
def test_parse_slice(text: str, by: str, start: float | None, end: float | None) -> None:
    part = parse_slice(text)
    assert (part.by, part.start, part.end) == (by, start, end)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("100", "is not START:END"),
        ("a:b", "is not a whole number"),
        ("1:2:3", "is not START:END"),
        (":", "whole list"),
        ("20:10", "END must come after START"),
        ("1d:5", "is not a time with a unit"),
        ("3w:", "is not a whole number"),
    ],
)
def test_bad_slice_names_the_flag_and_the_fix(text: str, says: str) -> None:
    with pytest.raises(TraceError) as e:
        parse_slice(text)
    assert "--slice" in str(e.value) and says in str(e.value)
    assert "e.g. --slice" in str(e.value) or "give START" in str(e.value)


def test_slice_by_index_and_by_time(tmp_path: Path) -> None:
    _, pod_list = _files(tmp_path)
    pods = load_pods(pod_list)
    assert [p.name for p in slice_pods(pods, parse_slice("10:13"))] == ["p-10", "p-11", "p-12"]
    assert [p.name for p in slice_pods(pods, parse_slice("-2:"))] == ["p-38", "p-39"]
    # Creation times are i hours: [2h, 5h) holds pods 2, 3, 4.
    assert [p.name for p in slice_pods(pods, parse_slice("2h:5h"))] == ["p-2", "p-3", "p-4"]
    assert len(slice_pods(pods, parse_slice("1d:"))) == 40 - 24
    with pytest.raises(TraceError, match=r"selects no pods; the pod list has 40 \(indices 0\.\.39"):
        slice_pods(pods, parse_slice("100:200"))
    with pytest.raises(TraceError) as e:
        slice_pods(pods, parse_slice("30d:40d"))
    # The message says which times the list has, in the units --slice takes (39 h = 1d15h).
    assert "selects no pods" in str(e.value) and "created 0s to 1d15h" in str(e.value)


def test_time_slice_needs_creation_times(tmp_path: Path) -> None:
    _, pod_list = _files(tmp_path, times=False)
    with pytest.raises(TraceError, match="no creation_time column; use arrival indices"):
        slice_pods(load_pods(pod_list), parse_slice("0:1d"))


def test_cli_replays_only_the_slice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pod_list = _files(tmp_path)
    out = tmp_path / "placements.jsonl"
    assert run_trace(_args(nodes, pod_list, slice="5:15", placements=out, json=True)) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pods_arrived"] == 10
    assert summary["slice"] == {"slice": "5:15", "by": "index", "start": 5, "end": 15}
    placed = {json.loads(line)["pod"] for line in out.read_text().splitlines()}
    assert placed and placed <= {f"p-{i}" for i in range(5, 15)}
    # Inflation applies to the slice: copies of its pods only.
    assert run_trace(_args(nodes, pod_list, slice="0:4h", inflate=2, json=True)) == 0
    inflated = json.loads(capsys.readouterr().out)
    assert inflated["pods_arrived"] > 4 and inflated["arrived_pct"] >= 200


def test_cli_bad_slice_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pod_list = _files(tmp_path)
    assert run_trace(_args(nodes, pod_list, slice="50:60")) == 2
    err = capsys.readouterr().err
    assert "--slice 50:60 selects no pods" in err and "Traceback" not in err


def test_openb_time_slice_matches_an_independent_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pod_list = openb_dir() / "openb_pod_list_default.csv"
    assert pod_list.is_file(), f"the openb trace is missing from {openb_dir()}"
    with pod_list.open() as f:
        want = sum(
            1 for r in csv.DictReader(f) if 120 * 86400 <= int(r["creation_time"]) < 122 * 86400
        )
    assert want > 0
    nodes = openb_dir() / "openb_node_list_gpu_node.csv"
    assert run_trace(_args(nodes, pod_list, slice="120d:122d", json=True)) == 0
    assert json.loads(capsys.readouterr().out)["pods_arrived"] == want


def test_timeline_accounts_every_gpu(tmp_path: Path) -> None:
    nodes_csv, pod_list = _files(tmp_path, pods=60)
    nodes = load_nodes(nodes_csv)
    pods = load_pods(pod_list)
    for engine in ("arrays", "greedy"):
        result = replay(nodes, pods, ReplaySettings(batch=4), engine=engine)  # type: ignore[arg-type]
        assert len(result.timeline) == result.cycles == 15
        for s in result.timeline:
            assert s.idle_milli + s.fragment_milli == result.capacity_milli - s.allocated_milli
        last = result.timeline[-1]
        assert last.pods_arrived == 60 and last.allocated_milli == result.allocated_milli
        assert last.unplaced_pods == len(result.dropped) > 0, "the list overfills 12 GPUs"
        assert last.fragment_milli > 0, "fractional pods leave parts of devices free"
        assert [s.pods_arrived for s in result.timeline] == list(range(4, 61, 4))


def test_out_writes_the_replay_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    figures: list[Figure] = []
    close = replay_plots.plt.close

    def keep(fig: Any = None) -> None:
        if isinstance(fig, Figure):
            figures.append(fig)
        close(fig)

    monkeypatch.setattr(replay_plots.plt, "close", keep)
    nodes, pod_list = _files(tmp_path, pods=60)
    plots = tmp_path / "plots"
    args = _args(nodes, pod_list, slice=":48", drop_unplaced=True, out=plots, json=True)
    assert run_trace(args) == 0
    summary = json.loads(capsys.readouterr().out)
    names = [Path(p).name for p in summary["plots"]]
    assert names == ["replay_allocation.png", "replay_unallocated_gpu.png", "replay_pending.png"]
    for p in summary["plots"]:
        content = Path(p).read_bytes()
        assert content.startswith(b"\x89PNG\r\n\x1a\n") and len(content) > 10_000, p
    assert {ax.get_xlabel() for fig in figures for ax in fig.axes if ax.get_xlabel()} == {
        "pods arrived"
    }
    allocation = figures[0].axes[0]
    allocated = next(li for li in allocation.lines if li.get_label() == "allocated")
    assert max(allocated.get_ydata()) == pytest.approx(
        summary["allocated_pct"] / 100 * 12, abs=0.01
    )
    pending = figures[2].axes[0].lines[0].get_ydata()
    assert pending[-1] == summary["pods_unplaced"] > 0
    assert "dropped" in figures[2].axes[0].get_title()


def test_out_to_an_unwritable_place_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pod_list = _files(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert run_trace(_args(nodes, pod_list, out=blocker / "plots")) == 2
    assert "--out" in capsys.readouterr().err
