"""``python -m scheduler.bench e2e``: bind throughput on a real control plane, ours versus peers.

One throwaway control plane (etcd, kube-apiserver with RBAC, static tokens and an audit log,
kube-controller-manager, kwok) with ``--nodes`` fake GPU nodes. For each contender in turn
(ours, kube-scheduler, KAI-Scheduler; see :mod:`scheduler.bench.e2e_peers`):

1. a fresh namespace gets the same backlog of ``--pods`` pending pods (single pods, or gangs of
   ``--gang-size`` with one PodGroup each);
2. the scheduler is started as its own processes; that instant is "process start";
3. a watch of the namespace notes when each pod is first seen bound (arrival time of the event
   showing ``spec.nodeName``) until all are, or ``--timeout``;
4. CPU seconds and peak memory of its processes are read from /proc before they are stopped,
   and its API requests are counted from the audit log by user;
5. every pod is force-deleted so the next contender finds the nodes empty.

Prints one JSON document (a result per contender, ours-versus-peer ratios) on stdout and a
short table on stderr. Peers are built on demand by ``testenv/build_peers.sh``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from scheduler.bench import e2e_peers as peers
from scheduler.bench.e2e_cluster import (
    Api,
    ApiError,
    Backlog,
    BindWatch,
    create_backlog,
    create_namespace,
    delete_namespace,
)
from scheduler.bench.e2e_report import RunObservation, ratios, result_of, table
from scheduler.bench.e2e_stats import ProcessTreeMeter, count_audit
from testenv import ControlPlane, find_bin_dir, make_gpu_nodes

__all__ = [
    "BenchSpec",
    "add_parser",
    "audit_policy",
    "bench_control_plane",
    "contenders",
    "document",
    "prepare_cluster",
    "run",
    "run_bench",
    "run_contender",
]

REPO = peers.REPO
SCHEDULERS = ("ours", "kube-scheduler", "kai")


@dataclass(frozen=True)
class BenchSpec:
    """What is measured: the cluster, the backlog and how long a run may take."""

    nodes: int
    gpus_per_node: int
    backlog: Backlog
    #: Seconds a contender may take to bind the whole backlog.
    timeout: float
    #: Seconds the processes keep running after the last bind before CPU is read and they stop.
    settle: float = 2.0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``e2e`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "e2e", help="bind a backlog on a real control plane: ours vs kube-scheduler and KAI"
    )
    p.add_argument("--nodes", type=int, default=20)
    p.add_argument("--pods", type=int, default=150)
    p.add_argument("--gang-size", type=int, default=1, help="pods per PodGroup (1: single pods)")
    p.add_argument(
        "--scheduler",
        default="ours",
        help="ours, kube-scheduler, kai, all, or a comma-separated list (runs in that order)",
    )
    p.add_argument(
        "--throttle",
        choices=("default", "unthrottled", "both"),
        default="both",
        help="peers' client rate limits: their defaults, none, or one run each",
    )
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--pod-gpus", type=int, choices=(0, 1), default=1)
    p.add_argument("--timeout", type=float, default=None, help="seconds per contender")
    p.add_argument("--ours-config", type=Path, default=None, help="YAML merged over ours' config")
    p.add_argument("--ours-log-level", default="info", choices=("debug", "info", "warning"))
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return p


def audit_policy() -> dict[str, Any]:
    """Metadata-level audit of the contenders' identities only (so the log stays small and the
    API server's work for everyone else is unchanged), one event per request stage after the
    request was read."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "Metadata", "users": [peers.KUBE_SCHEDULER_USER]},
            {
                "level": "Metadata",
                "userGroups": [
                    f"system:serviceaccounts:{peers.OURS_NAMESPACE}",
                    f"system:serviceaccounts:{peers.KAI_NAMESPACE}",
                ],
            },
            {"level": "None"},
        ],
    }


