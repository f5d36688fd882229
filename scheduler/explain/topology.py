"""Why a gang whose pods have pod (anti-)affinity or spread rules fits no node, node by node.

The capacity reasoning of :mod:`.reasons` works on node classes and cannot see which pods run
in which domain; for gangs it finds room for, this module places the gang's pods one after
another on the cluster as it is after the cycle's assignments, asking the filter chain of
:mod:`scheduler.framework.filters` per node (the topology rule through
:class:`~scheduler.plugins.podtopology.PodTopology`, as the greedy pass does). The first pod
that no node accepts gets kube-scheduler's per-node tally:

    pod ns/web-3: 0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import pod_queue_usage
from scheduler.cluster.snapshot import Snapshot, bound_usage
from scheduler.explain.codes import POD_AFFINITY, POD_ANTI_AFFINITY, TOPOLOGY_SPREAD
from scheduler.framework.filters import FilterInput, first_failure, format_unavailable
from scheduler.framework.scoring import pod_demand
from scheduler.plugins.podtopology import (
    AFFINITY,
    ANTI_AFFINITY,
    EXISTING_ANTI_AFFINITY,
    SPREAD,
    SPREAD_LABEL,
    PodTopology,
)

if TYPE_CHECKING:
    from scheduler.solver.placement import PodAssignment
    from scheduler.solver.state import NodeSlot

__all__ = ["REASON_CODES", "TopologyExplainer", "reason_code"]

#: The reason code of each topology refusal.
REASON_CODES: Mapping[str, str] = {
    AFFINITY: POD_AFFINITY,
    ANTI_AFFINITY: POD_ANTI_AFFINITY,
    EXISTING_ANTI_AFFINITY: POD_ANTI_AFFINITY,
    SPREAD: TOPOLOGY_SPREAD,
    SPREAD_LABEL: TOPOLOGY_SPREAD,
}


def _size(pod: Pod) -> tuple[int, int, int]:
    use = pod_queue_usage(pod)
    return (use["gpu"], use["cpu"], use["memory"])


def reason_code(tally: Mapping[str, int]) -> str | None:
    """The code of the topology refusal that refused the most nodes (None: none did)."""
    ruled = [(n, r) for r, n in tally.items() if r in REASON_CODES]
    return REASON_CODES[max(ruled)[1]] if ruled else None


class TopologyExplainer:
    """The cluster after a cycle's assignments, per node, for :meth:`problem`."""

    def __init__(
        self, snapshot: Snapshot, assignments: Sequence[PodAssignment], freed: Collection[str]
    ) -> None:
        # Imported here: scheduler.solver imports this module (its greedy pass words
        # topology refusals with reason_code).
        from scheduler.solver.state import free_slots

        pods = snapshot.pod_by_uid
        usage = bound_usage(snapshot)
        #: Each node's free state, as the solver's ClusterState starts from it.
        self.views: dict[str, NodeSlot] = {s.name: s for s in free_slots(snapshot.nodes, usage)}
        located = [(p, p.node_name or "") for p in usage.bound if p.uid not in freed]
        for uid in freed:
            victim = pods.get(uid)
            if victim is not None and victim.node_name in self.views and victim.active:
                self._give(victim, victim.node_name or "", victim.gpu_grant, -1)
        for a in assignments:
            pod = pods.get(a.pod_uid)
            if pod is not None and a.node in self.views:
                self._give(pod, a.node, a.gpu_grant, 1)
                located.append((pod, a.node))
        self.topology = PodTopology(snapshot.node_by_name, located)

    def _give(self, pod: Pod, node: str, grant: Sequence[tuple[int, int]], step: int) -> None:
        """Take (``step`` 1) or give back (-1) what ``pod`` holds on ``node``."""
        view = self.views[node]
        demand = pod_demand(pod, view.node)
        requests = demand.requests if demand is not None else pod.requests
        for k, v in requests.items():
            view.free[k] = view.free.get(k, 0) - step * v
        for i, milli in grant:
            if 0 <= i < len(view.gpu_free):
                view.gpu_free[i] = min(GPU_MILLI, view.gpu_free[i] - step * milli)

    def _devices(self, view: NodeSlot, count: int, milli: int) -> tuple[tuple[int, int], ...]:
        fitting = sorted((f, i) for i, f in enumerate(view.gpu_free) if f >= milli)
        return tuple((i, milli) for _, i in fitting[:count])

    def problem(self, pods: Sequence[Pod]) -> tuple[str, str] | None:
        """(code, message) when the gang's ``pods`` (largest first) cannot all be placed
        because of topology rules; None when they can, or when what stops them is not a
        topology rule (the capacity reasoning words that). The state is left as it was."""
        placed: list[tuple[Pod, str, tuple[tuple[int, int], ...]]] = []
        order = sorted(pods, key=_size, reverse=True)  # as the greedy pass places them
        try:
            for k, pod in enumerate(order):
                accept = self.topology.check(pod)
                inputs = [
                    (FilterInput(v, pod_demand(pod, v.node), accept), name)
                    for name, v in self.views.items()
                ]
                spot = next((n for fi, n in inputs if first_failure(pod, fi) is None), None)
                if spot is not None:
                    demand = pod_demand(pod, self.views[spot].node)
                    grant = (
                        self._devices(self.views[spot], demand.gpu_count, demand.gpu_milli)
                        if demand is not None and demand.gpu_count
                        else ()
                    )
                    self._give(pod, spot, grant, 1)
                    self.topology.add(pod, spot)
                    placed.append((pod, spot, grant))
                    continue
                tally = Counter(r for fi, _ in inputs if (r := first_failure(pod, fi)))
                code = reason_code(tally)
                if code is None:
                    return None
                message = f"pod {pod.key}: {format_unavailable(len(inputs), tally)}"
                if len(pods) > 1:
                    message += f" (after {k} of the gang's {len(pods)} pods were placed)"
                return code, message
            return None
        finally:
            for pod, node, grant in reversed(placed):
                self.topology.remove(pod.uid)
                self._give(pod, node, grant, -1)
