"""Trace replay: pods arrive one batch per cycle onto a fixed cluster, with no departures.

Each cycle takes the pods that arrived (up to ``batch``) and places them; with
``drop_unplaced`` a pod not placed in the first cycle that sees it is dropped for good (the
FGD paper's rule). Three engines run the cycles:

- ``cycle``: the live scheduler's :func:`scheduler.cycle.run_cycle` (snapshot, fair share,
  greedy + CP-SAT, validation, commit) on the simulator's in-memory backend, with
  ``placement.scoring: fragmentation`` (:mod:`scheduler.plugins.fragmentation`). This is
  what a cluster running the scheduler with that setting would do. About 0.1-0.5 s per cycle
  on the openb cluster, so it is used for batches.
- ``greedy``: only the placement pass of that cycle (:func:`scheduler.solver.place_gangs`
  with the same scorer) on one incrementally updated state: about 2 ms per pod, so a 10k-pod
  replay with one pod per cycle takes under a minute. With one single-pod gang per cycle
  and one queue, the skipped stages have nothing to decide. One difference: its workload
  mix counts every arrival, the cycle's only the pods alive in the snapshot.
- ``arrays`` (:mod:`scheduler.simulate.replay_arrays`): a vectorised re-implementation with
  the same fragmentation arithmetic (but not the model-scarcity term): seconds per replay; a
  cross-check, and the only engine with the ``fgd`` baseline policy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from scheduler.cluster.node import GPU_MILLI
from scheduler.plugins.fragmentation import (
    PRICE_WEIGHT,
    FragmentationScorer,
    Measure,
    free_gpu_by_model,
)
from scheduler.simulate.replay_arrays import CycleEngine, Outcome, array_engine, mix_for, trace_task
from scheduler.simulate.replay_timeline import DeviceLedger, ReplaySample
from scheduler.simulate.trace import (
    TraceError,
    TraceNode,
    TracePod,
    add_trace_arguments,
    load_trace_args,
    to_node,
    to_pod,
)

__all__ = [
    "CHECKPOINTS",
    "TRACE_QUEUE",
    "Engine",
    "Policy",
    "ReplayResult",
    "ReplaySettings",
    "TracePlacement",
    "add_trace_arguments",
    "auto_engine",
    "load_trace_args",
    "replay",
    "run_trace",
    "settings_from_args",
    "write_placements",
]

#: The queue every trace pod is in (one queue: the trace has no tenants).
TRACE_QUEUE = "trace"

Engine = Literal["arrays", "greedy", "cycle"]

#: Arrived workload (% of cluster GPU capacity) at which the allocation ratio is recorded.
CHECKPOINTS = (50, 80, 90, 100, 110, 120, 130)

Policy = Literal["frag", "fgd", "bestfit", "paper-bestfit"]


@dataclass(frozen=True)
class ReplaySettings:
    """How a replay schedules.

    ``policy``: ``frag`` (ours: fragmentation increase under the ``mixed`` measure, ties
    broken towards packing), ``fgd`` (FGD's single-task measure, task-count mix, no
    tie-break: a baseline), ``bestfit`` (least GPU, then tightest device, then least CPU
    left on the node), ``paper-bestfit`` (BestFit as the FGD paper's simulator scores it:
    free CPU and GPU after the pod in one integer score, random among equal best; the
    baseline the paper's published ratios are measured against).
    """

    batch: int = 1
    drop_unplaced: bool = True
    policy: Policy = "frag"
    #: Rebuild the mix arrays (and every node's cached fragmentation) after this many arrivals
    #: or this share of the arrivals before the last rebuild, whichever is more: the mix
    #: settles as pods accumulate, and fewer rebuilds keep more cached scores (measured on
    #: openb seeds 42-44, batch 1: half the time at 0.05, allocation within +-0.03 points).
    refresh_every: int = 64
    refresh_growth: float = 0.05
    #: ``frag`` policy knobs: weigh task types by GPU request (else by count), count CPU-only
    #: types in the mix, which fragmentation measure, share of task types kept.
    gpu_weighted: bool = False
    cpu_only_in_mix: bool = True
    measure: Measure = "mixed"
    coverage: float = 1.0
    #: Weight of the model-scarcity term (0 turns it off; see fragmentation.model_scarcity).
    scarcity_weight: float = 1.0
    #: Weight of the share-price term (``placement.sharePriceWeight``; 0 turns it off; see
    #: :mod:`scheduler.plugins.device_prices`), on the live engines.
    price_weight: float = PRICE_WEIGHT
    #: Seed of the ``paper-bestfit`` baseline's random choice among equally scored nodes.
    tie_seed: int = 0
    #: ``frag`` policy, live engines (``greedy``, ``cycle``): hold a share back rather than
    #: strand an idle device (``placement.holdStrandingShares``; see
    #: :mod:`scheduler.plugins.strand_guard`).
    hold_stranding: bool = False


@dataclass(frozen=True, slots=True)
class TracePlacement:
    """One placed pod: node name, device index -> thousandths, and the cycle it was placed in."""

    pod: str
    node: str
    gpus: tuple[tuple[int, int], ...]
    cycle: int


@dataclass
class ReplayResult:
    """What a replay did."""

    placements: list[TracePlacement]
    #: checkpoint % -> allocation ratio % (None if arrivals never reached it).
    ratios: dict[int, float | None]
    capacity_milli: int
    arrived_milli: int
    allocated_milli: int
    pods_arrived: int
    dropped: list[str] = field(default_factory=list)
    cycles: int = 0
    seconds: float = 0.0
    #: The cluster after every cycle (for ``--out`` plots).
    timeline: list[ReplaySample] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary."""
        cap = self.capacity_milli or 1
        return {
            "pods_arrived": self.pods_arrived,
            "pods_placed": len(self.placements),
            "pods_unplaced": len(self.dropped),
            "cycles": self.cycles,
            "arrived_pct": round(100 * self.arrived_milli / cap, 2),
            "allocated_pct": round(100 * self.allocated_milli / cap, 2),
            "allocation_ratio_at_arrived": {
                str(k): (None if v is None else round(v, 2)) for k, v in self.ratios.items()
            },
            "seconds": round(self.seconds, 2),
        }


def _greedy_engine(nodes: Sequence[TraceNode], settings: ReplaySettings) -> CycleEngine:
    """Each cycle through the live scheduler's placement pass
    (:func:`scheduler.solver.place_gangs`) with :class:`FragmentationScorer` plugged in, on one
    :class:`~scheduler.solver.ClusterState` kept across cycles; every pod is its own gang."""
    from scheduler.cluster.snapshot import Snapshot
    from scheduler.solver import ClusterState, GangRequest, place_gangs
    from scheduler.solver.greedy import ClassIndex

    state = ClusterState.from_snapshot(Snapshot(nodes=tuple(to_node(n) for n in nodes)))
    scorer = FragmentationScorer(
        mix_for(settings),
        sorted({n.model for n in nodes if n.gpus}),
        refresh_every=settings.refresh_every,
        refresh_growth=settings.refresh_growth,
        capacity=lambda: free_gpu_by_model(
            (s.node.gpu_model, s.gpu_free) for s in state.nodes.values()
        ),
        scarcity_weight=settings.scarcity_weight,
        price_weight=settings.price_weight,
    )
    scorer.hold_stranding = settings.hold_stranding
    # One index for the whole replay: between refreshes of the mix a class keeps its score,
    # so a cycle re-ranks only the classes the previous one changed.
    index = ClassIndex(state, scorer)

    def place(cycle: int, batch: list[TracePod]) -> list[Outcome]:
        scorer.mix.extend(trace_task(p) for p in batch)
        if scorer.refresh():
            index.forget_scores()
        domain = {p.name: to_pod(p) for p in batch}
        gangs = [GangRequest(d.gang, d.queue, required=(d,)) for d in domain.values()]
        result = place_gangs(state, gangs, scorer, cycle=cycle, index=index)
        done = {a.pod_uid: a for a in result.assignments}
        return [
            (p, done[p.name].node, done[p.name].gpu_grant) if p.name in done else (p, None, ())
            for p in batch
        ]

    return place


def _cycle_engine(nodes: Sequence[TraceNode], settings: ReplaySettings) -> CycleEngine:
    """Each cycle is the live :func:`scheduler.cycle.run_cycle` (snapshot, fair share, greedy
    and CP-SAT, validation, commit) on the simulator's in-memory backend, with
    ``placement.scoring: fragmentation`` (policy ``frag``) or binpack (policy ``bestfit``).

    A pod left pending is marked failed at once: nothing departs, so free capacity only
    shrinks and it could not fit later either; keeping it would only slow the next cycles.
    """
    import asyncio
    import weakref

    from scheduler.cluster.gang import Gang
    from scheduler.cluster.queue import Queue
    from scheduler.cycle import run_cycle
    from scheduler.plugins.scorer_memory import ScorerMemory
    from scheduler.simulate.backend import SimulatedCluster
    from scheduler.solver.placement import PlacementSettings

    cluster = SimulatedCluster([to_node(n) for n in nodes], [Queue(TRACE_QUEUE)])
    # Nothing is taken back: the trace's pods stay where they land (as in the FGD paper).
    placement = PlacementSettings(
        scoring="packing" if settings.policy == "bestfit" else "fragmentation",
        take_back=False,
        hold_stranding_shares=settings.hold_stranding,
        share_price_weight=settings.price_weight,
    )

    # One event loop for every cycle: asyncio.run() in the main thread installs a SIGINT
    # handler holding the cycle's task, and on the way out the signal module formats that
    # handler (and with it the task's result, the whole cycle report) into an error message
    # it then discards (openb seed 42, batch 64: 137 s before, 125 s with one loop).
    loop = asyncio.new_event_loop()
    scorers = ScorerMemory()  # as the live loop keeps it: measured node states carry over

    def place(cycle: int, batch: list[TracePod]) -> list[Outcome]:
        domain = [to_pod(p, queue=TRACE_QUEUE) for p in batch]
        # Creation time = arrival sequence, so the cycle takes them oldest first, as it
        # would pods created one after another in a real cluster.
        first = cycle * settings.batch
        cluster.add_pods(
            domain,
            [
                Gang(d.namespace, d.name, queue=TRACE_QUEUE, implicit=True, creation_time=first + i)
                for i, d in enumerate(domain)
            ],
        )
        loop.run_until_complete(run_cycle(cluster, placement, cycle, scorers=scorers))
        out: list[Outcome] = []
        for p, d in zip(batch, domain, strict=True):
            pod = cluster.pods[d.uid].pod
            if pod.node_name is not None:
                out.append((p, pod.node_name, pod.gpu_grant))
                continue
            cluster.fail_pod(d.uid)
            out.append((p, None, ()))
        return out

    weakref.finalize(place, loop.close)
    return place


def guard_runs(policy: str, engine: str) -> bool:
    """Whether ``hold_stranding`` can apply: the strand guard lives in the live scheduler's
    greedy and cycle with fragmentation scoring (policy ``frag``), not in the vectorised
    ``arrays`` engine or the baselines."""
    return policy == "frag" and engine != "arrays"


def replay(
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    settings: ReplaySettings,
    *,
    engine: Engine = "arrays",
    progress: Callable[[float, float], None] | None = None,
) -> ReplayResult:
    """Replay ``pods`` (in arrival order) onto ``nodes``; see the module docstring for the
    engines (``greedy`` supports the ``frag`` policy only, ``cycle`` ``frag`` and ``bestfit``).
    """
    if settings.batch < 1:
        raise ValueError(f"--batch is {settings.batch}; it must be at least 1")
    supported = {"greedy": ("frag",), "cycle": ("frag", "bestfit")}.get(engine)
    if supported is not None and settings.policy not in supported:
        raise ValueError(f"--engine {engine} supports --policy {' or '.join(supported)} only")
    if settings.hold_stranding and not guard_runs(settings.policy, engine):
        raise ValueError(
            f"--hold-stranding needs --policy frag on --engine greedy or cycle "
            f"(got --policy {settings.policy}, --engine {engine})"
        )
    start = time.perf_counter()
    engines = {"arrays": array_engine, "greedy": _greedy_engine, "cycle": _cycle_engine}
    place = engines[engine](nodes, settings)
    capacity = sum(n.gpus for n in nodes) * GPU_MILLI
    placements: list[TracePlacement] = []
    ratios: dict[int, float | None] = dict.fromkeys(CHECKPOINTS)
    pending: list[str] = []
    dropped: list[str] = []
    arrived = allocated = unplaced = 0
    cycle = 0
    ledger = DeviceLedger(nodes)
    timeline: list[ReplaySample] = []
    for cycle, batch in enumerate(_batches(pods, settings.batch)):
        crossed: list[int] = []
        for p in batch:
            arrived += p.gpu_request_milli
            crossed += [
                c
                for c in CHECKPOINTS
                if ratios[c] is None and c not in crossed and arrived * 100 >= c * capacity
            ]
        # Pods left waiting from earlier cycles are not retried: nothing ever departs, so free
        # capacity only shrinks and a pod that did not fit then cannot fit now.
        for p, node, grant in place(cycle, batch):
            if node is None:
                (dropped if settings.drop_unplaced else pending).append(p.name)
                unplaced += p.gpu_request_milli
                continue
            allocated += p.gpu_request_milli
            placements.append(TracePlacement(p.name, node, grant, cycle))
            ledger.take(node, grant)
        for c in crossed:
            ratios[c] = 100 * allocated / capacity if capacity else 0.0
        timeline.append(
            ReplaySample(
                cycle=cycle,
                pods_arrived=min(len(pods), (cycle + 1) * settings.batch),
                arrived_milli=arrived,
                allocated_milli=allocated,
                unplaced_pods=len(dropped) + len(pending),
                unplaced_milli=unplaced,
                idle_milli=ledger.idle_milli,
                fragment_milli=ledger.fragment_milli,
            )
        )
        if progress is not None:
            progress(min(len(pods), (cycle + 1) * settings.batch), len(pods))
    return ReplayResult(
        placements=placements,
        ratios=ratios,
        capacity_milli=capacity,
        arrived_milli=arrived,
        allocated_milli=allocated,
        pods_arrived=len(pods),
        dropped=dropped + pending,
        cycles=cycle + 1 if pods else 0,
        seconds=time.perf_counter() - start,
        timeline=timeline,
    )


def auto_engine(batch: int, policy: str) -> Engine:
    """The engine ``--engine auto`` picks: the live cycle for batches (each cycle costs
    tenths of a second on the openb cluster); for one pod per cycle (10k full cycles would
    take most of an hour) the live greedy for ``frag`` and the vectorised replay for the
    baselines. ``fgd`` and ``paper-bestfit`` exist only there, at every batch size (the
    paper's BestFit is kube-scheduler's one pod at a time)."""
    if policy in ("fgd", "paper-bestfit") or (batch == 1 and policy != "frag"):
        return "arrays"
    return "cycle" if batch > 1 else "greedy"


def _batches(pods: Sequence[TracePod], size: int) -> Iterator[list[TracePod]]:
    for i in range(0, len(pods), size):
        yield list(pods[i : i + size])


def write_placements(path: str | Path, placements: Sequence[TracePlacement]) -> None:
    """One JSON object per placed pod: ``{"pod", "node", "gpus": {"<index>": milli}, "cycle"}``."""
    with Path(path).open("w") as f:
        for pl in placements:
            gpus = {str(d): m for d, m in pl.gpus}
            f.write(
                json.dumps({"pod": pl.pod, "node": pl.node, "gpus": gpus, "cycle": pl.cycle}) + "\n"
            )


# --- command line (``kai-scheduler simulate --trace openb``; flags: trace.add_trace_arguments)


def settings_from_args(args: argparse.Namespace) -> ReplaySettings:
    """ReplaySettings from parsed flags."""
    return ReplaySettings(
        batch=args.batch,
        drop_unplaced=bool(args.drop_unplaced),
        policy=args.policy,
        hold_stranding=bool(getattr(args, "hold_stranding", False)),
    )


def _quiet_logs() -> None:
    """The greedy logs every unplaced gang at debug level; keep stdout for the summary."""
    import logging

    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def run_trace(
    args: argparse.Namespace, progress: Callable[[float, float], None] | None = None
) -> int:
    """Run a trace replay from parsed flags; prints a table (or JSON). Exit code 0/2.
    ``progress(pods done, pods)`` is called after every cycle."""
    try:
        nodes, pods = load_trace_args(args)
    except TraceError as e:
        print(f"kai-scheduler simulate: {e}", file=sys.stderr)
        return 2
    engine = auto_engine(args.batch, args.policy) if args.engine == "auto" else args.engine
    if engine != "arrays":
        _quiet_logs()
    try:
        result = replay(nodes, pods, settings_from_args(args), engine=engine, progress=progress)
    except ValueError as e:
        print(f"kai-scheduler simulate: {e}", file=sys.stderr)
        return 2
    if args.placements:
        try:
            write_placements(args.placements, result.placements)
        except OSError as e:
            print(f"kai-scheduler simulate: --placements {args.placements}: {e}", file=sys.stderr)
            return 2
    summary = result.summary()
    summary.update(
        policy=args.policy,
        engine=engine,
        batch=args.batch,
        drop_unplaced=bool(args.drop_unplaced),
    )
    # What any scheduler could reach at each checkpoint (nothing departs in a replay), so the
    # distance to the best possible is printed beside every ratio.
    from scheduler.bench.openb_bound import ceilings_at

    reached = [int(k) for k, v in summary["allocation_ratio_at_arrived"].items() if v is not None]
    summary["lp_ceiling_at_arrived"] = ceilings_at(pods, nodes, reached, args.batch)
    if getattr(args, "slice", None):
        from scheduler.simulate.trace_slice import parse_slice

        summary["slice"] = parse_slice(args.slice).to_json()
    plots: list[str] = []
    if getattr(args, "out", None):
        from scheduler.simulate.replay_plots import write_replay_plots

        title = f"openb replay ({args.policy}, batch {args.batch})"
        try:
            written = write_replay_plots(
                result, args.out, title=title, dropped=bool(args.drop_unplaced)
            )
        except OSError as e:
            print(
                f"kai-scheduler simulate: --out {args.out}: cannot write plots ({e.strerror or e})",
                file=sys.stderr,
            )
            return 2
        plots = [str(path) for path in written]
        summary["plots"] = plots
    if getattr(args, "json", False):
        print(json.dumps(summary))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"openb replay ({args.policy}, batch {args.batch}, engine {engine})")
    table.add_column("arrived % of GPU capacity", justify="right")
    table.add_column("GPU allocation ratio %", justify="right")
    table.add_column("LP ceiling %", justify="right")
    ceilings = summary["lp_ceiling_at_arrived"]
    for k, v in summary["allocation_ratio_at_arrived"].items():
        ceiling = ceilings.get(k)
        table.add_row(
            k, "-" if v is None else f"{v:.2f}", "-" if ceiling is None else f"{ceiling:.2f}"
        )
    console = Console()
    console.print(table)
    console.print(
        f"pods arrived {summary['pods_arrived']}, placed {summary['pods_placed']}, "
        f"unplaced {summary['pods_unplaced']}; {summary['seconds']} s"
    )
    for path in plots:
        console.print(f"wrote {path}")
    return 0
