"""The strand guard: a share waits rather than strand an idle device once capacity is scarce
(``placement.holdStrandingShares``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from scheduler.cluster import GPU, Gang, GpuRequest, Node, Pod, PodPhase, Queue, Resources, Snapshot
from scheduler.cluster.node import GPU_MODEL_LABEL
from scheduler.config import ConfigError, parse_config
from scheduler.plugins.fragmentation import TaskType, WorkloadMix, scorer_for_snapshot
from scheduler.plugins.strand_guard import FIT_BELOW, HELD_CODE, fitting_share, hold_reason
from scheduler.solver import ClusterState, GangRequest, PodAssignment, place_gangs, solve
from scheduler.solver.held_shares import ShareHold
from scheduler.solver.placement import PlacementSettings

GUARDED = PlacementSettings(scoring="fragmentation", hold_stranding_shares=True)
UNGUARDED = PlacementSettings(scoring="fragmentation")


def _node(name: str, gpus: int = 8, model: str = "A") -> Node:
    return Node(
        name,
        Resources({"cpu": 128000, "memory": 512 << 30, GPU: gpus}),
        labels=((GPU_MODEL_LABEL, model),),
    )


def _pod(name: str, milli: int, node: str | None = None, device: int = 0, gang: str = "") -> Pod:
    """A pod taking ``milli`` of one device; running on ``node``'s ``device`` when given."""
    requests: dict[str, int] = {"cpu": 1000, "memory": 1 << 30}
    if milli >= 1000:
        requests[GPU] = 1
    return Pod(
        uid=name,
        namespace="ns",
        name=name,
        requests=Resources(requests),
        gpu=GpuRequest(1, milli),
        gang=f"ns/{gang or name}",
        queue="q",
        node_name=node,
        phase=PodPhase.RUNNING if node else PodPhase.PENDING,
        gpu_grant=((device, milli),) if node else (),
    )


def _cluster(used: dict[str, list[int]], pending: list[Pod]) -> Snapshot:
    """Nodes of 8 devices; ``used[node][d]`` thousandths run on device d (one pod each)."""
    running = [
        _pod(f"{n}-{d}", u, node=n, device=d)
        for n, row in used.items()
        for d, u in enumerate(row)
        if u
    ]
    pods = (*running, *pending)
    return Snapshot(
        nodes=tuple(_node(n) for n in used),
        pods=pods,
        gangs=tuple(
            Gang("ns", g.split("/")[1], queue="q", min_member=n) for g, n in _sizes(pods).items()
        ),
        queues=(Queue("q"),),
    )


