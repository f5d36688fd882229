"""The greedy pass: whole gangs in admission order, each pod on the best-scored node class.

It is the solver's fallback, the complete hint for CP-SAT, and (through :func:`place_gangs`)
the simulator's placement for per-pod trace replay.

For each gang (in the order given, which is the fairness admission order), the queue rules
are checked first; then each of its ``required`` pods, largest first, goes to the class with
the lowest :class:`~scheduler.framework.NodeScorer` score among the classes it fits and may
run on; if some pod fits nowhere, every pod of the gang is released again (all or nothing).
After all gangs, optional extras (pods beyond ``min_member``) are placed one by one.

Scores are cached per (pod shape, class): a class is an exact description of a node's free
state, so its score for a shape never changes. Per shape a lazy heap of classes gives the
best non-empty class in O(log classes).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import pod_queue_usage, pod_usage_triple
from scheduler.framework.filters import node_rules_allow
from scheduler.framework.scoring import (
    BatchScorer,
    DevicePicker,
    HoldsShares,
    NodeScorer,
    PodDemand,
    ScoreKey,
)
from scheduler.plugins.fragmentation import allowed_models
from scheduler.plugins.packing import PackingScorer
from scheduler.plugins.podtopology import NodeCheck, Preference
from scheduler.plugins.strand_guard import HELD_CODE
from scheduler.solver.placement import PodAssignment
from scheduler.solver.preferences import PER_CLASS_CANDIDATES, PREFERENCE_CANDIDATES, preferred
from scheduler.solver.queues import QueueBook
from scheduler.solver.state import ClassKey, ClusterState, NodeSlot, pick_devices, uses_node_name
from scheduler.solver.why_not import DETAILED_WHY_NOT, NO_FIT, node_check, why_not

__all__ = [
    "ClassIndex",
    "GangRequest",
    "GreedyResult",
    "ShapeKey",
    "place_extra_pods",
    "place_extras",
    "place_gangs",
    "pod_size",
    "shape_key",
    "shared_index",
]

log = structlog.get_logger(__name__)

#: Everything about a pod that decides where it may go and what it takes.
ShapeKey = tuple[object, ...]


def shape_key(pod: Pod) -> ShapeKey:
    """Pods with equal shape keys are interchangeable for placement.

    Pods with anti-affinity are a shape per gang: the CP-SAT patterns put at most one pod of
    a :attr:`~scheduler.cluster.pod.Pod.one_per_node` shape on a node, which keeps one
    gang's pods apart without keeping them from other gangs' pods.
    """
    return (*fit_key(pod), pod.gang if pod.pod_anti_affinity else "")


def fit_key(pod: Pod) -> ShapeKey:
    """Pods with equal fit keys fit and score the same on every node class (the class
    index ranks classes once per fit key; topology rules are checked on top)."""
    return (pod.requests, pod.gpu, pod.tolerations, pod.node_selector, pod.affinity)


def pod_size(pod: Pod) -> tuple[int, int, int]:
    """Sort key: GPU thousandths, CPU, memory (largest placed first)."""
    return pod_usage_triple(pod)


@dataclass(frozen=True, slots=True)
class GangRequest:
    """A pending gang as the placement passes see it.

    ``required`` pods are placed together or not at all (``min_member`` minus running
    members); ``extras`` are optional and go only after every gang.
    """

    key: str
    queue: str
    priority: int = 0
    preemptible: bool = True
    required: tuple[Pod, ...] = ()
    extras: tuple[Pod, ...] = ()
    #: Queue usage of the required pods (computed when not given).
    ask: Mapping[str, int] = field(default_factory=dict, compare=False)
    #: Moved by consolidation and restarting (:attr:`Snapshot.restoring`): admitted first,
    #: and once placed kept by the later stages.
    restoring: bool = False

    def __post_init__(self) -> None:
        if not self.ask:
            gpu = cpu = memory = 0
            for p in self.required:
                g, c, m = pod_usage_triple(p)
                gpu += g
                cpu += c
                memory += m
            # QUEUE_RESOURCES, in order
            object.__setattr__(self, "ask", {"gpu": gpu, "cpu": cpu, "memory": memory})


@dataclass
class GreedyResult:
    """Assignments per gang (required pods first, then extras) and why others failed."""

    placed: dict[str, list[PodAssignment]] = field(default_factory=dict)
    failed: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def assignments(self) -> list[PodAssignment]:
        """All assignments, gang by gang."""
        return [a for pods in self.placed.values() for a in pods]


@dataclass(frozen=True, slots=True)
class _ToScore:
    """A class a pod fits, with the devices it would take, waiting for its score."""

    slot: NodeSlot
    demand: PodDemand
    grant: tuple[tuple[int, int], ...]
    skey: object


@dataclass
class _ShapeHeap:
    """One pod shape's ranking; classes are named by their :class:`ClassIndex` id."""

    pod: Pod
    id: int
    heap: list[tuple[float, int, int]] = field(default_factory=list)
    in_heap: set[int] = field(default_factory=set)
    scores: dict[int, float | None] = field(default_factory=dict)
    cursor: int = 0


