"""A node's ``pods`` capacity, and gangs that can *never* fit told apart from gangs that fit
once something frees up: scenarios through the explainer and through a whole solve (greedy and
CP-SAT), the message a user reads checked word for word."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node
from scheduler.cluster.pod import GpuRequest, Pod, PodPhase
from scheduler.cluster.queue import Queue, QueueResource
from scheduler.cluster.resources import Resources
from scheduler.cluster.snapshot import Snapshot
from scheduler.explain import NEVER_CODES, explain_unplaced
from scheduler.fairness import compute_fair_shares
from scheduler.solver import PlacementSettings, solve, validate

G = "nvidia.com/gpu"
GIB = 2**30
GREEDY = PlacementSettings(greedy_only=True)
CPSAT = PlacementSettings(time_limit_seconds=2.0)
BOTH = pytest.mark.parametrize("settings", [GREEDY, CPSAT], ids=["greedy", "cpsat"])


def node(
    name: str, pods: int, gpus: int = 0, cpu: int = 64, pool: str = "", unschedulable: bool = False
) -> Node:
    alloc = {"cpu": cpu * 1000, "memory": 256 * GIB, "pods": pods, G: gpus}
    labels = (("pool", pool),) if pool else ()
    return Node(name, Resources(alloc), labels=labels, unschedulable=unschedulable)


def pod(
    name: str,
    gang: str,
    queue: str = "team-a",
    *,
    gpus: int = 0,
    cpu: float = 0.1,
    pool: str = "",
    on: str | None = None,
) -> Pod:
    req = {"cpu": int(cpu * 1000), "memory": GIB, G: gpus}
    return Pod(
        uid=name,
        namespace="ns",
        name=name,
        requests=Resources(req),
        gpu=GpuRequest(gpus) if gpus else None,
        gang=f"ns/{gang}",
        queue=queue,
        node_selector=(("pool", pool),) if pool else (),
        node_name=on,
        phase=PodPhase.RUNNING if on else PodPhase.PENDING,
    )


def snapshot(
    nodes: list[Node], pods: list[Pod], *, gpu_limit: int | None = None, min_member: int = 0
) -> Snapshot:
    """Queues dept > team-a, team-b (``gpu_limit`` GPUs on team-a); each gang needs all its
    pods (``min_member`` overrides for gang ``job``)."""
    counts = Counter(p.gang for p in pods)
    gangs = tuple(
        Gang(
            "ns",
            key.removeprefix("ns/"),
            min_member if key == "ns/job" and min_member else n,
            next(p.queue for p in pods if p.gang == key),
        )
        for key, n in sorted(counts.items())
    )
    limit = (("gpu", QueueResource(0, 1, gpu_limit * 1000)),) if gpu_limit is not None else ()
    queues = (Queue("dept"), Queue("team-a", "dept", resources=limit), Queue("team-b", "dept"))
    return Snapshot(tuple(nodes), tuple(pods), gangs, queues)


def explain(snap: Snapshot, gang: str = "ns/job") -> tuple[str, str]:
    return explain_unplaced(snap, compute_fair_shares(snap), [], [gang])[gang]


def running(count: int, nodes: int) -> list[Pod]:
    """``count`` one-pod gangs of queue team-b, spread round-robin over n0..n{nodes-1}."""
    return [pod(f"busy{i}-0", f"busy{i}", "team-b", on=f"n{i % nodes}") for i in range(count)]


# --- what the explainer says ----------------------------------------------------------------

NEVER_FITS = "ExceedsCluster"


@dataclass
class Case:
    """Nodes and pods (gang ``job`` is explained), the reason expected, team-a's GPU limit
    and the gang's minMember (0: all its pods)."""

    nodes: list[Node]
    pods: list[Pod]
    code: str
    message: str
    gpu_limit: int | None = None
    min_member: int = 0


