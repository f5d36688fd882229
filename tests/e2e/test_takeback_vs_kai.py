"""Taking back, end to end, against NVIDIA KAI-Scheduler itself.

Every scenario of :mod:`scheduler.bench.takeback_diff` (reclaim between two queues,
preemption by priority, consolidation, elastic shrink, a non-preemptible gang that must not be
touched, a reclaim under a PodDisruptionBudget) runs under our scheduler and then under
KAI-Scheduler v0.12.0 (scheduler + binder + podgrouper built from its Go module) on one control
plane of this module's own: KAI's CRDs replace ours while it runs, which the session's control
plane must not see. Each scenario must end with the same gangs running, shrunk, moved, pending
and evicted under both - and as docs/taking-back.md says - or differ exactly as the scenario's
documented :class:`~scheduler.bench.takeback_diff.Difference` says (docs/taking-back.md,
"Differences from KAI-Scheduler").

Nothing is skipped: missing KAI binaries are built by ``testenv/build_peers.sh kai`` (cached in
``.cache/peer-bin``; a cold build takes minutes, hence this module's long timeout). With the
binaries cached the module takes about two minutes on the 2-core machine (2 min 2 s
measured): one control plane, then each scheduler started once for all scenarios, every
scenario on fresh kwok nodes, queues and namespace, judged stable after ``SETTLE`` seconds
without change.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.bench import takeback_diff as td
from testenv import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

#: Seconds without any change (both schedulers cycle every second) that count as stable.
SETTLE = 5.0


@pytest.fixture(scope="module")
def kai_binaries() -> Path:
    """KAI's scheduler, binder, podgrouper, CRDs and RBAC: built when missing, never skipped."""
    return td.kai_dir()


@pytest.fixture(scope="module")
def diff(kai_binaries: Path) -> Iterator[dict[str, dict[str, Any]]]:
    """Every scenario under ours, then under KAI; the comparison per scenario."""
    cp = ControlPlane()
    try:
        cp.start()
        td.prepare_plane(cp)
        comparisons = td.run_diff(
            cp,
            td.SCENARIOS,
            ["ours", "kai"],
            cp.log_dir / "takeback-diff",
            settle=SETTLE,
            kai_path=kai_binaries,
        )
        yield {c["scenario"]: c for c in comparisons}
    finally:
        cp.stop()


def _why(comparison: dict[str, Any]) -> str:
    """The table and each run's details, for a failure message."""
    runs = {
        name: {k: v for k, v in run.items() if k not in ("logs",)}
        for name, run in comparison["runs"].items()
    }
    logs = sorted({log for run in comparison["runs"].values() for log in run.get("logs", [])})
    return f"\n{td.table([comparison])}\nruns: {runs}\nlogs: {logs}"


def _outcomes(comparison: dict[str, Any], scheduler: str) -> dict[str, str]:
    return {row["gang"]: row[scheduler] for row in comparison["gangs"]}


def _evicted(comparison: dict[str, Any], scheduler: str) -> dict[str, dict[str, Any]]:
    gangs = comparison["runs"][scheduler]["gangs"]
    return {g: r for g, r in gangs.items() if r["evicted_pods"]}


@pytest.mark.parametrize("name", [s.name for s in td.SCENARIOS])
def test_same_gangs_run_and_are_evicted_as_under_kai(
    diff: dict[str, dict[str, Any]], name: str
) -> None:
    scenario = td.scenario_named(name)
    c = diff[name]
    why = _why(c)
    assert c["incomplete_runs"] == [], f"a run failed or never settled:{why}"
    ours, kai = _outcomes(c, "ours"), _outcomes(c, "kai")
    # Ours does what docs/taking-back.md says.
    assert ours == dict(scenario.expect), f"ours deviates from the documented outcome:{why}"
    if scenario.difference is None:
        assert kai == ours, f"KAI-Scheduler ends differently:{why}"
        assert c["verdict"] == "same", why
    else:
        # A deliberate difference: KAI does exactly what the documented difference says
        # (the reason is in the scenario and in docs/taking-back.md).
        assert kai == {**scenario.expect, **scenario.difference.kai}, why
        assert kai != ours, f"the documented difference did not show:{why}"
        assert c["verdict"] == "deliberate", why
    # The eviction actions are the documented ones (KAI names a shrink by the action that
    # needed the room: see _action_matches).
    assert c["actions_as_expected"] == {"ours": True, "kai": True}, why
    # Nobody evicted anything while the first wave was being set up.
    for run in c["runs"].values():
        assert run["setup_evictions"] == [], why


def test_eviction_reasons_are_recorded_where_each_scheduler_writes_them(
    diff: dict[str, dict[str, Any]],
) -> None:
    seen_ours = seen_kai = 0
    for c in diff.values():
        why = _why(c)
        for gang, r in _evicted(c, "ours").items():
            seen_ours += 1
            kinds = {m.split(" ", 1)[0] for m in r["event_messages"]}
            # An Event on each victim pod (and one on its PodGroup) naming the action ...
            assert "Pod" in kinds, f"{gang}: no Event on the evicted pods:{why}"
            # ... and DisruptionTarget set by the scheduler before the Eviction API's own.
            assert "PreemptionByScheduler" in r["disruption_reasons"], f"{gang}:{why}"
        for gang, r in _evicted(c, "kai").items():
            seen_kai += 1
            kinds = {m.split(" ", 1)[0] for m in r["event_messages"]}
            assert kinds == {"PodGroup"}, f"{gang}: KAI's Evict Event is on the PodGroup:{why}"
            assert r["disruption_reasons"] == ["PreemptionByScheduler"], f"{gang}:{why}"
    assert seen_ours and seen_kai, "no scenario evicted anything"


def test_outcome_vocabulary() -> None:
    # (running, evicted pods, replicas, minMember) -> outcome
    assert td.outcome_of(2, 0, 2, 2) == "running"
    assert td.outcome_of(0, 0, 2, 2) == "pending"
    assert td.outcome_of(0, 2, 2, 2) == "evicted"
    assert td.outcome_of(2, 2, 4, 2) == "shrunk"
    assert td.outcome_of(1, 1, 1, 1) == "moved"
    assert td.outcome_of(1, 0, 2, 2) == "partial(1/2)"