class ClassIndex:
    """Best class per pod shape over a :class:`ClusterState` that changes underneath."""

    def __init__(
        self, state: ClusterState, scorer: NodeScorer, *, spread_devices: bool = False
    ) -> None:
        self.state = state
        self.scorer = scorer
        self.picker = scorer if isinstance(scorer, DevicePicker) else None
        self.keyer = scorer if isinstance(scorer, ScoreKey) else None
        self.batch = scorer if isinstance(scorer, BatchScorer) else None
        self._scores: dict[object, float | None] = {}
        self.spread = spread_devices
        # Classes by a small int id of this index: every shape asks its sets and maps about
        # every new class, and a class key (a tuple of a node's free resources and devices)
        # is hashed anew each time (about 4 % of a 5,000-node cycle, before ids).
        self._ids: dict[ClassKey, int] = {}
        self._keys: list[ClassKey] = []
        #: ids of every class that became non-empty, in order (append-only; shapes keep a
        #: cursor)
        self.events: list[int] = []
        self._events_from_now()
        self._unsubscribe = state.subscribe(self._event)
        self.shapes: dict[ShapeKey, _ShapeHeap] = {}
        self._seq: dict[int, int] = {}
        self._accepts: dict[tuple[object, int], bool] = {}
        #: whether the last :meth:`best` found room that only the topology check refused
        self.refused_by_rules = False
        #: Holds shares back rather than strand idle devices (:mod:`~scheduler.plugins.
        #: strand_guard`), when the scorer does.
        self.holder = scorer if isinstance(scorer, HoldsShares) else None
        #: why the last :meth:`best` passed over room (the strand guard's reason), if it did
        self.held_reason: str | None = None
        #: the pod the last :meth:`best` ranked classes with: its shape's first pod, which
        #: takes what that pod does from every node (:func:`fit_key`)
        self.ranked_with: Pod | None = None

    def _events_from_now(self) -> None:
        """Start the event log from the classes the state has now."""
        self.events.clear()
        for key in self.state.classes:
            self._event(key)

    def _event(self, key: ClassKey) -> None:
        """Class ``key`` gained its first member."""
        i = self._ids.get(key)
        if i is None:
            i = self._ids[key] = len(self._keys)
            self._keys.append(key)
        self.events.append(i)

    def close(self) -> None:
        """Stop following the state."""
        self._unsubscribe()

    def forget_scores(self) -> None:
        """Drop every cached score (the scorer's notion of quality changed), and restart the
        event log from the classes that exist now so new rankings do not replay history."""
        self._scores.clear()
        self.shapes.clear()
        self._seq.clear()
        self._events_from_now()

    def grant(self, pod: Pod, demand: PodDemand, node: str) -> tuple[tuple[int, int], ...] | None:
        """Devices for ``pod`` on ``node`` (picker of the scorer, else the default packer)."""
        slot = self.state.nodes[node]
        if not demand.gpu_count:
            return ()
        if self.picker is not None:
            devices = self.picker.pick_devices(slot, demand)
        else:
            devices = pick_devices(
                slot.gpu_free, demand.gpu_count, demand.gpu_milli, spread=self.spread
            )
        if devices is None:
            return None
        return tuple((i, demand.gpu_milli) for i in devices)

    def _prepare(self, pod: Pod, shape: int, key: ClassKey) -> float | _ToScore | None:
        """What ranking ``pod`` on class ``key`` needs: None (it does not fit), a score
        known already, or the candidate still to score."""
        # Every device picker needs ``count`` devices with ``milli`` free each; the class key
        # holds the free devices sorted, so that is one comparison. Most classes that fail a
        # pod fail here (partly used devices), before a picker or scorer runs. A request by
        # GPU memory is sized per node: checked below, once its demand is known.
        gpu = pod.gpu
        devices = key[2]
        if gpu is not None and gpu.memory_mib is None and gpu.count:
            need = min(gpu.milli, GPU_MILLI)
            if len(devices) < gpu.count or devices[-gpu.count] < need:
                return None
        slot = self.state.representative(key)
        if slot is None:
            return None
        sig = (pod.tolerations, pod.node_selector, pod.affinity)
        ok = self._accepts.get((sig, slot.static_id))
        if ok is None:
            node = self.state.static_nodes[slot.static_id]
            ok = node_rules_allow(pod, node)
            self._accepts[(sig, slot.static_id)] = ok
        if not ok:
            return None
        demand = self.state.demand_on(pod, slot)
        if demand is None or not slot.fits(demand):
            return None
        count = demand.gpu_count
        by_memory = gpu is not None and gpu.memory_mib is not None
        if by_memory and count and (len(devices) < count or devices[-count] < demand.gpu_milli):
            return None
        skey: object = None
        if self.keyer is not None:
            # devices + static traits + what the scorer says it reads (see ScoreKey)
            skey = (shape, slot.static_id, devices, self.keyer.score_key(slot))
            if skey in self._scores:
                return self._scores[skey]
        grant = self.grant(pod, demand, slot.name)
        if grant is None:
            if self.keyer is not None:
                self._scores[skey] = None
            return None
        return _ToScore(slot, demand, grant, skey)

    def _evaluate_many(self, pod: Pod, shape: int, keys: Sequence[ClassKey]) -> list[float | None]:
        """Scores of ``pod`` on each class of ``keys`` (None where it does not fit). The
        candidates left to score go to the scorer in one call when it is a
        :class:`~scheduler.framework.scoring.BatchScorer`."""
        out: list[float | None] = []
        todo: list[tuple[int, _ToScore]] = []
        for key in keys:
            r = self._prepare(pod, shape, key)
            if isinstance(r, _ToScore):
                todo.append((len(out), r))
                r = None
            out.append(r)
        if not todo:
            return out
        candidates = [(t.slot, t.demand, t.grant) for _, t in todo]
        if self.batch is not None:
            scores = self.batch.score_many(candidates)
        else:
            scores = [self.scorer.score(*c) for c in candidates]
        for (i, t), score in zip(todo, scores, strict=True):
            out[i] = float(score)
            if self.keyer is not None:
                self._scores[t.skey] = out[i]
        return out

    def best(
        self, pod: Pod, accept: NodeCheck | None = None, prefer: Preference | None = None
    ) -> str | None:
        """Name of a node in the best class for ``pod``, or None when it fits nowhere.

        ``accept`` (a :class:`~scheduler.plugins.podtopology.PodTopology` check) must also
        allow the node; it is asked per member, best class first. ``prefer`` (the pod's
        preferences) chooses among the first :data:`PREFERENCE_CANDIDATES` allowed nodes
        in packing order (:func:`_preferred`).
        """
        skey = fit_key(pod)
        sh = self.shapes.get(skey)
        if sh is None:
            sh = self.shapes[skey] = _ShapeHeap(pod, len(self.shapes))
        self.ranked_with = sh.pod
        events, keys = self.events, self._keys
        classes = self.state.classes
        # New events in order; the classes never scored for this shape are scored together.
        order: list[int] = []
        fresh: list[int] = []
        taken: set[int] = set()
        in_heap, scores = sh.in_heap, sh.scores
        for i in events[sh.cursor :]:
            if i in in_heap or i in taken:
                continue
            if i not in scores:
                if keys[i] not in classes:
                    # Empty again by now: nothing to score. Caching "None" here would hide
                    # the class for good; it comes back as a new event when it regains a
                    # member.
                    continue
                fresh.append(i)
            taken.add(i)
            order.append(i)
        sh.cursor = len(events)
        if fresh:
            found = self._evaluate_many(sh.pod, sh.id, [keys[i] for i in fresh])
            for i, value in zip(fresh, found, strict=True):
                scores[i] = value
        for i in order:
            score = scores[i]
            if score is not None:
                seq = self._seq.setdefault(i, len(self._seq))
                heapq.heappush(sh.heap, (score, seq, i))
                in_heap.add(i)
        heap = sh.heap
        refused: list[tuple[float, int, int]] = []
        held: list[tuple[float, int, int]] = []
        guarded = self.holder is not None and _may_strand(pod) and self.holder.may_hold(pod)
        asked: dict[tuple[str | None, int], str | None] = {}
        self.held_reason = None
        seen: list[str] = []  # allowed candidates, in packing order (with ``prefer``)
        points: list[float | None] = []  # their kube-scheduler resource scores, if any
        try:
            while heap:
                key = keys[heap[0][2]]
                members = classes.get(key)
                if members:
                    if guarded and key[2] and key[2][-1] >= GPU_MILLI:
                        reason = self._held(pod, key, asked)
                        if reason is not None:
                            self.held_reason = reason
                            held.append(heapq.heappop(heap))
                            continue
                    if prefer is not None:
                        allowed = self._allowed(members, accept, PER_CLASS_CANDIDATES)
                        if allowed:
                            seen += allowed
                            points += [self._points(allowed[0], heap[0][0])] * len(allowed)
                        refused.append(heapq.heappop(heap))
                        if len(seen) >= PREFERENCE_CANDIDATES:
                            break
                        continue
                    if accept is None:
                        return next(iter(members))
                    node = self._accepted(members, accept)
                    if node is not None:
                        return node
                    refused.append(heapq.heappop(heap))
                    continue
                sh.in_heap.discard(heapq.heappop(heap)[2])
            return preferred(seen, prefer, points) if prefer is not None else None
        finally:
            for entry in (*refused, *held):  # for this pod only: the class stays ranked
                heapq.heappush(heap, entry)
            self.refused_by_rules = bool(refused) and not seen

    def _held(
        self, pod: Pod, key: ClassKey, asked: dict[tuple[str | None, int], str | None]
    ) -> str | None:
        """The strand guard's reason to keep ``pod`` off class ``key`` (a class with an idle
        device), from the device its picker would take there and the free room now.
        ``asked``: the guard's answers for an idle device per (model, thousandths) in this
        search (the room does not change during it)."""
        assert self.holder is not None
        slot = self.state.representative(key)
        demand = self.state.demand_on(pod, slot) if slot is not None else None
        if slot is None or demand is None or demand.gpu_count != 1:
            return None
        milli, model = demand.gpu_milli, slot.node.gpu_model
        if (model, milli) not in asked:
            room = self.state.gpu_room(allowed_models(pod))
            asked[(model, milli)] = self.holder.held(model, 1, milli, GPU_MILLI, room)
        reason = asked[(model, milli)]
        if reason is None or not any(milli <= f < GPU_MILLI for f in key[2]):
            return reason  # no partly used device fits: the picker can only take an idle one
        grant = self.grant(pod, demand, slot.name)
        return reason if grant and slot.gpu_free[grant[0][0]] >= GPU_MILLI else None

    def _points(self, node: str, score: float) -> float | None:
        """kube-scheduler's resource score of ``node`` from its class score, when the scorer
        ranks the node as kube-scheduler does (:meth:`PackingScorer.resource_points`)."""
        if not isinstance(self.scorer, PackingScorer):
            return None
        return self.scorer.resource_points(self.state.nodes[node], score)

    def _allowed(
        self, members: Mapping[str, None], accept: NodeCheck | None, limit: int
    ) -> list[str]:
        """Up to ``limit`` members ``accept`` allows (all of them when there is no check)."""
        out = []
        for node in members:
            if accept is None or accept(node) is None:
                out.append(node)
                if len(out) >= limit:
                    break
        return out

    def _accepted(self, members: Mapping[str, None], accept: NodeCheck) -> str | None:
        """The first member ``accept`` allows. Members share the labels the class keeps
        (:attr:`ClusterState.label_keys`); when the check reads only those, one answers for
        all, else each member is asked (hostname: nodes differ)."""
        kept = self.state.label_keys
        if kept is not None and accept.keys <= kept:
            first = next(iter(members))
            return first if accept(first) is None else None
        for node in members:
            if accept(node) is None:
                return node
        return None


