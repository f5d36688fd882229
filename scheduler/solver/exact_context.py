"""What every model of one exact search shares (:mod:`.cpsat_topology`): the nodes' labels,
the *fixed* pods - those on nodes in the state, which holds no model pod: the running ones
and the other gangs' pods as the greedy placed them - indexed by label, and each model pod's
candidate nodes (:meth:`ExactContext.candidates`): placeable, accepted by taints / node
selector / required node affinity, with room for the pod alone (every resource: pods count
and host ports are resources), carrying every key the pod's affinity and spread terms name,
and outside the domains the fixed pods' anti-affinity (both directions) closes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler.cluster.pod import Pod
from scheduler.cluster.podaffinity import LabelSelector
from scheduler.framework.filters import node_rules_allow
from scheduler.solver.state import ClusterState, pick_devices

__all__ = ["ExactContext", "located_pods"]


def located_pods(state: ClusterState) -> list[tuple[Pod, str]]:
    """The pods on nodes in ``state`` (bound and applied), as PodTopology follows them."""
    out = [(p, p.node_name or "") for p in state.bound.values() if p.node_name in state.nodes]
    out += [(state.pods[uid], a.node) for uid, a in state.placed.items()]
    return out


class ExactContext:
    """What every model of one call shares: node labels, the fixed pods (on nodes in
    ``state``, which holds no model pod) indexed by label, and candidates per pod."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.labels: dict[str, Mapping[str, str]] = {
            n: s.node.label_map for n, s in state.nodes.items()
        }
        self.located = located_pods(state)
        self._carrying: dict[tuple[str, str], list[tuple[Pod, str]]] = {}
        for pod, node in self.located:
            for kv in pod.labels:
                self._carrying.setdefault(kv, []).append((pod, node))
        #: (term, key, value) of the fixed pods' anti-affinity: the domains they guard
        self.guards = [
            (t, t.topology_key, value)
            for pod, node in self.located
            for t in pod.pod_anti_affinity
            if t.selector is not None
            and (value := self.labels[node].get(t.topology_key)) is not None
        ]
        self._allowed: dict[tuple[object, int], bool] = {}
        self._by_label: dict[tuple[str, str], list[str]] | None = None

    def scope(self, pod: Pod) -> Sequence[str]:
        """The nodes carrying every label of the pod's node selector (all nodes without
        one), in the state's order: where :meth:`candidates` looks."""
        if not pod.node_selector:
            return list(self.state.nodes)
        if self._by_label is None:
            self._by_label = {}
            for name, labels in self.labels.items():
                for kv in labels.items():
                    self._by_label.setdefault(kv, []).append(name)
        lists = [self._by_label.get(kv, []) for kv in pod.node_selector]
        shortest = min(lists, key=len)
        if len(lists) == 1:
            return shortest
        rest = [set(x) for x in lists if x is not shortest]
        return [n for n in shortest if all(n in r for r in rest)]

    def fixed(self, selector: LabelSelector | None) -> Sequence[tuple[Pod, str]]:
        """The fixed pods a rule with ``selector`` may select (by its anchor label)."""
        if selector is None:
            return ()
        anchor = selector.anchor
        return self.located if anchor is None else self._carrying.get(anchor, ())

    def candidates(self, pod: Pod) -> list[str]:
        """Nodes ``pod`` may take whatever the other model pods do: placeable, node rules,
        room for it alone, every key its affinity and spread name, and outside the domains
        the fixed pods' anti-affinity (either way) closes to it."""
        state = self.state
        labels_of = pod.label_map
        closed = {(k, v) for t, k, v in self.guards if t.matches(pod.namespace, labels_of)}
        for t in pod.pod_anti_affinity:
            for other, node in self.fixed(t.selector):
                value = self.labels[node].get(t.topology_key)
                if value is not None and t.matches(other.namespace, other.label_map):
                    closed.add((t.topology_key, value))
        keys = {t.topology_key for t in pod.pod_affinity} | {c.topology_key for c in pod.spread}
        sig = (pod.tolerations, pod.node_selector, pod.affinity)
        out = []
        for name in self.scope(pod):
            slot = state.nodes[name]
            if not slot.placeable:
                continue
            ok = self._allowed.get((sig, slot.static_id))
            if ok is None:
                ok = self._allowed[(sig, slot.static_id)] = node_rules_allow(pod, slot.node)
            if not ok:
                continue
            labels = self.labels[name]
            if any(k not in labels for k in keys):
                continue
            if closed and any((k, v) in closed for k, v in labels.items()):
                continue
            demand = state.demand_on(pod, slot)
            if demand is None or not slot.fits(demand):
                continue
            if demand.gpu_count and (
                pick_devices(slot.gpu_free, demand.gpu_count, demand.gpu_milli) is None
            ):
                continue
            out.append(name)
        return out
