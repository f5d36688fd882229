"""Why a gang waits: each reason code, with the message a user reads checked word for word."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from scheduler.cluster.dracodes import DEVICES_UNAVAILABLE
from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node, Taint
from scheduler.cluster.pod import GpuRequest, Pod, PodPhase
from scheduler.cluster.podaffinity import LabelSelector, PodAffinityTerm, SpreadConstraint
from scheduler.cluster.queue import UNLIMITED, Queue, QueueResource
from scheduler.cluster.resources import Resources
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm
from scheduler.cluster.snapshot import Snapshot
from scheduler.explain import ALL_CODES, explain_unplaced
from scheduler.explain.codes import HELD_TO_AVOID_STRANDING
from scheduler.fairness import compute_fair_shares
from scheduler.solver.placement import PodAssignment

G = "nvidia.com/gpu"
GIB = 2**30

NODE_TERMS = (
    "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
)


def node(
    name: str,
    gpus: int = 8,
    cpu: int = 64,
    mem_gib: int = 256,
    *,
    labels: tuple[tuple[str, str], ...] = (),
    taints: tuple[Taint, ...] = (),
    **kw: Any,
) -> Node:
    return Node(
        name,
        Resources({G: gpus, "cpu": cpu * 1000, "memory": mem_gib * GIB}),
        labels=labels,
        taints=taints,
        **kw,
    )


def pod(
    name: str,
    gang: str,
    queue: str = "team-a",
    *,
    gpus: int = 0,
    cpu: float = 1,
    mem_gib: int = 1,
    frac: int | None = None,
    on: str | None = None,
    grant: tuple[tuple[int, int], ...] = (),
    **kw: Any,
) -> Pod:
    req = {"cpu": int(cpu * 1000), "memory": mem_gib * GIB}
    gpu = None
    if gpus:
        req[G] = gpus
        gpu = GpuRequest(gpus)
    if frac is not None:
        gpu = GpuRequest(1, frac)
    return Pod(
        uid=name,
        namespace="ns",
        name=name,
        requests=Resources(req),
        gpu=gpu,
        gang=f"ns/{gang}",
        queue=queue,
        node_name=on,
        gpu_grant=grant,
        phase=PodPhase.RUNNING if on else PodPhase.PENDING,
        **kw,
    )


def queues(team_a: QueueResource | None = None, dept: QueueResource | None = None) -> list[Queue]:
    a = (("gpu", team_a),) if team_a else ()
    d = (("gpu", dept),) if dept else ()
    return [
        Queue("dept", resources=d),
        Queue("team-a", "dept", resources=a),
        Queue("team-b", "dept"),
    ]


@dataclass
class Case:
    """Nodes, queues, pods (gang = pod name prefix before '-') and this cycle's assignments."""

    nodes: list[Node]
    pods: list[Pod]
    code: str
    message: str
    queues: list[Queue] = field(default_factory=queues)
    gangs: dict[str, tuple[int, str, bool]] = field(default_factory=dict)  # min, queue, preempt
    assignments: list[PodAssignment] = field(default_factory=list)
    gang: str = "ns/job"


def run(case: Case) -> tuple[str, str]:
    keys = sorted({p.gang for p in case.pods})
    gangs = []
    for key in keys:
        name = key.removeprefix("ns/")
        members, queue, preemptible = case.gangs.get(
            name, (1, next(p.queue for p in case.pods if p.gang == key), True)
        )
        gangs.append(Gang("ns", name, members, queue, preemptible=preemptible))
    snap = Snapshot(
        nodes=tuple(case.nodes),
        pods=tuple(case.pods),
        gangs=tuple(gangs),
        queues=tuple(case.queues),
    )
    report = compute_fair_shares(snap)
    return explain_unplaced(snap, report, case.assignments, [case.gang])[case.gang]


def assign(p: Pod, node_name: str, grant: tuple[tuple[int, int], ...] = ()) -> PodAssignment:
    return PodAssignment(p.uid, p.key, p.gang, node_name, grant)


TAKER = [pod(f"taker-{i}", "taker", "team-b", gpus=2) for i in range(3)]
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
WEB = (("app", "web"),)


