"""Taking back in the simulator's backend: evictions, restarts, nominations (hand-built
placements, so these tests do not depend on the solver's take-back stage)."""

from __future__ import annotations

import asyncio
from typing import Any

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod, PodPhase
from scheduler.cluster.queue import Queue, QueueResource
from scheduler.cluster.resources import GPU, Resources
from scheduler.cluster.snapshot import bound_usage
from scheduler.cycle import CommitResult
from scheduler.fairness import compute_fair_shares
from scheduler.simulate.backend import EVICTED, NOMINATED, SimulatedCluster
from scheduler.solver.placement import (
    EvictAction,
    Eviction,
    GangOutcome,
    Placement,
    PodAssignment,
)


def _pod(name: str, gang: str, queue: str, gpus: int = 2, node: str | None = None) -> Pod:
    return Pod(
        f"ns/{name}",
        "ns",
        name,
        Resources({GPU: gpus, "cpu": 1000}),
        gang=f"ns/{gang}",
        queue=queue,
        node_name=node,
        phase=PodPhase.RUNNING if node else PodPhase.PENDING,
    )


def _grant(first: int, gpus: int = 2) -> tuple[tuple[int, int], ...]:
    return tuple((first + i, 1000) for i in range(gpus))


def _cluster(grace: float = 0.0) -> SimulatedCluster:
    """n1 (4 GPUs) runs gang ns/v of queue a (2 pods x 2 GPUs, since t=0); gang ns/w of queue
    b (2 x 2 GPUs) waits."""
    node = Node("n1", Resources({GPU: 4, "cpu": 16000, "pods": 20}))
    node2 = Node("n2", Resources({GPU: 4, "cpu": 16000, "pods": 20}))
    queues = [
        Queue("a", resources=(("gpu", QueueResource(quota=2000)),)),
        Queue("b", resources=(("gpu", QueueResource(quota=2000)),)),
    ]
    cluster = SimulatedCluster([node, node2], queues, termination_grace=grace)
    victims = [_pod(f"v-{i}", "v", "a", node="n1") for i in range(2)]
    victims = [Pod(**{**_fields(p), "gpu_grant": _grant(2 * i)}) for i, p in enumerate(victims)]
    cluster.add_pods(victims, [Gang("ns", "v", min_member=2, queue="a")], duration=3600.0)
    cluster.add_pods(
        [_pod(f"w-{i}", "w", "b") for i in range(2)],
        [Gang("ns", "w", min_member=2, queue="b")],
        duration=600.0,
    )
    return cluster


def _fields(pod: Pod) -> dict[str, Any]:
    return {name: getattr(pod, name) for name in pod.__dataclass_fields__}


def _evict(
    uids: list[str], gang: str, *, action: EvictAction = "reclaim", for_gang: str = "ns/w"
) -> tuple[Eviction, ...]:
    return tuple(
        Eviction(
            uid,
            uid,
            gang,
            "a",
            "n1",
            action,
            for_gang,
            f"{action}ed for {for_gang}: queue a is over its fair share",
        )
        for uid in uids
    )


def _reclaim_placement(*, waits: bool = True) -> Placement:
    pods = tuple(
        PodAssignment(f"ns/w-{i}", f"ns/w-{i}", "ns/w", "n1", _grant(2 * i)) for i in (0, 1)
    )
    return Placement(
        assignments=pods,
        outcomes={"ns/w": GangOutcome("ns/w", "b", True, pods)},
        evictions=_evict(["ns/v-0", "ns/v-1"], "ns/v"),
        waits_for={"ns/w": ("ns/v-0", "ns/v-1")} if waits else {},
    )


def _commit(cluster: SimulatedCluster, placement: Placement) -> CommitResult:
    snap = cluster.snapshot_now()
    return asyncio.run(cluster.commit(snap, placement, compute_fair_shares(snap)))