def _may_strand(pod: Pod) -> bool:
    """Whether ``pod`` takes part of one device (what the strand guard looks at)."""
    gpu = pod.gpu
    return gpu is not None and gpu.count == 1 and not gpu.whole


def _place_pod(index: ClassIndex, pod: Pod, gang: str) -> PodAssignment | None:
    state = index.state
    accept = node_check(state, pod)
    prefer = (
        state.topology().preference(pod)
        if pod.preferences is not None or state.attractors > 0
        else None
    )
    node = index.best(pod, accept, prefer)
    if node is None:
        return None
    # The pod the shape was ranked with takes the same from every node (equal requests and
    # GPU ask; DRA aside), and its demand on this node's traits is known already: a pod's
    # own was computed here (about 5 us), then looked up again by apply.
    ranked = index.ranked_with if state.dra is None and index.ranked_with is not None else pod
    demand = state.demand_on(ranked, state.nodes[node])
    grant = index.grant(pod, demand, node) if demand is not None else None
    claims = state.claim_grants(pod, node)
    if demand is None or grant is None or claims is None:
        return None
    assignment = PodAssignment(pod.uid, pod.key, gang, node, grant, claims)
    state.apply(assignment, pod, demand)
    return assignment


def shared_index(
    state: ClusterState,
    scorer: NodeScorer,
    gangs: Sequence[GangRequest],
    *,
    spread_devices: bool = False,
) -> ClassIndex:
    """A :class:`ClassIndex` for several :func:`place_gangs` passes over ``gangs`` on
    ``state`` with ``scorer`` (the caller closes it). Nodes are split by name first when a pod
    selects one by name, as :func:`place_gangs` would do: that rebuilds every class, which an
    index made before could not follow."""
    _split_if_named(state, gangs)
    return ClassIndex(state, scorer, spread_devices=spread_devices)