def web_term(key: str, app: str = "web") -> PodAffinityTerm:
    """A required (anti-)affinity term on ``key`` selecting pods app=``app`` of namespace ns."""
    return PodAffinityTerm(key, LabelSelector((("app", app),)), ("ns",))


def host(name: str, zone: str = "a", **kw: Any) -> Node:
    return node(name, labels=((HOST, name), (ZONE, zone)), **kw)


CASES = {
    "queue missing": Case(
        [node("n1")],
        [pod("job-0", "job", "ghost", gpus=1)],
        "QueueMissing",
        "queue ghost does not exist; create it or set spec.queue / label kai.scheduler/queue",
    ),
    "non-leaf queue": Case(
        [node("n1")],
        [pod("job-0", "job", "dept", gpus=1)],
        "NonLeafQueue",
        "queue dept has child queues; submit jobs to a leaf queue such as team-a",
    ),
    "invalid queue": Case(
        [node("n1")],
        [pod("job-0", "job", "orphan", gpus=1)],
        "QueueInvalid",
        "queue orphan is invalid (spec.parentQueue: parent queue nobody does not exist; "
        "create it or fix spec.parentQueue)",
        queues=[*queues(), Queue("orphan", "nobody")],
    ),
    "unsupported field": Case(
        [node("n1")],
        [
            pod("job-0", "job", gpus=1),
            pod("job-1", "job", gpus=1, unsupported=(f"{NODE_TERMS}[0].matchFields[0]",)),
        ],
        "UnsupportedField",
        f"pod ns/job-1: {NODE_TERMS}[0].matchFields[0] is not supported yet; the pod waits "
        "(matchFields may only use metadata.name; select nodes by label with matchExpressions)",
        gangs={"job": (2, "team-a", True)},
    ),
    "resource claim not ready": Case(
        [node("n1")],
        [
            pod(
                "job-0",
                "job",
                gpus=1,
                blocked=(
                    "ResourceClaimNotReady",
                    "ResourceClaim ns/gpus (spec.resourceClaims[0]) does not exist; create it",
                ),
            ),
        ],
        "ResourceClaimNotReady",
        "pod ns/job-0: ResourceClaim ns/gpus (spec.resourceClaims[0]) does not exist; create it",
    ),
    "volume not found": Case(
        [node("n1")],
        [
            pod("job-0", "job", gpus=1),
            pod(
                "job-1",
                "job",
                gpus=1,
                blocked=("VolumeNotFound", "persistentvolumeclaim ns/data not found"),
            ),
        ],
        "VolumeNotFound",
        "pod ns/job-1: persistentvolumeclaim ns/data not found",
        gangs={"job": (2, "team-a", True)},
    ),
    "volume not bound": Case(
        [node("n1")],
        [
            pod(
                f"job-{i}",
                "job",
                gpus=1,
                blocked=(
                    "VolumeNotBound",
                    f"waiting for persistentvolumeclaim ns/d-{i} to be bound",
                ),
            )
            for i in range(3)
        ],
        "VolumeNotBound",
        "pod ns/job-0: waiting for persistentvolumeclaim ns/d-0 to be bound; 2 more pods of gang "
        "ns/job too",
        gangs={"job": (3, "team-a", True)},
    ),
    "scheduling gated": Case(
        [node("n1")],
        [
            pod("job-0", "job", gpus=1),
            pod("job-1", "job", gpus=1, scheduling_gates=("example.com/gate",)),
        ],
        "SchedulingGated",
        "pod ns/job-1 has scheduling gates [example.com/gate]; it is scheduled once they are "
        "removed (gang ns/job needs 2 pods placed together; 1 can be scheduled now)",
        gangs={"job": (2, "team-a", True)},
    ),
    "gang incomplete": Case(
        [node("n1")],
        [pod(f"job-{i}", "job", gpus=1) for i in range(3)],
        "GangIncomplete",
        "gang ns/job: 3/4 pods created (minMember 4)",
        gangs={"job": (4, "team-a", True)},
    ),
    "queue limit": Case(
        [node("n1", gpus=16)],
        [*(pod(f"run-{i}", "run", gpus=4, on="n1") for i in range(2)), pod("job-0", "job", gpus=1)],
        "QueueLimit",
        "queue team-a is at its gpu limit (8/8); the gang needs 1 more",
        queues=queues(QueueResource(0, 1, 8000)),
    ),
    "ancestor limit": Case(
        [node("n1", gpus=16)],
        [pod("run-0", "run", "team-b", gpus=3, on="n1"), pod("job-0", "job", gpus=2)],
        "QueueLimit",
        "queue dept would pass its gpu limit (3/4); the gang needs 2 more",
        queues=queues(dept=QueueResource(0, 1, 4000)),
    ),
    "limit reached by this cycle's assignments": Case(
        [node("n1", gpus=16)],
        [
            pod("run-0", "run", gpus=6, on="n1"),
            pod("now-0", "now", gpus=2),
            pod("job-0", "job", gpus=1),
        ],
        "QueueLimit",
        "queue team-a is at its gpu limit (8/8); the gang needs 1 more",
        queues=queues(QueueResource(0, 1, 8000)),
        assignments=[PodAssignment("now-0", "ns/now-0", "ns/now", "n1")],
    ),
    "non-preemptible over quota": Case(
        [node("n1")],
        [pod("run-0", "run", gpus=4, on="n1"), pod("job-0", "job", gpus=1)],
        "OverQuota",
        "queue team-a: non-preemptible work may only use quota (gpu 4/4 held by non-preemptible "
        "work); the gang needs 1 more",
        queues=queues(QueueResource(4000, 1, UNLIMITED)),
        gangs={"job": (1, "team-a", False), "run": (1, "team-a", False)},
    ),
    "no node matches nodeSelector": Case(
        [node("n1", labels=(("gpu-type", "a100"),))],
        [pod("job-0", "job", gpus=1, node_selector=(("gpu-type", "h100"),))],
        "NoMatchingNode",
        "no node matches nodeSelector gpu-type=h100",
    ),
    "no node matches affinity": Case(
        [node("n1", labels=(("zone", "a"),))],
        [
            pod(
                "job-0",
                "job",
                gpus=1,
                affinity=(NodeSelectorTerm((NodeSelectorRequirement("zone", "In", ("b", "c")),)),),
            )
        ],
        "NoMatchingNode",
        "no node matches the pod's required node affinity (zone In b,c)",
    ),
    "no node tolerates the taint": Case(
        [
            node("n1", taints=(Taint("dedicated", "infer"),)),
            node("n2", taints=(Taint("dedicated", "infer"), Taint("soft", "", "PreferNoSchedule"))),
        ],
        [pod("job-0", "job", gpus=1)],
        "NoMatchingNode",
        "no node tolerates taint dedicated=infer:NoSchedule; add a toleration or use other nodes",
    ),
    "all matching nodes cordoned or not ready": Case(
        [node("n1", unschedulable=True), node("n2", ready=False)],
        [pod("job-0", "job", gpus=1)],
        "NoMatchingNode",
        "all matching nodes are cordoned or NotReady (2)",
    ),
    "no nodes at all": Case(
        [], [pod("job-0", "job", gpus=1)], "NoMatchingNode", "the cluster has no nodes"
    ),
    "node too small for the GPUs": Case(
        [node("n1"), node("n2", gpus=4)],
        [pod("job-0", "job", gpus=16)],
        "NodeTooSmall",
        "pod ns/job-0 needs 16 GPUs on one node; the largest matching node has 8",
    ),
    "node too small for the cpu": Case(
        [node("n1", cpu=64)],
        [pod("job-0", "job", cpu=200)],
        "NodeTooSmall",
        "pod ns/job-0 needs 200 cpu on one node; the largest matching node has 64",
    ),
    "whole GPUs: largest free block": Case(
        [node("n1", gpus=4), node("n2", gpus=4)],
        [
            pod("run-0", "run", gpus=2, on="n1"),
            pod("run-1", "run", gpus=3, on="n2"),
            pod("job-0", "job", gpus=4),
        ],
        "InsufficientOnOneNode",
        "pod ns/job-0 needs 4 GPUs on one node; largest free block is 2",
    ),
    "fractional GPU: largest free share": Case(
        [node("n1", gpus=2)],
        [
            pod("run-0", "run", frac=700, on="n1", grant=((0, 700),)),
            pod("run-1", "run", frac=800, on="n1", grant=((1, 800),)),
            pod("job-0", "job", frac=500),
        ],
        "InsufficientOnOneNode",
        "pod ns/job-0 needs 0.5 of one GPU; the largest free share on a matching node is 0.3",
    ),
    "cpu: at most this much free": Case(
        [node("n1", cpu=16), node("n2", cpu=16)],
        [
            pod("run-0", "run", cpu=8, on="n1"),
            pod("run-1", "run", cpu=10, on="n2"),
            pod("job-0", "job", cpu=16),
        ],
        "InsufficientOnOneNode",
        "pod ns/job-0 needs 16 cpu on one node; at most 8 free",
    ),
    "memory: at most this much free": Case(
        [node("n1", mem_gib=64)],
        [pod("run-0", "run", mem_gib=32, on="n1"), pod("job-0", "job", mem_gib=48)],
        "InsufficientOnOneNode",
        "pod ns/job-0 needs 48GiB memory on one node; at most 32GiB free",
    ),
    "gang does not fit in total": Case(
        [node(f"n{i}", gpus=4) for i in range(3)],
        [
            *(pod(f"run-{i}", "run", gpus=2, on=f"n{i}") for i in range(3)),
            *(pod(f"job-{i}", "job", gpus=2) for i in range(4)),
        ],
        "GangDoesNotFit",
        "gang needs 8 GPUs across 4 pods together; only 6 GPUs are free on matching nodes",
        gangs={"job": (4, "team-a", True)},
    ),
    "gang does not pack": Case(
        [node("n1", gpus=4), node("n2", gpus=4)],
        [pod("run-0", "run", gpus=2, on="n2"), *(pod(f"job-{i}", "job", gpus=3) for i in range(2))],
        "GangDoesNotFit",
        "gang needs 2 pods placed together; matching nodes have enough free in total, but it is "
        "split across nodes and devices so they do not all fit",
        gangs={"job": (2, "team-a", True)},
    ),
    "gang never packs, even on empty nodes": Case(
        [node("n1", gpus=4), node("n2", gpus=2)],
        [pod(f"job-{i}", "job", gpus=3) for i in range(2)],
        "ExceedsCluster",
        "gang ns/job can never fit this cluster: its 2 pods are within the nodes' total "
        "capacity but cannot be packed onto them node by node, even with nothing else running; "
        "use larger nodes or make the gang smaller",
        gangs={"job": (2, "team-a", True)},
    ),
    "gang larger than the cluster": Case(
        [node(f"n{i}", gpus=8) for i in range(4)],
        [pod(f"job-{i}", "job", gpus=8) for i in range(5)],
        "ExceedsCluster",
        "gang ns/job can never fit this cluster: it needs 40 GPUs across 5 pods together, the "
        "cluster has 32; add nodes or make the gang smaller",
        gangs={"job": (5, "team-a", True)},
    ),
    "gang above its queue's limit": Case(
        [node(f"n{i}", gpus=8) for i in range(8)],
        [pod(f"job-{i}", "job", gpus=8) for i in range(5)],
        "ExceedsQueueLimit",
        "gang ns/job can never be admitted: it asks 40 GPUs, queue team-a's limit is 32 GPUs; "
        "raise the limit or make the gang smaller",
        queues=queues(QueueResource(0, 1, 32000)),
        gangs={"job": (5, "team-a", True)},
    ),
    "non-preemptible gang above its queue's quota": Case(
        [node("n1", gpus=8)],
        [pod("job-0", "job", gpus=6)],
        "ExceedsQueueQuota",
        "gang ns/job can never be admitted: it is non-preemptible and asks 6 GPUs, queue "
        "team-a's quota is 4 GPUs (non-preemptible work may only use quota); raise the quota or "
        "make the gang preemptible",
        queues=queues(QueueResource(4000, 1, UNLIMITED)),
        gangs={"job": (1, "team-a", False)},
    ),
    "pod anti-affinity": Case(
        [host("n1"), host("n2")],
        [
            *(pod(f"run-{i}", "run", gpus=1, on=f"n{i + 1}", labels=WEB) for i in range(2)),
            pod("job-0", "job", gpus=1, labels=WEB, pod_anti_affinity=(web_term(HOST),)),
        ],
        "PodAntiAffinity",
        "pod ns/job-0: 0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules",
    ),
    "pod affinity": Case(
        [host("n1"), host("n2", "b")],
        [pod("job-0", "job", gpus=1, labels=WEB, pod_affinity=(web_term(ZONE, "cache"),))],
        "PodAffinity",
        "pod ns/job-0: 0/2 nodes are available: 2 node(s) didn't match pod affinity rules",
    ),
    "topology spread": Case(
        [host("a1", "a"), host("b1", "b", gpus=2)],
        [
            pod("run-0", "run", gpus=1, on="a1", labels=WEB),
            pod("full-0", "full", gpus=2, on="b1"),
            pod(
                "job-0",
                "job",
                gpus=1,
                labels=WEB,
                spread=(SpreadConstraint(1, ZONE, LabelSelector(WEB)),),
            ),
        ],
        "TopologySpread",
        "pod ns/job-0: 0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't "
        "match pod topology spread constraints",
    ),
    "capacity taken this cycle": Case(
        [node("n1", gpus=8)],
        [*TAKER, pod("job-0", "job", gpus=4)],
        "CapacityTakenThisCycle",
        "resources went to higher-priority or fairer gangs this cycle (queue team-b below fair "
        "share); now pod ns/job-0 needs 4 GPUs on one node; largest free block is 2",
        assignments=[assign(p, "n1") for p in TAKER],
    ),
    "fits now, not placed this cycle": Case(
        [node("n1")],
        [pod("job-0", "job", gpus=4)],
        "NotPlacedThisCycle",
        "gang ns/job fits what is free now but was not placed this cycle (it came after other "
        "gangs or the solver ran out of time); it is retried next cycle",
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_explain_reasons(case: Case) -> None:
    assert run(case) == (case.code, case.message)
    assert case.code in ALL_CODES


def test_every_code_is_covered() -> None:
    # DevicesUnavailable comes from the solver's greedy pass, which sees the devices
    # (covered by tests/unit/test_solver_dra.py), HeldToAvoidStranding from the strand guard
    # (tests/unit/test_strand_guard.py); the explainer alone never says them.
    solver_only = {DEVICES_UNAVAILABLE, HELD_TO_AVOID_STRANDING}
    assert {c.code for c in CASES.values()} == set(ALL_CODES) - solver_only


def test_preemptible_gang_may_exceed_quota() -> None:
    case = CASES["non-preemptible over quota"]
    assert run(Case(case.nodes, case.pods, "", "", queues=case.queues))[0] == "NotPlacedThisCycle"


def test_preemptible_usage_does_not_count_against_quota_for_non_preemptible_work() -> None:
    """KAI's rule: preemptible work in the queue can be taken back, so it does not block."""
    case = CASES["non-preemptible over quota"]
    gangs = {"job": (1, "team-a", False), "run": (1, "team-a", True)}
    got = run(Case(case.nodes, case.pods, "", "", queues=case.queues, gangs=gangs))
    assert got[0] != "OverQuota"


def test_explains_many_gangs_on_many_nodes_quickly() -> None:
    rng = random.Random(7)
    nodes, pods, gangs, keys = [], [], [], []
    for i in range(5000):
        pool = i % 5
        nodes.append(
            node(
                f"n{i}",
                labels=(("kubernetes.io/hostname", f"n{i}"), ("pool", f"p{pool}")),
                taints=(Taint("dedicated", "x"),) if pool == 4 else (),
            )
        )
        used = rng.choice([8, 8, 7, 6, 4])
        pods.append(pod(f"b{i}", f"b{i}", f"q{i % 20}", gpus=used, on=f"n{i}"))
        gangs.append(Gang("ns", f"b{i}", queue=f"q{i % 20}"))
    for g in range(2000):
        size, per = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4, 8])
        sel = (("pool", f"p{rng.randint(0, 5)}"),) if rng.random() < 0.3 else ()
        pods += [
            pod(f"g{g}-{k}", f"g{g}", f"q{g % 20}", gpus=per, node_selector=sel)
            for k in range(size)
        ]
        gangs.append(Gang("ns", f"g{g}", size, f"q{g % 20}"))
        keys.append(f"ns/g{g}")
    snap = Snapshot(
        nodes=tuple(nodes),
        pods=tuple(pods),
        gangs=tuple(gangs),
        queues=(Queue("root"), *(Queue(f"q{j}", "root") for j in range(20))),
    )
    report = compute_fair_shares(snap)
    start = time.perf_counter()
    reasons = explain_unplaced(snap, report, [], keys)
    elapsed = time.perf_counter() - start
    assert set(reasons) == set(keys)
    assert {code for code, _ in reasons.values()} >= {"NoMatchingNode", "InsufficientOnOneNode"}
    # target is < 1 s; the bound leaves room for a busy shared CI machine
    assert elapsed < 4.0


