"""The long chaos run: ``python -m tests.chaos --minutes 10 --seed S``.

Starts its own control plane (the binaries ``scripts/setup.sh`` builds), installs the CRDs
and RBAC, makes kwok GPU nodes, runs :func:`tests.chaos.run.run_chaos` and prints the JSON
summary (faults injected by kind, binds, pods, violations). Exit code 0 without violations,
1 with, 2 when the harness itself failed. Repeat a failing run with the same ``--seed``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

from testenv import ControlPlane
from testenv.nodes import make_gpu_nodes
from tests.chaos.plan import FaultKind
from tests.chaos.run import ChaosEnv, ChaosSettings, install_kai, run_chaos_sync
from tests.chaos.workload import StreamSettings

__all__ = ["main"]


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the fault phase")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--nodes", type=int, default=4, help="kwok nodes of 8 GPUs each")
    parser.add_argument("--drain", type=float, default=120.0, help="seconds to drain at the end")
    parser.add_argument("--fault-gap", type=float, default=15.0, help="mean seconds between faults")
    parser.add_argument("--bind-failure-rate", type=float, default=0.05)
    parser.add_argument("--waiting", type=int, default=6, help="gangs waiting at any time")
    parser.add_argument("--json", type=Path, help="also write the summary to this file")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run and print the summary; the exit code (see the module docstring)."""
    args = _args(argv)
    settings = ChaosSettings(
        seed=args.seed,
        duration=args.minutes * 60,
        drain_timeout=args.drain,
        mean_fault_gap=args.fault_gap,
        bind_failure_rate=args.bind_failure_rate,
        stream=replace(StreamSettings(), max_waiting=args.waiting),
        # Some freezes outlast the scheduler's 90 s watch heartbeat, so its recovery from a
        # half-open watch is exercised too.
        fault_seconds={FaultKind.WATCH_FREEZE: (32.0, 100.0)},
    )
    print(f"chaos: seed {settings.seed}, {args.minutes:g} min, {args.nodes} nodes", file=sys.stderr)
    with ControlPlane() as cp:
        try:
            kubeconfig = install_kai(cp)
            namespace = f"chaos-{uuid.uuid4().hex[:6]}"
            cp.kubectl("create", "namespace", namespace)
            cp.kubectl(
                "wait", "--for=create", "serviceaccount/default", "-n", namespace,
                "--timeout=30s", timeout=45,
            )  # fmt: skip
            tag = {"kai-chaos": namespace}
            nodes = make_gpu_nodes(
                cp, args.nodes, gpus=8, cpu="16", memory="64Gi", pods=12, labels=tag,
                name_prefix=f"chaos-{namespace[-6:]}",
            )  # fmt: skip
            with tempfile.TemporaryDirectory(prefix="kai-chaos-") as work:
                env = ChaosEnv(
                    cp=cp,
                    scheduler_kubeconfig=kubeconfig,
                    namespace=namespace,
                    nodes=tuple(nodes),
                    node_selector=tag,
                    workdir=Path(work),
                    log_dir=cp.log_dir / "chaos",
                )
                report = run_chaos_sync(env, settings, echo=None if args.quiet else sys.stderr)
        except Exception as e:
            print(f"chaos: the harness failed: {e!r}\n{cp.log_tail(20)}", file=sys.stderr)
            return 2
    text = report.to_json()
    print(text)
    if args.json is not None:
        args.json.write_text(text)
    counts = report.summary["violation_counts"]
    print(
        f"chaos: seed {settings.seed}: {len(report.violations)} violation(s) {json.dumps(counts)}",
        file=sys.stderr,
    )
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
