"""Take-back victim selection by greedy: for one pending gang, release the cheapest allowed
units (:mod:`.victims`) until the gang fits, then give back those it does not need, trying
two orders (cheapest units cluster-wide, and node by node). Its :class:`Choice` is the hint
of the gang's CP-SAT model (:mod:`.takeback_model`) and the answer when that finds nothing
better or is not run; it is also what every take-back module passes around.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.resources import CPU
from scheduler.cluster.snapshot import Snapshot
from scheduler.solver.greedy import GangRequest, place_gangs
from scheduler.solver.placement import EvictAction
from scheduler.solver.state import ClusterState, NodeSlot
from scheduler.solver.victims import Unit, branch_pair

__all__ = [
    "MAX_GREEDY_TRIES",
    "MAX_GREEDY_UNITS",
    "Choice",
    "UnitIndex",
    "choice_cost",
    "greedy_choice",
]

#: Units the cheapest-first greedy releases at most before it gives up.
MAX_GREEDY_UNITS = 256

#: Greedy placement passes per gang while choosing victims (each is a full greedy pass).
MAX_GREEDY_TRIES = 24


@dataclass
class Choice:
    """Units one gang takes back: evicted (with the action) or moved."""

    evict: dict[int, EvictAction]  # unit id -> action
    move: set[int]
    #: GPU thousandths any plan must evict for the gang (see Placement.min_evicted_gpu_milli).
    floor: int = 0


def choice_cost(choice: Choice, cost: Sequence[int]) -> int:
    """What ``choice`` costs by the units' ``cost`` (see :func:`.takeback_model.unit_costs`)."""
    return sum(cost[u] for u in (*choice.evict, *choice.move))


class _Need:
    """A necessary condition for the gang to fit, kept up to date as units are released and
    given back: enough whole free GPUs (and CPU) on the nodes it accepts, and one node with
    enough for its largest pod."""

    def __init__(self, g: GangRequest, state: ClusterState, accepting: set[str]) -> None:
        counts = [p.gpu.count if p.gpu is not None and p.gpu.whole else 0 for p in g.required]
        self.devices, self.largest = sum(counts), max(counts, default=0)
        self.cpu = sum(p.requests[CPU] for p in g.required)
        self.state, self.accepting = state, accepting
        self.per_node: dict[str, tuple[int, int]] = {}
        self.total_devices = self.total_cpu = self.roomy = 0
        # One row per node class (its members have the same free state).
        for names in state.classes.values():
            members = names.keys() & accepting
            if members:
                row = self._row(state.nodes[next(iter(members))])
                for n in members:
                    self._count(row, 1)
                    self.per_node[n] = row

    @staticmethod
    def _row(slot: NodeSlot) -> tuple[int, int]:
        return sum(1 for f in slot.gpu_free if f >= GPU_MILLI), slot.free.get(CPU, 0)

    def _add(self, n: str) -> None:
        row = self._row(self.state.nodes[n])
        self._count(row, 1)
        self.per_node[n] = row

    def _count(self, row: tuple[int, int], sign: int) -> None:
        self.total_devices += sign * row[0]
        self.total_cpu += sign * row[1]
        self.roomy += sign * (row[0] >= self.largest)

    def changed(self, nodes: AbstractSet[str]) -> None:
        """Re-read the given nodes after pods were released or given back there."""
        for n in nodes & self.accepting:
            self._count(self.per_node.pop(n), -1)
            self._add(n)

    def possible(self) -> bool:
        return self.total_devices >= self.devices and self.total_cpu >= self.cpu and self.roomy > 0

    def reachable(self, units: Sequence[Unit]) -> bool:
        """Could it fit if every one of ``units`` were gone? (Devices that become whole: held
        whole by them, or shared and left free once their shares go.)"""
        freed: dict[str, dict[int, int]] = {}
        for u in units:
            for p in u.pods:
                if p.node_name in self.accepting and p.gpu_grant:
                    here = freed.setdefault(p.node_name, {})
                    for d, m in p.gpu_grant:
                        here[d] = here.get(d, 0) + m
        gained: Counter[str] = Counter()
        nodes = self.state.nodes
        for n, here in freed.items():
            free = nodes[n].gpu_free
            gained[n] = sum(
                1 for d, m in here.items() if d < len(free) and free[d] < GPU_MILLI <= free[d] + m
            )
        total = self.total_devices + sum(gained.values())
        best = max((self.per_node[n][0] + gained[n] for n in self.per_node), default=0)
        return total >= self.devices and best >= self.largest


