"""Taking back for gangs of whole-node pods: the victims chosen must be able to free a whole
node, not just the cheapest devices (found on the 5,000-node benchmark, where a 4 x 8-GPU
gang got no plan on a cluster with a thousand nodes that could be freed whole)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.bench.synthetic import make_gang, make_node, make_pod, make_queue
from scheduler.cluster import Gang, Pod
from scheduler.solver import PlacementSettings, takeback_greedy, takeback_model
from tests.unit.test_takeback import BOTH, NOW, evicted_gangs, placed, run, running, snap


def _share(name: str, node: str, device: int, started: float) -> tuple[Gang, list[Pod]]:
    """A running one-pod gang holding half of one device."""
    gang = Gang("default", name, min_member=1, queue="a", priority=10, creation_time=started)
    pod = make_pod(
        f"{name}-0",
        gang=name,
        queue="a",
        fraction=0.5,
        priority=10,
        node=node,
        grant=((device, 500),),
        created=started,
    )
    return gang, [replace(pod, start_time=started)]


@BOTH
def test_a_device_shared_by_victims_counts_as_freed(settings: PlacementSettings) -> None:
    # n0: seven devices held whole, the eighth half used by a share. Both gangs may be
    # preempted; the pending pod needs the whole node. The greedy once counted only the
    # devices victims held whole (seven), judged the node out of reach and gave no plan.
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=16)]
    big = running("big", "a", [("n0", tuple(range(7)))], priority=10, started=100)
    share = _share("share", "n0", 7, 100)
    want = make_gang("want", 1, queue="a", gpus=8, priority=75, created=NOW - 1)
    p = run(snap([make_node("n0")], queues, big, share, want), settings)
    assert set(evicted_gangs(p)) == {"big", "share"}
    assert "want" in placed(p)


@BOTH
def test_nodes_that_cannot_be_freed_whole_do_not_crowd_out_those_that_can(
    settings: PlacementSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # p0..p5: four devices held by a cheap victim, four by work that may not be taken. f0:
    # two dearer victims of four devices each. Per GPU freed the partial nodes are cheapest,
    # but none of them can ever hold the 8-GPU pod. With the greedy's units and the model's
    # nodes capped below the partial nodes' count (as 256 of each are among a thousand such
    # nodes at 5,000 nodes), only leaving them out finds the plan.
    monkeypatch.setattr(takeback_greedy, "MAX_GREEDY_UNITS", 4)
    monkeypatch.setattr(takeback_model, "MAX_MODEL_NODES", 4)
    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=64)]
    groups = []
    for i in range(6):
        node = f"p{i}"
        groups.append(running(f"cheap{i}", "a", [(node, (0, 1, 2, 3))], priority=10, started=100))
        groups.append(running(f"kept{i}", "a", [(node, (4, 5, 6, 7))], priority=100, started=100))
    groups.append(running("dear0", "a", [("f0", (0, 1, 2, 3))], priority=40, started=100))
    groups.append(running("dear1", "a", [("f0", (4, 5, 6, 7))], priority=40, started=100))
    want = make_gang("want", 1, queue="a", gpus=8, priority=75, created=NOW - 1)
    nodes = [make_node(f"p{i}") for i in range(6)] + [make_node("f0")]
    p = run(snap(nodes, queues, *groups, want), settings)
    assert set(evicted_gangs(p)) == {"dear0", "dear1"}
    assert "want" in placed(p)


def test_a_gang_with_a_pod_without_devices_rules_no_node_out() -> None:
    # The partial node p0 cannot take the 8-GPU pod, but the gang's CPU-only pod may go
    # there: only a gang whose every pod needs whole devices leaves such nodes out.
    from scheduler.fairness import compute_fair_shares
    from scheduler.solver.problem import build_problem
    from scheduler.solver.state import ClusterState
    from scheduler.solver.takeback_model import _cannot_host

    queues = [make_queue("root"), make_queue("a", "root", gpu_quota=64)]
    cheap = running("cheap", "a", [("p0", (0, 1, 2, 3))], priority=10, started=100)
    kept = running("kept", "a", [("p0", (4, 5, 6, 7))], priority=100, started=100)
    gpu_gang, gpu_pods = make_gang("gpu", 1, queue="a", gpus=8, priority=75, created=NOW - 2)
    cpu_gang, cpu_pods = make_gang("cpu", 1, queue="a", gpus=0, priority=75, created=NOW - 1)
    mixed = (replace(cpu_gang, min_member=2), [*cpu_pods, replace(gpu_pods[0], gang=cpu_gang.key)])
    hosts = {"p0": (1, 1, 4)}  # one candidate, holding four devices
    for group, ruled_out in (((gpu_gang, gpu_pods), {"p0"}), (mixed, set())):
        s = snap([make_node("p0")], queues, cheap, kept, group)
        g = build_problem(s, compute_fair_shares(s)).order[0]
        evicting, either = _cannot_host(g, ClusterState.from_snapshot(s), hosts, {})
        assert evicting == either == ruled_out
