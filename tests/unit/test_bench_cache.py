"""``python -m scheduler.bench cache`` runs end to end at a small size and prints its JSON."""

from __future__ import annotations

import json

import pytest

from scheduler.bench.__main__ import main


def test_cache_bench_prints_every_measure(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["cache", "--nodes", "20", "--pods", "300", "--gangs", "10", "--changes", "3",
         "--cycles", "2"]
    )  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["pods"] == 300 and out["bound_pods"] == 260
    assert out["rss_mb"] > 0 and out["apply_us_per_pod"] > 0
    assert out["snapshot_seconds"]["p50"] is not None
    assert out["cycle_seconds"]["p50"] >= out["solve_seconds_p50"] > 0
