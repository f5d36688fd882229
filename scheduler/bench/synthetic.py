"""Synthetic clusters: small builders for scenario tests and a generator for benchmarks.

Builders take human units (GPUs, CPU cores, GiB) and return the domain types. The generator
builds a heterogeneous cluster (several node shapes, taints and labels on some, a 3-level
queue tree with quotas), fills it to a given fraction with running pods and adds pending
gangs of mixed sizes, including fractional GPU pods.

With ``running_fill`` F > 0, a share F of the cluster's GPUs is held by running, preemptible
gangs (priority 50, one to four pods across nodes, started 10 minutes to 2 hours ago) of two
leaf queues far above their quota (:data:`OVER_QUOTA_LEAVES`); the rest of the fill (``fill``
is the total, raised to F if lower) is work of the same priority in the other four leaves,
and every pending gang comes from those. With F well above their share of the fill, those leaves
stay below their quota (fill 0.7, F 0.5: about 0.05 of the GPUs each, quota 0.08), so cycles
must take back (reclaim) to admit work.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import GPU_MILLI, Node, Taint
from scheduler.cluster.pod import GpuRequest, Pod, PodPhase
from scheduler.cluster.podaffinity import LabelSelector, PodAffinityTerm, SpreadConstraint
from scheduler.cluster.queue import UNLIMITED, Queue, QueueResource
from scheduler.cluster.resources import CPU, GPU, MEMORY, PODS, Resources
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm, Toleration
from scheduler.cluster.snapshot import Snapshot

__all__ = [
    "GIB",
    "OVER_QUOTA_LEAVES",
    "ClusterSpec",
    "make_gang",
    "make_node",
    "make_pod",
    "make_queue",
    "synthetic_snapshot",
]

GIB = 2**30


def make_node(
    name: str,
    *,
    gpus: int = 8,
    cpu: float = 64,
    memory_gib: int = 512,
    labels: dict[str, str] | None = None,
    taints: Iterable[Taint] = (),
    unschedulable: bool = False,
    ready: bool = True,
    gpu_memory_mib: int | None = None,
    max_pods: int = 110,
) -> Node:
    """A node with ``gpus`` devices, ``cpu`` cores and ``memory_gib`` GiB."""
    alloc = {CPU: int(cpu * 1000), MEMORY: memory_gib * GIB, PODS: max_pods, GPU: gpus}
    return Node(
        name,
        Resources(alloc),
        tuple(sorted((labels or {}).items())),
        tuple(taints),
        unschedulable=unschedulable,
        ready=ready,
        gpu_memory_mib=gpu_memory_mib,
    )


def make_pod(
    name: str,
    *,
    namespace: str = "default",
    gang: str | None = None,
    queue: str = "",
    gpus: int = 0,
    fraction: float | None = None,
    gpu_memory_mib: int | None = None,
    cpu: float = 1,
    memory_gib: float = 1,
    priority: int = 0,
    node: str | None = None,
    grant: tuple[tuple[int, int], ...] = (),
    selector: dict[str, str] | None = None,
    tolerations: Iterable[Toleration] = (),
    affinity: Iterable[NodeSelectorTerm] = (),
    created: float = 0.0,
    started: float = 0.0,
    labels: dict[str, str] | None = None,
    anti_affinity: Iterable[PodAffinityTerm] = (),
    spread: Iterable[SpreadConstraint] = (),
) -> Pod:
    """A pod; running (phase Running) when ``node`` is given, else pending.

    ``gpus`` whole devices, or ``fraction`` of one device, or ``gpu_memory_mib`` of one;
    ``started``: its ``start_time`` (0: unknown, the creation time stands in).
    """
    requests = {CPU: int(cpu * 1000), MEMORY: int(memory_gib * GIB)}
    gpu: GpuRequest | None = None
    if fraction is not None:
        gpu = GpuRequest(max(1, gpus), round(fraction * GPU_MILLI))
    elif gpu_memory_mib is not None:
        gpu = GpuRequest(max(1, gpus), GPU_MILLI, memory_mib=gpu_memory_mib)
    elif gpus:
        requests[GPU] = gpus
        gpu = GpuRequest(gpus, GPU_MILLI)
    return Pod(
        uid=f"{namespace}/{name}",
        namespace=namespace,
        name=name,
        requests=Resources(requests),
        gpu=gpu,
        priority=priority,
        node_selector=tuple(sorted((selector or {}).items())),
        affinity=tuple(affinity),
        tolerations=tuple(tolerations),
        gang=f"{namespace}/{gang or name}",
        queue=queue,
        phase=PodPhase.RUNNING if node else PodPhase.PENDING,
        node_name=node,
        gpu_grant=grant,
        creation_time=created,
        start_time=started,
        labels=tuple(sorted((labels or {}).items())),
        pod_anti_affinity=tuple(anti_affinity),
        spread=tuple(spread),
    )


def make_gang(
    name: str,
    size: int,
    *,
    queue: str,
    namespace: str = "default",
    min_member: int | None = None,
    priority: int = 0,
    preemptible: bool | None = None,
    created: float = 0.0,
    **pod_args: Any,
) -> tuple[Gang, list[Pod]]:
    """A gang of ``size`` identical pending pods (``pod_args`` go to :func:`make_pod`)."""
    gang = Gang(
        namespace,
        name,
        min_member=size if min_member is None else min_member,
        queue=queue,
        priority=priority,
        preemptible=priority < 100 if preemptible is None else preemptible,
        creation_time=created,
    )
    pods = [
        make_pod(
            f"{name}-{i}",
            namespace=namespace,
            gang=name,
            queue=queue,
            priority=priority,
            created=created,
            **pod_args,
        )
        for i in range(size)
    ]
    return gang, pods


def make_queue(
    name: str,
    parent: str = "",
    *,
    gpu_quota: float = 0,
    gpu_weight: int = 1,
    gpu_limit: float = UNLIMITED,
    cpu_quota: float = UNLIMITED,
    cpu_limit: float = UNLIMITED,
    priority: int = 100,
) -> Queue:
    """A queue; GPU amounts in devices, CPU in cores (-1 = unlimited)."""

    def units(v: float, scale: int) -> int:
        return UNLIMITED if v == UNLIMITED else round(v * scale)

    return Queue(
        name,
        parent,
        priority,
        (
            ("gpu", QueueResource(units(gpu_quota, 1000), gpu_weight, units(gpu_limit, 1000))),
            ("cpu", QueueResource(units(cpu_quota, 1000), 1, units(cpu_limit, 1000))),
        ),
    )


@dataclass(frozen=True)
class ClusterSpec:
    """Benchmark cluster parameters."""

    nodes: int = 500
    gpus_per_node: int = 8
    gangs: int = 200
    fill: float = 0.7
    seed: int = 0
    #: Random extra CPU (cores) and memory (GiB) on running pods, up to this many: makes
    #: every node's remainder different (many node classes), as in real clusters.
    jitter: int = 0
    #: Priorities drawn (uniformly) for pending gangs; >= 100 means non-preemptible.
    priorities: tuple[int, ...] = (50, 50, 50, 100)
    #: Share of all GPUs held by running preemptible gangs of over-quota queues (see the
    #: module docstring); 0 keeps the plain fill (and the exact same snapshots as before).
    running_fill: float = 0.0
    #: Share of pending gangs whose pods keep apart: half of them with required
    #: anti-affinity on ``kubernetes.io/hostname`` among the gang's pods (one pod per node),
    #: half with a zone spread constraint (maxSkew 1, DoNotSchedule). Nodes then carry a
    #: hostname label, as real nodes do. 0 keeps the exact same snapshots as before.
    constraints: float = 0.0


# (share of nodes, gpus scale, cpu cores, memory GiB, labels, taints)
_NODE_SHAPES: list[tuple[float, float, int, int, dict[str, str], tuple[Taint, ...]]] = [
    (0.5, 1.0, 128, 1024, {"nvidia.com/gpu.product": "H100", "zone": "a"}, ()),
    (0.25, 1.0, 96, 768, {"nvidia.com/gpu.product": "A100", "zone": "b"}, ()),
    (
        0.15,
        1.0,
        128,
        1024,
        {"nvidia.com/gpu.product": "H100", "zone": "a", "pool": "reserved"},
        (Taint("dedicated", "training"),),
    ),
    (0.1, 0.5, 64, 512, {"nvidia.com/gpu.product": "L4", "zone": "b"}, ()),
]
# whole GPUs per pod, pods per gang (min, max), weight: about 5 pods per gang on average
_GANG_SHAPES = [(1, (1, 8), 4), (2, (2, 8), 2), (4, (2, 8), 2), (8, (2, 8), 1), (0, (1, 8), 1)]
_LEAVES = ["r0-t0-a", "r0-t0-b", "r0-t1-a", "r1-t0-a", "r1-t0-b", "r1-t1-a"]
#: With ``running_fill``: leaves whose running work far exceeds their quota (one per root, so
#: each has siblings and cousins below their fair share that may reclaim from it).
OVER_QUOTA_LEAVES = ("r0-t0-a", "r1-t1-a")
_UNDER_QUOTA_LEAVES = [leaf for leaf in _LEAVES if leaf not in OVER_QUOTA_LEAVES]
#: Priority of all running work with ``running_fill`` ("train": preemptible, and equal to
#: the usual pending priority, so that pending gangs take back by reclaim, not preemption).
_RUNNING_PRIORITY = 50


def _queues(total_gpus: int) -> list[Queue]:
    out = [
        make_queue("r0", gpu_quota=total_gpus * 0.5),
        make_queue("r1", gpu_quota=total_gpus * 0.4),
    ]
    for root in ("r0", "r1"):
        for t in ("t0", "t1"):
            out.append(
                make_queue(
                    f"{root}-{t}",
                    root,
                    gpu_quota=total_gpus * 0.2,
                    gpu_weight=2 if t == "t0" else 1,
                )
            )
    for leaf in _LEAVES:
        parent = leaf.rsplit("-", 1)[0]
        limit = total_gpus * 0.3 if leaf.endswith("b") else UNLIMITED
        out.append(make_queue(leaf, parent, gpu_quota=total_gpus * 0.08, gpu_limit=limit))
    return out


def _pick_shape(roll: float) -> tuple[float, float, int, int, dict[str, str], tuple[Taint, ...]]:
    acc = 0.0
    for shape in _NODE_SHAPES:
        acc += shape[0]
        if roll <= acc:
            return shape
    return _NODE_SHAPES[-1]


HOSTNAME_LABEL = "kubernetes.io/hostname"


def _apart(job: str, *, spread: bool) -> dict[str, Any]:
    """Pod arguments that keep a gang's pods apart: one per node, or balanced over zones."""
    mine = LabelSelector((("job", job),))
    if spread:
        return {"labels": {"job": job}, "spread": (SpreadConstraint(1, "zone", mine),)}
    return {"labels": {"job": job}, "anti_affinity": (PodAffinityTerm(HOSTNAME_LABEL, mine),)}