def test_victims_hold_their_gpus_while_terminating_and_the_gang_is_held_until_they_go() -> None:
    cluster = _cluster(grace=30.0)
    cluster.advance(100.0)
    result = _commit(cluster, _reclaim_placement())
    assert result.bound_pods == 0 and result.bound_gangs == ()

    # Victims: still bound, deleting, in the snapshot (they hold their devices).
    snap = cluster.snapshot_now()
    by_uid = {p.uid: p for p in snap.pods}
    for i in (0, 1):
        victim = by_uid[f"ns/v-{i}"]
        assert victim.deleting and victim.node_name == "n1" and victim.active
    # The reclaimer: shown on its node, nominated, not bound, not pending.
    for i in (0, 1):
        held = by_uid[f"ns/w-{i}"]
        assert held.nominated and held.node_name == "n1" and held.gpu_grant == _grant(2 * i)
        assert held.phase == PodPhase.PENDING and not held.pending
    assert cluster.pending_gangs() == []
    assert bound_usage(snap).used["n1"][GPU] == 8  # victims and nominees both count
    w = cluster.gangs["ns/w"]
    assert w.placed_at is None and w.last_reason is not None and w.last_reason[0] == NOMINATED
    assert cluster.nominations.keys() == {"ns/w"}
    # The victim gang lost every running pod: its job restarts.
    v = cluster.gangs["ns/v"]
    assert (v.restarts, v.restarted_at, v.placed_at) == (1, 100.0, None)
    assert v.last_reason is not None and v.last_reason[0] == EVICTED
    assert "over its fair share" in v.last_reason[1]
    assert [r.eviction.action for r in cluster.evictions] == ["reclaim", "reclaim"]
    assert [r.gpu for r in cluster.evictions] == [2000, 2000]
    assert len(w.made_room) == 2 and len(v.evictions) == 2

    assert cluster.next_completion() == 130.0
    cluster.advance(129.0)
    assert cluster.pods["ns/w-0"].pod.nominated and "ns/v-0" in {
        p.uid for p in cluster.active_pods()
    }

    cluster.advance(130.0)
    for i in (0, 1):
        gone = cluster.pods[f"ns/v-{i}"]
        assert gone.pod.phase == PodPhase.FAILED and gone.finished_at == 130.0
        bound = cluster.pods[f"ns/w-{i}"].pod
        assert bound.phase == PodPhase.RUNNING and not bound.nominated
        assert bound.node_name == "n1" and bound.start_time == 130.0
    assert w.placed_at == 130.0 and w.last_reason is None and not cluster.nominations
    assert cluster.pods["ns/w-0"].finishes_at == 130.0 + 600.0

    # Replacements: new uids and names, same gang, pending, the full run time again.
    replacements = [cluster.pods[uid] for uid in v.pod_uids[2:]]
    assert [r.pod.name for r in replacements] == ["v-0-r1", "v-1-r1"]
    assert all(r.pod.gang == "ns/v" and r.pod.pending for r in replacements)
    assert all(r.pod.creation_time == 130.0 and r.duration == 3600.0 for r in replacements)
    assert [r.replaces for r in replacements] == ["ns/v-0", "ns/v-1"]
    assert cluster.pods["ns/v-0"].replaced_by == "ns/v-0-r1"
    assert cluster.pending_gangs() == ["ns/v"]


def test_zero_grace_evicts_and_binds_in_the_same_commit() -> None:
    cluster = _cluster()
    cluster.advance(50.0)
    result = _commit(cluster, _reclaim_placement())
    assert result.bound_gangs == ("ns/w",) and result.bound_pods == 2
    assert all(cluster.pods[f"ns/v-{i}"].pod.phase == PodPhase.FAILED for i in (0, 1))
    assert all(cluster.pods[f"ns/w-{i}"].pod.start_time == 50.0 for i in (0, 1))
    assert cluster.gangs["ns/w"].placed_at == 50.0 and not cluster.nominations
    assert cluster.pending_gangs() == ["ns/v"]
    assert bound_usage(cluster.snapshot_now()).used["n1"][GPU] == 4


def test_a_second_restart_gets_new_names_again() -> None:
    cluster = _cluster()
    _commit(cluster, _reclaim_placement())
    # Place the restarted gang on n2, then evict it again (for someone else).
    again = [
        PodAssignment(f"ns/v-{i}-r1", f"ns/v-{i}-r1", "ns/v", "n2", _grant(2 * i)) for i in (0, 1)
    ]
    _commit(
        cluster,
        Placement(
            assignments=tuple(again),
            outcomes={"ns/v": GangOutcome("ns/v", "a", True, tuple(again))},
        ),
    )
    assert cluster.gangs["ns/v"].placed_at == 0.0 and cluster.gangs["ns/v"].first_placed_at == 0.0
    _commit(
        cluster,
        Placement(evictions=_evict(["ns/v-0-r1", "ns/v-1-r1"], "ns/v", action="preempt")),
    )
    names = sorted(cluster.pods[u].pod.name for u in cluster.gangs["ns/v"].pod_uids)
    assert names == ["v-0", "v-0-r1", "v-0-r2", "v-1", "v-1-r1", "v-1-r2"]
    assert cluster.gangs["ns/v"].restarts == 2


