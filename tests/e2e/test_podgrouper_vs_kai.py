"""The pod grouper, end to end, against NVIDIA KAI-Scheduler v0.12.0's own pod grouper.

Every case of :mod:`scheduler.bench.podgrouper_diff` (a bare Pod, a batch Job with and without
``kai.scheduler/batch-min-member``, a CronJob's Job, a Deployment, a bare ReplicaSet, a
StatefulSet, a LeaderWorkerSet made by the LWS controller without a gang provider, a Volcano
Job; each with no labels, with queue and ``priorityClassName`` labels on the top owner, with
the preemptibility label, with a pod spec ``priorityClassName``) runs under our grouper, then
under KAI's ``cmd/podgrouper`` built from its Go module, on one control plane of this
module's own: KAI's CRDs replace ours while it runs, which the session's control plane must
not see. For each case the PodGroups both make must agree - count, name pattern, owner,
``minMember``, queue, priority class, preemptibility - or differ exactly as the case's
documented :class:`~scheduler.bench.podgrouper_diff.Difference` says (docs/podgrouper.md,
"Differences from KAI's pod grouper").

Nothing is skipped: missing KAI binaries are built by ``testenv/build_peers.sh kai`` (cached in
``.cache/peer-bin``; a cold build takes minutes, hence this module's long timeout). With the
binaries cached the module takes about a minute and a half on the 2-core machine (93 s
measured): one control plane, Volcano's job controller and the LWS controller started once,
each grouper started once for all cases (every case in a namespace of its own), a run ending
when nothing changed for ``SETTLE`` seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.bench import podgrouper_diff as pd
from scheduler.bench import takeback_diff as td
from testenv import ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

#: Seconds without any change that end a run (both groupers act within milliseconds).
SETTLE = 3.0


@pytest.fixture(scope="module")
def kai_binaries() -> Path:
    """KAI's podgrouper (and the rest), CRDs and RBAC: built when missing, never skipped."""
    return td.kai_dir()


@pytest.fixture(scope="module")
def diff(kai_binaries: Path) -> Iterator[dict[str, dict[str, Any]]]:
    """Every case under ours, then under KAI; the comparison per case."""
    cp = ControlPlane()
    controllers: list[Any] = []
    try:
        cp.start()
        controllers = pd.prepare_plane(cp)
        comparisons = pd.run_diff(
            cp,
            pd.CASES,
            cp.log_dir / "podgrouper-diff",
            settle=SETTLE,
            kai_path=kai_binaries,
        )
        print(f"\n{pd.table(comparisons)}")
        yield {c["case"]: c for c in comparisons}
    finally:
        for c in reversed(controllers):
            c.stop()
        cp.stop()


def _why(comparison: dict[str, Any]) -> str:
    runs = {
        name: {k: run.get(k) for k in ("namespace", "pods", "podgroups", "error", "log")}
        for name, run in comparison["runs"].items()
    }
    return f"\n{pd.table([comparison])}\nruns: {runs}"


@pytest.mark.parametrize("name", [c.name for c in pd.CASES])
def test_podgroups_as_kai_makes_them_or_as_documented(
    diff: dict[str, dict[str, Any]], name: str
) -> None:
    case = pd.case_named(name)
    c = diff[name]
    why = _why(c)
    assert c["verdict"] != "incomplete", f"a run failed or a PodGroup is missing:{why}"
    for run in c["runs"].values():
        assert run["unclaimed"] == [], f"a PodGroup no pod names:{why}"
    if case.difference is None:
        assert c["differences"] == {}, f"ours and KAI differ, and no difference is declared:{why}"
        assert c["verdict"] == "same", why
    else:
        # Exactly the declared fields differ, with the declared values on both sides (the
        # reason is in the case and in docs/podgrouper.md).
        assert c["problems"] == [], f"not the documented difference:{why}"
        assert set(c["differences"]) == set(case.difference.kai), why
        assert c["verdict"] == "deliberate", why


def test_every_kind_was_compared(diff: dict[str, dict[str, Any]]) -> None:
    kinds = {c["kind"] for c in diff.values() if c["verdict"] in ("same", "deliberate")}
    assert kinds == set(pd.KINDS)


def test_volcano_pods_keep_their_volcano_podgroup(diff: dict[str, dict[str, Any]]) -> None:
    # Ours leaves a Volcano Job's pods to the PodGroup Volcano named (the scheduler reads it).
    for name in ("volcano", "volcano-labels"):
        ours = diff[name]["runs"]["ours"]
        assert ours["volcano_group"], _why(diff[name])
        assert set(ours["pods"].values()) == {None}, _why(diff[name])