def synthetic_snapshot(spec: ClusterSpec) -> Snapshot:
    """A heterogeneous cluster at ``spec.fill`` GPU usage with ``spec.gangs`` pending gangs."""
    rng = random.Random(spec.seed)
    nodes: list[Node] = []
    for i in range(spec.nodes):
        shape = _pick_shape(rng.random())
        _, scale, cpu, mem, labels, taints = shape
        gpus = max(1, round(spec.gpus_per_node * scale))
        if spec.constraints:
            labels = {**labels, HOSTNAME_LABEL: f"node-{i:05d}"}
        nodes.append(
            make_node(
                f"node-{i:05d}",
                gpus=gpus,
                cpu=cpu,
                memory_gib=mem,
                labels=labels,
                taints=taints,
                gpu_memory_mib=81920,
            )
        )
    total_gpus = sum(n.gpu_count for n in nodes)
    queues = _queues(total_gpus)
    pods: list[Pod] = []
    gangs: list[Gang] = []
    toleration = Toleration("dedicated", "Equal", "training")
    now = 1e6
    taking_back = spec.running_fill > 0
    held: dict[str, int] = {}
    if taking_back:
        held = _over_quota_gangs(rng, nodes, spec.running_fill, now, toleration, pods, gangs)
    leaves = _UNDER_QUOTA_LEAVES if taking_back else _LEAVES
    # With taking back, the rest of the running work has the usual pending priority too.
    protected: dict[str, Any] = {"priority": _RUNNING_PRIORITY} if taking_back else {}
    gang_protected: dict[str, Any] = {"priority": _RUNNING_PRIORITY} if taking_back else {}
    # running pods: whole-GPU pods per node up to the fill, a few fractional
    for n in nodes:
        target = round(n.gpu_count * spec.fill + rng.uniform(-1.5, 1.5))
        target = max(0, min(n.gpu_count, target))
        used = held.get(n.name, 0)
        k = 0
        while used < target:
            take = min(rng.choice([1, 1, 2, 4]), target - used)
            leaf = rng.choice(leaves)
            name = f"run-{n.name}-{k}"
            grant = tuple((used + j, GPU_MILLI) for j in range(take))
            noise = rng.randint(0, spec.jitter) if spec.jitter else 0
            pods.append(
                make_pod(
                    name,
                    queue=leaf,
                    gpus=take,
                    cpu=8 * take + noise,
                    memory_gib=64 * take + noise,
                    node=n.name,
                    grant=grant,
                    tolerations=(toleration,),
                    **protected,
                )
            )
            gangs.append(Gang("default", name, 1, leaf, **gang_protected))
            used += take
            k += 1
        if used < n.gpu_count and rng.random() < 0.2:
            name = f"run-{n.name}-frac"
            pods.append(
                make_pod(
                    name,
                    queue=rng.choice(leaves),
                    fraction=0.5,
                    cpu=4,
                    memory_gib=32,
                    node=n.name,
                    grant=((used, 500),),
                    **protected,
                )
            )
            gangs.append(Gang("default", name, 1, pods[-1].queue, **gang_protected))
    weights = [w for *_, w in _GANG_SHAPES]
    for g in range(spec.gangs):
        gpus, (lo, hi), _ = rng.choices(_GANG_SHAPES, weights)[0]
        size = rng.randint(lo, hi)
        leaf = rng.choice(leaves)
        priority = rng.choice(spec.priorities)
        extra: dict[str, Any] = {}
        roll = rng.random()
        if roll < 0.1:
            extra["tolerations"] = (toleration,)
        elif roll < 0.2:
            extra["selector"] = {"zone": "a"}
        elif roll < 0.25:
            extra["affinity"] = (
                NodeSelectorTerm(
                    (NodeSelectorRequirement("nvidia.com/gpu.product", "In", ("H100", "A100")),)
                ),
            )
        if gpus == 0 and rng.random() < 0.5:
            extra["fraction"] = 0.25 * rng.randint(1, 3)
        if spec.constraints and rng.random() < spec.constraints:
            extra.update(_apart(f"job-{g:05d}", spread=rng.random() < 0.5))
        gang, members = make_gang(
            f"job-{g:05d}",
            size,
            queue=leaf,
            priority=priority,
            gpus=gpus,
            cpu=max(1, 8 * gpus) if gpus else 2,
            memory_gib=max(4, 64 * gpus) if gpus else 8,
            created=float(g),
            **extra,
        )
        gangs.append(gang)
        pods.extend(members)
    return Snapshot(tuple(nodes), tuple(pods), tuple(gangs), tuple(queues), now=now)


