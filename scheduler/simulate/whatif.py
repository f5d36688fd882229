"""``kai-scheduler simulate --snapshot FILE [--set PATH=V ...] [--config FILE] [--cycles N]``.

Answers "what would the next cycles do (if I changed this)?" for a snapshot of a real cluster
(``kai-scheduler snapshot``, or the running scheduler's ``GET /debug/snapshot``): the very same
:func:`scheduler.cycle.run_cycle` runs on the in-memory backend, starting from the snapshot,
and the usual tables (queues, gangs: placed where, waiting why, evictions) and plots follow.

How the snapshot becomes a simulated cluster (:class:`SnapshotCluster`):

- times are shifted so the snapshot is taken at simulated time 0 (creation and start times
  keep their distance to it, so runtimes and delays count as in the live cycle);
- pods that belong to a gang and hold or wait for capacity are live pods of the simulation;
  the rest (other schedulers' pods, finished gang members, which still count toward their
  gang's minMember) are kept as they are, so the first cycle sees exactly the snapshot;
- live pods run forever (a snapshot does not know when they will finish); evicted pods leave
  after the termination grace (0 s) and are replaced by pending ones, as in the simulator;
- PodDisruptionBudgets are kept, each evicted pod using one of its allowed disruptions;
- devices and ResourceClaims (the snapshot's ``dra``) are kept: a pending pod uses the claims
  the snapshot names for it, a bound pod those reserved for it, and the simulated cluster
  allocates and frees them as in the simulator (:mod:`scheduler.simulate.claims`).

The replay stops after ``--cycles`` cycles or when nothing more can change. Exit codes: 0 the
run completed, 2 bad input (the message names the flag or ``--set`` path), 1 the run failed.
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
from dataclasses import dataclass, field
from typing import Any

from scheduler.cluster.disruption import DisruptionBudget
from scheduler.cluster.pod import Pod
from scheduler.cluster.snapshot import Snapshot
from scheduler.config import ConfigError, load_config, parse_config
from scheduler.plugins.scorer_memory import ScorerMemory
from scheduler.simulate.backend import SimulatedCluster
from scheduler.simulate.whatif_sets import Change, WhatIfError, apply_changes, parse_change

__all__ = [
    "CycleDecision",
    "SnapshotCluster",
    "WhatIfRun",
    "add_whatif_arguments",
    "replay_snapshot",
    "run_whatif",
    "shift_times",
]

#: Default number of cycles replayed (take-back needs a cycle to evict and one to place).
DEFAULT_CYCLES = 5


def add_whatif_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--snapshot`` mode's flags on the ``simulate`` parser."""
    g = parser.add_argument_group("what-if on a cluster snapshot")
    g.add_argument(
        "--snapshot", metavar="FILE", default=None,
        help="replay a snapshot file (kai-scheduler snapshot, or GET /debug/snapshot)",
    )  # fmt: skip
    g.add_argument(
        "--set", dest="what_if", metavar="PATH=VALUE", action="append", default=[],
        help="change the snapshot first, e.g. queue.team-a.gpu.quota=16, "
        "node.n1.unschedulable=true, config.placement.gpu=spread (repeatable)",
    )  # fmt: skip
    g.add_argument(
        "--config", dest="what_if_config", metavar="FILE", default=None,
        help="scheduler config file to solve with (default: the one stored in the snapshot)",
    )  # fmt: skip
    g.add_argument(
        "--cycles", type=int, default=DEFAULT_CYCLES, metavar="N",
        help=f"cycles to replay at most (default {DEFAULT_CYCLES})",
    )  # fmt: skip


