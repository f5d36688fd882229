"""A second greedy answer for the first stage, guided by the relaxation.

The greedy pass admits gangs in fairness order and never revisits a choice: when capacity
runs short, early gangs fragment nodes that later, larger gangs of queues still below their
fair share needed. The relaxation (:mod:`scheduler.solver.bound`) says *which* gangs are
worth admitting when capacity is seen as a whole. This pass places exactly those first -
largest pods first, so gangs that need whole nodes get them before small pods split them -
then backfills the rest of the stage in admission order. It is a heuristic: R ignores how
pods share single nodes, so some chosen gangs may not fit; the caller keeps whichever of
the two answers is worth more and hands it to CP-SAT as the hint.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from scheduler.cluster.pod import Pod
from scheduler.cluster.resources import CPU
from scheduler.fairness import FairShareReport
from scheduler.framework.filters import node_rules_allow
from scheduler.framework.scoring import NodeScorer
from scheduler.solver.cpsat import ModelGang, Scale
from scheduler.solver.greedy import GangRequest, GreedyResult, place_gangs, pod_size
from scheduler.solver.placement import PodAssignment
from scheduler.solver.quality import NodeQuality
from scheduler.solver.queues import QueueBook
from scheduler.solver.rows import admission_value
from scheduler.solver.state import ClusterState

__all__ = ["guided_order", "place_guided", "quality_change", "stage_value"]


def _flexibility(state: ClusterState) -> Callable[[Pod], int]:
    """Free GPU thousandths (CPU millicores for CPU pods) on nodes that accept a pod."""
    room: Counter[int] = Counter()
    cpu: Counter[int] = Counter()
    for key, members in state.classes.items():
        room[key[0]] += len(members) * sum(max(0, f) for f in key[2])
        cpu[key[0]] += len(members) * max(0, dict(key[1]).get(CPU, 0))
    cache: dict[object, int] = {}

    def flex(pod: Pod) -> int:
        rules = (pod.tolerations, pod.node_selector, pod.affinity, pod.gpu is None)
        found = cache.get(rules)
        if found is None:
            found = cache[rules] = sum(
                (cpu if pod.gpu is None else room)[sid]
                for sid, node in enumerate(state.static_nodes)
                if node_rules_allow(pod, node)
            )
        return found

    return flex


def guided_order(
    state: ClusterState, gangs: Sequence[GangRequest], chosen: set[str], fixed: set[str]
) -> list[GangRequest]:
    """Fixed and chosen gangs, largest pod first, then the pods with the fewest places to go
    (so pods that may go anywhere do not take the room of pods that may not), then more pods
    (admission order breaks ties); followed by every other gang in admission order."""
    flex = _flexibility(state)
    first = [g for g in gangs if g.key in chosen or g.key in fixed]
    rank = {g.key: i for i, g in enumerate(gangs)}

    def key(g: GangRequest) -> tuple[object, ...]:
        big = max(g.required, key=pod_size)
        return (tuple(-v for v in pod_size(big)), flex(big), -len(g.required), rank[g.key])

    first.sort(key=key)
    rest = [g for g in gangs if g.key not in chosen and g.key not in fixed]
    return first + rest


def place_guided(
    state: ClusterState,
    gangs: Sequence[GangRequest],
    chosen: set[str],
    fixed: set[str],
    scorer: NodeScorer,
    book: QueueBook,
    *,
    spread_devices: bool,
    cycle: int | None = None,
) -> GreedyResult:
    """Place ``gangs`` (required pods only) in :func:`guided_order` onto ``state``."""
    return place_gangs(
        state,
        guided_order(state, gangs, chosen, fixed),
        scorer,
        book=book,
        extras=False,
        spread_devices=spread_devices,
        cycle=cycle,
    )


def stage_value(
    state: ClusterState,
    top: Sequence[GangRequest],
    model_gangs: Sequence[ModelGang],
    report: FairShareReport,
    scale: Scale,
    placed: Mapping[str, Sequence[PodAssignment]],
    *,
    quality: NodeQuality | None,
    held: Sequence[PodAssignment] = (),
) -> int:
    """The first stage's value (:class:`~scheduler.solver.cpsat.Scale`) of ``placed``: the
    required pods of ``top`` gangs measured on the real nodes of ``state``. ``held`` are the
    assignments ``state`` holds now (taken off again for the measure)."""
    return scale.value(
        admission_value(model_gangs, {g.key for g in top if g.key in placed}, report, {}),
        quality_change(state, top, placed, quality, held) if quality is not None else 0,
    )


def quality_change(
    state: ClusterState,
    top: Sequence[GangRequest],
    placed: Mapping[str, Sequence[PodAssignment]],
    quality: NodeQuality,
    held: Sequence[PodAssignment] = (),
) -> int:
    """Change of ``quality``'s cost over the real nodes of ``state`` that the required pods
    of ``top`` gangs in ``placed`` land on, from the state without ``held`` (what
    ``state`` holds now) to that state plus them."""
    required = {g.key: len(g.required) for g in top}
    by_node: dict[str, list[PodAssignment]] = {}
    for key, pods in placed.items():
        for a in list(pods)[: required.get(key, 0)]:
            by_node.setdefault(a.node, []).append(a)
    on_node: dict[str, list[PodAssignment]] = {}
    for a in held:
        if a.node in by_node:
            on_node.setdefault(a.node, []).append(a)
    change = 0
    devices_only = quality.devices_only  # then no CPU and memory to follow on GPU nodes
    for name, here in by_node.items():
        slot = state.nodes[name]
        states = []
        free, gpu = dict(slot.free), list(slot.gpu_free)
        follow = not (devices_only and gpu)
        for group, sign in ((on_node.get(name, ()), 1), (here, -1)):
            for a in group:
                if follow:
                    demand = state.demand(state.pods[a.pod_uid], name)
                    for r, v in demand.requests.items() if demand else ():
                        free[r] = free.get(r, 0) + sign * v
                for i, m in a.gpu_grant:
                    gpu[i] += sign * m
            states.append((dict(free) if follow else free, list(gpu)))
        before, after = quality.costs(slot.node, states)
        change += after - before
    return change
