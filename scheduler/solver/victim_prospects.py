"""Whether taking back could help a pending gang at all, decided before any unit is built.

Building the eviction units (:func:`scheduler.solver.victims.build_units`) walks every running
pod and costs seconds on a cluster with tens of thousands of them; a cycle whose left-out
gangs cannot take anything (one queue, one priority, a full cluster) paid that for nothing.
These checks are *necessary* conditions only: when one says "no", no plan of the take-back
model exists; when it says "maybe", the model decides as before.

- Preemption needs a running preemptible gang of the same queue with a lower priority;
  reclaim needs a queue :func:`~scheduler.solver.victims.queue_rule` allows reclaiming from
  that holds running preemptible work (min runtimes are not looked at: that only makes the
  answer "maybe" more often).
- Consolidation moves pods and frees nothing: the gang fits after moves only if the free
  capacity of all placeable nodes together covers what it asks.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.resources import CPU, GPU, MEMORY
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import FairShareReport
from scheduler.solver.greedy import GangRequest
from scheduler.solver.state import ClusterState
from scheduler.solver.victims import queue_rule

__all__ = ["free_total", "least_need", "lowest_running_priority", "may_evict_for", "room_anywhere"]


def lowest_running_priority(snapshot: Snapshot) -> dict[str, int]:
    """Queue -> the lowest priority among its running preemptible managed gangs (queues
    without any are absent): the candidates :func:`~.victims.build_units` would make."""
    gangs = snapshot.gang_by_key
    nodes = snapshot.node_by_name
    lowest: dict[str, int] = {}
    seen: set[str] = set()
    for p in snapshot.pods:
        if p.gang in seen or p.node_name not in nodes or not p.managed or not p.active:
            continue
        if p.deleting or p.nominated:
            continue
        seen.add(p.gang)
        gang = gangs.get(p.gang)
        if gang is None or not gang.preemptible:
            continue
        known = lowest.get(gang.queue)
        if known is None or gang.priority < known:
            lowest[gang.queue] = gang.priority
    return lowest


def may_evict_for(
    g: GangRequest,
    lowest: Mapping[str, int],
    snapshot: Snapshot,
    report: FairShareReport,
    charged: Mapping[str, Mapping[str, int]],
) -> bool:
    """False when no running unit may be preempted or reclaimed for ``g``."""
    tree = snapshot.queue_tree
    for queue, priority in lowest.items():
        rule = queue_rule(g, queue, tree, report, charged)
        if rule == "reclaim" or (rule == "preempt" and priority < g.priority):
            return True
    return False


def least_need(g: GangRequest) -> tuple[int, int, int]:
    """GPU thousandths, CPU milli and memory bytes the gang's required pods need at the
    least (a share sized by GPU memory counts 0: how much it is depends on the node)."""
    gpu = cpu = memory = 0
    for p in g.required:
        requests = p.requests
        cpu += requests.get(CPU)
        memory += requests.get(MEMORY)
        if p.gpu is not None:
            gpu += p.gpu.total_milli if p.gpu.memory_mib is None else 0
        else:
            gpu += requests.get(GPU) * GPU_MILLI
    return gpu, cpu, memory


def free_total(state: ClusterState) -> tuple[int, int, int]:
    """Free GPU thousandths, CPU milli and memory bytes of all placeable nodes together."""
    gpu = cpu = memory = 0
    for slot in state.nodes.values():
        if not slot.placeable:
            continue
        gpu += sum(slot.gpu_free)
        free = slot.free
        cpu += free.get(CPU, 0)
        memory += free.get(MEMORY, 0)
    return gpu, cpu, memory


def room_anywhere(total: tuple[int, int, int], g: GangRequest) -> bool:
    """False when ``total`` (:func:`free_total`) is less than the gang needs
    (:func:`least_need`): then no moving of pods can make the gang fit."""
    return all(have >= need for have, need in zip(total, least_need(g), strict=True))