def shift_times(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with every time moved so that it is taken at 0 (differences kept)."""
    t0 = snapshot.now
    if not t0:
        return snapshot
    pods = tuple(
        dataclasses.replace(p, creation_time=p.creation_time - t0, start_time=p.start_time - t0)
        for p in snapshot.pods
    )
    gangs = tuple(
        dataclasses.replace(g, creation_time=g.creation_time - t0) for g in snapshot.gangs
    )
    queues = tuple(
        dataclasses.replace(q, creation_time=q.creation_time - t0) for q in snapshot.queues
    )
    return dataclasses.replace(snapshot, pods=pods, gangs=gangs, queues=queues, now=0.0)


class SnapshotCluster(SimulatedCluster):
    """A :class:`SimulatedCluster` that starts as a snapshot (see the module docstring)."""

    def __init__(self, snapshot: Snapshot) -> None:
        start = shift_times(snapshot)
        super().__init__(start.nodes, start.queues, dra=start.dra)
        self.all_gangs = start.gangs
        self.budgets = start.budgets
        known = {g.key for g in start.gangs}
        #: Uids in the snapshot's order: the first cycle sees the pods as the live one did.
        self._order = [p.uid for p in start.pods]
        nodes = {n.name for n in start.nodes}

        def simulated(p: Pod) -> bool:
            # A pod bound to a node the cluster no longer has (deleted before the pod was
            # collected) holds nothing anywhere; the live cycle sees it as it is, and so
            # does the replay: it stays as captured instead of stopping the replay.
            return p.gang in known and p.active and not (p.bound and p.node_name not in nodes)

        live = [p for p in start.pods if simulated(p)]
        #: Pods the simulation never changes (no gang of ours, finished, or on a gone node).
        self.fixed: dict[str, Pod] = {p.uid: p for p in start.pods if not simulated(p)}
        by_gang: dict[str, list[Pod]] = {}
        for p in live:
            by_gang.setdefault(p.gang, []).append(p)
        for gang in start.gangs:
            # One call per gang: every gang gets its record, also those with no live pod.
            self.add_pods(by_gang.get(gang.key, []), [gang])
        if self.claims is not None and start.dra is not None:
            reserved: dict[str, list[str]] = {}
            for claim in start.dra.claims:
                for ref in claim.reserved_for:
                    reserved.setdefault(ref.uid, []).append(claim.key)
            pending = start.dra.claim_keys_by_pod
            for p in live:
                self.claims.use(p, reserved.get(p.uid, []) if p.bound else pending.get(p.uid, ()))

    def snapshot_now(self) -> Snapshot:
        """The cluster as a cycle sees it: the snapshot's pods in their order, as they are now,
        then the pods created since (replacements of evicted ones)."""
        live = {r.pod.uid: r.pod for r in self._live.values()}
        pods: list[Pod] = []
        for uid in self._order:
            pod = live.pop(uid, None) or self.fixed.get(uid)
            if pod is not None:
                pods.append(pod)
        pods.extend(live.values())
        dra = None
        if self.claims is not None:
            dra = self.claims.view(p for p in pods if p.pending and p.uid not in self.fixed)
        return Snapshot(
            nodes=self.nodes,
            pods=tuple(pods),
            gangs=self.all_gangs,
            queues=self.queues,
            now=self.now,
            budgets=self._budgets_now(),
            dra=dra,
        )

    def _budgets_now(self) -> tuple[DisruptionBudget, ...]:
        if not self.evictions:
            return self.budgets
        evicted = {e.eviction.pod_uid for e in self.evictions}
        return tuple(
            dataclasses.replace(
                b, allowed=max(0, b.allowed - sum(1 for u in b.pod_uids if u in evicted))
            )
            for b in self.budgets
        )


@dataclass(frozen=True)
class CycleDecision:
    """What one replayed cycle decided."""

    cycle: int
    time: float
    #: Gang -> pod key -> node, for the gangs placed (or nominated) in this cycle.
    placed: dict[str, dict[str, str]]
    #: Gang -> (reason code, reason), for the gangs left waiting.
    waiting: dict[str, tuple[str, str]]
    #: (pod key, node, action, for gang) of every eviction.
    evictions: list[tuple[str, str, str, str]]
    status: str

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data."""
        return {
            "cycle": self.cycle,
            "time": self.time,
            "status": self.status,
            "placed": self.placed,
            "waiting": {k: {"code": c, "reason": r} for k, (c, r) in self.waiting.items()},
            "evictions": [
                {"pod": p, "node": n, "action": a, "for_gang": g} for p, n, a, g in self.evictions
            ],
        }


@dataclass
class WhatIfRun:
    """A replay's result: the simulator's result plus what each cycle decided."""

    result: Any  # SimulationResult (imported lazily: it pulls in the solver)
    decisions: list[CycleDecision] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)


def _decision(number: int, now: float, placement: Any) -> CycleDecision:
    placed: dict[str, dict[str, str]] = {}
    waiting: dict[str, tuple[str, str]] = {}
    for key in sorted(placement.outcomes):
        o = placement.outcomes[key]
        if o.placed:
            placed[key] = {a.pod_key: a.node for a in sorted(o.pods, key=lambda a: a.pod_key)}
        else:
            waiting[key] = (o.reason_code, o.reason)
    evictions = [(e.pod_key, e.node, str(e.action), e.for_gang) for e in placement.evictions]
    return CycleDecision(number, now, placed, waiting, evictions, str(placement.status))


