"""``python -m scheduler.bench dra``: time a cycle's placement with DRA devices and claims.

Builds a snapshot as the cache would (:class:`~scheduler.cluster.snapshot.Snapshot` with
``dra`` = :meth:`DraView.build <scheduler.cluster.draview.DraView.build>`): ``--nodes``
nodes, each publishing one ResourceSlice of ``--devices`` devices of one driver (attributes
``model``, ``index``, ``numa``; capacity ``memory``; models h100/80Gi, a100/80Gi, a100/40Gi
over 50/30/20 % of the nodes), one DeviceClass selecting the driver by CEL, a share
``--fill`` of the devices held by running pods' allocated claims, and ``--pods`` pending pods
(single pods and gangs of 2-4) whose claims mix:

- ``model``: 1 device whose ``model`` attribute is h100 or a100 (CEL on a string),
- ``memory``: 2 devices with ``memory`` capacity >= 64Gi (CEL quantity comparison),
- ``first``: ``firstAvailable``, 2 h100 devices or else 1 a100 device,
- ``numa``: 2 devices sharing the ``numa`` attribute (``matchAttribute``),
- ``pair``: two claims of 1 device each.

Each cycle solves a fresh snapshot (seed, seed+1, ...); only ``solve()`` is timed. With
``--same-cluster`` every cycle solves the snapshot of ``--seed`` again: the devices do not
change between cycles, as in a live cluster, so selector results cached across cycles are
reused (the first cycle is cold). The JSON
line reports the cycle time, pods placed, and the devices the placement allocates, read from
the assignments' :class:`~scheduler.solver.placement.ClaimGrant` - so a solver that places
claim pods without choosing devices shows as ``claim_pods_without_grants`` > 0. Besides the
solver's own validator, :func:`check_devices` checks every grant independently: no device
twice or already in use, each device on the pod's node and accepted by its request's class
and selectors, the counts and ``matchAttribute`` of every request met.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import resource
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import structlog

from scheduler.bench.synthetic import make_node, make_pod, make_queue
from scheduler.cluster.dra import (
    ClaimAllocation,
    ConsumerRef,
    Device,
    DeviceClass,
    DeviceConstraint,
    DeviceId,
    DeviceRequest,
    DeviceResult,
    RequestAlternative,
    ResourceClaim,
    ResourceSlice,
)
from scheduler.cluster.dra_alloc import DeviceCatalog, node_name_selector
from scheduler.cluster.draview import DraView
from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.quantity import parse_quantity
from scheduler.cluster.snapshot import Snapshot
from scheduler.solver import PlacementSettings, solve, validate
from scheduler.solver.placement import PodAssignment

__all__ = ["DRIVER", "DraBenchSpec", "add_parser", "check_devices", "dra_snapshot", "run"]

DRIVER = "gpu.bench.example.com"
#: A GPU class by name (first DNS label ``gpu``): its devices count toward GPU quota.
DEVICE_CLASS = "gpu.bench.example.com"
NAMESPACE = "bench"
#: (share of nodes, model, memory per device)
_MODELS = [(0.5, "h100", "80Gi"), (0.3, "a100", "80Gi"), (0.2, "a100", "40Gi")]
#: (claim mix name, weight)
MIX = [("model", 40), ("memory", 20), ("first", 15), ("numa", 15), ("pair", 10)]
_LEAVES = ("dra-a", "dra-b")


@dataclass(frozen=True)
class DraBenchSpec:
    """Benchmark cluster parameters."""

    nodes: int = 1000
    devices: int = 8
    pods: int = 500
    #: Share of every node's devices held by running pods' allocated claims.
    fill: float = 0.0
    #: Share of pending pods that belong to gangs of 2-4 pods (the rest are single pods).
    gang_share: float = 0.3
    seed: int = 0


def _attr(name: str) -> str:
    return f'device.attributes["{DRIVER}"].{name}'


def _alt(name: str, selectors: Sequence[str] = (), count: int = 1) -> RequestAlternative:
    return RequestAlternative(name, DEVICE_CLASS, tuple(selectors), "ExactCount", count)


def _claims_for(rng: random.Random, pod: str, kind: str) -> list[ResourceClaim]:
    """The claims of one pending pod of mix ``kind``."""

    def claim(suffix: str, *requests: DeviceRequest, **kw: Any) -> ResourceClaim:
        return ResourceClaim(NAMESPACE, f"{pod}-{suffix}", f"uid-{pod}-{suffix}", requests, **kw)

    if kind == "model":
        model = rng.choice(["h100", "h100", "a100"])
        return [
            claim("gpu", DeviceRequest("gpu", (_alt("gpu", [f'{_attr("model")} == "{model}"']),)))
        ]
    if kind == "memory":
        big = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("64Gi")) >= 0'
        return [claim("gpu", DeviceRequest("gpu", (_alt("gpu", [big], 2),)))]
    if kind == "first":
        alternatives = (
            _alt("gpu/h100", [f'{_attr("model")} == "h100"'], 2),
            _alt("gpu/a100", [f'{_attr("model")} == "a100"'], 1),
        )
        return [claim("gpu", DeviceRequest("gpu", alternatives, first_available=True))]
    if kind == "numa":
        request = DeviceRequest("gpu", (_alt("gpu", count=2),))
        return [claim("gpu", request, constraints=(DeviceConstraint(f"{DRIVER}/numa"),))]
    return [claim(s, DeviceRequest("gpu", (_alt("gpu"),))) for s in ("a", "b")]


def _slice(node: str, devices: int, model: str, memory: str) -> ResourceSlice:
    half = max(1, devices // 2)
    mem = Fraction(parse_quantity(memory))
    return ResourceSlice(
        name=f"{node}-{DRIVER}",
        driver=DRIVER,
        pool=node,
        generation=1,
        node_name=node,
        devices=tuple(
            Device(
                f"gpu-{i}",
                attributes=(("index", i), ("model", model), ("numa", i // half)),
                capacity=(("memory", mem),),
            )
            for i in range(devices)
        ),
    )


def dra_snapshot(spec: DraBenchSpec) -> tuple[Snapshot, Counter[str]]:
    """The benchmark's snapshot, and how many pending pods of each claim mix it has."""
    rng = random.Random(spec.seed)
    nodes: list[Node] = []
    slices: list[ResourceSlice] = []
    claims: list[ResourceClaim] = []
    pods: list[Pod] = []
    gangs: list[Gang] = []
    for i in range(spec.nodes):
        roll, acc = rng.random(), 0.0
        model, memory = _MODELS[-1][1:]
        for share, m, mem in _MODELS:
            acc += share
            if roll < acc:
                model, memory = m, mem
                break
        name = f"node-{i:05d}"
        labels = {"kubernetes.io/hostname": name, "gpu.bench/model": model}
        nodes.append(make_node(name, gpus=0, cpu=128, memory_gib=1024, labels=labels))
        slices.append(_slice(name, spec.devices, model, memory))
        # Running pods holding 1-2 devices each, up to the fill.
        target, used, k = round(spec.devices * spec.fill), 0, 0
        while used < target:
            take = min(rng.choice([1, 2]), target - used)
            pod_name = f"run-{name}-{k}"
            pod = make_pod(pod_name, namespace=NAMESPACE, queue=rng.choice(_LEAVES), node=name)
            pods.append(dataclasses.replace(pod, resource_claims=1))
            gangs.append(Gang(NAMESPACE, pod_name, 1, pod.queue))
            results = tuple(
                DeviceResult("gpu", DRIVER, name, f"gpu-{used + j}") for j in range(take)
            )
            claims.append(
                ResourceClaim(
                    NAMESPACE,
                    f"{pod_name}-gpu",
                    f"uid-{pod_name}-gpu",
                    (DeviceRequest("gpu", (_alt("gpu", count=take),)),),
                    allocation=ClaimAllocation(results, node_name_selector(name)),
                    reserved_for=(ConsumerRef("pods", pod_name, pod.uid),),
                )
            )
            used, k = used + take, k + 1
    mix: Counter[str] = Counter()
    pod_claims: dict[str, tuple[str, ...]] = {}
    kinds, weights = [m for m, _ in MIX], [w for _, w in MIX]
    made = 0
    while made < spec.pods:
        size = rng.randint(2, 4) if rng.random() < spec.gang_share else 1
        size = min(size, spec.pods - made)
        gang_name = f"job-{made:05d}"
        queue = rng.choice(_LEAVES)
        kind = rng.choices(kinds, weights)[0]  # one mix per gang: its pods are alike
        gangs.append(Gang(NAMESPACE, gang_name, size, queue, creation_time=float(made)))
        for j in range(size):
            pod_name = f"{gang_name}-{j}"
            own = _claims_for(rng, pod_name, kind)
            claims.extend(own)
            pod = make_pod(
                pod_name,
                namespace=NAMESPACE,
                gang=gang_name,
                queue=queue,
                cpu=4,
                memory_gib=16,
                created=float(made),
            )
            pods.append(dataclasses.replace(pod, resource_claims=len(own)))
            pod_claims[pod.uid] = tuple(c.key for c in own)
            mix[kind] += 1
        made += size
    devices = spec.nodes * spec.devices
    queues = [make_queue("dra", gpu_quota=devices)]
    queues += [make_queue(leaf, "dra", gpu_quota=devices / 2) for leaf in _LEAVES]
    view = DraView.build(
        [DeviceClass(DEVICE_CLASS, (f'device.driver == "{DRIVER}"',))],
        slices,
        claims,
        pod_claims,
    )
    pods_out = _with_claim_gpus(tuple(pods), view)
    snap = Snapshot(tuple(nodes), pods_out, tuple(gangs), tuple(queues), now=1e6, dra=view)
    return snap, mix