class UnitIndex:
    """Per-node and per-cost views of a cycle's units, built once per take-back stage and
    shared by every gang: each gang may take most units of the cluster, and walking all of
    them for every gang was most of a gang's time."""

    def __init__(self, units: Sequence[Unit], cost: Sequence[int]) -> None:
        #: Unit ids by (cost, id): the cheapest-first order (the sort is stable and the ids
        #: come in order, so sorting by cost alone gives it without a key tuple per unit).
        self.by_cost = sorted(range(len(units)), key=cost.__getitem__)
        self.ids = frozenset(range(len(units)))
        self.cost = cost
        self._by_cost_on: dict[str, list[int]] = {}
        #: Per unit, (node, devices its pods hold there) for each node it runs on.
        self.places: list[tuple[tuple[str, int], ...]] = []
        #: Per node: its units (in id order), their total cost and the devices they hold.
        self.on_node: dict[str, list[int]] = {}
        self.total: dict[str, int] = {}
        self.freed: dict[str, int] = {}
        for u in units:
            c = cost[u.id]
            if len(u.pods) == 1:  # most units: one pod, on one node
                p = u.pods[0]
                places: tuple[tuple[str, int], ...] = ((p.node_name or "", len(p.gpu_grant)),)
            else:
                places = tuple(
                    (n, sum(len(p.gpu_grant) for p in u.pods if p.node_name == n)) for n in u.nodes
                )
            self.places.append(places)
            for n, dev in places:
                here = self.on_node.get(n)
                if here is None:
                    self.on_node[n] = [u.id]
                    self.total[n] = c
                    self.freed[n] = dev
                else:
                    here.append(u.id)
                    self.total[n] += c
                    self.freed[n] += dev

    def per_node(
        self, actions: Mapping[int, EvictAction], accepting: AbstractSet[str]
    ) -> dict[str, tuple[int, int, int]]:
        """Per node of ``accepting`` hosting a unit of ``actions``: how many, their total
        cost and the devices their pods hold there. Usually nearly every unit may be taken:
        then the cycle's totals minus the units that may not (a few), else the sums of those
        that may."""
        count: dict[str, int] = {}
        total: dict[str, int] = {}
        freed: dict[str, int] = {}
        places, cost = self.places, self.cost
        if 2 * len(actions) >= len(self.ids):
            for i in self.ids.difference(actions):
                c = cost[i]
                for n, dev in places[i]:
                    if n in accepting:
                        count[n] = count.get(n, 0) - 1
                        total[n] = total.get(n, 0) - c
                        freed[n] = freed.get(n, 0) - dev
            for n, here in self.on_node.items():
                if n in accepting:
                    count[n] = count.get(n, 0) + len(here)
                    total[n] = total.get(n, 0) + self.total[n]
                    freed[n] = freed.get(n, 0) + self.freed[n]
        else:
            for i in actions:
                c = cost[i]
                for n, dev in places[i]:
                    if n in accepting:
                        count[n] = count.get(n, 0) + 1
                        total[n] = total.get(n, 0) + c
                        freed[n] = freed.get(n, 0) + dev
        return {n: (k, total[n], freed[n]) for n, k in count.items() if k}

    def by_cost_on(self, n: str) -> list[int]:
        """Node ``n``'s units by (cost, id) (sorted once per cycle, when first asked)."""
        found = self._by_cost_on.get(n)
        if found is None:
            cost = self.cost
            found = self._by_cost_on[n] = sorted(self.on_node[n], key=cost.__getitem__)
        return found

    def cheapest_on(self, n: str, actions: Mapping[int, EvictAction]) -> int | None:
        """The least cost of a unit of ``actions`` on node ``n`` (None: there is none)."""
        for i in self.by_cost_on(n):
            if i in actions:
                return self.cost[i]
        return None


def _node_order(
    actions: Mapping[int, EvictAction],
    index: UnitIndex,
    cost: Sequence[int],
    state: ClusterState,
    per_node: Mapping[str, tuple[int, int, int]],
) -> list[int]:
    """Units in the order the greedy takes them: node by node, the nodes that free the most
    GPUs per unit of cost first, and on each node its cheapest units first. Taking the
    cheapest units cluster-wide would free a device here and a device there, and a gang of
    large pods needs whole nodes' worth of room. Only units of ``actions`` count, on the
    nodes in ``accepting``."""
    keys: list[tuple[float, str]] = []
    nodes = state.nodes
    for n, (_, total, freed) in per_node.items():
        gained = freed
        for f in nodes[n].gpu_free:  # and the devices already whole free there
            if f >= GPU_MILLI:
                gained += 1
        keys.append((total / max(1, gained), n))
    # Usually a few dozen nodes give the units wanted: pop them in order from a heap rather
    # than sort every node (keys end with the node name: no ties, the same order).
    heapq.heapify(keys)
    order: list[int] = []
    seen: set[int] = set()
    while keys:
        n = heapq.heappop(keys)[1]
        for i in index.by_cost_on(n):
            if i in actions and i not in seen:
                seen.add(i)
                order.append(i)
        if len(order) >= MAX_GREEDY_UNITS:  # as many as the other order offers
            break
    return order


