"""The README's first command: the quickstart scenario, its outcome and its outputs.

Runs the real cycle (fair share, solver, explain) on the in-memory backend.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from scheduler.cluster.pod import PodPhase
from scheduler.explain import (
    GANG_DOES_NOT_FIT,
    INSUFFICIENT_ON_ONE_NODE,
    NO_MATCHING_NODE,
    NODE_TOO_SMALL,
)
from scheduler.simulate.engine import SimulationResult, simulate
from scheduler.simulate.report import gang_summaries, summary
from scheduler.simulate.scenario import load_scenario


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The CLI quiets structlog globally; give other tests their configuration back."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "simulate" / "quickstart.yaml"
#: Reasons that mean "not enough free capacity right now" (what the waiting gangs hit).
CAPACITY_CODES = {INSUFFICIENT_ON_ONE_NODE, GANG_DOES_NOT_FIT}


@pytest.fixture(scope="module")
def result() -> SimulationResult:
    started = time.perf_counter()
    res = simulate(load_scenario(QUICKSTART))
    assert time.perf_counter() - started < 5.0, "the quickstart must stay quick"
    return res


def test_quickstart_outcome(result: SimulationResult) -> None:
    gangs = {g.gang: g for g in gang_summaries(result)}
    assert result.end_time == 40 * 60 and result.stopped == "end"
    assert not result.scenario.settings.placement.take_back and not result.cluster.evictions

    pretrain = gangs["team-a/pretrain"]
    assert (pretrain.status, pretrain.placed_at) == ("running", 0.0)
    # nodeSelector pins it to the H100 node.
    nodes = {result.cluster.pods[f"team-a/pretrain-{i}"].pod.node_name for i in range(4)}
    assert nodes == {"h100"}

    sweep = [g for g in gangs.values() if g.job == "sweep"]
    assert len(sweep) == 8
    assert all(g.implicit and g.status == "finished" and g.placed_at == 0.0 for g in sweep)

    # team-b's gang waits (cluster full) and runs when the sweep frees 8 GPUs at 10m.
    finetune = gangs["team-b/finetune"]
    assert finetune.arrived_at == 120.0
    assert finetune.status == "running"
    assert finetune.placed_at == 600.0
    record = result.cluster.gangs["team-b/finetune"]
    assert record.first_reason is not None
    assert record.first_reason[0] in CAPACITY_CODES, record.first_reason
    assert "GPU" in record.first_reason[1]
    assert record.waited_cycles >= 1

    # big-train needs all 16 GPUs and still waits at the end, with the scheduler's reason.
    big = gangs["team-a/big-train"]
    assert big.status == "waiting" and big.placed_at is None
    assert big.reason_code in CAPACITY_CODES, (big.reason_code, big.reason)
    assert big.reason_code not in (NO_MATCHING_NODE, NODE_TOO_SMALL)
    assert big.reason


def test_gangs_are_never_partly_bound(result: SimulationResult) -> None:
    for record in result.cluster.gangs.values():
        # Pods evicted and replaced (none here: taking back is off) would not count.
        uids = [u for u in record.pod_uids if result.cluster.pods[u].replaced_by is None]
        pods = [result.cluster.pods[uid].pod for uid in uids]
        started = [p for p in pods if p.bound]
        assert not started or len(started) >= record.gang.min_member, record.gang.key
        # No elastic extras here: every pod of a gang was bound in one and the same cycle.
        bound_at = {result.cluster.pods[uid].bound_at for uid in uids}
        assert len(bound_at) == 1, (record.gang.key, bound_at)
        if record.gang.key == "team-a/big-train":
            assert all(p.phase == PodPhase.PENDING and not p.bound for p in pods)


def test_queue_numbers_at_the_end(result: SimulationResult) -> None:
    queues = {q["name"]: q for q in summary(result)["queues"]}
    assert queues["team-a"]["allocated"]["gpu"] == 8  # pretrain
    assert queues["team-b"]["allocated"]["gpu"] == 8  # finetune
    assert queues["team-a"]["requested"]["gpu"] == 24  # + big-train waiting for 16
    assert queues["research"]["allocated"]["gpu"] == 16
    assert queues["team-a"]["peak_allocated_gpu"] == 16  # pretrain + sweep at the start
    for name in ("team-a", "team-b"):
        assert queues[name]["fair_share"]["gpu"] >= 8  # at least the quota when it asks
    # Over time: team-a held 16 GPUs before 10m, then 8; team-b 0 then 8.
    before = next(s for s in result.samples if s.time == 300.0)
    after = next(s for s in result.samples if s.time >= 600.0)
    assert before.allocated_gpu.get("team-a") == 16_000 and not before.allocated_gpu.get("team-b")
    assert after.allocated_gpu.get("team-b") == 8_000


def test_cli_prints_the_table_json_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from scheduler.simulate.__main__ import main

    assert main([str(QUICKSTART)]) == 0
    out = capsys.readouterr().out
    for text in ("team-b/finetune", "waited 8m", "big-train", "waiting", "Fair share"):
        assert text in out, text

    plots = tmp_path / "plots"
    assert main([str(QUICKSTART), "--json", "--out", str(plots)]) == 0
    data = json.loads(capsys.readouterr().out)
    by_gang = {g["gang"]: g for g in data["gangs"]}
    assert by_gang["team-b/finetune"]["placed_at"] == 600.0
    assert by_gang["team-b/finetune"]["waited_seconds"] == 480.0
    assert by_gang["team-a/big-train"]["status"] == "waiting"
    assert by_gang["team-a/big-train"]["reason_code"] in CAPACITY_CODES
    assert len(data["plots"]) == 2
    for name in data["plots"]:
        png = Path(name)
        content = png.read_bytes()
        assert content.startswith(b"\x89PNG\r\n\x1a\n"), png
        assert len(content) > 10_000, f"{png} looks empty ({len(content)} bytes)"


def test_plots_are_only_written_with_out(tmp_path: Path) -> None:
    from scheduler.simulate.__main__ import main

    assert main([str(QUICKSTART), "--json"]) == 0
    assert not list(tmp_path.iterdir())
    assert not list(Path.cwd().glob("*.png"))


def test_readme_command_runs_the_quickstart() -> None:
    """``kai-scheduler simulate examples/simulate/quickstart.yaml`` via the real entry point."""
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler", "simulate", str(QUICKSTART)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "team-b/finetune" in proc.stdout and "Queue" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_reasons_example_hits_each_documented_reason() -> None:
    result = simulate(load_scenario(ROOT / "examples" / "simulate" / "reasons.yaml"))
    by_job = {g.job: g for g in gang_summaries(result)}
    expected = {
        "half-gang": "GangIncomplete",
        "train-big": "ExceedsQueueLimit",
        "wants-h100": NO_MATCHING_NODE,
        "eight-gpus": NODE_TOO_SMALL,
        "to-parent": "NonLeafQueue",
    }
    for job, code in expected.items():
        assert (by_job[job].status, by_job[job].reason_code) == ("waiting", code), job
    assert by_job["llm-serve"].status == "running"
    eval_job = by_job["eval"]
    assert eval_job.placed_at is not None and eval_job.placed_at >= 20 * 60
    assert eval_job.waited_code == "QueueLimit"


def test_trace_mode_is_handed_to_replay(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``simulate --trace ...`` goes to scheduler.simulate.replay.run_trace, untouched."""
    import argparse

    import scheduler.simulate.replay as replay
    from scheduler.simulate.__main__ import main

    seen: list[argparse.Namespace] = []

    def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--trace")
        parser.add_argument("--nodes")

    def run_trace(args: argparse.Namespace, progress: object = None) -> int:
        seen.append(args)
        return 7

    monkeypatch.setattr(replay, "add_trace_arguments", add_trace_arguments, raising=False)
    monkeypatch.setattr(replay, "run_trace", run_trace, raising=False)
    assert main(["--trace", "openb", "--nodes", "n.csv"]) == 7
    assert seen[0].trace == "openb" and seen[0].nodes == "n.csv"
    assert main([str(QUICKSTART), "--trace", "openb"]) == 2
    assert "not both" in capsys.readouterr().err