def _with_claim_gpus(pods: tuple[Pod, ...], view: DraView) -> tuple[Pod, ...]:
    """Claim GPUs on the pods, as the cache sets them."""
    from scheduler.cache.dra_usage import with_claim_gpus

    return with_claim_gpus(pods, view)


def _request_of(result: str) -> str:
    """The claim request a result names (``req`` or ``req/sub`` of firstAvailable)."""
    return result.split("/", 1)[0]


def check_devices(snapshot: Snapshot, assignments: Sequence[PodAssignment]) -> list[str]:
    """Problems with the devices the assignments allocate (empty = ok), checked without
    the solver: each placed pod with claims has a grant per claim; no device is allocated
    twice or was in use; every device is on the pod's node, is accepted by its request's
    class and selectors, and each request got its count (an alternative's, for
    ``firstAvailable``) with ``matchAttribute`` met."""
    view = snapshot.dra or DraView()
    catalog = DeviceCatalog(view.slices, view.class_by_name)
    devices = {(s.driver, s.pool, d.name): (s, d) for s in view.slices for d in s.devices}
    taken: set[DeviceId] = set(view.busy)
    allocations: dict[str, ClaimAllocation] = {}
    problems: list[str] = []
    for a in assignments:
        keys = view.claim_keys_by_pod.get(a.pod_uid, ())
        if [g.claim for g in a.claims] != list(keys):
            problems.append(f"pod {a.pod_key}: grants {[g.claim for g in a.claims]} for {keys}")
            continue
        for grant in a.claims:
            claim = view.claim_by_key[grant.claim]
            alloc = grant.allocation or allocations.get(grant.claim) or claim.allocation
            if alloc is None:
                problems.append(f"pod {a.pod_key}: claim {grant.claim} is never allocated")
                continue
            if grant.allocation is not None:
                if grant.claim in allocations or claim.allocation is not None:
                    problems.append(f"claim {grant.claim} allocated twice")
                    continue
                allocations[grant.claim] = grant.allocation
                for r in grant.allocation.results:
                    if r.device_id in taken:
                        problems.append(f"claim {grant.claim}: device {r.device_id} in use")
                    taken.add(r.device_id)
            problems += _check_claim(claim, alloc, a.node, devices, catalog)
    return problems


