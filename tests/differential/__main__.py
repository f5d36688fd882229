"""``python -m tests.differential --cases 1000 --seed 7``: the long differential run.

Starts its own control plane (etcd, kube-apiserver, kube-controller-manager, kwok) with
kube-scheduler's identity, starts kube-scheduler and ours, runs the cases (seeds ``seed``,
``seed+1``, ...) and prints one JSON document: counts, the failing seeds by check, and every
failure with the command that replays its case (``--seed S --cases 1``). ``--cases-out FILE``
also writes every case's placements. Exit status 1 when a case failed. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .run import Harness, Settings, differential_control_plane, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.differential", description=__doc__)
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1, help="seed of the first case")
    parser.add_argument("--batch", type=int, default=Settings.batch_size, help="cases per batch")
    parser.add_argument("--stable", type=float, default=Settings.stable, help="settle seconds")
    parser.add_argument("--timeout", type=float, default=Settings.timeout, help="per batch")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--cases-out", type=Path, default=None, help="every case's outcome")
    args = parser.parse_args(argv)
    if args.cases < 1 or args.batch < 1:
        parser.error("--cases and --batch must be >= 1")
    settings = Settings(batch_size=args.batch, stable=args.stable, timeout=args.timeout)
    began = time.monotonic()
    with differential_control_plane() as cp:
        print(f"control plane up; logs in {cp.log_dir}", file=sys.stderr, flush=True)
        with Harness(cp, cp.log_dir / "differential", settings=settings) as harness:
            results = harness.run(args.seed, args.cases)
    doc = {"seed": args.seed, **summary(results, time.monotonic() - began)}
    doc["log_dir"] = str(cp.log_dir)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.cases_out:
        args.cases_out.write_text(json.dumps([r.to_dict() for r in results], indent=1) + "\n")
    return 1 if doc["failed_seeds"] else 0


if __name__ == "__main__":
    sys.exit(main())
