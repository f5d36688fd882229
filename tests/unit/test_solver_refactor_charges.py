"""The solver refactor keeps its results: :meth:`QueueBook.charge_many` books what charging
one by one books, the explainer's queue charges are the solver's, and one pass over the
topology rules gives both sets of gangs :func:`topology_gangs` gives."""

from __future__ import annotations

import random
from typing import Any

from scheduler.bench.synthetic import make_gang, make_node, make_pod
from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import Pod
from scheduler.cluster.podaffinity import (
    HOSTNAME_LABEL,
    LabelSelector,
    PodAffinityTerm,
    SpreadConstraint,
)
from scheduler.cluster.queue import Queue, pod_queue_usage
from scheduler.cluster.snapshot import Snapshot
from scheduler.explain.reasons import _Explainer
from scheduler.fairness import compute_fair_shares
from scheduler.solver import PodAssignment, QueueBook
from scheduler.solver.problem import build_problem
from scheduler.solver.ruled_gangs import topology_gang_sets, topology_gangs

QUEUES = (
    Queue("root"),
    Queue("a", "root"),
    Queue("b", "root"),
    Queue("a1", "a"),
    Queue("a2", "a"),
)


def _book() -> QueueBook:
    snap = Snapshot((), (), (), QUEUES)
    return QueueBook(snap.queue_tree, compute_fair_shares(snap))


def _rows(book: QueueBook) -> tuple[list[Any], list[Any]]:
    """The books with their order (queues and resources) kept."""
    return (
        [(q, list(row.items())) for q, row in book.charged.items()],
        [(q, list(row.items())) for q, row in book.pinned.items()],
    )


def test_charge_many_books_what_charging_one_by_one_books() -> None:
    rng = random.Random(7)
    queues = ["a1", "a2", "b", "a", "unknown"]
    for _ in range(50):
        charges = [
            (
                rng.choice(queues),
                {"gpu": rng.randrange(0, 4000), "cpu": rng.randrange(0, 9000)},
                rng.random() < 0.6,
            )
            for _ in range(rng.randrange(0, 12))
        ]
        one_by_one = _book()
        for queue, usage, preemptible in charges:
            one_by_one.charge(queue, usage, preemptible=preemptible)
        at_once = _book()
        at_once.charge_many(iter(charges))
        assert _rows(at_once) == _rows(one_by_one)


def test_explainer_charges_are_the_solver_book_charges() -> None:
    """Pods of preemptible, non-preemptible and unknown gangs (these count as preemptible
    against the pod's own queue); assignments of pods not in the snapshot are left out."""
    soft, soft_pods = make_gang("soft", 2, queue="a1", gpus=1)
    hard, hard_pods = make_gang("hard", 2, queue="a2", priority=100, cpu=3)
    loose = make_pod("loose", gang="default/gone", queue="b", gpus=2)
    pods: list[Pod] = [*soft_pods, *hard_pods, loose]
    snap = Snapshot((make_node("n0"),), tuple(pods), (soft, hard), QUEUES)
    report = compute_fair_shares(snap)
    assignments = [PodAssignment(p.uid, p.key, p.gang, "n0") for p in pods]
    assignments.append(PodAssignment("missing", "default/missing", "default/soft", "n0"))
    explainer = _Explainer(snap, report, assignments)
    book = QueueBook(snap.queue_tree, report)
    for p in pods:
        gang = snap.gang_by_key.get(p.gang)
        queue = gang.queue if gang is not None else p.queue
        book.charge(queue, pod_queue_usage(p), preemptible=gang is None or gang.preemptible)
    assert explainer.charged == book.charged
    assert explainer.pinned == book.pinned
    assert set(explainer.pinned) == {"a2", "a", "root"}
    assert explainer.placed_in == {"a1": 2, "a2": 2, "b": 1}


def test_one_pass_gives_both_sets_of_topology_gangs() -> None:
    def apart(job: str) -> dict[str, Any]:
        term = PodAffinityTerm(HOSTNAME_LABEL, LabelSelector((("job", job),)))
        return {"labels": {"job": job}, "anti_affinity": (term,)}

    spread = SpreadConstraint(1, "zone", LabelSelector((("app", "web"),)))
    web, web_pods = make_gang("web", 2, queue="a1", labels={"app": "web"}, spread=(spread,))
    other, other_pods = make_gang("other", 1, queue="a1", labels={"app": "web"})
    free, free_pods = make_gang("free", 1, queue="a1", labels={"app": "db"})
    own, own_pods = make_gang("own", 2, queue="a1", **apart("own"))
    nodes = tuple(make_node(f"n{i}", gpus=0, labels={HOSTNAME_LABEL: f"n{i}"}) for i in range(4))
    gangs: tuple[Gang, ...] = (web, other, free, own)
    snap = Snapshot(nodes, (*web_pods, *other_pods, *free_pods, *own_pods), gangs, QUEUES)
    problem = build_problem(snap, compute_fair_shares(snap))
    found = topology_gang_sets(snap, problem)
    assert found.left_to_greedy == {"default/web", "default/other"}
    assert found.ruled == {"default/web", "default/other", "default/own"}
    assert topology_gangs(snap, problem) == set(found.left_to_greedy)
    assert topology_gangs(snap, problem, expressed=True) == set(found.ruled)
    # No rule at all: both sets are empty.
    plain = Snapshot(nodes, tuple(free_pods), (free,), QUEUES)
    nothing = topology_gang_sets(plain, build_problem(plain, compute_fair_shares(plain)))
    assert nothing.ruled == nothing.left_to_greedy == frozenset()
