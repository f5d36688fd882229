"""What a pod's node search must check besides its class (:func:`node_check`: topology rules
and ResourceClaims), and why a pod with such rules fits no node (:func:`why_not`), worded as
kube-scheduler words it. Used by the greedy pass (:mod:`.greedy`).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from scheduler.cluster.dracodes import DEVICES_UNAVAILABLE
from scheduler.cluster.pod import Pod
from scheduler.explain.codes import POD_AFFINITY, POD_ANTI_AFFINITY, TOPOLOGY_SPREAD
from scheduler.explain.topology import reason_code
from scheduler.framework.filters import FilterInput, first_failure, format_unavailable
from scheduler.plugins.podtopology import NodeCheck
from scheduler.solver.state import ClusterState

if TYPE_CHECKING:
    from scheduler.solver.greedy import ClassIndex

__all__ = ["DETAILED_WHY_NOT", "DRA_REASONS", "NO_FIT", "ROUGHLY", "node_check", "why_not"]

#: The code of a gang that found no room (the explainer words the capacity problem).
NO_FIT = "NoFit"


def node_check(state: ClusterState, pod: Pod) -> NodeCheck | None:
    """What must allow a node for ``pod`` besides the class-level rules: its topology rules
    (and running pods' anti-affinity), and whether its ResourceClaims can be allocated
    there; None when nothing must."""
    topology = state.topology().check(pod) if state.needs_topology(pod) else None
    if not state.needs_devices(pod):
        return topology
    devices = state.devices_check(pod)
    if topology is None:
        return NodeCheck(devices, _EACH_NODE)
    check = topology

    def both(node: str) -> str | None:
        return check(node) or devices(node)

    return NodeCheck(both, topology.keys | _EACH_NODE)


#: The "label" a devices check depends on: none a class keeps (devices differ node by node,
#: whatever the labels), so every member of a class is asked.
_EACH_NODE = frozenset({"\x00devices"})


#: The node-level reasons of the ResourceClaim check (see :mod:`scheduler.solver.dra_state`;
#: written out here so the greedy does not load the CEL library for clusters without claims).
DRA_REASONS = frozenset(
    {"cannot allocate all claims", "its ResourceClaims are not known to this cycle"}
)
#: Per greedy pass, gangs whose refusals are counted node by node (see :func:`why_not`).
DETAILED_WHY_NOT = 32
#: Past that many: some node has room, and the pod's topology rules refuse it.
ROUGHLY = "nodes with room are refused by its pod affinity, anti-affinity or spread rules"


def _rough_code(pod: Pod) -> str:
    if pod.spread:
        return TOPOLOGY_SPREAD
    return POD_AFFINITY if pod.pod_affinity and not pod.pod_anti_affinity else POD_ANTI_AFFINITY


def why_not(
    index: ClassIndex, pod: Pod, placed: int, total: int, *, detailed: bool = True
) -> tuple[str, str]:
    """(code, message) for a pod with topology rules that fits no node now: the filter chain
    over every node class, worded as kube-scheduler words it. The code names the topology
    rule that refused the most nodes (NoFit when none did: the explainer then words the
    capacity problem).

    Not ``detailed`` (past :data:`DETAILED_WHY_NOT` gangs in a pass): only whether some
    node with room exists - then the rules refused it (code from the pod's rules), else it
    is a capacity problem (NoFit) - without counting node by node."""
    state = index.state
    accept = node_check(state, pod)
    gang = f" (after {placed} of the gang's {total} pods were placed)" if total > 1 else ""
    if not detailed:
        # The pod's last search (just now, same state) says whether room was found.
        if index.refused_by_rules:
            if state.needs_devices(pod) and not pod.topology_rules:
                return DEVICES_UNAVAILABLE, f"pod {pod.key}: {_devices_detail(state)}{gang}"
            return _rough_code(pod), f"pod {pod.key}: {ROUGHLY}{gang}"
        return NO_FIT, f"pod {pod.key}: no node has room for it{gang}"
    # The node rules once per class (members share free state and the labels selectors
    # read), the topology rule per member (it reads labels a class may ignore); nodes
    # outside the classes (cordoned, NotReady) on their own.
    tally: Counter[str] = Counter()
    for members in state.classes.values():
        rep = state.nodes[next(iter(members))]
        reason = first_failure(pod, FilterInput(rep, state.demand_on(pod, rep)))
        if reason is not None:
            tally[reason] += len(members)
        elif accept is not None:
            for m in members:
                reason = accept(m)
                if reason is not None:
                    tally[reason] += 1
    for s in state.unplaceable():
        tally[first_failure(pod, FilterInput(s, state.demand_on(pod, s))) or "unknown"] += 1
    code = reason_code(tally) or NO_FIT
    message = f"pod {pod.key}: {format_unavailable(len(state.nodes), tally)}{gang}"
    if state.needs_devices(pod) and tally and max(tally, key=tally.__getitem__) in DRA_REASONS:
        code = DEVICES_UNAVAILABLE
        message += f"; {_devices_detail(state)}"
    return code, message


def _devices_detail(state: ClusterState) -> str:
    """The first refusal's detail: which claim and request, and what is missing."""
    detail = state.dra.last_detail if state.dra is not None else ""
    return detail or "no node with room can allocate its ResourceClaims"
