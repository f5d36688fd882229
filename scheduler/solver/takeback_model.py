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
from scheduler.solver.takeback_greedy import Choice, UnitIndex, choice_cost, greedy_choice
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
    index: UnitIndex,
    *,
    greedy_only: bool = False,
) -> Choice | None:
    """The units to evict (with ``actions``' action) or move (among ``movable``) so that
    ``g`` fits: CP-SAT's answer when it costs no more than the greedy choice it is hinted
    with, else the greedy choice (alone with ``greedy_only``); None when neither is found.
    Its ``floor`` is the GPU thousandths any plan must evict for ``g``."""
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
    # Nodes hosting a candidate: per node the units of ``actions`` there (from the cycle's
    # index, see UnitIndex.per_node), and the movable units (in their order).
    hosts = index.per_node(actions, accepting)
    if not hosts and not movable:
        return None
    moving_on: dict[str, list[Unit]] = defaultdict(list)
    for u in movable:
        for n in u.nodes:
            if n in accepting:
                moving_on[n].append(u)
    # Nodes where no pod of the gang could go even with their candidates gone are left out:
    # evicted or moved (the model's), evicted only (the greedy's, which never moves).
    evicting, useless = _cannot_host(g, state, hosts, moving_on)
    for n in useless:
        hosts.pop(n, None)
        moving_on.pop(n, None)
    hosting = hosts.keys() | moving_on.keys()
    rooms = victim_rooms(
        [units[i] for i in actions], actions, g, snapshot.queue_tree, book.report, book.charged
    )
    hint = greedy_choice(
        snapshot,
        g,
        units,
        cost,
        actions,
        state,
        pdb_used,
        rooms,
        accepting,
        index,
        {n: v for n, v in hosts.items() if n not in evicting},
    )
    if hint is not None:
        hint.floor = floor
    if greedy_only:
        return hint  # the model's nodes below are not needed
    # Deferred, as in scheduler.solver.cpsat: OR-Tools is the largest import of the process
    # (a stage that only takes the greedy's choice never needs it).
    from ortools.sat.python import cp_model

    # Only the first nodes of each order are taken: nsmallest is sorted(...)[:k] (the keys
    # end with the node name, so there are no ties), without sorting every victim's node.
    chosen_nodes = heapq.nsmallest(
        MAX_MODEL_NODES // 4,
        (n for n in roomy if n not in hosting),
        key=lambda n: (-sum(state.nodes[n].gpu_free), n),
    )

    # Cheapest freed GPU first when the node set must be cut.
    def cheapest(n: str) -> tuple[int, str]:
        least = index.cheapest_on(n, actions) if n in hosts else None
        for u in moving_on.get(n, ()):
            if least is None or cost[u.id] < least:
                least = cost[u.id]
        return (least if least is not None else 0, n)

    chosen_nodes += heapq.nsmallest(MAX_MODEL_NODES - len(chosen_nodes), hosting, key=cheapest)
    # Per node of the model, the units that may free room there: those of ``actions`` (in
    # unit order), then the movable ones.
    victim_nodes: dict[str, list[Unit]] = {}
    for n in chosen_nodes:
        on_n = [units[i] for i in index.on_node[n] if i in actions] if n in hosts else []
        on_n += moving_on.get(n, ())
        if on_n:
            victim_nodes[n] = on_n
    # Only units with a pod on a node of the model can make room in it.
    in_model = {u.id for on_n in victim_nodes.values() for u in on_n}
    candidates = [units[i] for i in sorted(in_model) if i in actions]
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

    held = {u.id: _held(state, u) for u in (*candidates, *movable)}
    # Pods to place: the gang's, and those of moved units (only if moved: by the unit's id).
    specs: list[tuple[str, Pod, int, int | None]] = [
        ("g", pods[0], len(pods), None) for pods in shapes.values()
    ]
    for u in movable:
        for pods in _group(u.pods).values():
            specs.append((f"m{u.id}", pods[0], len(pods), u.id))
    # Whether a pod may go to a node at all (taints, selector, affinity, allocatable) depends
    # on the node's static traits only: asked once per (demand, traits), not per node (the
    # state keeps the label keys pods select on; a pod naming nodes is asked per node).
    by_traits = [not uses_node_name(pod) for _, pod, _, _ in specs]
    eligible: dict[tuple[int, int], bool] = {}
    fitting: list[tuple[str, list[int]]] = []  # per node of the model, the demands it takes
    hosted: set[int] = set()
    for n in chosen_nodes:
        slot = state.nodes[n]
        ks: list[int] = []
        for k, (_, pod, _, _) in enumerate(specs):
            ok = eligible.get((k, slot.static_id)) if by_traits[k] else None
            if ok is None:
                ok = pod.accepts(slot.node) and _within_allocatable(state, pod, slot)
                if by_traits[k]:
                    eligible[k, slot.static_id] = ok
            if ok:
                ks.append(k)
                hosted.add(k)
        fitting.append((n, ks))
    if any(unit is None and k not in hosted for k, (_, _, _, unit) in enumerate(specs)):
        return None  # a pod of the gang fits on no node of the model
    if _cannot_fit(state, specs, fitting, victim_nodes, held):
        # The model has no solution (CP-SAT would say INFEASIBLE, or UNKNOWN after its whole
        # time limit): what it would fall back to, without building it.
        if hint is not None:
            hint.floor = floor
        return hint

    model = cp_model.CpModel()
    e = {u.id: model.new_bool_var(f"e{u.id}") for u in candidates}
    m = {u.id: model.new_bool_var(f"m{u.id}") for u in movable}
    demands: list[tuple[str, Pod, int, cp_model.IntVar | None]] = [
        (tag, pod, count, None if unit is None else m[unit]) for tag, pod, count, unit in specs
    ]
    per_node: dict[str, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
    placed_of: dict[int, list[cp_model.IntVar]] = defaultdict(list)
    for n, ks in fitting:
        for k in ks:
            v = model.new_int_var(0, demands[k][2], f"x{k}_{n}")
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
        # Per resource some placed demand asks for here: those demands' columns (in their
        # order) and amounts. Resources none of them asks for get no row.
        rows: dict[str, tuple[list[cp_model.IntVar], list[int]]] = {}
        for d, v in asked:
            for r, need in d.requests.items():  # type: ignore[union-attr]
                if need:
                    row = rows.get(r)
                    if row is None:
                        rows[r] = ([v], [need])
                    else:
                        row[0].append(v)
                        row[1].append(need)
        free_now = slot.free
        for r in sorted(rows):
            # What is placed fits in what is free plus what freed units hold here.
            xs, cs = rows[r]
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
    # No probing in presolve: on the 5,000-node benchmark's take-back models it was about a
    # third of each solve (13 ms against 20), and the optima found were the same.
    solver.parameters.cp_model_probing_level = 0
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


def _cannot_host(
    g: GangRequest,
    state: ClusterState,
    hosts: Mapping[str, tuple[int, int, int]],
    moving_on: Mapping[str, Sequence[Unit]],
) -> tuple[set[str], set[str]]:
    """Nodes where no pod of ``g`` fits even with every candidate there gone: (with the
    evicted ones gone, with the evicted and the moved ones gone). A node fails when it has
    fewer whole devices than the gang's smallest whole-GPU pod asks for, counting each device
    a candidate holds any part of as freed (an upper bound).

    Freeing room on such a node only costs. Left in, the nodes whose few cheap victims free
    part of the node came first (least cost per GPU freed): in the model they took the
    places of nodes that could be freed whole, and the greedy spent its units on them, so a
    gang of whole-node pods found no plan on a cluster with a thousand freeable nodes."""
    # A pod without whole devices (CPU only, a share) may go to any node: no node is ruled out.
    least = min(
        (p.gpu.count if p.gpu is not None and p.gpu.whole else 0 for p in g.required), default=0
    )
    if not least:
        return set(), set()
    evicting: set[str] = set()
    either: set[str] = set()
    nodes = state.nodes
    for n in hosts.keys() | moving_on.keys():
        room = hosts[n][2] if n in hosts else 0
        if room < least:
            room += sum(1 for f in nodes[n].gpu_free if f >= GPU_MILLI)
        if room >= least:
            continue
        evicting.add(n)
        for u in moving_on.get(n, ()):
            room += sum(len(p.gpu_grant) for p in u.pods if p.node_name == n)
        if room < least:
            either.add(n)
    return evicting, either


def _within_allocatable(state: ClusterState, pod: Pod, slot: NodeSlot) -> bool:
    """The pod can be sized on the node and asks for no more than it has (pods aside)."""
    d = state.demand_on(pod, slot)
    return d is not None and not any(
        v > slot.node.allocatable.get(r, 0) for r, v in d.requests.items() if r != "pods"
    )


def _cannot_fit(
    state: ClusterState,
    specs: Sequence[tuple[str, Pod, int, int | None]],
    fitting: Sequence[tuple[str, Sequence[int]]],
    victim_nodes: Mapping[str, Sequence[Unit]],
    held: Mapping[int, Mapping[str, tuple[dict[str, int], dict[int, int]]]],
) -> bool:
    """True when the model of :func:`solve_gang` has no solution: some shape of the gang has
    fewer pods than it needs room for even with every unit of the model freed.

    A relaxation of the model's rows, one shape at a time: on each node it may use, as many
    of its pods as the node's resource rows, whole devices (free, or held only by units of
    the model) and GPU thousandths allow with all those units gone. Other shapes and moved
    pods only take room away, so a shortfall here is a shortfall of the model.
    """
    for k, (_, pod, count, unit) in enumerate(specs):
        if unit is not None:
            continue  # moved pods: placed only if moved
        room = 0
        for n, ks in fitting:
            if k not in ks:
                continue
            slot = state.nodes[n]
            d = state.demand_on(pod, slot)
            if d is None:
                continue
            frees = [held[u.id][n] for u in victim_nodes.get(n, ()) if n in held.get(u.id, {})]
            most = count
            for r, need in d.requests.items():
                if need > 0:
                    cap = slot.free.get(r, 0) + sum(res.get(r, 0) for res, _ in frees)
                    most = min(most, max(0, cap // need))
            if d.gpu_count and most:
                freed: dict[int, int] = {}
                for _, dev in frees:
                    for i, milli in dev.items():
                        freed[i] = freed.get(i, 0) + milli
                milli_cap = sum(slot.gpu_free) + sum(freed.values())
                if d.gpu_milli >= GPU_MILLI:
                    whole = sum(
                        1
                        for i, f in enumerate(slot.gpu_free)
                        if f >= GPU_MILLI or (i in freed and f + freed[i] >= GPU_MILLI)
                    )
                    most = min(most, whole // d.gpu_count, milli_cap // (GPU_MILLI * d.gpu_count))
                elif d.gpu_milli > 0:
                    most = min(most, milli_cap // (d.gpu_count * d.gpu_milli))
            room += most
            if room >= count:
                break
        if room < count:
            return True
    return False


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
