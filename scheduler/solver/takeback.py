"""Taking back: evict running work so a pending gang fits (reclaim, preemption, consolidation,
elastic shrink).

Runs after placement, on the gangs placement left out, in admission order (priority, then
fairness), at most ``take_back_gangs`` per cycle. For each gang one CP-SAT model over the
nodes that could host it:

- columns: ``x[n, s]`` pods of the gang's shape ``s`` on node ``n``; ``e[u]`` evict unit
  ``u`` (:mod:`.victims`: a whole running gang, or one elastic pod beyond minMember);
  ``m[u]`` move unit ``u`` (consolidation: evicted and placed again in this model, on
  columns ``y[n, u, s]``);
- rows: every pod of the gang placed; per node and resource, what is placed fits in what is
  free plus what evicted or moved units free there; whole GPUs only on devices that are
  free or freed entirely (``w[d]``), shares within the freed thousandths; a unit is evicted
  or moved or kept, a shrink never together with its whole gang; PodDisruptionBudgets; per
  victim branch of the queue tree, what is reclaimed stays within its excess over fair
  share; moved pods at most ``consolidation_max_pods`` per cycle;
- objective (minimise): whole gangs evicted, lower priority first; then GPU-seconds lost
  (:meth:`.victims.Unit.work`). Moves cost their GPU-seconds only, so moving a pod is
  preferred to evicting a gang, and shrinking an elastic gang to minMember to either.

The model is solved with a hint from the greedy choice (cheapest units first, then the
ones not needed dropped) and falls back to it. The chosen pods are placed on a
:class:`ClusterState` with real device grants; a gang whose pods do not pack after all is
left for the next cycle. Everything returned is checked again by
:func:`scheduler.solver.validate.validate_evictions`.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import structlog
from ortools.sat.python import cp_model

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import Pod
from scheduler.cluster.resources import CPU
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import FairShareReport
from scheduler.fairness.admission import OVER_QUOTA, format_queue_amount
from scheduler.framework.scoring import NodeScorer
from scheduler.solver.greedy import GangRequest, place_gangs, pod_size, shape_key
from scheduler.solver.placement import EvictAction, Eviction, PlacementSettings, PodAssignment
from scheduler.solver.queues import QueueBook
from scheduler.solver.state import ClusterState, NodeSlot
from scheduler.solver.victims import (
    Unit,
    action_for,
    branch_pair,
    build_units,
    dominant,
    fair,
    may_evict,
    used,
    victim_rooms,
)

__all__ = ["TakeBack", "take_back"]

log = structlog.get_logger(__name__)

#: Units the cheapest-first greedy releases at most before it gives up.
MAX_GREEDY_UNITS = 256

#: Consolidation candidates in one gang's model at most (cheapest first). Each brings its
#: pods' placement columns on every node of the model: at 5,000 nodes, 64 candidates made
#: building the model take 0.6 s; a cycle moves at most ``consolidation_max_pods`` (16).
MAX_MODEL_MOVERS = 24

#: Greedy placement passes per gang while choosing victims (each is a full greedy pass).
MAX_GREEDY_TRIES = 24

#: Nodes in one gang's model at most (those with free room first, then those whose victims
#: cost least per GPU freed).
MAX_MODEL_NODES = 256

#: The least time the stage gets in a cycle, whatever placement used of the cycle's budget.
MIN_BUDGET_SECONDS = 0.2


@dataclass
class TakeBack:
    """What the stage decided: placements (nominations), evictions, and per gang the pods it
    waits for."""

    assignments: list[PodAssignment] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    waits_for: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Pending gang -> why it could not take anything back (for the explainer).
    refused: dict[str, str] = field(default_factory=dict)
    #: See :attr:`scheduler.solver.placement.Placement.min_evicted_gpu_milli`.
    min_evicted_gpu_milli: int = 0


@dataclass
class _Choice:
    evict: dict[int, EvictAction]  # unit id -> action
    move: set[int]
    #: GPU thousandths any plan must evict for the gang (see Placement.min_evicted_gpu_milli).
    floor: int = 0


def take_back(
    snapshot: Snapshot,
    report: FairShareReport,
    order: Sequence[GangRequest],
    admitted: set[str],
    state: ClusterState,
    book: QueueBook,
    settings: PlacementSettings,
    scorer: NodeScorer | None = None,
    *,
    cycle: int | None = None,
    budget: float | None = None,
) -> TakeBack:
    """Evict for the gangs of ``order`` not in ``admitted`` (see module docstring).

    ``state`` holds this cycle's placements and ``book`` their queue charges; both are
    updated with what this stage decides (victims released, gangs placed).

    ``budget``: seconds this stage may spend on gangs (default: the settings' time limit,
    at least :data:`MIN_BUDGET_SECONDS`); building the units is not counted. No gang is
    started when less than half of what a gang took so far is left.
    """
    out = TakeBack()
    if not settings.take_back:
        return out
    started = time.perf_counter()
    now = snapshot.now
    # Pods already terminating (evicted by an earlier cycle, or by a leader before us) free
    # their room soon: a gang that fits once they are gone is held for them instead of
    # evicting anyone more. Room already promised to a held gang stays taken (held pods are
    # in the snapshot and in ``state``).
    leaving: dict[str, list[str]] = defaultdict(list)
    for p in snapshot.pods:
        if p.deleting and p.node_name and p.active and p.uid in state.bound:
            state.release(p.uid)
            leaving[p.node_name].append(p.uid)
    units: list[Unit] | None = None  # built once the first gang may take back
    cost: list[int] = []  # by unit id (see _costs)
    # The stage's own budget, like placement's (building the units is not counted).
    deadline = time.perf_counter() + max(
        MIN_BUDGET_SECONDS, settings.time_limit_seconds if budget is None else budget
    )
    per_gang: list[float] = []  # seconds each gang took: a gang not worth starting is not
    gangs = snapshot.gang_by_key
    taken: set[int] = set()  # units already evicted or moved this cycle
    taken_gangs: set[str] = set()
    moved_pods = 0
    pdb_used: Counter[str] = Counter()
    tried = 0
    for g in order:
        if not g.required or g.key in admitted or tried >= settings.take_back_gangs:
            continue
        gang = gangs.get(g.key)
        if gang is None:
            continue
        why = may_evict(gang, now)
        if why is not None:
            out.refused[g.key] = why
            continue
        problem = book.problem(g.queue, g.ask, preemptible=g.preemptible)
        if problem is not None and problem[0] == OVER_QUOTA:
            # Only non-preemptible usage counts against that quota: no eviction can help.
            out.refused[g.key] = problem[1]
            continue
        if units is None:
            building = time.perf_counter()
            units = build_units(snapshot)
            cost = _costs(units, now)
            deadline += time.perf_counter() - building
        if not units and not leaving:
            break
        tried += 1
        gang_started = time.perf_counter()
        left = deadline - gang_started
        if left <= 0.01 or (per_gang and left < 0.5 * sum(per_gang) / len(per_gang)):
            break
        if leaving and _hold_for_leaving(g, state, book, leaving, scorer, settings, out):
            admitted.add(g.key)
            continue
        actions: dict[int, EvictAction] = {}
        rules: dict[str, tuple[str | None, float]] = {}
        for u in units:
            if u.id in taken or u.gang in taken_gangs:
                continue
            act = action_for(g, u, snapshot.queue_tree, report, book.charged, now, rules)
            if act is not None:
                actions[u.id] = act
        movable = [
            u
            for u in units
            if u.whole
            and u.id not in taken
            and u.gang not in taken_gangs
            and u.id not in actions
            and len(u.pods) <= settings.consolidation_max_pods - moved_pods
            and now - u.started >= snapshot.queue_tree.min_runtime(u.queue, "preempt")
        ]
        if not actions and not movable:
            out.refused[g.key] = "no running work may be taken for it"
            continue
        found = _solve_one(
            snapshot,
            g,
            units,
            cost,
            actions,
            movable,
            state,
            book,
            pdb_used,
            settings.consolidation_max_pods - moved_pods,
            left / max(1, settings.take_back_gangs - tried + 1),
            settings.workers,
            greedy_only=settings.greedy_only,
        )
        per_gang.append(time.perf_counter() - gang_started)
        if found is None:
            out.refused[g.key] = "evicting what it may take would not make room"
            continue
        if not found.evict and not found.move:
            continue  # it fits as things are: placement left it out for another reason
        for i in found.evict:
            book.charge(units[i].queue, units[i].usage, -1)
        problem = book.problem(g.queue, g.ask, preemptible=g.preemptible)
        for i in found.evict:
            book.charge(units[i].queue, units[i].usage)
        if problem is not None:
            out.refused[g.key] = problem[1]
            continue
        placed = _apply(snapshot, g, units, found, state, scorer, settings)
        if placed is None:
            out.refused[g.key] = "the pods it would free do not pack the gang"
            continue
        assignments, moves = placed
        uids: list[str] = []
        # Messages first: they quote the queues' usage as it was when the choice was made.
        for uid_, act in sorted(found.evict.items()):
            out.evictions += _evictions(snapshot, report, book, g, units[uid_], act)
        for uid_ in sorted(found.evict):
            u = units[uid_]
            book.charge(u.queue, u.usage, -1)
            uids += [p.uid for p in u.pods]
            taken.add(u.id)
            if u.whole:
                taken_gangs.add(u.gang)
        for uid_ in sorted(found.move):
            u = units[uid_]
            out.evictions += _evictions(snapshot, report, book, g, u, "consolidate")
            uids += [p.uid for p in u.pods]
            taken.add(u.id)
            taken_gangs.add(u.gang)
            moved_pods += len(u.pods)
        book.charge(g.queue, g.ask, preemptible=g.preemptible)
        for b in snapshot.budgets:
            pdb_used[b.key] += sum(1 for p in b.pod_uids if p in set(uids))
        out.assignments += assignments
        out.waits_for[g.key] = tuple(uids)
        out.min_evicted_gpu_milli += found.floor
        admitted.add(g.key)
        log.info(
            "taken_back",
            cycle=cycle,
            gang=g.key,
            queue=g.queue,
            evicted=sorted({units[i].gang for i in found.evict}),
            moved=sorted({units[i].gang for i in found.move}),
            pods=len(uids),
            placed_moves=moves,
        )
    log.debug("take_back_done", cycle=cycle, seconds=round(time.perf_counter() - started, 4))
    return out


def _hold_for_leaving(
    g: GangRequest,
    state: ClusterState,
    book: QueueBook,
    leaving: Mapping[str, list[str]],
    scorer: NodeScorer | None,
    settings: PlacementSettings,
    out: TakeBack,
) -> bool:
    """Place ``g`` where terminating pods are leaving, held for them; True when it was."""
    if book.problem(g.queue, g.ask, preemptible=g.preemptible) is not None:
        return False
    spread = settings.gpu_strategy == "spread"
    result = place_gangs(state, [g], scorer, extras=False, spread_devices=spread)
    placed = result.assignments
    waits = [uid for n in sorted({a.node for a in placed}) for uid in leaving.get(n, ())]
    if g.key not in result.placed or not waits:
        for a in reversed(placed):
            state.release(a.pod_uid)
        return False
    book.charge(g.queue, g.ask, preemptible=g.preemptible)
    out.assignments += placed
    out.waits_for[g.key] = tuple(waits)
    log.info("held_for_terminating", gang=g.key, queue=g.queue, pods=len(waits))
    return True


# --- the model ------------------------------------------------------------------------------


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


def _costs(units: Sequence[Unit], now: float) -> list[int]:
    """Lexicographic eviction cost of each unit, by unit id (see module docstring): a whole
    gang costs more than all the work of every unit together, more the higher its priority
    ranks among the units; then its work. One list per cycle, shared by every gang."""
    ranks = {p: i for i, p in enumerate(sorted({u.priority for u in units}))}
    scale = sum(u.work(now) for u in units) + 1
    return [((1 + ranks[u.priority]) * scale if u.whole else 0) + u.work(now) for u in units]


def _solve_one(
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
) -> _Choice | None:
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
    for i in actions:
        for n in units[i].nodes & accepting:
            victim_nodes[n].append(units[i])
    if not victim_nodes and not movable:
        return None
    for u in movable:
        for n in u.nodes & accepting:
            victim_nodes[n].append(u)
    with_room = sorted(
        (n for n in roomy if n not in victim_nodes),
        key=lambda n: (-sum(state.nodes[n].gpu_free), n),
    )
    # Cheapest freed GPU first when the node set must be cut.
    ordered_victim_nodes = sorted(
        victim_nodes, key=lambda n: (min(cost[u.id] for u in victim_nodes[n]), n)
    )
    chosen_nodes = with_room[: MAX_MODEL_NODES // 4]
    chosen_nodes += ordered_victim_nodes[: MAX_MODEL_NODES - len(chosen_nodes)]
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
    hint = _greedy_choice(snapshot, g, units, cost, actions, state, pdb_used, rooms, accepting)
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
    for n in chosen_nodes:
        slot = state.nodes[n]
        for k, (_, pod, count, _) in enumerate(demands):
            if not pod.accepts(slot.node):
                continue
            d = state.demand_on(pod, slot)
            if d is None or any(
                v > slot.node.allocatable.get(r, 0) for r, v in d.requests.items() if r != "pods"
            ):
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

    def freed(u_id: int) -> cp_model.IntVar:
        return frees[u_id]

    for n in chosen_nodes:
        slot = state.nodes[n]
        here = [u for u in victim_nodes.get(n, ()) if u.id in frees]
        resources: set[str] = set(slot.free)
        for k, _ in per_node[n]:
            resources |= set(state.demand_on(demands[k][1], slot).requests)  # type: ignore[union-attr]
        for r in sorted(resources):
            load = []
            for k, v in per_node[n]:
                need = state.demand_on(demands[k][1], slot).requests.get(r, 0)  # type: ignore[union-attr]
                if need:
                    load.append(need * v)
            if not load:
                continue
            credit = [held[u.id][n][0].get(r, 0) * freed(u.id) for u in here if held[u.id].get(n)]
            model.add(sum(load) <= slot.free.get(r, 0) + sum(credit))
        # Devices.
        whole_load = []
        share_load = []
        for k, v in per_node[n]:
            d = state.demand_on(demands[k][1], slot)
            if d is None or not d.gpu_count:
                continue
            if d.gpu_milli >= GPU_MILLI:
                whole_load.append(d.gpu_count * v)
            else:
                share_load.append(d.gpu_count * d.gpu_milli * v)
        if not whole_load and not share_load:
            continue
        holders: dict[int, list[int]] = defaultdict(list)
        for u in here:
            for i in held[u.id].get(n, ({}, {}))[1]:
                holders[i].append(u.id)
        device_free: list[cp_model.LinearExprT] = []
        whole_free: list[cp_model.LinearExprT] = []
        for i, free in enumerate(slot.gpu_free):
            gained = [held[uid][n][1][i] * freed(uid) for uid in holders.get(i, [])]
            device_free.append(free + sum(gained))
            if free >= GPU_MILLI:
                whole_free.append(1)
            elif (
                holders.get(i) and free + sum(held[uid][n][1][i] for uid in holders[i]) >= GPU_MILLI
            ):
                w = model.new_bool_var(f"w{n}_{i}")
                for uid in holders[i]:
                    model.add(w <= freed(uid))
                whole_free.append(w)
        if whole_load:
            model.add(sum(whole_load) <= sum(whole_free))
        model.add(sum(share_load) + GPU_MILLI * sum(whole_load) <= sum(device_free))
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
            model.add(sum(u.usage.get(r, 0) * e[u.id] for u in members) <= room)
    if m:
        model.add(sum(len(u.pods) * m[u.id] for u in movable) <= move_cap)
    model.minimize(sum(cost[uid] * var for uid, var in frees.items()))
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
        choice = _Choice(
            {uid: actions[uid] for uid, var in e.items() if solver.value(var)},
            {uid for uid, var in m.items() if solver.value(var)},
        )
        if hint is None or _total(choice, cost) <= _total(hint, cost):
            choice.floor = floor
            return choice
    if hint is not None:
        hint.floor = floor
    return hint


def _total(choice: _Choice, cost: Sequence[int]) -> int:
    return sum(cost[u] for u in (*choice.evict, *choice.move))


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
        """Could it fit if every one of ``units`` were gone? (Devices they hold whole.)"""
        gained: Counter[str] = Counter()
        for u in units:
            for p in u.pods:
                if p.node_name in self.accepting:
                    gained[p.node_name] += sum(1 for _, m in p.gpu_grant if m >= GPU_MILLI)
        total = self.total_devices + sum(gained.values())
        best = max((self.per_node[n][0] + gained[n] for n in self.per_node), default=0)
        return total >= self.devices and best >= self.largest


def _node_order(
    useful: Sequence[int],
    units: Sequence[Unit],
    cost: Sequence[int],
    state: ClusterState,
    accepting: set[str],
) -> list[int]:
    """Units in the order the greedy takes them: node by node, the nodes that free the most
    GPUs per unit of cost first, and on each node its cheapest units first. Taking the
    cheapest units cluster-wide would free a device here and a device there, and a gang of
    large pods needs whole nodes' worth of room."""
    on_node: dict[str, list[int]] = defaultdict(list)
    for i in useful:
        for n in units[i].nodes & accepting:
            on_node[n].append(i)

    def node_key(n: str) -> tuple[float, str]:
        slot = state.nodes[n]
        freed = sum(1 for f in slot.gpu_free if f >= GPU_MILLI)
        freed += sum(
            len(p.gpu_grant) for i in on_node[n] for p in units[i].pods if p.node_name == n
        )
        total = sum(cost[i] for i in on_node[n])
        return (total / max(1, freed), n)

    order: list[int] = []
    seen: set[int] = set()
    for n in sorted(on_node, key=node_key):
        for i in sorted(on_node[n], key=lambda i: (cost[i], i)):
            if i not in seen:
                seen.add(i)
                order.append(i)
        if len(order) >= MAX_GREEDY_UNITS:  # as many as the other order offers
            break
    return order