async def replay_snapshot_async(
    snapshot: Snapshot, config: Mapping[str, Any] | None, cycles: int, name: str = "snapshot"
) -> WhatIfRun:
    """Run up to ``cycles`` cycles from ``snapshot`` with the config mapping ``config``."""
    from scheduler.cycle import run_cycle
    from scheduler.fairness import compute_fair_shares
    from scheduler.simulate.engine import SimulationResult, _grid, _sample
    from scheduler.simulate.scenario import Scenario, ScenarioSettings

    cfg = parse_config(dict(config) if config is not None else None)
    settings = ScenarioSettings(cycle_period=cfg.cycle_period, placement=cfg.placement)
    cluster = SnapshotCluster(snapshot)
    scenario = Scenario(name, settings, cluster.nodes, cluster.queues, ())
    result = SimulationResult(
        scenario=scenario,
        cluster=cluster,
        end_time=0.0,
        cycles=0,
        final_report=compute_fair_shares(cluster.snapshot_now()),
    )
    run = WhatIfRun(result)
    fair: dict[str, int] = {}
    period = settings.cycle_period
    scorers = ScorerMemory()  # one per run: cycles reuse the scorer's measured states
    started = time.perf_counter()
    t = 0.0
    result.stopped = "idle"
    while True:
        cluster.advance(t)
        if cluster.dirty and cluster.pending_gangs():
            if result.cycles >= cycles:
                result.stopped = "limit"
                break
            result.cycles += 1
            report = await run_cycle(cluster, settings.placement, result.cycles, scorers=scorers)
            result.solver_status[str(report.placement.status)] += 1
            result.solve_seconds += report.solve_seconds
            fair = {n: s.fair_share.get("gpu", 0) for n, s in report.fair_share.queues.items()}
            run.decisions.append(_decision(result.cycles, t, report.placement))
            result.samples.append(_sample(cluster, fair))
            t += period
            continue
        result.samples.append(_sample(cluster, fair))
        # Nothing changed: only an evicted pod leaving can make a waiting gang fit now.
        nxt = cluster.next_completion()
        if nxt is None:
            break
        t = max(_grid(nxt, period), t + period)
    result.end_time = cluster.now
    result.final_report = compute_fair_shares(cluster.snapshot_now())
    result.wall_seconds = time.perf_counter() - started
    return run


def replay_snapshot(
    snapshot: Snapshot, config: Mapping[str, Any] | None, cycles: int, name: str = "snapshot"
) -> WhatIfRun:
    """Synchronous :func:`replay_snapshot_async` (its own event loop)."""
    return asyncio.run(replay_snapshot_async(snapshot, config, cycles, name))


def _error(message: str) -> int:
    print(f"kai-scheduler simulate: {message}", file=sys.stderr)
    return 2


def _inputs(args: argparse.Namespace) -> tuple[Snapshot, dict[str, Any] | None, list[Change]]:
    """Snapshot, config mapping and changes; raises ValueError subclasses for bad input."""
    from scheduler.snapshotfile import config_to_mapping, read_snapshot

    stored = read_snapshot(args.snapshot)
    config: dict[str, Any] | None = dict(stored.config) if stored.config is not None else None
    if args.what_if_config:
        config = config_to_mapping(load_config(args.what_if_config))
    changes = [parse_change(text) for text in args.what_if]
    snapshot, mapping = apply_changes(stored.snapshot, config, changes)
    return snapshot, mapping, changes


def run_whatif(args: argparse.Namespace) -> int:
    """The ``simulate --snapshot`` mode; the exit code."""
    from scheduler.snapshotfile import SnapshotFileError

    if getattr(args, "scenario", None) or getattr(args, "trace", None):
        return _error("give --snapshot FILE or a scenario/--trace, not both")
    if args.cycles < 1:
        return _error(f"--cycles {args.cycles}: give at least 1")
    try:
        snapshot, config, changes = _inputs(args)
    except (SnapshotFileError, WhatIfError, ConfigError) as e:
        return _error(str(e))
    from scheduler.simulate.cli import _quiet_logs

    _quiet_logs()
    run = replay_snapshot(snapshot, config, args.cycles, name=os.path.basename(args.snapshot))
    run.changes = [c.text for c in changes]
    plots: list[str] = []
    if args.out:
        from scheduler.simulate.plots import write_plots

        try:
            plots = [str(p) for p in write_plots(run.result, args.out)]
        except OSError as e:
            return _error(f"--out {args.out}: cannot write plots ({e.strerror or e})")
    try:
        _print(run, plots, as_json=args.json)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _print(run: WhatIfRun, plots: Sequence[str], *, as_json: bool) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from scheduler.simulate.report import format_time, print_report, summary

    if as_json:
        data = summary(run.result)
        data["changes"] = run.changes
        data["decisions"] = [d.to_json() for d in run.decisions]
        data["plots"] = list(plots)
        print(json.dumps(data, indent=2))
        return
    console = Console() if sys.stdout.isatty() else Console(width=140)
    if run.changes:
        console.print("[bold]What if[/]: " + ", ".join(escape(c) for c in run.changes))
    print_report(run.result, console)
    table = Table(title="Placements per cycle", title_justify="left")
    for col in ("Cycle", "At", "Gang", "Pods -> nodes"):
        table.add_column(col, overflow="fold")
    for d in run.decisions:
        for gang, pods in d.placed.items():
            nodes: dict[str, int] = {}
            for node in pods.values():
                nodes[node] = nodes.get(node, 0) + 1
            where = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(nodes.items()))
            table.add_row(str(d.cycle), format_time(d.time), escape(gang), escape(where))
    if table.rows:
        console.print(table)
    else:
        console.print("No gang would be placed.")
    for p in plots:
        print(f"wrote {p}")