@pytest.mark.parametrize(
    ("resource", "limit", "used", "ask", "message"),
    [
        (
            "cpu",
            4000,
            3000,
            2000,
            "queue team-a would pass its cpu limit (3/4); the gang needs 2 more",
        ),
        ("cpu", 4000, 4000, 500, "queue team-a is at its cpu limit (4/4); the gang needs 0.5 more"),
        (
            "memory",
            8000 * 10**6,
            6000 * 10**6,
            4 * 10**9,
            "queue team-a would pass its memory limit (6000MB/8000MB); the gang needs 4000MB more",
        ),
    ],
)
def test_queue_limit_units(resource: str, limit: int, used: int, ask: int, message: str) -> None:
    from scheduler.fairness import queue_admission_problem

    qs = [Queue("team-a", resources=((resource, QueueResource(0, 1, limit)),))]
    snap = Snapshot(queues=tuple(qs))
    report = compute_fair_shares(snap)
    problem = queue_admission_problem(
        snap.queue_tree,
        report,
        "team-a",
        {resource: ask},
        preemptible=True,
        charged={"team-a": {resource: used}},
    )
    assert problem == ("QueueLimit", message)
    assert (
        queue_admission_problem(
            snap.queue_tree,
            report,
            "team-a",
            {resource: limit - used},
            preemptible=True,
            charged={"team-a": {resource: used}},
        )
        is None
    )