def _greedy_choice(
    snapshot: Snapshot,
    g: GangRequest,
    units: Sequence[Unit],
    cost: Sequence[int],
    actions: Mapping[int, EvictAction],
    state: ClusterState,
    pdb_used: Mapping[str, int],
    rooms: Mapping[str, tuple[tuple[str, int], ...]],
    accepting: set[str],
) -> _Choice | None:
    """Evict the cheapest allowed units until the gang fits, then give back those it does not
    need (most expensive first). Leaves ``state`` as it found it. Budgets are respected as
    units are added; fairness rooms too.

    Trying a placement costs a greedy pass, so it is tried only once the whole free GPUs (or
    CPU) on the nodes the gang accepts could hold it, and at most :data:`MAX_GREEDY_TRIES`
    times."""
    useful = [i for i in actions if not units[i].nodes.isdisjoint(accepting)]

    def in_order(order: Sequence[int]) -> _Choice | None:
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
            return _Choice({i: actions[i] for i in gone}, set())
        finally:
            for i in list(reversed(gone)):
                give_back(i)

    # Kept up to date as units are taken and given back; each order gives back all it took,
    # so one serves both.
    need = _Need(g, state, accepting)
    best: _Choice | None = None
    # Two orders: cheapest units first (best when little room is needed), and node by node
    # (best when the gang needs whole nodes); the cheaper answer wins.
    cheapest = sorted(useful, key=lambda i: (cost[i], i))[:MAX_GREEDY_UNITS]
    for order in (cheapest, _node_order(useful, units, cost, state, accepting)):
        found = in_order(order)
        if found is not None and (best is None or _total(found, cost) < _total(best, cost)):
            best = found
    return best