def _split_if_named(state: ClusterState, gangs: Sequence[GangRequest]) -> None:
    """Give every node of ``state`` its own class when a pod of ``gangs`` selects nodes by
    name (idempotent)."""
    if any(uses_node_name(p) for g in gangs for p in (*g.required, *g.extras)):
        state.split_by_name()


def place_gangs(
    state: ClusterState,
    gangs: Sequence[GangRequest],
    scorer: NodeScorer | None = None,
    *,
    book: QueueBook | None = None,
    extras: bool = True,
    spread_devices: bool = False,
    cycle: int | None = None,
    index: ClassIndex | None = None,
) -> GreedyResult:
    """Place ``gangs`` in the given order onto ``state`` (which is changed in place).

    ``scorer`` defaults to binpack (:class:`~scheduler.plugins.packing.PackingScorer`).
    ``index``: a :class:`ClassIndex` over ``state`` kept by the caller across passes (a
    replay placing one pod per pass), so node classes are not re-ranked from scratch each
    time; it must use the same scorer, and the caller closes it.
    ``book`` applies queue limits and non-preemptible quota (None: no queue rules, e.g. for
    a simulator that checks them itself). The returned assignments are already applied to
    ``state``; release them with :meth:`ClusterState.release` to undo.
    """
    _split_if_named(state, gangs)
    own_index = index is None
    if index is None:
        index = ClassIndex(state, scorer or PackingScorer(), spread_devices=spread_devices)
    elif index.state is not state:
        raise ValueError("place_gangs: the index must follow the state being placed onto")
    result = GreedyResult()
    # shape signature -> why it failed (the strand guard's reason, or no room)
    failed_shapes: dict[tuple[int, ...], tuple[str, str]] = {}
    explained = 0
    interned: dict[ShapeKey, int] = {}
    try:
        for gang in gangs:
            ask = gang.ask
            if book is not None and gang.required:
                problem = book.problem(gang.queue, ask, preemptible=gang.preemptible)
                if problem is not None:
                    result.failed[gang.key] = problem
                    continue
            pods = sorted(gang.required, key=pod_size, reverse=True)
            # Capacity only shrinks during this pass, so a set of shapes that failed once
            # fails again: skip the attempt.
            signature = tuple(
                sorted(interned.setdefault(shape_key(p), len(interned)) for p in pods)
            )
            # Where other pods run can open room for pods with topology rules (affinity to
            # a pod placed since, a spread minimum raised): no skipping for them.
            # Devices of claims are not part of the shape either.
            ruled = any(state.needs_topology(p) or state.needs_devices(p) for p in pods)
            if signature in failed_shapes and not ruled:
                result.failed[gang.key] = failed_shapes[signature]
                continue
            done: list[PodAssignment] = []
            for pod in pods:
                a = _place_pod(index, pod, gang.key)
                if a is None:
                    break
                done.append(a)
            if len(done) < len(pods):
                # Asked before the gang's placed pods leave: they may be what refuses it.
                why = None
                if ruled:
                    detailed = explained < DETAILED_WHY_NOT
                    explained += 1
                    why = why_not(index, pods[len(done)], len(done), len(pods), detailed=detailed)
                for a in reversed(done):
                    state.release(a.pod_uid)
                if why is not None:
                    result.failed[gang.key] = why
                    continue
                held = index.held_reason
                failed_shapes[signature] = result.failed[gang.key] = (
                    (HELD_CODE, f"pod {pods[len(done)].key}: {held}")
                    if held is not None
                    else (NO_FIT, "no room for the whole gang")
                )
                log.debug("gang_not_placed", gang=gang.key, queue=gang.queue, cycle=cycle)
                continue
            result.placed[gang.key] = done
            if book is not None:
                book.charge(gang.queue, ask, preemptible=gang.preemptible)
        if extras:
            for key, more in place_extras(index, gangs, set(result.placed), book).items():
                result.placed.setdefault(key, []).extend(more)
                result.failed.pop(key, None)
    finally:
        if own_index:
            index.close()
    return result


