"""Cost of the cache at scale: memory per object, applying events, building a cycle's snapshot.

``python -m scheduler.bench cache --nodes 5000 --pods 50000 --gangs 2000`` fills a
:class:`~scheduler.cache.Cache` with API-shaped Node, Pod and PodGroup objects (as a list and a
watch would deliver them: full metadata with managedFields, status, several containers), then
measures, and prints as one JSON document:

- ``rss_mb``: the process's resident memory after the fill (and ``rss_before_mb``), and what
  that is per pod;
- ``apply_us_per_pod``: the cost of one watch event for a pod, over the initial fill;
- ``snapshot_seconds``: p50/max of building a snapshot right after one pod changed (a bind
  confirmed, a new pod) - the work a cycle does on the event loop before it can solve;
- with ``--cycles N``: ``cycle_seconds`` p50/max of N cycles as the live loop runs them on the
  event loop's side (one change, snapshot, fair share + solve), the pending gangs staying
  pending (nothing is committed), so every cycle solves the whole backlog.

Most of the pods are bound (running), ``--gangs`` gangs of ``--gang-size`` are pending.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import random
import resource
import statistics
import time
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    """Register ``cache`` with the bench CLI."""
    p = subparsers.add_parser("cache", help="cache memory and snapshot cost at scale")
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods", type=int, default=50000, help="pods in total (bound + pending)")
    p.add_argument("--gangs", type=int, default=2000, help="pending gangs")
    p.add_argument("--gang-size", type=int, default=4)
    p.add_argument("--changes", type=int, default=20, help="snapshots measured")
    p.add_argument("--cycles", type=int, default=0, help="also time N snapshot+solve cycles")
    p.add_argument("--seed", type=int, default=1)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _node(i: int) -> dict[str, Any]:
    name = f"node-{i:05d}"
    alloc = {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": str(10 + i),
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "topology.kubernetes.io/zone": f"zone-{i % 3}",
            },
            "managedFields": [{"manager": "kwok", "fieldsV1": {"f:status": {"f:x": {}}}}],
        },
        "spec": {},
        "status": {
            "capacity": dict(alloc),
            "allocatable": alloc,
            "conditions": [
                {"type": t, "status": "True" if t == "Ready" else "False", "reason": t}
                for t in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
            ],
            "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250}"}],
            "nodeInfo": {"kubeletVersion": "v1.37.2", "osImage": "Ubuntu 24.04"},
        },
    }


def _pod(name: str, ns: str, rv: int, node: str | None, gpus: int, group: str) -> dict[str, Any]:
    env = [{"name": f"VAR_{k}", "value": "x" * 40} for k in range(10)]
    containers = [
        {
            "name": c,
            "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "command": ["python", "train.py", "--epochs", "10"],
            "env": env,
            "resources": {
                "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": str(gpus)},
                "limits": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": str(gpus)},
            },
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        }
        for c in (("main",) if not gpus else ("main", "sidecar"))
    ]
    if len(containers) > 1:
        containers[1]["resources"] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": f"uid-{ns}-{name}",
        "resourceVersion": str(rv),
        "creationTimestamp": "2026-11-30T10:00:00Z",
        "labels": {"app": "train", "kai.scheduler/queue": "team-a"},
        "annotations": {"pod-group-name": group} if group else {},
        "managedFields": [
            {"manager": "kube-controller-manager", "fieldsV1": {"f:spec": {"f:containers": {}}}}
        ],
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": group or name}],
    }
    spec: dict[str, Any] = {
        "schedulerName": "kai-scheduler",
        "containers": containers,
        "volumes": [{"name": "data", "emptyDir": {}}],
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
        ],
        "priority": 50,
    }
    status: dict[str, Any] = {"phase": "Pending", "qosClass": "Burstable"}
    if node:
        spec["nodeName"] = node
        meta["annotations"]["kai.scheduler/gpu-grant"] = json.dumps(
            {str(d): 1000 for d in range(gpus)}
        )
        status = {
            "phase": "Running",
            "qosClass": "Burstable",
            "conditions": [{"type": t, "status": "True"} for t in ("Ready", "PodScheduled")],
            "containerStatuses": [
                {"name": c["name"], "ready": True, "restartCount": 0, "image": c["image"]}
                for c in containers
            ],
        }
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": status}


def run(args: argparse.Namespace) -> int:
    """Fill a cache, then measure (see module docstring)."""
    from scheduler.cache import Cache

    rng = random.Random(args.seed)
    gc.collect()
    rss_before = _rss_mb()
    cache = Cache("kai-scheduler", "default-queue")
    nodes = [_node(i) for i in range(args.nodes)]
    cache.relisted("Node", nodes)
    cache.relisted(
        "Queue",
        [{"kind": "Queue", "metadata": {"name": "team-a", "uid": "q"}, "spec": {"resources": {}}}],
    )
    pending = min(args.pods, args.gangs * args.gang_size)
    bound = args.pods - pending
    groups = [
        {
            "kind": "PodGroup",
            "metadata": {"name": f"g{g}", "namespace": "ns", "uid": f"pg{g}"},
            "spec": {"minMember": args.gang_size, "queue": "team-a"},
        }
        for g in range(args.gangs)
    ]
    cache.relisted("PodGroup", groups)
    started = time.perf_counter()
    rv = 1000
    per_node = max(1, -(-bound // max(1, args.nodes)))
    for i in range(bound):
        rv += 1
        node = f"node-{(i // per_node) % args.nodes:05d}"
        cache.apply("Pod", "ADDED", _pod(f"run-{i}", "ns", rv, node, 1 if i % 8 else 0, ""))
    for i in range(pending):
        rv += 1
        g = i // args.gang_size
        cache.apply("Pod", "ADDED", _pod(f"g{g}-{i}", "ns", rv, None, 1, f"g{g}"))
    fill = time.perf_counter() - started
    del nodes, groups
    gc.collect()
    rss_after = _rss_mb()
    first = time.perf_counter()
    snapshot = cache.snapshot()
    first_snapshot = time.perf_counter() - first
    versions = itertools.count(rv + 1)

    def change_one(k: int) -> None:
        """One running pod changes (a label, its phase), as a watch event would say."""
        i = rng.randrange(bound) if bound else 0
        node = f"node-{(i // per_node) % args.nodes:05d}"
        changed = _pod(f"run-{i}", "ns", next(versions), node, 1 if i % 8 else 0, "")
        changed["metadata"]["labels"]["tick"] = str(k)
        changed["status"]["phase"] = "Running" if k % 2 else "Succeeded"
        cache.apply("Pod", "MODIFIED", changed)

    times: list[float] = []
    for k in range(args.changes):
        change_one(k)
        t = time.perf_counter()
        snapshot = cache.snapshot()
        times.append(time.perf_counter() - t)
    out: dict[str, Any] = {
        "benchmark": "cache",
        "nodes": args.nodes,
        "pods": args.pods,
        "bound_pods": bound,
        "pending_gangs": args.gangs,
        "rss_before_mb": round(rss_before, 1),
        "rss_mb": round(rss_after, 1),
        "kb_per_pod": round((rss_after - rss_before) * 1024 / max(1, args.pods), 2),
        "apply_us_per_pod": round(fill / max(1, args.pods) * 1e6, 1),
        "first_snapshot_seconds": round(first_snapshot, 4),
        "snapshot_seconds": {
            "p50": round(statistics.median(times), 4) if times else None,
            "max": round(max(times), 4) if times else None,
        },
    }
    if args.cycles:
        from scheduler.cycle import _decide
        from scheduler.solver import PlacementSettings

        settings = PlacementSettings()
        cycles: list[float] = []
        solves: list[float] = []
        for k in range(args.cycles):
            change_one(args.changes + k)
            t = time.perf_counter()
            snapshot = cache.snapshot()
            s0 = time.perf_counter()
            _, placement = _decide(snapshot, settings)
            done = time.perf_counter()
            cycles.append(done - t)
            solves.append(done - s0)
        out["cycle_seconds"] = {
            "p50": round(statistics.median(cycles), 3),
            "max": round(max(cycles), 3),
        }
        out["solve_seconds_p50"] = round(statistics.median(solves), 3)
        out["solve_status"] = str(placement.status)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out))
    return 0