def _check_claim(
    claim: ResourceClaim,
    alloc: ClaimAllocation,
    node: str,
    devices: dict[DeviceId, tuple[ResourceSlice, Device]],
    catalog: DeviceCatalog,
) -> list[str]:
    problems: list[str] = []
    by_request: dict[str, list[DeviceResult]] = {}
    for r in alloc.results:
        found = devices.get(r.device_id)
        if found is None or found[0].node_name != node:
            problems.append(f"claim {claim.key}: device {r.device_id} is not on node {node}")
        by_request.setdefault(_request_of(r.request), []).append(r)
    for request in claim.requests:
        got = by_request.get(request.name, [])
        names = {r.request for r in got}
        alt = next((x for x in request.alternatives if x.name in names), None)
        if alt is None and not request.first_available:
            alt = request.alternatives[0]
        if alt is None or len(names) > 1 or (alt.mode == "ExactCount" and len(got) != alt.count):
            problems.append(f"claim {claim.key}: request {request.name} got {len(got)} devices")
            continue
        ids = catalog.matching(alt).ids
        problems += [
            f"claim {claim.key}: device {r.device_id} does not match request {request.name}"
            for r in got
            if r.device_id not in ids
        ]
    for c in claim.constraints:
        values = {
            found[1].attribute(c.attribute, r.driver)
            for r in alloc.results
            if (not c.requests or _request_of(r.request) in c.requests)
            and (found := devices.get(r.device_id)) is not None
        }
        if len(values) > 1:
            problems.append(f"claim {claim.key}: matchAttribute {c.attribute} has {values}")
    return problems


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``dra`` subcommand."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "dra", help="benchmark a cycle with DRA devices and pods using ResourceClaims"
    )
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--devices", type=int, default=8, help="devices per node (one slice each)")
    p.add_argument("--pods", type=int, default=500, help="pending pods using claims")
    p.add_argument("--fill", type=float, default=0.0, help="share of devices already in use")
    p.add_argument("--gang-share", type=float, default=0.3, help="share of pods in gangs of 2-4")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cycles", type=int, default=5)
    p.add_argument(
        "--same-cluster",
        action="store_true",
        help="solve the same snapshot every cycle (devices unchanged, as in a live cluster)",
    )
    p.add_argument("--time-limit", type=float, default=0.5, help="CP-SAT seconds per cycle")
    p.add_argument("--workers", type=int, default=1, help="CP-SAT worker threads")
    p.add_argument("--greedy-only", action="store_true")
    return p


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print one JSON line; 0 when every placement was valid."""
    if args.nodes < 1 or args.devices < 1 or args.pods < 0 or args.cycles < 1:
        raise SystemExit("--nodes >= 1, --devices >= 1, --pods >= 0 and --cycles >= 1")
    if not 0 <= args.fill <= 1 or not 0 <= args.gang_share <= 1:
        raise SystemExit("--fill and --gang-share are shares between 0 and 1")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    settings = PlacementSettings(
        time_limit_seconds=args.time_limit, workers=args.workers, greedy_only=args.greedy_only
    )
    seconds: list[float] = []
    rows: list[dict[str, Any]] = []
    invalid, device_problems = 0, 0
    first_problems: list[str] = []
    mix: Counter[str] = Counter()
    for k in range(args.cycles):
        spec = DraBenchSpec(
            args.nodes,
            args.devices,
            args.pods,
            args.fill,
            args.gang_share,
            args.seed if args.same_cluster else args.seed + k,
        )
        snap, mix = dra_snapshot(spec)
        started = time.perf_counter()
        placement = solve(snap, settings, cycle=k)
        seconds.append(time.perf_counter() - started)
        problems = validate(snap, placement.assignments)
        invalid += bool(problems)
        found = check_devices(snap, placement.assignments)
        device_problems += bool(found)
        first_problems = first_problems or (problems + found)[:5]
        claim_uids = snap.dra.claim_keys_by_pod if snap.dra else {}
        with_claims = [a for a in placement.assignments if a.pod_uid in claim_uids]
        rows.append(
            {
                "status": placement.status.value,
                "pods": len(placement.assignments),
                "claim_pods": len(with_claims),
                "without_grants": sum(1 for a in with_claims if not a.claims),
                "devices": sum(
                    len(g.allocation.results)
                    for a in placement.assignments
                    for g in a.claims
                    if g.allocation is not None
                ),
                "gangs": sum(1 for o in placement.outcomes.values() if o.placed),
            }
        )
    out = {
        "bench": "dra",
        "nodes": args.nodes,
        "devices_per_node": args.devices,
        "pending_pods": args.pods,
        "fill": args.fill,
        "gang_share": args.gang_share,
        "seed": args.seed,
        "cycles": args.cycles,
        "same_cluster": args.same_cluster,
        "time_limit": args.time_limit,
        "workers": args.workers,
        "greedy_only": args.greedy_only,
        "claim_mix_last_cycle": dict(sorted(mix.items())),
        "cycle_seconds_p50": round(statistics.median(seconds), 4),
        "cycle_seconds_p95": round(_pct(seconds, 0.95), 4),
        "cycle_seconds": [round(s, 3) for s in seconds],
        "pods_placed": [r["pods"] for r in rows],
        "gangs_placed": [r["gangs"] for r in rows],
        "claim_pods_placed": [r["claim_pods"] for r in rows],
        "claim_pods_without_grants": [r["without_grants"] for r in rows],
        "devices_allocated": [r["devices"] for r in rows],
        "status": [r["status"] for r in rows],
        "validator": "ok" if invalid == 0 else f"{invalid} invalid cycles",
        "device_check": "ok" if device_problems == 0 else f"{device_problems} invalid cycles",
        "problems": first_problems,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(out))
    return 0 if invalid == 0 and device_problems == 0 else 1