def place_extras(
    index: ClassIndex,
    gangs: Sequence[GangRequest],
    admitted: set[str],
    book: QueueBook | None,
) -> dict[str, list[PodAssignment]]:
    """Optional pods of admitted gangs (and of gangs that need nothing more), one by one,
    in gang order; each is checked against the queue rules on its own."""
    out: dict[str, list[PodAssignment]] = {}
    for gang in gangs:
        if not gang.extras or (gang.required and gang.key not in admitted):
            continue
        for pod in sorted(gang.extras, key=pod_size, reverse=True):
            ask: Mapping[str, int] = pod_queue_usage(pod)
            if book is not None and book.problem(gang.queue, ask, preemptible=gang.preemptible):
                continue
            a = _place_pod(index, pod, gang.key)
            if a is None:
                continue
            out.setdefault(gang.key, []).append(a)
            if book is not None:
                book.charge(gang.queue, ask, preemptible=gang.preemptible)
    return out


def place_extra_pods(
    state: ClusterState,
    gangs: Sequence[GangRequest],
    admitted: set[str],
    scorer: NodeScorer | None = None,
    *,
    book: QueueBook | None = None,
    spread_devices: bool = False,
) -> dict[str, list[PodAssignment]]:
    """:func:`place_extras` on a state, with its own class index."""
    index = ClassIndex(state, scorer or PackingScorer(), spread_devices=spread_devices)
    try:
        return place_extras(index, gangs, admitted, book)
    finally:
        index.close()