def test_shrink_brings_back_only_the_evicted_extra_pods() -> None:
    node = Node("n1", Resources({GPU: 4, "cpu": 16000, "pods": 20}))
    cluster = SimulatedCluster([node], [Queue("a")])
    pods = [
        Pod(**{**_fields(_pod(f"e-{i}", "e", "a", gpus=1, node="n1")), "gpu_grant": ((i, 1000),)})
        for i in range(3)
    ]
    cluster.add_pods(pods, [Gang("ns", "e", min_member=2, queue="a")], duration=None)
    _commit(
        cluster, Placement(evictions=_evict(["ns/e-2"], "ns/e", action="shrink", for_gang="ns/x"))
    )
    record = cluster.gangs["ns/e"]
    assert record.restarts == 0 and record.placed_at == 0.0 and record.last_reason is None
    pending = [cluster.pods[u].pod for u in record.pod_uids if cluster.pods[u].pod.pending]
    assert [p.name for p in pending] == ["e-2-r1"]
    running = [p for p in cluster.active_pods() if p.bound]
    assert sorted(p.name for p in running) == ["e-0", "e-1"]


def test_a_pod_evicted_and_placed_elsewhere_is_replaced_on_its_new_node() -> None:
    """Consolidation: the placement evicts ns/v-1 and assigns it to n2 in the same cycle."""
    cluster = _cluster(grace=20.0)
    move = PodAssignment("ns/v-1", "ns/v-1", "ns/v", "n2", _grant(0))
    w = tuple(PodAssignment(f"ns/w-{i}", f"ns/w-{i}", "ns/w", "n1", _grant(2)) for i in (0,))
    placement = Placement(
        assignments=(move, *w),
        outcomes={"ns/w": GangOutcome("ns/w", "b", True, w)},
        evictions=_evict(["ns/v-1"], "ns/v", action="consolidate"),
        waits_for={"ns/w": ("ns/v-1",)},
    )
    result = _commit(cluster, placement)
    # The moved pod's replacement is bound on n2 at once (nobody waits there).
    assert result.bound_gangs == ("ns/v",)
    replacement = cluster.pods["ns/v-1-r1"].pod
    assert replacement.node_name == "n2" and replacement.phase == PodPhase.RUNNING
    assert cluster.pods["ns/v-1"].replaced_by == "ns/v-1-r1"
    # ns/w waits for the old pod to terminate; it stays held meanwhile.
    assert cluster.pods["ns/w-0"].pod.nominated
    cluster.advance(20.0)
    assert cluster.pods["ns/w-0"].pod.phase == PodPhase.RUNNING
    assert cluster.pods["ns/v-1"].pod.phase == PodPhase.FAILED
    # No second replacement when the old pod leaves.
    assert [u for u in cluster.gangs["ns/v"].pod_uids if u.startswith("ns/v-1-r")] == ["ns/v-1-r1"]
    # Gang ns/v kept a running pod all along: not a restart.
    assert cluster.gangs["ns/v"].restarts == 0


def test_a_nomination_waiting_for_a_pod_that_is_not_evicted_is_refused() -> None:
    cluster = _cluster(grace=30.0)
    placement = Placement(
        assignments=_reclaim_placement().assignments,
        outcomes=_reclaim_placement().outcomes,
        evictions=_evict(["ns/v-0"], "ns/v"),
        waits_for={"ns/w": ("ns/v-0", "ns/v-1")},  # ns/v-1 keeps running
    )
    result = _commit(cluster, placement)
    assert result.failed_gangs == ("ns/w",)
    assert not cluster.nominations
    assert all(cluster.pods[f"ns/w-{i}"].pod.pending for i in (0, 1))
    record = cluster.gangs["ns/w"]
    assert record.last_reason is not None and "not being evicted" in record.last_reason[1]


def test_evicting_a_pod_that_is_gone_is_ignored() -> None:
    cluster = _cluster()
    _commit(cluster, Placement(evictions=_evict(["ns/v-0", "ns/v-1"], "ns/v")))
    count = len(cluster.evictions)
    _commit(cluster, Placement(evictions=_evict(["ns/v-0", "ns/nope"], "ns/v")))
    assert len(cluster.evictions) == count == 2


def test_extra_pods_without_an_outcome_are_bound() -> None:
    node = Node("n1", Resources({GPU: 4, "cpu": 16000, "pods": 20}))
    cluster = SimulatedCluster([node], [Queue("a")])
    pods = [_pod(f"e-{i}", "e", "a", gpus=1) for i in range(3)]
    cluster.add_pods(pods, [Gang("ns", "e", min_member=2, queue="a")])
    extra = PodAssignment("ns/e-2", "ns/e-2", "ns/e", "n1", ((2, 1000),))
    result = _commit(cluster, Placement(assignments=(extra,)))
    assert result.bound_pods == 1
    assert cluster.pods["ns/e-2"].pod.node_name == "n1"


def test_bound_pods_start_when_they_are_bound() -> None:
    cluster = _cluster()
    cluster.advance(42.0)
    _commit(cluster, _reclaim_placement(waits=False))
    assert cluster.pods["ns/w-0"].pod.start_time == 42.0
    assert cluster.pods["ns/w-0"].pod.started == 42.0
