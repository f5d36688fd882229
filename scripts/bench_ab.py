#!/usr/bin/env python3
"""Time the solver of two source trees side by side: ``scripts/bench_ab.py OLD NEW``.

This machine's speed drifts by 20 % over minutes, more than most changes are worth, so two
runs of ``python -m scheduler.bench solver`` minutes apart compare the machine as much as
the code. Here one process per tree builds the same synthetic snapshots (seeds 1..cycles,
the 5,000-node bench by default) and solves them in turn, alternating which tree goes
first; what is compared is the ratio of each pair, taken within seconds of each other.

Prints one JSON line: the p50 of each tree and the median and mean ratio NEW / OLD.
``OLD`` and ``NEW`` are folders holding a ``scheduler/`` package (e.g. ``git worktree
add /tmp/old <commit>``); run it with the repository's virtualenv.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import IO


def child(args: argparse.Namespace) -> None:
    """One tree: build a snapshot when told its index, then solve it when told to go."""
    import logging

    import structlog

    from scheduler.bench.synthetic import ClusterSpec, synthetic_snapshot
    from scheduler.solver import PlacementSettings, solve

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    # Trees from before taking back (2026-11-29, the code the solver target was set on) have
    # neither its setting nor warm_up: a small solve warms them up as warm_up does.
    try:
        settings = PlacementSettings(take_back=not args.no_take_back)
    except TypeError:  # a tree that never takes back
        settings = PlacementSettings()
    try:
        from scheduler.solver.warm import warm_up

        warm_up(settings)
    except ImportError:
        solve(synthetic_snapshot(ClusterSpec(nodes=50, gangs=20, seed=10_000)), settings)
    priorities = (50, 50, 50, 100)
    print("ready", flush=True)
    for line in sys.stdin:
        k = int(line)
        # By name: older trees' ClusterSpec ends at ``priorities`` (the same snapshots).
        spec = ClusterSpec(
            nodes=args.nodes, gpus_per_node=8, gangs=args.gangs, fill=0.7, seed=1 + k,
            jitter=0, priorities=priorities,
        )  # fmt: skip
        snapshot = synthetic_snapshot(spec)
        print("built", flush=True)
        sys.stdin.readline()
        started = time.perf_counter()
        solve(snapshot, settings, cycle=k)
        print(time.perf_counter() - started, flush=True)


def _ask(proc: subprocess.Popen[str], line: str) -> str:
    stdin: IO[str] | None = proc.stdin
    stdout: IO[str] | None = proc.stdout
    assert stdin is not None and stdout is not None
    stdin.write(line + "\n")
    stdin.flush()
    return stdout.readline().strip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--cycles", type=int, default=5, help="snapshots per round (seeds 1..)")
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--gangs", type=int, default=2000)
    p.add_argument("--no-take-back", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return 0
    flags = [f"--nodes={args.nodes}", f"--gangs={args.gangs}"]
    flags += ["--no-take-back"] if args.no_take_back else []
    procs = []
    for root in (args.old, args.new):
        env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
        cmd = [sys.executable, os.path.abspath(__file__), "x", "y", "--child", *flags]
        proc = subprocess.Popen(
            cmd, cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        procs.append(proc)
    times: list[list[float]] = [[], []]
    for r in range(args.rounds):
        for k in range(args.cycles):
            for proc in procs:  # both build first (not timed), then solve one after the other
                assert _ask(proc, str(k)) == "built"
            order = (0, 1) if (r + k) % 2 == 0 else (1, 0)
            for i in order:
                times[i].append(float(_ask(procs[i], "go")))
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    ratios = [b / a for a, b in zip(times[0], times[1], strict=True)]
    print(
        json.dumps(
            {
                "bench": "solver-ab",
                "old": args.old,
                "new": args.new,
                "nodes": args.nodes,
                "gangs": args.gangs,
                "take_back": not args.no_take_back,
                "pairs": len(ratios),
                "old_p50": round(statistics.median(times[0]), 4),
                "new_p50": round(statistics.median(times[1]), 4),
                "ratio_median": round(statistics.median(ratios), 4),
                "ratio_mean": round(statistics.mean(ratios), 4),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
