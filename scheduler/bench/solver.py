"""``python -m scheduler.bench solver``: time the placement solver on synthetic clusters.

Each cycle solves a fresh synthetic snapshot (seed, seed+1, ...) with the same parameters;
snapshot generation is not timed, ``solve()`` is (fair shares, greedy, CP-SAT, validation,
explanations). Prints one JSON line. ``best_bound`` bounds the first stage's objective over
every valid placement (see :mod:`scheduler.solver.bound`), so ``min_objective_over_bound``
is a lower bound of how close to optimal each cycle got.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import time
from typing import Any

import structlog

from scheduler.bench.synthetic import ClusterSpec, synthetic_snapshot
from scheduler.solver import PlacementSettings, solve, validate

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``solver`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "solver", help="benchmark the gang placement solver on a synthetic cluster"
    )
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--gangs", type=int, default=200, help="pending gangs per cycle")
    p.add_argument("--fill", type=float, default=0.7, help="GPU fraction already in use")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cycles", type=int, default=5)
    p.add_argument(
        "--jitter", type=int, default=0, help="random extra cores/GiB on running pods (0 = none)"
    )
    p.add_argument("--time-limit", type=float, default=0.5, help="CP-SAT seconds per cycle")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--priorities",
        default="50,50,50,100",
        help="comma-separated priorities drawn for pending gangs (>= 100: non-preemptible)",
    )
    p.add_argument("--greedy-only", action="store_true")
    p.add_argument(
        "--lower-tier-stages",
        action="store_true",
        help="also optimise priorities below the first stage (PlacementSettings)",
    )
    p.add_argument("--gpu-strategy", choices=["binpack", "spread"], default="binpack")
    p.add_argument("--scoring", choices=["packing", "fragmentation"], default="packing")
    return p


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print one JSON line; 0 when every placement was valid."""
    if args.nodes < 1 or args.gangs < 0 or not 0 <= args.fill <= 1 or args.cycles < 1:
        raise SystemExit("--nodes >= 1, --gangs >= 0, --cycles >= 1 and 0 <= --fill <= 1")
    try:
        priorities = tuple(int(p) for p in args.priorities.split(","))
    except ValueError:
        raise SystemExit(f"--priorities {args.priorities!r}: use integers like 50,100") from None
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    settings = PlacementSettings(
        gpu_strategy=args.gpu_strategy,
        scoring=args.scoring,
        time_limit_seconds=args.time_limit,
        workers=args.workers,
        greedy_only=args.greedy_only,
        lower_tier_stages=args.lower_tier_stages,
    )
    seconds: list[float] = []
    cpu: list[float] = []  # process CPU time (all threads): comparable under contention
    rows: list[dict[str, Any]] = []
    invalid = 0
    for k in range(args.cycles):
        spec = ClusterSpec(
            args.nodes,
            args.gpus_per_node,
            args.gangs,
            args.fill,
            args.seed + k,
            args.jitter,
            priorities,
        )
        snap = synthetic_snapshot(spec)
        started, cpu_started = time.perf_counter(), time.process_time()
        placement = solve(snap, settings, cycle=k)
        seconds.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
        if validate(snap, placement.assignments):
            invalid += 1
        rows.append(
            {
                "status": placement.status.value,
                "gangs": sum(1 for o in placement.outcomes.values() if o.placed),
                "pods": len(placement.assignments),
                "gpus": sum(m for a in placement.assignments for _, m in a.gpu_grant) / 1000,
                "objective": placement.objective,
                "bound": placement.best_bound,
                "greedy": placement.greedy_objective,
                "build": placement.build_seconds,
                "solve": placement.solve_seconds,
                "explain": placement.explain_seconds,
            }
        )
    ratios = [r["objective"] / r["bound"] for r in rows if r["bound"]]
    greedy_ratios = [r["greedy"] / r["bound"] for r in rows if r["bound"]]
    last = rows[-1]
    out = {
        "bench": "solver",
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "gangs": args.gangs,
        "fill": args.fill,
        "seed": args.seed,
        "cycles": args.cycles,
        "time_limit": args.time_limit,
        "jitter": args.jitter,
        "priorities": args.priorities,
        "greedy_only": args.greedy_only,
        "lower_tier_stages": args.lower_tier_stages,
        "cycle_seconds_p50": round(statistics.median(seconds), 4),
        "cycle_seconds_p95": round(_pct(seconds, 0.95), 4),
        "cycle_seconds": [round(s, 3) for s in seconds],
        "cycle_cpu_seconds_p50": round(statistics.median(cpu), 4),
        "cpsat_seconds_p50": round(statistics.median(r["solve"] for r in rows), 4),
        "build_seconds_p50": round(statistics.median(r["build"] for r in rows), 4),
        "explain_seconds_p50": round(statistics.median(r["explain"] for r in rows), 4),
        "admitted_gangs": statistics.mean(r["gangs"] for r in rows),
        "admitted_pods": statistics.mean(r["pods"] for r in rows),
        "admitted_gpus": statistics.mean(r["gpus"] for r in rows),
        "status": [r["status"] for r in rows],
        "objective": last["objective"],
        "best_bound": last["bound"],
        "greedy_objective": last["greedy"],
        "min_objective_over_bound": round(min(ratios), 6) if ratios else None,
        "min_greedy_over_bound": round(min(greedy_ratios), 6) if greedy_ratios else None,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "validator": "ok" if invalid == 0 else f"{invalid} invalid cycles",
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(out))
    return 0 if invalid == 0 else 1