def _selected(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if names == ["all"]:
        return list(SCHEDULERS)
    unknown = [n for n in names if n not in SCHEDULERS]
    if unknown or not names:
        raise SystemExit(f"--scheduler {text!r}: use {', '.join(SCHEDULERS)}, all, or a list")
    return names


def _build_peer(peer: str) -> None:
    # Progress goes to stderr: stdout carries only the JSON result.
    script = REPO / "testenv" / "build_peers.sh"
    print(f"[bench] building/checking {peer} with {script} ...", file=sys.stderr, flush=True)
    subprocess.run([str(script), peer], check=True, stdout=sys.stderr, cwd=REPO)


def _kube_scheduler_binary() -> Path:
    built_with_testenv = find_bin_dir() / "kube-scheduler"
    if built_with_testenv.is_file():
        return built_with_testenv
    _build_peer("kube-scheduler")
    return REPO / ".cache" / "peer-bin" / "kube-scheduler" / "kube-scheduler"


ContenderFactory = Callable[[ControlPlane, Path], peers.Contender]


@dataclass
class _KaiFactory:
    """Prepares KAI on the control plane once (first use), then makes its contenders."""

    kai_dir: Path
    unthrottled: bool
    shared: dict[str, dict[str, Path]]

    def __call__(self, cp: ControlPlane, work: Path) -> peers.Contender:
        if "kubeconfigs" not in self.shared:
            self.shared["kubeconfigs"] = peers.prepare_kai(cp, self.kai_dir)
        return peers.kai(self.kai_dir, self.shared["kubeconfigs"], unthrottled=self.unthrottled)


def contenders(
    names: Sequence[str],
    *,
    throttle: str = "both",
    ours_config: Mapping[str, Any] | None = None,
    ours_log_level: str = "info",
) -> list[tuple[str, ContenderFactory]]:
    """(key, factory) per run, in the order of ``names`` (``ours``, ``kube-scheduler``, ``kai``;
    peers once per ``throttle`` mode), building missing peers first. A factory prepares its
    contender on the control plane right before its run: KAI's CRDs replace ours, so KAI is
    prepared only when its turn comes."""
    modes = {"default": [False], "unthrottled": [True], "both": [False, True]}[throttle]
    suffix = {False: "", True: "-unthrottled"}
    out: list[tuple[str, ContenderFactory]] = []
    for name in names:
        if name == "ours":
            out.append(
                ("ours", partial(peers.ours, config_overrides=dict(ours_config or {}),
                                 log_level=ours_log_level))
            )  # fmt: skip
        elif name == "kube-scheduler":
            binary = _kube_scheduler_binary()
            for fast in modes:
                factory = partial(peers.kube_scheduler, binary=binary, unthrottled=fast)
                out.append((name + suffix[fast], factory))
        else:
            _build_peer("kai")
            kai_dir = (REPO / ".cache" / "peer-bin" / "kai").resolve()
            shared: dict[str, dict[str, Path]] = {}
            for fast in modes:
                out.append((name + suffix[fast], _KaiFactory(kai_dir, fast, shared)))
    return out


def bench_control_plane() -> ControlPlane:
    """A (not yet started) control plane with what the bench measures by: the audit log and
    kube-scheduler's static identity."""
    return ControlPlane(static_users={peers.KUBE_SCHEDULER_USER: ()}, audit_policy=audit_policy())


def prepare_cluster(cp: ControlPlane, spec: BenchSpec) -> None:
    """Our CRDs, the default queues (ours and KAI read the same ones) and the kwok nodes."""
    cp.kubectl("apply", "-f", str(REPO / "crds"))
    cp.kubectl(
        "wait", "--for", "condition=Established", "--timeout=60s",
        "crd/queues.scheduling.run.ai", "crd/podgroups.scheduling.run.ai",
    )  # fmt: skip
    cp.kubectl("apply", "-f", str(REPO / "manifests" / "defaults"))
    per_node = -(-spec.backlog.pods // max(1, spec.nodes))
    make_gpu_nodes(
        cp, spec.nodes, gpus=spec.gpus_per_node, pods=max(110, per_node + 10), name_prefix="bench"
    )


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def _sample(meter: ProcessTreeMeter, every: float = 0.5) -> None:
    while True:
        meter.sample()
        await asyncio.sleep(every)


async def run_contender(
    cp: ControlPlane, spec: BenchSpec, contender: peers.Contender, namespace: str, log_dir: Path
) -> dict[str, Any]:
    """One contender on one fresh backlog; its JSON result. Cleans the namespace afterwards."""
    backlog = spec.backlog
    with_gangs = contender.gangs and backlog.gang_size > 1
    async with Api(cp.server, cp.admin_token, cp.ca_file) as api:
        await create_namespace(api, namespace)
        watch = BindWatch(api, namespace)
        await watch.start()
        began = time.monotonic()
        await create_backlog(
            api, namespace, backlog, contender.scheduler_name, with_gangs=with_gangs
        )
        if not await watch.wait(lambda: len(watch.added) >= backlog.pods, 120):
            raise RuntimeError(f"only {len(watch.added)} of {backlog.pods} pods were created")
        backlog_seconds = time.monotonic() - began
        if watch.bound:
            raise RuntimeError(f"{len(watch.bound)} pods were bound before the scheduler started")
        await asyncio.sleep(1.0)  # let the API server finish the creation burst's work
        audit = cp.audit_log
        offset = audit.stat().st_size if audit and audit.exists() else 0
        wall_start = time.time()
        load_at_start = os.getloadavg()[0]
        _log(f"{contender.key}: {backlog.pods} pods pending, starting the scheduler")
        started = time.monotonic()
        comps = contender.spawn(log_dir)
        meter = ProcessTreeMeter([c.pid for c in comps if c.pid is not None])
        sampler = asyncio.create_task(_sample(meter))

        def done() -> bool:
            return len(watch.bound) >= backlog.pods or any(not c.running() for c in comps)

        try:
            finished = await watch.wait(done, spec.timeout)
            ended = time.monotonic()
            meter.sample()
            cpu_at_last_bind = meter.cpu_seconds
            exited = {c.name: code for c in comps if (code := c.exit_code()) is not None}
            if not exited:
                await asyncio.sleep(spec.settle)
            meter.sample()  # the last reading: /proc forgets a process once it is reaped
        finally:
            sampler.cancel()
            await asyncio.gather(*(asyncio.to_thread(c.stop) for c in comps))
        await asyncio.sleep(1.0)  # the API server logs a closed watch when it notices
        counted = count_audit(audit, offset, contender.users, wall_start) if audit else None
        await watch.stop()
        error = None
        if exited:
            error = f"exited early: {exited}; see {', '.join(str(c.log_path) for c in comps)}"
        obs = RunObservation(
            key=contender.key,
            pods=backlog.pods,
            with_gangs=with_gangs,
            started=started,
            ended=ended,
            timed_out=not finished,
            added=dict(watch.added),
            # A bind seen after the deadline does not count: the run had already failed.
            bound={p: t for p, t in watch.bound.items() if t <= ended},
            rebound=len(watch.rebound),
            deleted=len(watch.deleted),
            meter=meter,
            cpu_at_last_bind=cpu_at_last_bind,
            audit=counted,
            backlog_seconds=backlog_seconds,
            exited=exited,
            error=error,
            notes=contender.notes,
            logs=[str(c.log_path) for c in comps],
        )
        result = result_of(obs)
        # Other work on the machine skews every timing: say how busy it was.
        result["load_avg_1m_at_start"] = round(load_at_start, 2)
        _log(
            f"{contender.key}: {result['bound']}/{backlog.pods} bound, last bind at "
            f"{result['seconds_to_last_bind']}s; cleaning up"
        )
        try:
            await delete_namespace(
                api, namespace, kai_crds=contender.key.startswith("kai"), timeout=600
            )
        except (ApiError, TimeoutError, aiohttp.ClientError) as e:
            # The measurement stands; only what follows it on this cluster would be skewed.
            result["cleanup_error"] = f"{type(e).__name__}: {e}"
        return result


def run_bench(
    cp: ControlPlane,
    spec: BenchSpec,
    factories: Sequence[tuple[str, ContenderFactory]],
    log_dir: Path,
    on_result: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run each contender in turn on a prepared control plane; their results. ``on_result``
    gets the results so far after each run (the CLI saves them, so a late failure loses
    nothing). A run that fails, or whose clean-up fails, ends the series: the next contender
    would not find the cluster as the others did."""
    log_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for i, (key, factory) in enumerate(factories):
        try:
            contender = factory(cp, log_dir)
            result = asyncio.run(run_contender(cp, spec, contender, f"bench-{i}-{key}", log_dir))
            if spec.backlog.gang_size > 1 and not contender.gangs:
                result["notes"].append(
                    f"no PodGroups: {key} has no gang concept, so the same pods were created "
                    "as independent pods"
                )
        except Exception as e:  # recorded in the output, which must appear all the same
            _log(f"{key}: failed: {type(e).__name__}: {e}")
            result = {"scheduler": key, "complete": False, "bound_exactly_once": False}
            result["error"] = f"{type(e).__name__}: {e}"
        results.append(result)
        if on_result is not None:
            on_result(results)
        if "cleanup_error" in result or "bound" not in result:
            skipped = [k for k, _ in factories[i + 1 :]]
            if skipped:
                _log(f"stopping after {key}: {result.get('cleanup_error') or result['error']}")
                result.setdefault("notes", []).append(f"not run after this failure: {skipped}")
            break
    return results


def _validate(args: argparse.Namespace) -> None:
    _selected(args.scheduler)
    if args.nodes < 1 or args.pods < 1 or args.gang_size < 1:
        raise SystemExit("--nodes, --pods and --gang-size must be >= 1")
    if args.pods % args.gang_size:
        raise SystemExit(f"--pods {args.pods} is not a multiple of --gang-size {args.gang_size}")
    if args.pod_gpus and args.pods > args.nodes * args.gpus_per_node:
        raise SystemExit(
            f"{args.pods} one-GPU pods do not fit {args.nodes} nodes x {args.gpus_per_node} GPUs"
        )


def document(spec: BenchSpec, results: Sequence[dict[str, Any]], log_dir: Path) -> dict[str, Any]:
    """The bench's JSON output: parameters, versions, a result per contender, the ratios."""
    versions = dict(
        line.split("=", 1)
        for line in (REPO / "testenv" / "versions.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    return {
        "bench": "e2e",
        "nodes": spec.nodes,
        "gpus_per_node": spec.gpus_per_node,
        "pods": spec.backlog.pods,
        "gang_size": spec.backlog.gang_size,
        "pod_gpus": spec.backlog.pod_gpus,
        "timeout_seconds": spec.timeout,
        "versions": versions,
        "scheduler_revision": peers.scheduler_revision(),
        "results": list(results),
        "ratios": ratios(results),
        "ratio_meaning": "ours / peer: below 1 is better for times, CPU, memory, requests; "
        "above 1 is better for pods per second",
        "log_dir": str(log_dir),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print the JSON; 0 when every contender bound the whole backlog
    exactly once."""
    _validate(args)
    spec = BenchSpec(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        backlog=Backlog(pods=args.pods, gang_size=args.gang_size, pod_gpus=args.pod_gpus),
        timeout=args.timeout if args.timeout else 120 + args.pods / 10,
    )
    overrides = yaml.safe_load(args.ours_config.read_text()) if args.ours_config else {}
    # Builds missing peers first, before any clock matters.
    factories = contenders(
        _selected(args.scheduler),
        throttle=args.throttle,
        ours_config=overrides,
        ours_log_level=args.ours_log_level,
    )
    with bench_control_plane() as cp:
        _log(f"control plane up in {cp.startup_seconds:.1f}s; logs in {cp.log_dir}")
        prepare_cluster(cp, spec)
        _log(f"{spec.nodes} nodes ready")

        def save(partial_results: list[dict[str, Any]]) -> None:
            if args.out:
                doc = document(spec, partial_results, cp.log_dir)
                args.out.write_text(json.dumps(doc, indent=2) + "\n")

        results = run_bench(cp, spec, factories, cp.log_dir / "bench", on_result=save)
    text = json.dumps(document(spec, results, cp.log_dir), indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print(table(results), file=sys.stderr)
    return 0 if all(r["complete"] and r["bound_exactly_once"] for r in results) else 1