def test_solver_reasons_match_explaining_from_the_snapshot() -> None:
    # The solver hands the explainer its own grouped free capacity and the explainer answers
    # once per class of equal gangs; both shortcuts must give the same words as explaining
    # every gang from the snapshot.
    from scheduler.bench.synthetic import ClusterSpec, synthetic_snapshot
    from scheduler.solver import PlacementSettings, solve

    snap = synthetic_snapshot(ClusterSpec(120, 8, 90, 0.8, 7, 2, (50, 100)))
    report = compute_fair_shares(snap)
    placement = solve(snap, PlacementSettings(time_limit_seconds=0.2), report)
    waiting = [k for k, o in placement.outcomes.items() if not o.placed]
    assert len({placement.outcomes[k].reason_code for k in waiting}) >= 2
    expected = {  # one call per gang: no sharing between gangs at all
        k: explain_unplaced(snap, report, placement.assignments, [k], freed=placement.freed)[k]
        for k in waiting
    }
    got = {k: (placement.outcomes[k].reason_code, placement.outcomes[k].reason) for k in waiting}
    assert got == expected
    for key in waiting:  # messages name their own gang and pods, not a cached neighbour's
        name = key.split("/")[1]
        message = got[key][1]
        if "pod default/" in message:
            assert f"pod default/{name}-" in message, message
