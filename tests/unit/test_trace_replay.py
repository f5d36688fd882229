"""Trace replay: a slice of the openb trace, checked by an independent placements checker.

The checker reads the CSVs with the csv module and the placements file with json; it shares
no code with the replay engine. Only the arrival order (shuffle + inflation) is taken from
``scheduler.simulate.trace``, because that order *is* the definition the ratios refer to.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from scheduler.simulate.replay import (
    CHECKPOINTS,
    ReplaySettings,
    add_trace_arguments,
    replay,
    run_trace,
)
from scheduler.simulate.trace import (
    TraceError,
    arrival_order,
    inflate,
    load_nodes,
    load_pods,
    openb_dir,
    parse_mix,
    shuffle_pods,
)

OPENB = openb_dir()

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase\n"


def _slice_files(tmp_path: Path) -> tuple[Path, Path]:
    """A slice of the openb trace: up to 3 nodes of every shape and the first 400 pods."""
    nodes_out, pods_out = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    assert (OPENB / "openb_node_list_gpu_node.csv").is_file(), (
        f"the openb trace is missing from {OPENB}; set KAI_OPENB_DIR to its folder"
    )
    rows = list(csv.DictReader((OPENB / "openb_node_list_gpu_node.csv").open()))
    by_shape: dict[tuple[str, ...], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        by_shape[(r["cpu_milli"], r["memory_mib"], r["gpu"], r["model"])].append(r)
    picked = [r for group in by_shape.values() for r in group[:3]]
    nodes_out.write_text(
        NODE_HEADER
        + "".join(
            f"{r['sn']},{r['cpu_milli']},{r['memory_mib']},{r['gpu']},{r['model']}\n"
            for r in picked
        )
    )
    pod_lines = (OPENB / "openb_pod_list_default.csv").read_text().splitlines()
    pods_out.write_text("\n".join(pod_lines[:401]) + "\n")
    return nodes_out, pods_out


def _args(nodes: Path, pods: Path, **extra: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_trace_arguments(parser)
    argv = ["--trace", "openb", "--nodes", str(nodes), "--pods", str(pods)]
    for k, v in extra.items():
        flag = "--" + k.replace("_", "-")
        argv += [flag] if v is True else [flag, str(v)]
    return parser.parse_args(argv)


def check_placements(
    nodes_csv: Path, pods: dict[str, dict[str, Any]], lines: list[str]
) -> list[str]:
    """Independent checker: capacity per node and device, model constraints, uniqueness."""
    nodes = {r["sn"]: r for r in csv.DictReader(nodes_csv.open())}
    problems: list[str] = []
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    dev: dict[tuple[str, int], int] = defaultdict(int)
    seen: set[str] = set()
    for line in lines:
        rec = json.loads(line)
        name, node = rec["pod"], rec["node"]
        if name in seen:
            problems.append(f"{name} listed twice")
        seen.add(name)
        if name not in pods:
            problems.append(f"{name} is not an arrived pod")
            continue
        if node not in nodes:
            problems.append(f"{name} on unknown node {node}")
            continue
        pod, n = pods[name], nodes[node]
        cpu[node] += int(pod["cpu_milli"])
        mem[node] += int(pod["memory_mib"])
        gpus = {int(k): int(v) for k, v in rec["gpus"].items()}
        want = int(pod["num_gpu"])
        if len(gpus) != want:
            problems.append(f"{name} got {len(gpus)} devices, asked {want}")
        for index, milli in gpus.items():
            if not 0 <= index < int(n["gpu"]):
                problems.append(f"{name} on missing device {node}/{index}")
            if milli != int(pod["gpu_milli"]):
                problems.append(f"{name} got {milli} milli, asked {pod['gpu_milli']}")
            dev[(node, index)] += milli
        spec = {s for s in (pod.get("gpu_spec") or "").split("|") if s}
        if want and spec and n["model"] not in spec:
            problems.append(f"{name} needs {spec} but {node} is {n['model']}")
    for node, used in cpu.items():
        if used > int(nodes[node]["cpu_milli"]):
            problems.append(f"{node} CPU over capacity")
    for node, used in mem.items():
        if used > int(nodes[node]["memory_mib"]):
            problems.append(f"{node} memory over capacity")
    for (node, index), used in dev.items():
        if used > 1000:
            problems.append(f"{node}/{index} over 1000 milli")
    return problems


def _ratios_from_file(
    lines: list[str], arrivals: list[dict[str, Any]], capacity: int, batch: int
) -> dict[str, float | None]:
    """Allocation % at the end of the cycle in which arrivals first reach each checkpoint."""
    per_cycle: dict[int, int] = defaultdict(int)
    by_name = {p["name"]: p for p in arrivals}
    for line in lines:
        rec = json.loads(line)
        p = by_name[rec["pod"]]
        per_cycle[rec["cycle"]] += int(p["num_gpu"]) * int(p["gpu_milli"])
    out: dict[str, float | None] = {}
    arrived = 0
    crossing: dict[int, int] = {}
    for i, p in enumerate(arrivals):
        arrived += int(p["num_gpu"]) * int(p["gpu_milli"])
        for c in CHECKPOINTS:
            if c not in crossing and arrived * 100 >= c * capacity:
                crossing[c] = i // batch
    for c in CHECKPOINTS:
        if c not in crossing:
            out[str(c)] = None
            continue
        allocated = sum(v for cyc, v in per_cycle.items() if cyc <= crossing[c])
        out[str(c)] = round(100 * allocated / capacity, 2)
    return out


@pytest.mark.parametrize(
    ("batch", "engine"),
    [(1, "arrays"), (16, "arrays"), (1, "greedy"), (16, "greedy"), (16, "cycle"), (16, "auto")],
)
def test_replay_slice_is_valid_and_ratios_match(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], batch: int, engine: str
) -> None:
    nodes_csv, pods_csv = _slice_files(tmp_path)
    out = tmp_path / "placements.jsonl"
    args = _args(
        nodes_csv,
        pods_csv,
        shuffle_seed=7,
        inflate=1.3,
        batch=batch,
        drop_unplaced=True,
        placements=out,
        mix="gpuspec=0.3,gpushare=0.5",
        engine=engine,
        json=True,
    )
    assert run_trace(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    lines = out.read_text().splitlines()

    nodes = load_nodes(nodes_csv)
    ordered = arrival_order(
        load_pods(pods_csv),
        nodes,
        seed=7,
        inflate_to=1.3,
        mix=parse_mix("gpuspec=0.3,gpushare=0.5"),
    )
    arrivals: list[dict[str, Any]] = [
        {
            "name": p.name,
            "cpu_milli": p.cpu_milli,
            "memory_mib": p.memory_mib,
            "num_gpu": p.num_gpu,
            "gpu_milli": p.gpu_milli,
            "gpu_spec": "|".join(p.gpu_spec),
        }
        for p in ordered
    ]
    assert any(a["gpu_spec"] for a in arrivals), "the slice must exercise model constraints"
    problems = check_placements(nodes_csv, {str(a["name"]): a for a in arrivals}, lines)
    assert problems == []
    assert summary["pods_placed"] == len(lines)
    assert summary["pods_placed"] + summary["pods_unplaced"] == len(arrivals)
    assert summary["pods_unplaced"] > 0, "inflation to 130% must saturate the slice"
    capacity = sum(int(r["gpu"]) for r in csv.DictReader(nodes_csv.open())) * 1000
    assert (
        _ratios_from_file(lines, arrivals, capacity, batch)
        == summary["allocation_ratio_at_arrived"]
    )
    assert summary["allocation_ratio_at_arrived"]["130"] is not None
    # The LP ceiling stands beside every ratio, and no placement is above it.
    ceilings = summary["lp_ceiling_at_arrived"]
    reached = {k: v for k, v in summary["allocation_ratio_at_arrived"].items() if v is not None}
    assert ceilings.keys() == reached.keys()
    assert all(reached[k] <= ceilings[k] for k in reached)


def test_checker_catches_broken_placements(tmp_path: Path) -> None:
    """The checker itself must be able to fail."""
    nodes_csv = tmp_path / "nodes.csv"
    nodes_csv.write_text(NODE_HEADER + "a,4000,1000,1,T4\n")
    pods = {
        "x": {"cpu_milli": 3000, "memory_mib": 10, "num_gpu": 1, "gpu_milli": 600, "gpu_spec": ""},
        "y": {
            "cpu_milli": 3000,
            "memory_mib": 10,
            "num_gpu": 1,
            "gpu_milli": 600,
            "gpu_spec": "A10",
        },
    }
    lines = [
        json.dumps({"pod": "x", "node": "a", "gpus": {"0": 600}, "cycle": 0}),
        json.dumps({"pod": "y", "node": "a", "gpus": {"0": 600}, "cycle": 0}),
        json.dumps({"pod": "x", "node": "a", "gpus": {"1": 600}, "cycle": 0}),
    ]
    problems = " | ".join(check_placements(nodes_csv, pods, lines))
    for expected in (
        "listed twice",
        "CPU over capacity",
        "over 1000 milli",
        "missing device",
        "needs",
    ):
        assert expected in problems


def test_drop_unplaced_changes_only_the_label(tmp_path: Path) -> None:
    """Nothing departs, so keeping unplaced pods waiting places exactly the same pods."""
    nodes_csv, pods_csv = _slice_files(tmp_path)
    nodes = load_nodes(nodes_csv)
    pods = inflate(shuffle_pods(load_pods(pods_csv), 3), 1.2, 1000 * sum(n.gpus for n in nodes), 3)
    a = replay(nodes, pods, ReplaySettings(batch=8, drop_unplaced=True))
    b = replay(nodes, pods, ReplaySettings(batch=8, drop_unplaced=False))
    assert a.placements == b.placements
    assert sorted(a.dropped) == sorted(b.dropped) and a.dropped


def test_frag_policy_beats_bestfit_on_a_fractional_mix(tmp_path: Path) -> None:
    nodes_csv, pods_csv = _slice_files(tmp_path)
    nodes = load_nodes(nodes_csv)
    cap = 1000 * sum(n.gpus for n in nodes)
    pods = arrival_order(load_pods(pods_csv), nodes, seed=11, inflate_to=1.3)
    frag = replay(nodes, pods, ReplaySettings(policy="frag"))
    best = replay(nodes, pods, ReplaySettings(policy="bestfit"))
    assert frag.allocated_milli >= best.allocated_milli
    assert frag.allocated_milli <= cap


def test_bad_trace_input_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes_csv = tmp_path / "nodes.csv"
    nodes_csv.write_text(NODE_HEADER + "a,lots,1000,1,T4\n")
    pods_csv = tmp_path / "pods.csv"
    pods_csv.write_text(POD_HEADER + "p,1000,10,1,1500,,LS,Running\n")
    with pytest.raises(TraceError, match="cpu_milli"):
        load_nodes(nodes_csv)
    with pytest.raises(TraceError, match="gpu_milli"):
        load_pods(pods_csv)
    with pytest.raises(TraceError, match="--mix"):
        parse_mix("gpushare=2")
    assert run_trace(_args(nodes_csv, pods_csv)) == 2
    assert "cpu_milli" in capsys.readouterr().err


def test_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes_csv, pods_csv = _slice_files(tmp_path)
    assert run_trace(_args(nodes_csv, pods_csv, shuffle_seed=1, inflate=1.1)) == 0
    out = capsys.readouterr().out
    assert "allocation ratio" in out and "110" in out


@pytest.mark.parametrize("engine", ["greedy", "cycle"])
def test_live_engines_are_close_to_the_array_engine(tmp_path: Path, engine: str) -> None:
    """The live cycle (or its greedy) with the fragmentation scorer and the vectorised
    replay agree closely; all three beat plain binpack through the live cycle."""
    nodes_csv, pods_csv = _slice_files(tmp_path)
    nodes = load_nodes(nodes_csv)
    pods = arrival_order(load_pods(pods_csv), nodes, seed=5, inflate_to=1.3)
    fast = replay(nodes, pods, ReplaySettings(batch=32))
    live = replay(nodes, pods, ReplaySettings(batch=32), engine=engine)  # type: ignore[arg-type]
    assert live.placements and fast.placements
    assert abs(live.allocated_milli - fast.allocated_milli) <= 0.03 * fast.capacity_milli
    # every pod is accounted for exactly once: placed or dropped
    names = [pl.pod for pl in live.placements] + live.dropped
    assert sorted(names) == sorted(p.name for p in pods)


def test_cycle_engine_rejects_the_fgd_baseline(tmp_path: Path) -> None:
    nodes_csv, _ = _slice_files(tmp_path)
    nodes = load_nodes(nodes_csv)
    with pytest.raises(ValueError, match="--engine cycle supports --policy frag or bestfit"):
        replay(nodes, [], ReplaySettings(policy="fgd"), engine="cycle")


def test_share_gap_bound_is_tight_on_a_single_size_workload() -> None:
    """Ten 1-GPU nodes, thirteen 810-milli pods: any scheduler ends at 81 %, and so do we."""
    from scheduler.bench.openb import share_gap_bound
    from scheduler.simulate.trace import TraceNode, TracePod

    nodes = [TraceNode(f"n{i}", 8000, 8192, 1, "T4") for i in range(10)]
    pods = [TracePod(f"p{i}", 1000, 1024, 1, 810) for i in range(13)]
    assert share_gap_bound(pods, 10_000) == pytest.approx(81.0)
    result = replay(nodes, pods, ReplaySettings())
    assert result.allocated_milli == 8100
    # Small pods can fill the gaps, and the bound says so.
    filler = [TracePod(f"s{i}", 100, 64, 1, 190) for i in range(10)]
    assert share_gap_bound(pods + filler, 10_000) == pytest.approx(100.0)


def test_joint_bound_caps_what_a_later_target_allows() -> None:
    """Reaching 95 % later strands at most 500 thousandths, so at most 500 / 190 of the
    810-milli pods can have been placed earlier: 21.3 % instead of 81 %."""
    from scheduler.bench.openb import share_gap_bound
    from scheduler.simulate.trace import TracePod

    pods = [TracePod(f"p{i}", 1000, 1024, 1, 810) for i in range(13)]
    assert share_gap_bound(pods, 10_000, pods, 95.0) == pytest.approx(810 * 500 / 190 / 100)
    assert share_gap_bound(pods, 10_000, pods, 0.0) == pytest.approx(81.0)


def test_paper_bestfit_scores_free_cpu_and_gpu_and_draws_among_equals() -> None:
    """The FGD paper simulator's BestFit: one integer score of free CPU and total free GPU
    after the pod, a random node among the equal best, the tightest device for a share."""
    from scheduler.simulate.trace import TraceNode, TracePod

    nodes = [
        TraceNode("a", 96_000, 10**6, 2, "V100"),
        TraceNode("b", 32_000, 10**6, 2, "V100"),
        TraceNode("c", 32_000, 10**6, 2, "V100"),
    ]

    def pod(name: str, cpu: int, milli: int) -> TracePod:
        return TracePod(name, cpu, 1024, 1, milli)

    # p1: b and c tie (same free CPU and GPU after it) and beat a (more CPU left); p2 then
    # prefers the node p1 went to (less GPU left) and its used device (tighter).
    pods = [pod("p1", 8_000, 600), pod("p2", 8_000, 300)]
    chosen: set[str] = set()
    for seed in range(12):
        out = replay(nodes, pods, ReplaySettings(policy="paper-bestfit", tie_seed=seed))
        first, second = out.placements
        assert first.node in ("b", "c")
        assert second.node == first.node
        assert second.gpus == ((first.gpus[0][0], 300),)
        chosen.add(first.node)
        again = replay(nodes, pods, ReplaySettings(policy="paper-bestfit", tie_seed=seed))
        assert again.placements == out.placements
    assert chosen == {"b", "c"}


def test_auto_engine_runs_the_live_cycle_where_affordable() -> None:
    from scheduler.simulate.replay import auto_engine

    assert auto_engine(64, "frag") == "cycle"
    assert auto_engine(64, "bestfit") == "cycle"
    assert auto_engine(1, "frag") == "greedy"
    assert auto_engine(1, "bestfit") == "arrays"
    assert auto_engine(64, "fgd") == "arrays"
    assert auto_engine(64, "paper-bestfit") == "arrays"


def test_replay_reports_progress_after_every_cycle(tmp_path: Path) -> None:
    nodes_csv, pods_csv = _slice_files(tmp_path)
    nodes = load_nodes(nodes_csv)
    pods = arrival_order(load_pods(pods_csv), nodes, seed=3, inflate_to=1.1)
    seen: list[tuple[float, float]] = []
    replay(nodes, pods, ReplaySettings(batch=16), progress=lambda d, t: seen.append((d, t)))
    assert len(seen) == -(-len(pods) // 16)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1] == (len(pods), len(pods))


@pytest.mark.parametrize(("engine", "batch"), [("greedy", 1), ("cycle", 2)])
def test_hold_stranding_reaches_the_live_engines(engine: str, batch: int) -> None:
    """``--hold-stranding`` turns on ``placement.holdStrandingShares`` in the live engines:
    14 whole GPUs of 16 taken, then two 810 shares, which only idle devices could take
    (12.5 % free, nothing in the mix fits the 190 they would leave). Held and dropped with
    the flag, placed without it."""
    from scheduler.simulate.replay import settings_from_args
    from scheduler.simulate.trace import TraceNode, TracePod

    nodes = [TraceNode(n, 64_000, 10**6, 8, "V100") for n in ("a", "b")]
    pods = [TracePod(f"w{i}", 1000, 1024, 1, 1000) for i in range(14)]
    pods += [TracePod(f"s{i}", 1000, 1024, 1, 810) for i in range(2)]

    def placed(hold: bool) -> list[str]:
        settings = ReplaySettings(batch=batch, hold_stranding=hold)
        result = replay(nodes, pods, settings, engine=engine)  # type: ignore[arg-type]
        return sorted(pl.pod for pl in result.placements)

    assert placed(False) == sorted(p.name for p in pods)
    assert placed(True) == sorted(f"w{i}" for i in range(14))
    parser = argparse.ArgumentParser()
    add_trace_arguments(parser)
    assert settings_from_args(parser.parse_args(["--hold-stranding"])).hold_stranding
    assert not settings_from_args(parser.parse_args([])).hold_stranding


def test_hold_stranding_is_refused_where_it_is_not_implemented(tmp_path: Path) -> None:
    nodes_csv, pods_csv = _slice_files(tmp_path)
    nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)
    with pytest.raises(ValueError, match="--hold-stranding needs --policy frag"):
        replay(nodes, pods, ReplaySettings(hold_stranding=True), engine="arrays")
    with pytest.raises(ValueError, match="--hold-stranding needs --policy frag"):
        replay(nodes, pods, ReplaySettings(policy="bestfit", hold_stranding=True), engine="cycle")
