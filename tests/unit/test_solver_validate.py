"""The validator catches each kind of broken placement (it must be able to say no)."""

from __future__ import annotations

from dataclasses import replace

from scheduler.bench.synthetic import make_gang, make_node, make_pod, make_queue
from scheduler.cluster import Gang, Pod, Snapshot, Taint
from scheduler.solver import PodAssignment, validate

QUEUES = (
    make_queue("root"),
    make_queue("a", "root", gpu_limit=2),
    make_queue("np", "root", gpu_quota=1),
)


def snap(*gangs: tuple[Gang, list[Pod]], running: tuple[Pod, ...] = ()) -> Snapshot:
    nodes = (
        make_node("n0", gpus=2, cpu=4, max_pods=3),
        make_node("tainted", gpus=2, taints=[Taint("x", "y")]),
        make_node("off", gpus=2, unschedulable=True),
    )
    pods = tuple(p for _, ps in gangs for p in ps) + running
    return Snapshot(nodes, pods, tuple(g for g, _ in gangs), QUEUES)


def assign(pod_name: str, node: str, grant: tuple[tuple[int, int], ...] = ()) -> PodAssignment:
    return PodAssignment(
        f"default/{pod_name}", f"default/{pod_name}", f"default/{pod_name[:-2]}", node, grant
    )


def test_valid_placement_has_no_violations() -> None:
    s = snap(make_gang("g", 2, queue="a", gpus=1))
    assert validate(s, [assign("g-0", "n0", ((0, 1000),)), assign("g-1", "n0", ((1, 1000),))]) == []


def test_partial_gang_is_caught() -> None:
    s = snap(make_gang("g", 2, queue="a", gpus=1))
    assert any("all or none" in v for v in validate(s, [assign("g-0", "n0", ((0, 1000),))]))


def test_device_and_capacity_overuse_are_caught() -> None:
    s = snap(make_gang("g", 3, queue="root-less", gpus=1, cpu=2))
    got = validate(
        s,
        [assign(f"g-{i}", "n0", ((0, 1000),)) for i in range(3)],
    )
    assert any("device 0 over capacity" in v for v in got)
    assert any("cpu over capacity" in v for v in got)
    assert any("nvidia.com/gpu over capacity" in v for v in got)


def test_wrong_grant_shape_is_caught() -> None:
    s = snap(make_gang("g", 1, queue="a", gpus=2))
    got = validate(s, [assign("g-0", "n0", ((0, 1000), (0, 1000)))])
    assert any("distinct devices" in v for v in got)
    s = snap(make_gang("f", 1, queue="a", fraction=0.5))
    assert any("needs 500" in v for v in validate(s, [assign("f-0", "n0", ((0, 1000),))]))


def test_taints_and_cordons_are_caught() -> None:
    s = snap(make_gang("g", 1, queue="a", gpus=1), make_gang("h", 1, queue="a", gpus=1))
    got = validate(s, [assign("g-0", "tainted", ((0, 1000),)), assign("h-0", "off", ((0, 1000),))])
    assert any("taints" in v for v in got)
    assert any("cordoned" in v for v in got)


def test_queue_limit_and_non_preemptible_quota_are_caught() -> None:
    s = snap(make_gang("g", 3, queue="a", gpus=1, cpu=0.5))
    got = validate(
        s,
        [
            assign("g-0", "n0", ((0, 1000),)),
            assign("g-1", "n0", ((1, 1000),)),
            assign("g-2", "tainted", ((0, 1000),)),
        ],
    )
    assert any("queue a: gpu limit exceeded" in v for v in got)
    s = snap(make_gang("p", 2, queue="np", gpus=1, priority=100, cpu=0.5))
    got = validate(s, [assign("p-0", "n0", ((0, 1000),)), assign("p-1", "n0", ((1, 1000),))])
    assert any("non-preemptible work over gpu quota" in v for v in got)


def test_bound_pod_and_double_placement_are_caught() -> None:
    running = make_pod("r", queue="a", gpus=1, node="n0", grant=((0, 1000),))
    s = snap(make_gang("g", 1, queue="a", gpus=1), running=(running,))
    got = validate(
        s,
        [
            PodAssignment(running.uid, running.key, running.gang, "n0", ((1, 1000),)),
            assign("g-0", "n0", ((1, 1000),)),
            assign("g-0", "n0", ((1, 1000),)),
        ],
    )
    assert any("not pending" in v for v in got)
    assert any("placed twice" in v for v in got)


def test_checked_prefix_is_counted_not_checked_again() -> None:
    s = snap(make_gang("g", 1, queue="a", gpus=1), make_gang("h", 1, queue="a", gpus=1))
    tainted = [assign("g-0", "tainted", ((0, 1000),))]
    # Its own rules were checked by an earlier call: not reported again...
    assert validate(s, tainted, checked=1) == []
    assert any("taints" in v for v in validate(s, tainted))
    # ...but what it takes still counts, and what follows is checked in full.
    both = [assign("g-0", "n0", ((0, 1000),)), assign("h-0", "n0", ((0, 1000),))]
    assert any("device 0 over capacity" in v for v in validate(s, both, checked=1))
    late = [assign("g-0", "n0", ((0, 1000),)), assign("h-0", "off", ((1, 1000),))]
    assert any("cordoned" in v for v in validate(s, late, checked=1))
    twice = [assign("g-0", "n0", ((0, 1000),)), assign("g-0", "n0", ((1, 1000),))]
    assert any("placed twice" in v for v in validate(s, twice, checked=1))


def test_extending_a_passed_placement_checks_what_the_extension_changes() -> None:
    """The second call of a cycle (``checked``: the first call's list, extended) reuses the
    first call's totals; it still sees what the new assignments break on nodes, devices,
    gangs and queues the first ones touched."""
    s = snap(make_gang("g", 1, queue="a", gpus=1), make_gang("h", 2, queue="a", gpus=1))
    first = [assign("g-0", "n0", ((0, 1000),))]
    assert validate(s, first) == []
    # h-0 on g-0's device, h-1 missing: device over capacity and a partial gang.
    got = validate(s, [*first, assign("h-0", "n0", ((0, 1000),))], checked=1)
    assert any("device 0 over capacity" in v for v in got)
    assert any("gang default/h: 1 pods placed" in v for v in got)
    # A pod of the first list placed again is caught too.
    assert any("placed twice" in v for v in validate(s, [*first, first[0]], checked=1))
    # Queue a's limit is 2 GPUs: three placed together exceed it.
    more = [assign("h-0", "n0", ((1, 1000),)), assign("h-1", "tainted", ((0, 1000),))]
    got = validate(s, [*first, *more], checked=1)
    assert any("queue a: gpu limit exceeded" in v for v in got)
    # The same answers as the full pass (copies of the first list: not the passed call's).
    copies = [replace(a) for a in first]
    assert got == validate(s, [*copies, *more], checked=1)


def test_a_solve_leaves_nothing_of_its_validation_behind() -> None:
    """What a call that passed remembers for the next (its totals hold every placed pod) is
    dropped when the solve is done, not kept alive into the next cycle."""
    import importlib

    from scheduler.solver import PlacementSettings, solve

    module = importlib.import_module("scheduler.solver.validate")
    s = snap(make_gang("g", 1, queue="a", gpus=1))
    assert validate(s, [assign("g-0", "n0", ((0, 1000),))]) == []
    assert module._last_passed is not None  # remembered between the calls of a cycle
    placement = solve(s, PlacementSettings(greedy_only=True))
    assert placement.assignments and not placement.violations
    assert module._last_passed is None