CASES = {
    "more pods than pod slots in the cluster": Case(
        [node(f"n{i}", pods=2) for i in range(5)],
        [pod(f"job-{i}", "job") for i in range(12)],
        NEVER_FITS,
        "gang ns/job can never fit this cluster: it needs 12 pod slots across 12 pods "
        "together, the cluster has 10; add nodes or make the gang smaller",
    ),
    "pod slots taken by running pods: fits once they finish": Case(
        [node(f"n{i}", pods=2) for i in range(5)],
        [*running(4, 5), *(pod(f"job-{i}", "job") for i in range(8))],
        "GangDoesNotFit",
        "gang needs 8 pod slots across 8 pods together; only 6 free on matching nodes "
        "(allocatable pods)",
    ),
    "every node at its pods capacity": Case(
        [node(f"n{i}", pods=1) for i in range(3)],
        [*running(3, 3), pod("job-0", "job")],
        "InsufficientOnOneNode",
        "pod ns/job-0 needs a free pod slot; every matching node is at its pods capacity "
        "(allocatable pods)",
    ),
    "minMember, not the pod count, is what must fit": Case(
        [node(f"n{i}", pods=2) for i in range(5)],
        [*running(2, 5), *(pod(f"job-{i}", "job") for i in range(12))],
        "GangDoesNotFit",
        "gang needs 10 pod slots across 10 pods together; only 8 free on matching nodes "
        "(allocatable pods)",
        min_member=10,
    ),
    "more GPUs than the cluster has": Case(
        [node(f"n{i}", pods=110, gpus=8) for i in range(4)],
        [pod(f"job-{i}", "job", gpus=8) for i in range(5)],
        NEVER_FITS,
        "gang ns/job can never fit this cluster: it needs 40 GPUs across 5 pods together, the "
        "cluster has 32; add nodes or make the gang smaller",
    ),
    "GPUs held by running pods: fits once they finish": Case(
        [node(f"n{i}", pods=110, gpus=8) for i in range(4)],
        [
            pod("busy-0", "busy", "team-b", gpus=8, on="n0"),
            *(pod(f"job-{i}", "job", gpus=8) for i in range(4)),
        ],
        "GangDoesNotFit",
        "gang needs 32 GPUs across 4 pods together; only 24 GPUs are free on matching nodes",
    ),
    "more cpu than the nodes its pods may use have": Case(
        [*(node(f"n{i}", pods=110, cpu=4, pool="small") for i in range(2)), node("big", 110)],
        [pod(f"job-{i}", "job", cpu=3, pool="small") for i in range(3)],
        NEVER_FITS,
        "gang ns/job can never fit the 2 nodes its pods may use: it needs 9 cpu across 3 pods "
        "together, they have 8; add nodes or make the gang smaller",
    ),
    "cordoned nodes are named: they may come back": Case(
        [node("n0", pods=2), node("n1", pods=2, unschedulable=True)],
        [pod(f"job-{i}", "job") for i in range(3)],
        NEVER_FITS,
        "gang ns/job can never fit this cluster: it needs 3 pod slots across 3 pods together, "
        "the cluster has 2 (1 more matching node is cordoned or NotReady); add nodes or make "
        "the gang smaller",
    ),
    "more GPUs than the queue's limit": Case(
        [node(f"n{i}", pods=110, gpus=8) for i in range(8)],
        [pod(f"job-{i}", "job", gpus=8) for i in range(5)],
        "ExceedsQueueLimit",
        "gang ns/job can never be admitted: it asks 40 GPUs, queue team-a's limit is 32 GPUs; "
        "raise the limit or make the gang smaller",
        gpu_limit=32,
    ),
    "queue limit taken by running work: fits once it finishes": Case(
        [node(f"n{i}", pods=110, gpus=8) for i in range(8)],
        [pod("run-0", "run", gpus=8, on="n0"), *(pod(f"job-{i}", "job", gpus=8) for i in range(4))],
        "QueueLimit",
        "queue team-a would pass its gpu limit (8/32); the gang needs 32 more",
        gpu_limit=32,
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_explainer_counts_pod_slots_and_says_when_it_can_never_fit(case: Case) -> None:
    snap = snapshot(case.nodes, case.pods, gpu_limit=case.gpu_limit, min_member=case.min_member)
    assert explain(snap) == (case.code, case.message)
    assert (case.code in NEVER_CODES) == ("can never" in case.message)


def test_nodes_without_a_pods_capacity_take_any_number() -> None:
    # Resources drops zero entries, so pods: 0 means "not given" - the solver reads it the
    # same way (framework.scoring.pod_demand); the explainer must not call that "full".
    nodes = [Node("n0", Resources({"cpu": 64000, "memory": 256 * GIB}))]
    snap = snapshot(nodes, [pod(f"job-{i}", "job") for i in range(50)])
    assert explain(snap)[0] == "NotPlacedThisCycle"


# --- through a whole solve: the solver enforces pods, and its reasons say the same -----------


@BOTH
def test_solver_never_places_more_pods_than_a_node_allows(settings: PlacementSettings) -> None:
    # 3 nodes x 2 pod slots, one slot used: a gang of 5 fits exactly, one of 6 never could
    # now; plenty of cpu and memory, so only the pods capacity can stop either.
    nodes = [node(f"n{i}", pods=2) for i in range(3)]
    pods = [*running(1, 3), *(pod(f"job-{i}", "job") for i in range(5))]
    snap = snapshot(nodes, pods)
    placement = solve(snap, settings)
    assert validate(snap, placement.assignments) == []
    assert placement.outcomes["ns/job"].placed
    per_node = Counter(a.node for a in placement.assignments)
    per_node["n0"] += 1  # the running pod
    assert per_node == {"n0": 2, "n1": 2, "n2": 2}

    pods.append(pod("job-5", "job"))
    snap = snapshot(nodes, pods)
    placement = solve(snap, settings)
    assert validate(snap, placement.assignments) == []
    assert [a for a in placement.assignments if a.gang == "ns/job"] == []
    outcome = placement.outcomes["ns/job"]
    assert (outcome.reason_code, outcome.reason) == (
        "GangDoesNotFit",
        "gang needs 6 pod slots across 6 pods together; only 5 free on matching nodes "
        "(allocatable pods)",
    )


@BOTH
def test_solve_tells_a_gang_larger_than_the_cluster_it_never_fits(
    settings: PlacementSettings,
) -> None:
    nodes = [node(f"n{i}", pods=2) for i in range(5)]
    snap = snapshot(nodes, [*running(2, 5), *(pod(f"job-{i}", "job") for i in range(12))])
    placement = solve(snap, settings)
    assert list(placement.assignments) == []
    outcome = placement.outcomes["ns/job"]
    assert (outcome.reason_code, outcome.reason) == (
        NEVER_FITS,
        "gang ns/job can never fit this cluster: it needs 12 pod slots across 12 pods "
        "together, the cluster has 10; add nodes or make the gang smaller",
    )


def test_the_solver_path_and_the_snapshot_path_agree_on_pod_slots() -> None:
    # The solver feeds the explainer its own node classes (free pods already counted down);
    # explaining from the snapshot must count the bound pods the same way.
    nodes = [node(f"n{i}", pods=3) for i in range(4)]
    pods = [*running(5, 4), *(pod(f"job-{i}", "job") for i in range(8))]
    snap = snapshot(nodes, pods)
    placement = solve(snap, GREEDY)
    outcome = placement.outcomes["ns/job"]
    assert not outcome.placed
    assert (outcome.reason_code, outcome.reason) == explain(snap)
    assert outcome.reason_code == "GangDoesNotFit"
    assert "only 7 free" in outcome.reason