# --- applying a choice ----------------------------------------------------------------------


def _apply(
    snapshot: Snapshot,
    g: GangRequest,
    units: Sequence[Unit],
    choice: _Choice,
    state: ClusterState,
    scorer: NodeScorer | None,
    settings: PlacementSettings,
) -> tuple[list[PodAssignment], int] | None:
    """Release the chosen units, place the gang, then place moved pods again (kept in
    ``state`` for this cycle only: their controllers recreate them, and the next cycle
    places the new pods). None, with ``state`` untouched, when any of it does not fit."""
    spread = settings.gpu_strategy == "spread"
    gone = [units[i] for i in (*choice.evict, *choice.move)]
    for u in gone:
        for p in u.pods:
            state.release(p.uid)
    result = place_gangs(state, [g], scorer, extras=False, spread_devices=spread)
    placed = result.assignments
    ok = g.key in result.placed
    moved: list[PodAssignment] = []
    if ok:
        for i in sorted(choice.move):
            u = units[i]
            pods = tuple(sorted(u.pods, key=pod_size, reverse=True))
            again = place_gangs(
                state,
                [GangRequest(u.gang, u.queue, u.priority, True, pods)],
                scorer,
                extras=False,
                spread_devices=spread,
            )
            moved += again.assignments
            if u.gang not in again.placed:
                ok = False
                break
    if not ok:
        for a in reversed([*placed, *moved]):
            state.release(a.pod_uid)
        for u in reversed(gone):
            for p in u.pods:
                state.restore_bound(p)
        return None
    return placed, len(moved)