def greedy_choice(
    snapshot: Snapshot,
    g: GangRequest,
    units: Sequence[Unit],
    cost: Sequence[int],
    actions: Mapping[int, EvictAction],
    state: ClusterState,
    pdb_used: Mapping[str, int],
    rooms: Mapping[str, tuple[tuple[str, int], ...]],
    accepting: set[str],
    index: UnitIndex,
    per_node: Mapping[str, tuple[int, int, int]],
) -> Choice | None:
    """Evict the cheapest allowed units until the gang fits, then give back those it does not
    need (most expensive first). Leaves ``state`` as it found it. Budgets are respected as
    units are added; fairness rooms too.

    Trying a placement costs a greedy pass, so it is tried only once the whole free GPUs (or
    CPU) on the nodes the gang accepts could hold it, and at most :data:`MAX_GREEDY_TRIES`
    times."""

    def in_order(order: Sequence[int]) -> Choice | None:
        """The greedy for one order of the units."""
        budgets = [
            (b.key, set(b.pod_uids), b.allowed - pdb_used.get(b.key, 0)) for b in snapshot.budgets
        ]
        tree = snapshot.queue_tree
        taken_from: Counter[tuple[str, str]] = Counter()
        spent: Counter[str] = Counter()
        gone: list[int] = []
        tries = 0

        def fits() -> bool:
            nonlocal tries
            tries += 1
            result = place_gangs(state, [g], extras=False)
            for a in reversed(result.assignments):
                state.release(a.pod_uid)
            return g.key in result.placed

        def take(i: int) -> None:
            for p in units[i].pods:
                state.release(p.uid)
            gone.append(i)
            need.changed(units[i].nodes)

        def give_back(i: int) -> None:
            for p in units[i].pods:
                state.restore_bound(p)
            gone.remove(i)
            need.changed(units[i].nodes)

        if not need.reachable([units[i] for i in order]):
            return None
        whole_gone: set[str] = set()
        shrunk: set[str] = set()
        sides: dict[str, str] = {}
        try:
            found = False
            for i in order:
                if tries >= MAX_GREEDY_TRIES:
                    break
                u = units[i]
                if u.gang in whole_gone or (u.whole and u.gang in shrunk):
                    continue  # a gang is taken whole or shrunk, never both
                counts = [
                    (key, sum(1 for p in u.pods if p.uid in covered), allowed)
                    for key, covered, allowed in budgets
                ]
                if any(n and spent[key] + n > allowed for key, n, allowed in counts):
                    continue
                branch = sides.get(u.queue, "")
                if u.queue != g.queue and u.queue not in sides:
                    branch = sides[u.queue] = branch_pair(tree, g.queue, u.queue)[1]
                limits = rooms.get(branch, ())
                if any(taken_from[branch, r] + u.usage.get(r, 0) > room for r, room in limits):
                    continue
                take(i)
                (whole_gone if u.whole else shrunk).add(u.gang)
                for key, n, _ in counts:
                    spent[key] += n
                for r, _ in limits:
                    taken_from[branch, r] += u.usage.get(r, 0)
                if need.possible() and fits():
                    found = True
                    break
            if not found:
                return None
            for i in sorted(gone, key=lambda i: -cost[i]):
                if tries >= 2 * MAX_GREEDY_TRIES:
                    break
                give_back(i)
                if not (need.possible() and fits()):
                    take(i)
            return Choice({i: actions[i] for i in gone}, set())
        finally:
            for i in list(reversed(gone)):
                give_back(i)

    # Kept up to date as units are taken and given back; each order gives back all it took,
    # so one serves both.
    need = _Need(g, state, accepting)
    best: Choice | None = None
    # Two orders: cheapest units first (best when little room is needed), and node by node
    # (best when the gang needs whole nodes); the cheaper answer wins.
    # (The first of the cycle's cheapest-first order that count: without sorting every unit.)
    cheapest: list[int] = []
    for i in index.by_cost:
        if i in actions and any(n in per_node for n in units[i].nodes):
            cheapest.append(i)
            if len(cheapest) >= MAX_GREEDY_UNITS:
                break
    for order in (cheapest, _node_order(actions, index, cost, state, per_node)):
        found = in_order(order)
        if found is not None and (
            best is None or choice_cost(found, cost) < choice_cost(best, cost)
        ):
            best = found
    return best
