"""The take-back CP-SAT model of one pending gang (see :mod:`.takeback` for its columns,
rows and objective): which nodes it spans (those with room, those whose victims cost least
per GPU freed, and landing nodes for moved pods), the lower bound of GPU thousandths any
plan must evict, the per-unit eviction costs shared by every gang of a cycle, and the
solve itself, hinted with and falling back to the greedy choice of :mod:`.takeback_greedy`.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import Pod
from scheduler.cluster.snapshot import Snapshot
from scheduler.solver.greedy import GangRequest, shape_key
from scheduler.solver.placement import EvictAction
from scheduler.solver.queues import QueueBook
from scheduler.solver.state import ClusterState, NodeSlot, uses_node_name
from scheduler.solver.takeback_greedy import Choice, choice_cost, greedy_choice
from scheduler.solver.victims import Unit, branch_pair, victim_rooms

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

__all__ = ["MAX_MODEL_MOVERS", "MAX_MODEL_NODES", "solve_gang", "unit_costs"]

#: Consolidation candidates in one gang's model at most (cheapest first). Each brings its
#: pods' placement columns on every node of the model: at 5,000 nodes, 64 candidates made
#: building the model take 0.6 s; a cycle moves at most ``consolidation_max_pods`` (16).
MAX_MODEL_MOVERS = 24

#: Nodes in one gang's model at most (those with free room first, then those whose victims
#: cost least per GPU freed).
MAX_MODEL_NODES = 256


def unit_costs(units: Sequence[Unit], now: float) -> list[int]:
    """Lexicographic eviction cost of each unit, by unit id (see :mod:`.takeback`): a whole
    gang costs more than all the work of every unit together, more the higher its priority
    ranks among the units; then its work. One list per cycle, shared by every gang."""
    ranks = {p: i for i, p in enumerate(sorted({u.priority for u in units}))}
    work = [u.work(now) for u in units]
    scale = sum(work) + 1
    return [
        ((1 + ranks[u.priority]) * scale if u.whole else 0) + w
        for u, w in zip(units, work, strict=True)
    ]


def solve_gang(
    snapshot: Snapshot,
    g: GangRequest,
    units: Sequence[Unit],
    cost: Sequence[int],
    actions: Mapping[int, EvictAction],
    movable: Sequence[Unit],
    state: ClusterState,
    book: QueueBook,
    pdb_used: Mapping[str, int],
    move_cap: int,
    time_limit: float,
    workers: int,
    *,
    greedy_only: bool = False,
) -> Choice | None:
    """The units to evict (with ``actions``' action) or move (among ``movable``) so that
    ``g`` fits: CP-SAT's answer when it costs no more than the greedy choice it is hinted
    with, else the greedy choice (alone with ``greedy_only``); None when neither is found.
    Its ``floor`` is the GPU thousandths any plan must evict for ``g``."""
    # Deferred, as in scheduler.solver.cpsat: OR-Tools is the largest import of the process.
    from ortools.sat.python import cp_model

    shapes = _group(g.required)
    reps = [pods[0] for pods in shapes.values()]
    # Nodes: those that accept some pod of the gang and have room or host a candidate.
    # Judged once per node class (same static traits and free state: same answer).
    accepting: set[str] = set()
    roomy: set[str] = set()
    for key, names in state.classes.items():
        slot = state.representative(key)
        if slot is None or not any(p.accepts(slot.node) for p in reps):
            continue
        accepting.update(names)
        if any((d := state.demand_on(p, slot)) is not None and slot.fits(d) for p in reps):
            roomy.update(names)
    floor = _min_milli_to_free(g, state, accepting)
    victim_nodes: dict[str, list[Unit]] = defaultdict(list)
    # Membership tests rather than ``nodes & accepting``: a set built per unit, for every
    # running gang of the cluster (which node comes first does not matter: lists are
    # appended in unit order, and the nodes are sorted below).
    for i in actions:
        u = units[i]
        for n in u.nodes:
            if n in accepting:
                victim_nodes[n].append(u)
    if not victim_nodes and not movable:
        return None
    for u in movable:
        for n in u.nodes:
            if n in accepting:
                victim_nodes[n].append(u)
    # Only the first nodes of each order are taken: nsmallest is sorted(...)[:k] (the keys
    # end with the node name, so there are no ties), without sorting every victim's node.
    chosen_nodes = heapq.nsmallest(
        MAX_MODEL_NODES // 4,
        (n for n in roomy if n not in victim_nodes),
        key=lambda n: (-sum(state.nodes[n].gpu_free), n),
    )

    # Cheapest freed GPU first when the node set must be cut.
    def cheapest(n: str) -> tuple[int, str]:
        here = victim_nodes[n]  # mostly one unit: no generator for it
        return (cost[here[0].id] if len(here) == 1 else min(cost[u.id] for u in here), n)

    chosen_nodes += heapq.nsmallest(MAX_MODEL_NODES - len(chosen_nodes), victim_nodes, key=cheapest)
    # Only units with a pod on a node of the model can make room in it.
    in_model = {u.id for n in chosen_nodes for u in victim_nodes.get(n, ())}
    candidates = [units[i] for i in actions if i in in_model]
    movable = sorted((u for u in movable if u.id in in_model), key=lambda u: cost[u.id])
    movable = movable[:MAX_MODEL_MOVERS]
    if movable:
        # Where moved pods may land: nodes with room for one of them, though maybe not for
        # any pod of the gang (so not among the nodes above).
        movers = [pods[0] for u in movable for pods in _group(u.pods).values()]
        landing: set[str] = set()
        for key, names in state.classes.items():
            slot = state.representative(key)
            if slot is not None and any(
                p.accepts(slot.node)
                and (d := state.demand_on(p, slot)) is not None
                and slot.fits(d)
                for p in movers
            ):
                landing.update(names)
        landing -= set(chosen_nodes)
        chosen_nodes += sorted(landing, key=lambda n: (-sum(state.nodes[n].gpu_free), n))[
            : MAX_MODEL_NODES // 4
        ]

    rooms = victim_rooms(
        [units[i] for i in actions], actions, g, snapshot.queue_tree, book.report, book.charged
    )
    hint = greedy_choice(snapshot, g, units, cost, actions, state, pdb_used, rooms, accepting)
    if hint is not None:
        hint.floor = floor
    if greedy_only:
        return hint

    model = cp_model.CpModel()
    e = {u.id: model.new_bool_var(f"e{u.id}") for u in candidates}
    m = {u.id: model.new_bool_var(f"m{u.id}") for u in movable}
    held = {u.id: _held(state, u) for u in (*candidates, *movable)}

    # Pods to place: the gang's, and those of moved units (only if moved).
    demands: list[tuple[str, Pod, int, cp_model.IntVar | None]] = [
        ("g", pods[0], len(pods), None) for pods in shapes.values()
    ]
    for u in movable:
        for pods in _group(u.pods).values():
            demands.append((f"m{u.id}", pods[0], len(pods), m[u.id]))
    per_node: dict[str, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
    placed_of: dict[int, list[cp_model.IntVar]] = defaultdict(list)
    # Whether a pod may go to a node at all (taints, selector, affinity, allocatable) depends
    # on the node's static traits only: asked once per (demand, traits), not per node (the
    # state keeps the label keys pods select on; a pod naming nodes is asked per node).
    by_traits = [not uses_node_name(pod) for _, pod, _, _ in demands]
    eligible: dict[tuple[int, int], bool] = {}
    for n in chosen_nodes:
        slot = state.nodes[n]
        for k, (_, pod, count, _) in enumerate(demands):
            ok = eligible.get((k, slot.static_id)) if by_traits[k] else None
            if ok is None:
                ok = pod.accepts(slot.node) and _within_allocatable(state, pod, slot)
                if by_traits[k]:
                    eligible[k, slot.static_id] = ok
            if not ok:
                continue
            v = model.new_int_var(0, count, f"x{k}_{n}")
            per_node[n].append((k, v))
            placed_of[k].append(v)
    for k, (_, _, count, flag) in enumerate(demands):
        total = sum(placed_of[k]) if placed_of[k] else 0
        if flag is None:
            if not placed_of[k]:
                return None
            model.add(total == count)
        else:
            model.add(total == count * flag)
    for u in candidates:
        if u.id in m:
            model.add(e[u.id] + m[u.id] <= 1)
    by_gang: dict[str, list[Unit]] = defaultdict(list)
    for u in candidates:
        by_gang[u.gang].append(u)
    for members in by_gang.values():
        whole = [u for u in members if u.whole]
        for u in members:
            if not u.whole and whole:
                model.add(e[u.id] + e[whole[0].id] <= 1)
    frees = {**e, **m}

    # Rows are written as weighted sums (one call per row rather than an expression object
    # per term): the model is the same, as CP-SAT stores every linear row merged by variable.
    weighted = cp_model.LinearExpr.weighted_sum
    for n in chosen_nodes:
        slot = state.nodes[n]
        # What each unit the model may free holds on this node: its variable, resources
        # and device thousandths.
        here = [
            (u.id, frees[u.id], *held[u.id][n])
            for u in victim_nodes.get(n, ())
            if u.id in frees and n in held[u.id]
        ]
        # Each placed demand's requests on this node, looked up once (not once per resource).
        asked = [(state.demand_on(demands[k][1], slot), v) for k, v in per_node[n]]
        resources: set[str] = set(slot.free)
        for d, _ in asked:
            resources |= set(d.requests)  # type: ignore[union-attr]
        free_now = slot.free
        for r in sorted(resources):
            # What is placed fits in what is free plus what freed units hold here.
            xs: list[cp_model.IntVar] = []
            cs: list[int] = []
            for d, v in asked:
                need = d.requests.get(r, 0)  # type: ignore[union-attr]
                if need:
                    xs.append(v)
                    cs.append(need)
            if not xs:
                continue
            for _, var, res, _ in here:
                amount = res.get(r, 0)
                if amount:
                    xs.append(var)
                    cs.append(-amount)
            model.add(weighted(xs, cs) <= free_now.get(r, 0))
        # Devices.
        whole_x: list[cp_model.IntVar] = []
        whole_c: list[int] = []
        share_x: list[cp_model.IntVar] = []
        share_c: list[int] = []
        for d, v in asked:
            if d is None or not d.gpu_count:
                continue
            if d.gpu_milli >= GPU_MILLI:
                whole_x.append(v)
                whole_c.append(d.gpu_count)
            else:
                share_x.append(v)
                share_c.append(d.gpu_count * d.gpu_milli)
        if not whole_x and not share_x:
            continue
        holders: dict[int, list[tuple[int, cp_model.IntVar, int]]] = defaultdict(list)
        for uid, var, _, dev in here:
            for i, milli in dev.items():
                holders[i].append((uid, var, milli))
        # Whole devices the gang's pods may take: free ones, and those freed entirely
        # (``w``: only if every unit holding part of it is freed).
        ones = 0
        ws: list[cp_model.IntVar] = []
        for i, free in enumerate(slot.gpu_free):
            if free >= GPU_MILLI:
                ones += 1
                continue
            held_here = holders.get(i)
            if held_here and free + sum(milli for _, _, milli in held_here) >= GPU_MILLI:
                w = model.new_bool_var(f"w{n}_{i}")
                for _, var, _ in held_here:
                    model.add(w <= var)
                ws.append(w)
        if whole_x:
            model.add(weighted([*whole_x, *ws], [*whole_c, *(-1 for _ in ws)]) <= ones)
        # Thousandths placed within those free plus those freed (merged per unit).
        gained: dict[int, int] = {}
        for held_here in holders.values():
            for uid, _, milli in held_here:
                gained[uid] = gained.get(uid, 0) - milli
        model.add(
            weighted(
                [*share_x, *whole_x, *(frees[uid] for uid in gained)],
                [*share_c, *(GPU_MILLI * c for c in whole_c), *gained.values()],
            )
            <= sum(slot.gpu_free)
        )
    for b in snapshot.budgets:
        covered = set(b.pod_uids)
        terms = [
            sum(1 for p in units[uid].pods if p.uid in covered) * var
            for uid, var in frees.items()
            if any(p.uid in covered for p in units[uid].pods)
        ]
        if terms:
            model.add(sum(terms) <= max(0, b.allowed - pdb_used.get(b.key, 0)))
    side = {
        q: branch_pair(snapshot.queue_tree, g.queue, q)[1]
        for q in {u.queue for u in candidates if u.queue != g.queue}
    }
    for branch, limits in rooms.items():
        members = [u for u in candidates if side.get(u.queue) == branch]
        for r, room in limits:
            if members:
                taken = weighted([e[u.id] for u in members], [u.usage.get(r, 0) for u in members])
                model.add(taken <= room)
            else:
                model.add(sum(u.usage.get(r, 0) * e[u.id] for u in members) <= room)
    if m:
        model.add(sum(len(u.pods) * m[u.id] for u in movable) <= move_cap)
    model.minimize(weighted(list(frees.values()), [cost[uid] for uid in frees]))
    if hint is not None and set(hint.evict) <= set(e):  # else the model could not express it
        for uid, var in e.items():
            model.add_hint(var, 1 if uid in hint.evict else 0)
        for var in m.values():
            model.add_hint(var, 0)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, time_limit)
    solver.parameters.num_workers = max(1, workers)
    status = solver.solve(model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        choice = Choice(
            {uid: actions[uid] for uid, var in e.items() if solver.value(var)},
            {uid for uid, var in m.items() if solver.value(var)},
        )
        if hint is None or choice_cost(choice, cost) <= choice_cost(hint, cost):
            choice.floor = floor
            return choice
    if hint is not None:
        hint.floor = floor
    return hint


def _within_allocatable(state: ClusterState, pod: Pod, slot: NodeSlot) -> bool:
    """The pod can be sized on the node and asks for no more than it has (pods aside)."""
    d = state.demand_on(pod, slot)
    return d is not None and not any(
        v > slot.node.allocatable.get(r, 0) for r, v in d.requests.items() if r != "pods"
    )


def _held(state: ClusterState, u: Unit) -> dict[str, tuple[dict[str, int], dict[int, int]]]:
    """Per node: resources (incl. the pod count) and device thousandths ``u`` frees there."""
    out: dict[str, tuple[dict[str, int], dict[int, int]]] = {}
    for p in u.pods:
        node = p.node_name or ""
        slot = state.nodes.get(node)
        if slot is None:
            continue
        demand = state.demand_on(p, slot)
        res, dev = out.setdefault(node, ({}, {}))
        for k, v in (demand.requests if demand else p.requests).items():
            res[k] = res.get(k, 0) + v
        for i, milli in p.gpu_grant:
            dev[i] = dev.get(i, 0) + milli
    return out


def _group(pods: Sequence[Pod]) -> dict[object, list[Pod]]:
    out: dict[object, list[Pod]] = {}
    for p in pods:
        out.setdefault(shape_key(p), []).append(p)
    return out


def _min_milli_to_free(g: GangRequest, state: ClusterState, accepting: set[str]) -> int:
    """A lower bound of the GPU thousandths that must be evicted for ``g`` to fit.

    As if every pod asked for the smallest whole-GPU count ``k`` among them: each pod needs
    ``k`` whole devices on one node, and a device with ``f`` thousandths free becomes whole
    only once ``1000 - f`` more are evicted from it. On each node the c-th pod takes the c·k
    cheapest devices; these marginal costs only grow, so taking the cheapest slots over all
    nodes gives the least total."""
    counts = [p.gpu.count for p in g.required if p.gpu is not None and p.gpu.whole]
    if not counts:
        return 0
    k, pods = min(counts), len(counts)
    slots: list[int] = []
    # Nodes of one class have the same free devices: one answer per class, counted for as
    # many of its nodes as the gang accepts (at most ``pods`` of them can matter).
    for key, names in state.classes.items():
        copies = min(pods, len(names.keys() & accepting))
        if not copies:
            continue
        costs = sorted(GPU_MILLI - min(f, GPU_MILLI) for f in key[2])
        for c in range(min(len(costs) // k, pods)):
            slots += [sum(costs[c * k : (c + 1) * k])] * copies
    return sum(sorted(slots)[:pods]) if len(slots) >= pods else sum(slots)