def _sizes(pods: tuple[Pod, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in pods:
        out[p.gang] = out.get(p.gang, 0) + 1
    return out


FULL = [1000] * 8


def test_hold_reason_only_for_a_share_alone_on_an_idle_device_when_room_is_scarce() -> None:
    scarce, plenty = (1500, 10_000), (2500, 10_000)  # 15 % and 25 % free
    reason = hold_reason(1, 810, 1000, 0.01, scarce, "A")
    assert reason is not None
    assert "190 thousandths" in reason and "15.0%" in reason and "holdStrandingShares" in reason
    assert hold_reason(1, 810, 1000, 0.01, plenty, "A") is None  # free room above 19 %
    assert hold_reason(1, 810, 1000, FIT_BELOW, scarce, "A") is None  # the rest is usable
    assert hold_reason(1, 810, 900, 0.01, scarce, "A") is None  # the device is in use already
    assert hold_reason(1, 1000, 1000, 0.0, scarce, "A") is None  # a whole device
    assert hold_reason(2, 810, 1000, 0.0, scarce, "A") is None  # several devices
    assert hold_reason(1, 810, 1000, 0.0, (0, 0), "A") is None  # no capacity known
    # The bar is what the pod would strand: a 500 share strands half a device.
    assert hold_reason(1, 500, 1000, 0.0, (4000, 10_000), None) is not None


def test_fitting_share_reads_the_mix_of_gpu_tasks_allowed_on_the_model() -> None:
    mix = WorkloadMix()
    mix.add(TaskType(1000, 1024, 1, 810), 6)
    mix.add(TaskType(1000, 1024, 1, 150), 1)
    mix.add(TaskType(1000, 1024, 2, 1000), 1)
    mix.add(TaskType(1000, 1024, 0, 0), 10)  # CPU-only tasks fit no device: not counted
    mix.add(TaskType(1000, 1024, 1, 100, ("B",)), 2)  # only on model B
    arrays = mix.arrays(["A", "B"])
    assert fitting_share(arrays, 0, 190) == pytest.approx(1 / 8)
    assert fitting_share(arrays, 1, 190) == pytest.approx(3 / 10)
    assert fitting_share(arrays, 0, 810) == pytest.approx(7 / 8)
    assert fitting_share(WorkloadMix().arrays(["A"]), 0, 190) == 1.0  # nothing known


def test_room_follows_what_is_placed_and_released() -> None:
    snap = _cluster({"a": [1000, 500, 0, 0, 0, 0, 0, 0]}, [_pod("p", 300)])
    state = ClusterState.from_snapshot(snap)
    assert state.gpu_room() == (6500, 8000) == state.gpu_room(("A",))
    assert state.gpu_room(("B",)) == (0, 0)
    state.apply(PodAssignment("p", "ns/p", "ns/p", "a", ((2, 300),)))
    assert state.gpu_room() == (6200, 8000)
    state.release("p")
    state.release("a-1")  # a bound pod
    assert state.gpu_room() == (7000, 8000)
    assert np.array_equal(sum(state.nodes["a"].gpu_free), 7000)


def _outcome(snap: Snapshot, settings: PlacementSettings, gang: str) -> tuple[bool, str, str]:
    o = solve(snap, settings).outcomes[gang]
    return o.placed, o.reason_code, o.reason


def test_a_share_waits_beside_an_idle_device_when_capacity_is_scarce() -> None:
    """22 whole GPUs run, 2 devices idle (8 % free): an 810 share would leave 190 that no
    pod of the mix fits. Held with a reason that names the rule; placed without the rule."""
    used = {"a": [1000] * 6 + [0, 0], "b": FULL, "c": FULL}
    snap = _cluster(used, [_pod("share", 810)])
    placed, code, message = _outcome(snap, GUARDED, "ns/share")
    assert not placed and code == HELD_CODE
    assert "190 thousandths" in message and "holdStrandingShares" in message
    assert _outcome(snap, UNGUARDED, "ns/share")[0]


def test_the_greedy_pass_holds_on_its_own() -> None:
    """The per-pod replay runs only the greedy (``place_gangs``): it asks the scorer itself."""
    used = {"a": [1000] * 6 + [0, 0], "b": FULL, "c": FULL}
    share = _pod("share", 810)
    snap = _cluster(used, [share])
    scorer = scorer_for_snapshot(snap)
    gangs = [GangRequest("ns/share", "q", required=(share,))]
    result = place_gangs(ClusterState.from_snapshot(snap), gangs, scorer)
    assert result.placed  # the rule is off
    scorer.hold_stranding = True
    result = place_gangs(ClusterState.from_snapshot(snap), gangs, scorer)
    assert not result.placed and result.failed["ns/share"][0] == HELD_CODE


def test_a_share_still_goes_to_a_device_it_fills_or_while_room_is_plentiful() -> None:
    # A device with 850 free: the share leaves 40 there instead of opening an idle one.
    used = {"a": [1000] * 5 + [150, 0, 0], "b": FULL, "c": FULL}
    result = solve(_cluster(used, [_pod("share", 810)]), GUARDED)
    (a,) = result.assignments
    assert (a.node, a.gpu_grant) == ("a", ((5, 810),))
    # Half the cluster idle: opening a device is worth it.
    used = {"a": [1000] * 4 + [0] * 4, "b": FULL, "c": [0] * 8}
    assert _outcome(_cluster(used, [_pod("share", 810)]), GUARDED, "ns/share")[0]


def test_a_gang_is_held_whole() -> None:
    """Two 810 shares in one gang: one fits a partly used device, the other would open an
    idle one. Neither is placed (never half a gang)."""
    used = {"a": [1000] * 5 + [150, 0, 0], "b": FULL, "c": FULL}
    pods = [_pod("g-0", 810, gang="g"), _pod("g-1", 810, gang="g")]
    result = solve(_cluster(used, pods), GUARDED)
    assert result.assignments == ()
    assert result.outcomes["ns/g"].reason_code == HELD_CODE
    assert len(solve(_cluster(used, pods), UNGUARDED).assignments) == 2


def test_the_answer_is_checked_against_the_cycle_start() -> None:
    """What the CP-SAT stage chose is checked too: a share alone on a device idle at the start
    is held; one that shares the device with another pod of the answer is not."""
    used = {"a": [1000] * 6 + [0, 0], "b": FULL, "c": FULL}
    snap = _cluster(used, [_pod("s1", 810), _pod("s2", 150)])
    scorer = scorer_for_snapshot(snap)
    scorer.hold_stranding = True
    hold = ShareHold.at_start(ClusterState.from_snapshot(snap), scorer)
    alone = [PodAssignment("s1", "ns/s1", "ns/s1", "a", ((6, 810),))]
    held = hold.held(snap, alone)
    assert set(held) == {"ns/s1"} and held["ns/s1"][0] == HELD_CODE
    paired = [*alone, PodAssignment("s2", "ns/s2", "ns/s2", "a", ((6, 150),))]
    assert hold.held(snap, paired) == {}
    scorer.hold_stranding = False
    assert hold.held(snap, alone) == {}


def test_config_needs_fragmentation_scoring() -> None:
    on = {"scoring": "fragmentation", "holdStrandingShares": True}
    assert parse_config({"placement": on}).placement.hold_stranding_shares
    assert not parse_config(None).placement.hold_stranding_shares
    with pytest.raises(ConfigError, match=r"placement\.holdStrandingShares"):
        parse_config({"placement": {"holdStrandingShares": True}})


def test_nothing_is_evicted_for_a_held_share() -> None:
    """A higher-priority share held back waits for capacity: taking back must not make room
    for it by preempting the running pods (it would then strand the device it freed)."""
    used = {"a": [1000] * 6 + [0, 0], "b": FULL, "c": FULL}
    snap = _cluster(used, [_pod("share", 810)])
    gangs = tuple(
        Gang("ns", g.name, queue="q", priority=100 if g.name == "share" else 0) for g in snap.gangs
    )
    snap = Snapshot(nodes=snap.nodes, pods=snap.pods, gangs=gangs, queues=snap.queues)
    result = solve(snap, GUARDED)
    assert result.evictions == () and result.assignments == ()
    assert result.outcomes["ns/share"].reason_code == HELD_CODE


def _aged(snap: Snapshot, now: float, created: dict[str, float]) -> Snapshot:
    """``snap`` at time ``now``, with the given pods created at the given times."""
    pods = tuple(
        replace(p, creation_time=created[p.uid]) if p.uid in created else p for p in snap.pods
    )
    return replace(snap, pods=pods, now=now)


def test_a_share_is_held_at_most_the_max_wait() -> None:
    """A share created more than ``hold_stranding_max_wait`` ago is placed like any other
    pod; a younger one is held, and its reason says when the wait ends. 0: no limit."""
    used = {"a": [1000] * 6 + [0, 0], "b": FULL, "c": FULL}
    snap = _cluster(used, [_pod("young", 810), _pod("old", 810)])
    snap = _aged(snap, 10_000.0, {"young": 9_500.0, "old": 9_000.0})
    short = replace(GUARDED, hold_stranding_max_wait=600.0)
    result = solve(snap, short)
    assert {a.pod_uid for a in result.assignments} == {"old"}
    young = result.outcomes["ns/young"]
    assert young.reason_code == HELD_CODE
    assert "600s after it was created" in young.reason and "holdStrandingMaxWait" in young.reason
    unlimited = solve(snap, replace(GUARDED, hold_stranding_max_wait=0.0))
    assert unlimited.assignments == ()
    assert "holdStrandingMaxWait" not in unlimited.outcomes["ns/old"].reason


def test_the_answer_check_lets_an_old_share_through() -> None:
    used = {"a": [1000] * 6 + [0, 0], "b": FULL, "c": FULL}
    snap = _aged(_cluster(used, [_pod("s1", 810)]), 10_000.0, {"s1": 1_000.0})
    scorer = scorer_for_snapshot(snap)
    scorer.hold_stranding = True
    hold = ShareHold.at_start(ClusterState.from_snapshot(snap), scorer)
    alone = [PodAssignment("s1", "ns/s1", "ns/s1", "a", ((6, 810),))]
    assert set(hold.held(snap, alone)) == {"ns/s1"}  # no limit set yet
    scorer.limit_holds(snap.now, 900.0)
    assert hold.held(snap, alone) == {}
    scorer.limit_holds(snap.now, 0.0)
    assert set(hold.held(snap, alone)) == {"ns/s1"}


def test_config_max_wait() -> None:
    on = {"scoring": "fragmentation", "holdStrandingShares": True}
    assert parse_config(None).placement.hold_stranding_max_wait == 900.0
    wait = parse_config({"placement": {**on, "holdStrandingMaxWait": "1h"}})
    assert wait.placement.hold_stranding_max_wait == 3600.0
    assert (
        parse_config(
            {"placement": {**on, "holdStrandingMaxWait": 0}}
        ).placement.hold_stranding_max_wait
        == 0.0
    )
    with pytest.raises(ConfigError, match=r"placement\.holdStrandingMaxWait"):
        parse_config({"placement": {**on, "holdStrandingMaxWait": "-1m"}})


def test_the_greedy_pass_lets_an_old_share_through() -> None:
    used = {"a": [1000] * 6 + [0, 0], "b": FULL, "c": FULL}
    snap = _aged(_cluster(used, [_pod("share", 810)]), 10_000.0, {"share": 1_000.0})
    (share,) = (p for p in snap.pods if p.uid == "share")
    scorer = scorer_for_snapshot(snap)
    scorer.hold_stranding = True
    gangs = [GangRequest("ns/share", "q", required=(share,))]
    assert not place_gangs(ClusterState.from_snapshot(snap), gangs, scorer).placed
    scorer.limit_holds(snap.now, 900.0)
    assert place_gangs(ClusterState.from_snapshot(snap), gangs, scorer).placed
