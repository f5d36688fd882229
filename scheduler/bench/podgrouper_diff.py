"""``python -m scheduler.bench podgrouper-diff``: our pod grouper versus KAI-Scheduler's own.

Each :class:`Case` is data: a workload kind (a bare Pod, a batch Job, a CronJob's Job, a
Deployment, a bare ReplicaSet, a StatefulSet, a LeaderWorkerSet, a Volcano Job) and what it
says about grouping (the queue label ``kai.scheduler/queue``, the ``priorityClassName`` label,
the ``kai.scheduler/preemptibility`` label, on the top owner or the pod template; the pod
spec's ``priorityClassName``; the min-member annotations). The same cases run under one
grouper at a time on one control plane - ours (``python -m scheduler podgrouper`` with the
shipped ServiceAccount and ClusterRole, our CRDs), then KAI-Scheduler v0.12.0's
``cmd/podgrouper`` built from its Go module (with KAI's CRDs and its ClusterRole, see
:mod:`scheduler.bench.e2e_peers`) - each run with its own namespaces (one per case) and its own
``schedulerName`` on the pods, so neither grouper sees the other run's pods. kube-controller-
manager, the LeaderWorkerSet controller (no gang provider) and Volcano's job controller make
the pods; no node exists, so every pod stays pending, which is all a grouper needs. (Volcano's
controller creates a Job's pods only once its Volcano PodGroup is ``Inqueue``, which a
scheduler would decide: the bench sets that phase itself.)

A run ends once every case has all its pods and nothing (pods' ``pod-group-name``, PodGroups)
changed for ``settle`` seconds. Per case it records the PodGroups the pods name and sums them
up in :data:`FIELDS`: how many pods were grouped, how many PodGroups, their names as a
pattern (``pg-<job>-<job uid>``), owner kinds, and the distinct ``minMember``, queue,
priority class and preemptibility values. The comparison (:func:`compare`) says per case:

- ``same``: ours and KAI agree on every field;
- ``deliberate``: they differ in exactly the fields the case's :class:`Difference` declares,
  with exactly the declared values (the reason is in the case and in docs/podgrouper.md,
  "Differences from KAI's pod grouper");
- ``UNDECLARED``: they differ and the case declares nothing;
- ``NOT-AS-DECLARED``: the case declares a difference that did not happen as declared;
- ``incomplete``: a run failed, or a pod named a PodGroup that does not exist.

Prints one JSON document on stdout and a table on stderr. KAI is built on demand by
``testenv/build_peers.sh kai`` (cached). The e2e test is tests/e2e/test_podgrouper_vs_kai.py.

The cases are in :mod:`scheduler.bench.podgrouper_cases`, a run's objects in
:mod:`scheduler.bench.podgrouper_manifests`, the summaries and their comparison in
:mod:`scheduler.bench.podgrouper_results`, one run under one grouper in
:mod:`scheduler.bench.podgrouper_run`; this module prepares the plane and runs the series.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scheduler.bench import e2e_peers as peers
from scheduler.bench.diff_plane import apply_our_defaults, kai_dir, log, pinned_versions
from scheduler.bench.podgrouper_cases import (
    CASES,
    FIELDS,
    KINDS,
    TEAM_QUEUE,
    Case,
    Difference,
    case_named,
)
from scheduler.bench.podgrouper_manifests import (
    LABEL_RUN,
    NAMESPACE_PREFIX,
    RunNames,
    workload_manifest,
)
from scheduler.bench.podgrouper_results import (
    GROUPERS,
    compare,
    consistent,
    name_pattern,
    summarize,
    table,
)
from scheduler.bench.podgrouper_run import OURS_SCHEDULER, kai_grouper, ours_grouper, run_cases
from testenv import ControlPlane

# The cases, manifests and results are re-exported: tests/unit/test_podgrouper_diff.py and
# tests/e2e use them from here.
__all__ = [
    "CASES",
    "FIELDS",
    "GROUPERS",
    "KINDS",
    "NAMESPACE_PREFIX",
    "Case",
    "Difference",
    "RunNames",
    "add_parser",
    "case_named",
    "compare",
    "consistent",
    "document",
    "name_pattern",
    "prepare_plane",
    "run",
    "run_diff",
    "summarize",
    "table",
    "workload_manifest",
]


def _log(message: str) -> None:
    log("podgrouper-diff", message)


# ------------------------------------------------------------------------------ running


def prepare_plane(cp: ControlPlane) -> list[Any]:
    """Our CRDs, the default queues, the PriorityClasses, the cases' queue; the Volcano and
    LeaderWorkerSet CRDs, Volcano's ``default`` queue; then Volcano's job controller and the
    LWS controller (no gang provider) started. Returns the controllers (stop them after)."""
    from testenv.controllers import LwsController, VolcanoControllerManager, ensure_volcano_queue

    apply_our_defaults(cp)
    queue = {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": TEAM_QUEUE},
        "spec": {
            "parentQueue": "default-parent-queue",
            "resources": {
                r: {"quota": 0, "limit": -1, "overQuotaWeight": 1} for r in ("gpu", "cpu", "memory")
            },
        },
    }
    peers.apply_objects(cp, [queue])
    started: list[Any] = []
    try:
        volcano = VolcanoControllerManager(
            cp,
            scheduler_names=(OURS_SCHEDULER, "kai-reference"),
            name="pgdiff-vc-controller-manager",
        )
        volcano.start()
        started.append(volcano)
        ensure_volcano_queue(cp, "default")
        lws = LwsController(cp, gang_scheduler_provider=None, name="pgdiff-lws-manager")
        lws.start()
        started.append(lws)
    except BaseException:
        for c in reversed(started):
            c.stop()
        raise
    return started


def _delete_namespaces(cp: ControlPlane, rid_label: str | None = None) -> None:
    selector = f"{LABEL_RUN}={rid_label}" if rid_label else LABEL_RUN
    cp.kubectl("delete", "namespaces", "-l", selector, "--wait=false", check=False)


def run_diff(
    cp: ControlPlane,
    cases: Sequence[Case],
    log_dir: Path,
    *,
    groupers: Sequence[str] = GROUPERS,
    settle: float = 3.0,
    timeout: float = 90.0,
    kai_path: Path | None = None,
    ours_log_level: str = "info",
) -> list[dict[str, Any]]:
    """Every case under each grouper in turn (ours with our CRDs, then KAI with KAI's), on a
    plane :func:`prepare_plane` has prepared; the comparison per case."""
    log_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {c.name: {} for c in cases}
    for name in groupers:
        if name == "ours":
            grouper = ours_grouper(cp, ours_log_level)
        elif name == "kai":
            grouper = kai_grouper(cp, kai_path or kai_dir())
        else:
            raise ValueError(f"unknown grouper {name!r}; use {', '.join(GROUPERS)}")
        for case_name, result in run_cases(
            cp, grouper, cases, log_dir, settle=settle, timeout=timeout
        ).items():
            runs[case_name][name] = result
        # The next run has its own namespaces and schedulerName; these go meanwhile.
        _delete_namespaces(cp)
    return [compare(c, runs[c.name]) for c in cases]


def document(comparisons: Sequence[Mapping[str, Any]], **params: Any) -> dict[str, Any]:
    """The command's JSON output."""
    versions = pinned_versions()
    return {
        "bench": "podgrouper-diff",
        "versions": versions,
        "scheduler_revision": peers.scheduler_revision(),
        **params,
        "fields": list(FIELDS),
        "cases": list(comparisons),
        "verdicts": {c["case"]: c["verdict"] for c in comparisons},
        "consistent": consistent(comparisons),
    }


# ------------------------------------------------------------------------------ CLI


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``podgrouper-diff`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "podgrouper-diff",
        help="the PodGroups our pod grouper and KAI-Scheduler v0.12.0's make, per workload kind",
    )
    p.add_argument(
        "--case",
        action="append",
        choices=[c.name for c in CASES],
        help="run only this case (repeatable); default: all",
    )
    p.add_argument(
        "--settle", type=float, default=3.0, help="seconds without change that end a run"
    )
    p.add_argument("--timeout", type=float, default=90.0, help="seconds for a run to settle")
    p.add_argument("--ours-log-level", default="info", choices=("debug", "info", "warning"))
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the comparison, print the JSON and the table; 0 when every case is consistent."""
    cases = [case_named(n) for n in args.case] if args.case else list(CASES)
    path = kai_dir()  # build before any clock matters
    began = time.monotonic()
    with ControlPlane() as cp:
        _log(f"control plane up in {cp.startup_seconds:.1f}s; logs in {cp.log_dir}")
        controllers = prepare_plane(cp)
        try:
            comparisons = run_diff(
                cp,
                cases,
                cp.log_dir / "podgrouper-diff",
                settle=args.settle,
                timeout=args.timeout,
                kai_path=path,
                ours_log_level=args.ours_log_level,
            )
        finally:
            for c in reversed(controllers):
                with contextlib.suppress(Exception):
                    c.stop()
    doc = document(
        comparisons,
        settle_seconds=args.settle,
        seconds=round(time.monotonic() - began, 1),
        log_dir=str(cp.log_dir),
    )
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print(table(comparisons), file=sys.stderr)
    return 0 if doc["consistent"] else 1
