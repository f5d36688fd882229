"""Differential test against kube-scheduler (issue #13), CI size: 200 seeded random cases.

Each case is a small cluster (2-6 nodes with zones, racks, disk types, taints) and a small
workload (3-12 pods with requests, selectors, node affinity, pod affinity and anti-affinity,
topology spread, host ports, tolerations, preferences), made twice on one control plane: one
copy for kube-scheduler, one for ours (:mod:`tests.differential`). The test fails when:

- (a) a pod ours bound breaks a Kubernetes placement rule (independent checker);
- the checker rejects a pod kube-scheduler bound (the checker is wrong);
- (b) ours leaves a pod unbound without a reason;
- (c) ours binds fewer pods than kube-scheduler: under 99 % of its total, or fewer in more
  than 5 % of the cases (case by case it is not met yet; the seeds are printed).

The failure message lists the seeds; ``python -m tests.differential --seed S --cases 1``
replays one case. ``KAI_DIFF_SEED`` / ``KAI_DIFF_CASES`` change the run.

It has its own control plane (kube-scheduler runs as its static identity
``system:kube-scheduler``, which the session control plane does not have).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testenv import ControlPlane
from tests.differential.run import Harness, Settings, differential_control_plane, summary

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("KAI_DIFF_SEED", "1"))
#: Share of cases where ours may bind fewer pods than kube-scheduler (check c; see below).
MAX_FEWER = 0.05
CASES = int(os.environ.get("KAI_DIFF_CASES", "200"))


@pytest.fixture(scope="module")
def differential_plane() -> Iterator[ControlPlane]:
    cp = differential_control_plane()
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


def _tails(paths: list[Path], lines: int = 30) -> str:
    out = []
    for path in paths:
        text = path.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"--- {path} ---\n" + "\n".join(text))
    return "\n".join(out)


@pytest.mark.timeout(600)
def test_ours_against_kube_scheduler(differential_plane: ControlPlane) -> None:
    began = time.monotonic()
    work = differential_plane.log_dir / "differential"
    with Harness(differential_plane, work, settings=Settings()) as harness:
        results = harness.run(SEED, CASES)
        logs = harness.logs
    doc = summary(results, time.monotonic() - began)
    (work / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    (work / "cases.json").write_text(json.dumps([r.to_dict() for r in results], indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "failures"}, indent=2))
    assert len(results) == CASES
    # Some of every kind of rule was drawn, so the run tested what it claims to.
    for feature in ("podAffinity", "podAntiAffinitySelf", "spreadDoNotSchedule", "hostPort"):
        assert doc["features"].get(feature, 0) > 0, doc["features"]
    fewer = doc["failed_seeds_by_check"].get("c", [])
    strict = [f for f in doc["failures"] if f["check"] != "c"]
    pods = doc["pods"]
    # (c) is met in total but not case by case (issue #13): a sequential scheduler's count
    # depends on where earlier pods went, and kube-scheduler breaks equal scores at random.
    # Measured 2026-12-05 with kube-scheduler's scores followed (LeastAllocated,
    # BalancedAllocation, InterPodAffinity with running pods' terms), 200 cases each: seed 1,
    # 3 runs: 0-4 cases fewer, 10-19 more, 958-968 pods against 944-952; seed 201: 3 fewer,
    # 15 more, 935 against 913. The cases left fewer follow a tie kube-scheduler broke the
    # other way; kube-scheduler's own count differed between two runs in 4 of 200 cases and
    # its placements in 65. The test fails beyond MAX_FEWER cases, or when ours binds under
    # 99 % of kube-scheduler's total.
    total_short = pods["ours_bound"] < 0.99 * pods["kube-scheduler_bound"]
    if strict or len(fewer) > MAX_FEWER * CASES or total_short:
        shown = [*strict, *(f for f in doc["failures"] if f["check"] == "c")][:40]
        pytest.fail(
            f"{len(doc['failed_seeds'])} of {CASES} cases failed; by check: "
            f"{doc['failed_seeds_by_check']}\nreplay one: python -m tests.differential --seed S "
            f"--cases 1\n"
            + "\n".join(json.dumps(f) for f in shown)
            + f"\n(all in {work})\n"
            + _tails(logs),
            pytrace=False,
        )