def _over_quota_gangs(
    rng: random.Random,
    nodes: list[Node],
    share: float,
    now: float,
    toleration: Toleration,
    pods: list[Pod],
    gangs: list[Gang],
) -> dict[str, int]:
    """Running preemptible gangs of :data:`OVER_QUOTA_LEAVES` holding ``share`` of all GPUs
    (whole devices, about ``share`` of every node, first fit over the nodes in random order);
    appends to ``pods`` and ``gangs`` and returns the GPUs they hold per node."""
    order = [n for n in nodes if n.gpu_count]
    rng.shuffle(order)
    target = round(share * sum(n.gpu_count for n in nodes))
    # Spread over the nodes like the rest of the fill, so the fill stays what was asked.
    cap = {
        n.name: max(0, min(n.gpu_count, round(n.gpu_count * share + rng.uniform(-1.5, 1.5))))
        for n in order
    }
    used = dict.fromkeys((n.name for n in order), 0)
    biggest = max(cap.values(), default=0)
    first_free = 0  # nodes before this one are full
    taken = 0
    g = 0
    while taken < target and first_free < len(order):
        per = min(rng.choice([1, 2, 4, 8]), biggest, target - taken)
        size = min(rng.randint(1, 4), -(-(target - taken) // per))
        leaf = OVER_QUOTA_LEAVES[g % len(OVER_QUOTA_LEAVES)]
        started = now - rng.uniform(600, 7200)
        name = f"over-{g:05d}"
        members: list[Pod] = []
        i = first_free
        while len(members) < size and i < len(order):
            n = order[i]
            if cap[n.name] - used[n.name] < per:
                i += 1
                continue
            base = used[n.name]
            members.append(
                make_pod(
                    f"{name}-{len(members)}",
                    gang=name,
                    queue=leaf,
                    gpus=per,
                    cpu=8 * per,
                    memory_gib=64 * per,
                    priority=_RUNNING_PRIORITY,
                    node=n.name,
                    grant=tuple((base + j, GPU_MILLI) for j in range(per)),
                    tolerations=(toleration,),
                    created=started,
                    started=started,
                )
            )
            used[n.name] += per
        while (
            first_free < len(order) and used[order[first_free].name] >= cap[order[first_free].name]
        ):
            first_free += 1
        if not members:
            # No node has ``per`` free devices left: try smaller pods.
            biggest = per - 1
            if biggest < 1:
                break
            continue
        pods.extend(members)
        gangs.append(
            Gang(
                "default",
                name,
                len(members),
                leaf,
                priority=_RUNNING_PRIORITY,
                preemptible=True,
                creation_time=started,
            )
        )
        taken += per * len(members)
        g += 1
    return {k: v for k, v in used.items() if v}
