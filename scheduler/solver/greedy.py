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

from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import QUEUE_RESOURCES, pod_queue_usage
from scheduler.cluster.selectors import node_accepts
from scheduler.framework.scoring import DevicePicker, NodeScorer, PodDemand, ScoreKey
from scheduler.plugins.packing import PackingScorer
from scheduler.solver.placement import PodAssignment
from scheduler.solver.queues import QueueBook
from scheduler.solver.state import ClassKey, ClusterState, pick_devices, uses_node_name

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
]

log = structlog.get_logger(__name__)

#: Everything about a pod that decides where it may go and what it takes.
ShapeKey = tuple[object, ...]

NO_FIT = "NoFit"


def shape_key(pod: Pod) -> ShapeKey:
    """Pods with equal shape keys are interchangeable for placement."""
    return (pod.requests, pod.gpu, pod.tolerations, pod.node_selector, pod.affinity)


def pod_size(pod: Pod) -> tuple[int, int, int]:
    """Sort key: GPU thousandths, CPU, memory (largest placed first)."""
    use = pod_queue_usage(pod)
    return (use["gpu"], use["cpu"], use["memory"])


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

    def __post_init__(self) -> None:
        if not self.ask:
            total = dict.fromkeys(QUEUE_RESOURCES, 0)
            for p in self.required:
                for r, v in pod_queue_usage(p).items():
                    total[r] += v
            object.__setattr__(self, "ask", total)


@dataclass
class GreedyResult:
    """Assignments per gang (required pods first, then extras) and why others failed."""

    placed: dict[str, list[PodAssignment]] = field(default_factory=dict)
    failed: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def assignments(self) -> list[PodAssignment]:
        """All assignments, gang by gang."""
        return [a for pods in self.placed.values() for a in pods]


@dataclass
class _ShapeHeap:
    pod: Pod
    id: int
    heap: list[tuple[float, int, ClassKey]] = field(default_factory=list)
    in_heap: set[ClassKey] = field(default_factory=set)
    scores: dict[ClassKey, float | None] = field(default_factory=dict)
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
        self._scores: dict[object, float | None] = {}
        self.spread = spread_devices
        #: every key that became non-empty, in order (append-only; shapes keep a cursor)
        self.events: list[ClassKey] = list(state.classes)
        self._unsubscribe = state.subscribe(self.events.append)
        self.shapes: dict[ShapeKey, _ShapeHeap] = {}
        self._seq: dict[ClassKey, int] = {}
        self._accepts: dict[tuple[object, int], bool] = {}

    def close(self) -> None:
        """Stop following the state."""
        self._unsubscribe()

    def forget_scores(self) -> None:
        """Drop every cached score (the scorer's notion of quality changed), and restart the
        event log from the classes that exist now so new rankings do not replay history."""
        self._scores.clear()
        self.shapes.clear()
        self._seq.clear()
        self.events[:] = list(self.state.classes)  # same list: the subscription appends to it

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

    def _evaluate(self, pod: Pod, shape: int, key: ClassKey) -> float | None:
        slot = self.state.representative(key)
        if slot is None:
            return None
        sig = (pod.tolerations, pod.node_selector, pod.affinity)
        ok = self._accepts.get((sig, slot.static_id))
        if ok is None:
            node = self.state.static_nodes[slot.static_id]
            ok = node_accepts(node, pod.tolerations, pod.node_selector, pod.affinity)
            self._accepts[(sig, slot.static_id)] = ok
        if not ok:
            return None
        demand = self.state.demand_on(pod, slot)
        if demand is None or not slot.fits(demand):
            return None
        skey: object = None
        if self.keyer is not None:
            # devices + static traits + what the scorer says it reads (see ScoreKey)
            skey = (shape, slot.static_id, key[2], self.keyer.score_key(slot))
            if skey in self._scores:
                return self._scores[skey]
        grant = self.grant(pod, demand, slot.name)
        score = None if grant is None else float(self.scorer.score(slot, demand, grant))
        if self.keyer is not None:
            self._scores[skey] = score
        return score

    def best(self, pod: Pod) -> str | None:
        """Name of a node in the best class for ``pod``, or None when it fits nowhere."""
        skey = shape_key(pod)
        sh = self.shapes.get(skey)
        if sh is None:
            sh = self.shapes[skey] = _ShapeHeap(pod, len(self.shapes))
        events = self.events
        while sh.cursor < len(events):
            key = events[sh.cursor]
            sh.cursor += 1
            if key in sh.in_heap:
                continue
            if key in sh.scores:
                score = sh.scores[key]
            elif key not in self.state.classes:
                # Empty again by now: nothing to score. Caching "None" here would hide the
                # class for good; it comes back as a new event when it regains a member.
                continue
            else:
                score = sh.scores[key] = self._evaluate(sh.pod, sh.id, key)
            if score is not None:
                seq = self._seq.setdefault(key, len(self._seq))
                heapq.heappush(sh.heap, (score, seq, key))
                sh.in_heap.add(key)
        classes = self.state.classes
        heap = sh.heap
        while heap:
            key = heap[0][2]
            members = classes.get(key)
            if members:
                return next(iter(members))
            heapq.heappop(heap)
            sh.in_heap.discard(key)
        return None


def _place_pod(index: ClassIndex, pod: Pod, gang: str) -> PodAssignment | None:
    state = index.state
    node = index.best(pod)
    if node is None:
        return None
    demand = state.demand_on(pod, state.nodes[node])
    grant = index.grant(pod, demand, node) if demand is not None else None
    if demand is None or grant is None:
        return None
    assignment = PodAssignment(pod.uid, pod.key, gang, node, grant)
    state.apply(assignment, pod)
    return assignment


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
    if any(uses_node_name(p) for g in gangs for p in (*g.required, *g.extras)):
        state.split_by_name()
    own_index = index is None
    if index is None:
        index = ClassIndex(state, scorer or PackingScorer(), spread_devices=spread_devices)
    elif index.state is not state:
        raise ValueError("place_gangs: the index must follow the state being placed onto")
    result = GreedyResult()
    failed_shapes: set[tuple[int, ...]] = set()
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
            if signature in failed_shapes:
                result.failed[gang.key] = (NO_FIT, "no room for the whole gang")
                continue
            done: list[PodAssignment] = []
            for pod in pods:
                a = _place_pod(index, pod, gang.key)
                if a is None:
                    break
                done.append(a)
            if len(done) < len(pods):
                for a in reversed(done):
                    state.release(a.pod_uid)
                failed_shapes.add(signature)
                result.failed[gang.key] = (NO_FIT, "no room for the whole gang")
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
