"""``python -m scheduler.bench takeback-diff``: taking back, ours versus NVIDIA KAI-Scheduler.

Each :class:`Scenario` is data: kwok GPU nodes, queues with quotas, a first wave of workloads
that fill the cluster and run (``setup``, step by step), then a second wave that can only run
if something is taken back. The same scenario runs under one scheduler at a time on one control
plane (ours, then KAI-Scheduler v0.12.0 as scheduler + binder + podgrouper, see
:mod:`scheduler.bench.e2e_peers`), each run with a fresh namespace, fresh queues and fresh
nodes, all removed afterwards. After the second wave the run waits until nothing changes for
``settle`` seconds (no pod created, bound, started or terminating; every controller caught up)
and records, per gang: how many pods run and wait, how many were evicted, the eviction actions
(from Events and the ``DisruptionTarget`` condition) and an outcome:

- ``running``: as many pods run as it wants, none was evicted;
- ``pending``: nothing runs and nothing was evicted (a second-wave gang that was not admitted);
- ``evicted``: pods were evicted and fewer than ``minMember`` run again;
- ``shrunk``: pods were evicted and at least ``minMember``, but not all, run;
- ``moved``: pods were evicted and all run again (consolidation: the controller recreated them
  and they were placed elsewhere).

Workloads are ReplicaSets, so an evicted pod comes back pending, as with any controller.
Gangs are KAI PodGroups (``scheduling.run.ai/v2alpha2``) created by the bench and named by the
pods' ``pod-group-name`` annotation, with the queue in the PodGroup and the label
``kai.scheduler/queue`` on the pods, so both schedulers read the same objects. KAI's podgrouper
would replace the PodGroup of an owned pod with its own (one per ReplicaSet, ``minMember: 1``),
so it is started with ``--pod-label-selector`` and groups only the pods labelled
``kai-diff/grouper=kai-podgrouper``: the gangs of one that a scenario leaves to it (ours reads
those pods as implicit gangs of one).

Prints one JSON document (per scenario and gang: expected, ours, KAI, match) on stdout and a
table on stderr. KAI is built on demand by ``testenv/build_peers.sh kai`` (cached).

The scenarios are in :mod:`scheduler.bench.takeback_scenarios`, a run's objects in
:mod:`scheduler.bench.takeback_manifests`, one scenario's run in
:mod:`scheduler.bench.takeback_run`; this module compares the runs and runs the series.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scheduler.bench import e2e_peers as peers
from scheduler.bench.diff_plane import (
    REPO,
    apply_kai_crds,
    apply_our_crds,
    apply_our_defaults,
    kai_dir,
    log,
    pinned_versions,
)
from scheduler.bench.takeback_manifests import LABEL_GROUPER, LABEL_RUN, NAMESPACE_PREFIX
from scheduler.bench.takeback_run import RunContext, SchedulerDied, outcome_of, run_scenario
from scheduler.bench.takeback_scenarios import PODGROUPER, SCENARIOS, Scenario, scenario_named
from testenv import ControlPlane

# kai_dir, outcome_of, SCENARIOS and scenario_named are re-exported: tests/e2e use them from
# here.
__all__ = [
    "SCENARIOS",
    "add_parser",
    "compare",
    "contender_for",
    "document",
    "kai_dir",
    "outcome_of",
    "prepare_plane",
    "run",
    "run_diff",
    "scenario_named",
    "table",
]

SCHEDULERS = ("ours", "kai")


def _log(message: str) -> None:
    log("takeback-diff", message)


# ------------------------------------------------------------------------------ comparing


def _action_matches(expected: str | None, actions: Sequence[str], scheduler: str) -> bool:
    """Whether the recorded actions say what ``expected`` (ours' vocabulary) says. KAI has no
    action of its own for a shrink: it removes the pods beyond ``minMember`` in the action
    that needed the room (reclaim or preempt)."""
    if expected is None:
        return not actions
    if scheduler == "kai" and expected == "shrink":
        return bool(actions) and set(actions) <= {"reclaim", "preempt"}
    return list(actions) == [expected]


def compare(scenario: Scenario, runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The comparison of one scenario's runs: a row per gang and a verdict.

    Verdicts: ``same`` (ours and KAI agree and match the expectation), ``deliberate``
    (they differ exactly as ``scenario.difference`` documents), ``DIFFERENT`` (anything
    else, including a run that deviates from the documented behaviour), ``incomplete``
    (a run failed or never became stable)."""
    kai_expect = dict(scenario.expect)
    if scenario.difference is not None:
        kai_expect.update(scenario.difference.kai)
    expect_of = {"ours": dict(scenario.expect), "kai": kai_expect}
    rows = []
    for w in scenario.reported():
        row: dict[str, Any] = {"gang": w.name, "expected": scenario.expect[w.name]}
        for name, run in runs.items():
            gang = (run.get("gangs") or {}).get(w.name)
            row[name] = gang["outcome"] if gang else None
            row[f"{name}_running"] = gang["running"] if gang else None
            row[f"{name}_actions"] = gang["actions"] if gang else None
        if "ours" in runs and "kai" in runs:
            row["match"] = (row["ours"], row["ours_running"]) == (row["kai"], row["kai_running"])
        rows.append(row)
    as_expected: dict[str, bool] = {}
    actions_as_expected: dict[str, bool] = {}
    for name, run in runs.items():
        gangs = run.get("gangs") or {}
        as_expected[name] = bool(gangs) and all(
            gangs[g]["outcome"] == o for g, o in expect_of[name].items()
        )
        actions_as_expected[name] = bool(gangs) and all(
            _action_matches(scenario.expect_actions.get(g), gangs[g]["actions"], name)
            for g in gangs
            if gangs[g]["evicted_pods"]
        )
    incomplete = [
        n
        for n, r in runs.items()
        if r.get("error") or not r.get("stable") or r.get("setup_evictions")
    ]
    if incomplete:
        verdict = "incomplete"
    elif (
        set(runs) == {"ours", "kai"} and all(r["match"] for r in rows) and all(as_expected.values())
    ):
        verdict = "same"
    elif scenario.difference is not None and all(as_expected.values()):
        verdict = "deliberate"
    elif set(runs) != {"ours", "kai"} and all(as_expected.values()):
        verdict = "as-expected"
    else:
        verdict = "DIFFERENT"
    return {
        "scenario": scenario.name,
        "summary": scenario.summary,
        "verdict": verdict,
        "incomplete_runs": incomplete,
        "as_expected": as_expected,
        "actions_as_expected": actions_as_expected,
        "deliberate_difference": (
            None
            if scenario.difference is None
            else {"kai": dict(scenario.difference.kai), "reason": scenario.difference.reason}
        ),
        "gangs": rows,
        "runs": dict(runs),
    }


def table(comparisons: Sequence[Mapping[str, Any]]) -> str:
    """A short human table (stderr)."""
    lines = [f"{'scenario':<12} {'gang':<12} {'expected':<9} {'ours':<20} {'kai':<20} match"]
    for c in comparisons:
        for row in c["gangs"]:

            def cell(name: str, row: Mapping[str, Any] = row) -> str:
                if name not in row:
                    return "-"
                acts = ",".join(row.get(f"{name}_actions") or [])
                return f"{row[name]}" + (f" [{acts}]" if acts else "")

            match = row.get("match")
            lines.append(
                f"{c['scenario']:<12} {row['gang']:<12} {row['expected']:<9} "
                f"{cell('ours'):<20} {cell('kai'):<20} {'' if match is None else match}"
            )
        settled = ", ".join(
            f"{name} {run.get('seconds_to_last_change')}s"
            for name, run in c["runs"].items()
            if run.get("seconds_to_last_change") is not None
        )
        lines.append(f"{'':<12} -> {c['verdict']} (last change after the second wave: {settled})")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ series


def prepare_plane(cp: ControlPlane) -> None:
    """Our CRDs, the default queues and the PriorityClasses both schedulers use."""
    apply_our_defaults(cp)


def _with_args(
    contender: peers.Contender,
    extra: Mapping[str, Sequence[str]],
    env: Mapping[str, str] | None = None,
) -> peers.Contender:
    """The contender with more arguments for the commands whose name ends with a key of
    ``extra`` (``-scheduler``, ``-podgrouper``, or the whole name) and more environment."""
    commands = []
    for cmd in contender.commands:
        more = [a for suffix, args in extra.items() if cmd.name.endswith(suffix) for a in args]
        commands.append(
            dataclasses.replace(cmd, argv=[*cmd.argv, *more], env={**cmd.env, **(env or {})})
        )
    return dataclasses.replace(contender, commands=tuple(commands))


def contender_for(
    cp: ControlPlane,
    name: str,
    work: Path,
    *,
    cycle: str,
    kai_path: Path | None = None,
    ours_log_level: str = "info",
) -> peers.Contender:
    """Prepare ``name`` (``ours`` or ``kai``) on the control plane, with its own CRDs."""
    if name == "ours":
        apply_our_crds(cp)
        c = peers.ours(cp, work, {"cyclePeriod": cycle}, ours_log_level)
        # The scheduler under test is this tree's, whatever the caller's working directory.
        return _with_args(c, {}, env={"PYTHONPATH": str(REPO)})
    if name == "kai":
        path = kai_path or kai_dir()
        apply_kai_crds(cp, path)
        kubeconfigs = peers.prepare_kai(cp, path)
        c = peers.kai(path, kubeconfigs, unthrottled=False)
        return _with_args(
            c,
            {
                # DisruptionTarget on victims, as ours does; the same cycle period.
                "-scheduler": [
                    "--update-pod-eviction-condition=true",
                    f"--schedule-period={cycle}",
                ],
                # Only the gangs of one the scenarios leave to it (see the module docstring).
                "-podgrouper": [f"--pod-label-selector={LABEL_GROUPER}={PODGROUPER}"],
            },
        )
    raise ValueError(f"unknown scheduler {name!r}; use {', '.join(SCHEDULERS)}")


def _sweep(cp: ControlPlane) -> None:
    """Remove what an interrupted earlier run may have left: its namespaces' pods, its queues
    and its nodes (so the fair shares of the next run are not skewed by them)."""
    out = cp.kubectl("get", "namespaces", "-o", "name").stdout.split()
    for ns in (n.split("/", 1)[1] for n in out):
        if ns.startswith(NAMESPACE_PREFIX):
            cp.kubectl("delete", "replicasets", "--all", "-n", ns, "--wait=false", check=False)
            cp.kubectl(
                "delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", check=False
            )
            cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    cp.kubectl("delete", "queues", "-l", LABEL_RUN, "--ignore-not-found", check=False)
    cp.kubectl("delete", "nodes", "-l", LABEL_RUN, "--ignore-not-found", check=False)


def run_diff(
    cp: ControlPlane,
    scenarios: Sequence[Scenario],
    schedulers: Sequence[str],
    log_dir: Path,
    *,
    settle: float = 6.0,
    cycle: str = "1s",
    wave_timeout: float = 90.0,
    kai_path: Path | None = None,
    ours_log_level: str = "info",
) -> list[dict[str, Any]]:
    """Every scenario under each scheduler in turn (one process set per scheduler, started
    before its first scenario); the comparison per scenario."""
    log_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {s.name: {} for s in scenarios}
    for name in schedulers:
        _sweep(cp)
        contender = contender_for(
            cp, name, log_dir, cycle=cycle, kai_path=kai_path, ours_log_level=ours_log_level
        )
        comps = contender.spawn(log_dir)

        def check_alive(comps: Sequence[Any] = comps) -> None:
            dead = {c.name: c.exit_code() for c in comps if not c.running()}
            if dead:
                raise SchedulerDied(f"exited: {dead}; logs in {log_dir}")

        ctx = RunContext(
            cp,
            name,
            contender.scheduler_name,
            check_alive=check_alive,
            settle=settle,
            wave_timeout=wave_timeout,
        )
        try:
            for scenario in scenarios:
                _log(f"{name}: scenario {scenario.name}")
                result = asyncio.run(run_scenario(ctx, scenario))
                result["logs"] = [str(c.log_path) for c in comps]
                runs[scenario.name][name] = result
                _log(
                    f"{name}: {scenario.name} done in {result['seconds']}s: "
                    + (
                        result["error"]
                        or ", ".join(f"{g}={r['outcome']}" for g, r in result["gangs"].items())
                    )
                )
        finally:
            for c in comps:
                c.stop()
    return [compare(s, runs[s.name]) for s in scenarios]


def document(comparisons: Sequence[Mapping[str, Any]], **params: Any) -> dict[str, Any]:
    """The command's JSON output."""
    versions = pinned_versions()
    verdicts = [c["verdict"] for c in comparisons]
    return {
        "bench": "takeback-diff",
        "versions": versions,
        "scheduler_revision": peers.scheduler_revision(),
        **params,
        "scenarios": list(comparisons),
        "verdicts": {c["scenario"]: c["verdict"] for c in comparisons},
        "consistent": all(v in ("same", "deliberate", "as-expected") for v in verdicts),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


# ------------------------------------------------------------------------------ CLI


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``takeback-diff`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "takeback-diff",
        help="reclaim/preempt/consolidate/shrink scenarios on a real control plane: ours vs KAI",
    )
    p.add_argument(
        "--scenario",
        action="append",
        choices=[s.name for s in SCENARIOS],
        help="run only this scenario (repeatable); default: all",
    )
    p.add_argument(
        "--scheduler", default="ours,kai", help="ours, kai, or both as a list (run in that order)"
    )
    p.add_argument(
        "--settle", type=float, default=6.0, help="seconds without change that count as stable"
    )
    p.add_argument("--cycle", default="1s", help="cycle period of both schedulers (their default)")
    p.add_argument("--timeout", type=float, default=90.0, help="seconds for the second wave")
    p.add_argument("--ours-log-level", default="info", choices=("debug", "info", "warning"))
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the comparison, print the JSON; 0 when every scenario is consistent."""
    names = [s.strip() for s in args.scheduler.split(",") if s.strip()]
    if not names or any(n not in SCHEDULERS for n in names):
        raise SystemExit(f"--scheduler {args.scheduler!r}: use ours, kai or ours,kai")
    scenarios = [scenario_named(n) for n in args.scenario] if args.scenario else list(SCENARIOS)
    path = kai_dir() if "kai" in names else None  # build before any clock matters
    began = time.monotonic()
    with ControlPlane() as cp:
        _log(f"control plane up in {cp.startup_seconds:.1f}s; logs in {cp.log_dir}")
        prepare_plane(cp)
        comparisons = run_diff(
            cp,
            scenarios,
            names,
            cp.log_dir / "takeback-diff",
            settle=args.settle,
            cycle=args.cycle,
            wave_timeout=args.timeout,
            kai_path=path,
            ours_log_level=args.ours_log_level,
        )
    doc = document(
        comparisons,
        schedulers=names,
        settle_seconds=args.settle,
        cycle=args.cycle,
        seconds=round(time.monotonic() - began, 1),
        log_dir=str(cp.log_dir),
    )
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print(table(comparisons), file=sys.stderr)
    return 0 if doc["consistent"] else 1