def _amount(resources: Sequence[str], values: Mapping[str, int]) -> str:
    return ", ".join(
        f"{format_queue_amount(r, values.get(r, 0))} {'GPUs' if r == 'gpu' else r}"
        for r in resources
    )


def _evictions(
    snapshot: Snapshot,
    report: FairShareReport,
    book: QueueBook,
    g: GangRequest,
    u: Unit,
    action: EvictAction,
) -> list[Eviction]:
    """One :class:`Eviction` per pod of ``u``, with the sentence its Event carries."""
    tree = snapshot.queue_tree
    if action == "preempt" or (action == "shrink" and u.queue == g.queue):
        why = (
            f"preempted by gang {g.key} of priority {g.priority} (this gang has priority "
            f"{u.priority}) in queue {g.queue}"
        )
    elif action in ("reclaim", "shrink"):
        mine, theirs = branch_pair(tree, g.queue, u.queue)
        res = dominant(g.ask)
        why = (
            f"reclaimed by queue {g.queue} for gang {g.key}: {mine} is below its fair share "
            f"({_amount(res, used(report, book.charged, mine))} of "
            f"{_amount(res, fair(report, mine))}) and {theirs} above its own "
            f"({_amount(res, used(report, book.charged, theirs))} of "
            f"{_amount(res, fair(report, theirs))})"
        )
    else:
        why = f"moved to make room for gang {g.key}; it fits on other nodes and restarts there"
    if action == "shrink":
        why = f"elastic pod beyond minMember released: {why}"
    return [
        Eviction(p.uid, p.key, u.gang, u.queue, p.node_name or "", action, g.key, why)
        for p in u.pods
    ]
