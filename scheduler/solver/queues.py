"""Queue bookkeeping during one solve: what each queue was charged this cycle.

The rules themselves (limits at every level, quota for non-preemptible work) live in
:func:`scheduler.fairness.queue_admission_problem`, shared with the explainer, so the solver
and the messages users read cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import QUEUE_RESOURCES, QueueTree, pod_usage_triple
from scheduler.fairness import FairShareReport, queue_admission_problem

__all__ = ["QueueBook"]


class QueueBook:
    """Usage charged to queues (leaf and ancestors) by placements made in this cycle."""

    def __init__(self, tree: QueueTree, report: FairShareReport) -> None:
        self.tree = tree
        self.report = report
        self.charged: dict[str, dict[str, int]] = {}
        #: The non-preemptible part of ``charged``.
        self.pinned: dict[str, dict[str, int]] = {}

    def problem(
        self, queue: str, ask: Mapping[str, int], *, preemptible: bool
    ) -> tuple[str, str] | None:
        """(reason_code, message) if admitting ``ask`` to ``queue`` breaks a limit or quota."""
        return queue_admission_problem(
            self.tree,
            self.report,
            queue,
            ask,
            preemptible=preemptible,
            charged=self.charged,
            charged_pinned=self.pinned,
        )

    def charge(
        self, queue: str, ask: Mapping[str, int], sign: int = 1, *, preemptible: bool = True
    ) -> None:
        """Add (``sign`` = 1) or remove (-1) ``ask`` on the queue and all its ancestors."""
        chain = self.tree.ancestors(queue) if queue in self.tree else [queue]
        books = (self.charged,) if preemptible else (self.charged, self.pinned)
        for book in books:
            for name in chain:
                row = book.setdefault(name, dict.fromkeys(QUEUE_RESOURCES, 0))
                for r in QUEUE_RESOURCES:
                    row[r] += sign * ask.get(r, 0)

    def charge_many(self, charges: Iterable[tuple[str, Mapping[str, int], bool]]) -> None:
        """Add every (queue, usage, preemptible) of ``charges``, summed per leaf queue and
        flag first: one walk up a queue's ancestors per leaf instead of one per charge. The
        books end as if each had been charged on its own, in the same order."""
        per_leaf: dict[tuple[str, bool], dict[str, int]] = {}
        for queue, usage, preemptible in charges:
            row = per_leaf.setdefault((queue, preemptible), dict.fromkeys(QUEUE_RESOURCES, 0))
            for r in QUEUE_RESOURCES:
                row[r] += usage.get(r, 0)
        for (queue, preemptible), total in per_leaf.items():
            self.charge(queue, total, preemptible=preemptible)

    def charge_pods(self, charges: Iterable[tuple[str, Pod, bool]]) -> None:
        """:meth:`charge_many` of (queue, pod, preemptible): each pod's own queue usage,
        summed as tuples (a cycle charges every pod it placed: no dict per pod)."""
        per_leaf: dict[tuple[str, bool], list[int]] = {}
        for queue, pod, preemptible in charges:
            gpu, cpu, memory = pod_usage_triple(pod)
            row = per_leaf.get((queue, preemptible))
            if row is None:
                per_leaf[queue, preemptible] = [gpu, cpu, memory]
            else:
                row[0] += gpu
                row[1] += cpu
                row[2] += memory
        for (queue, preemptible), (gpu, cpu, memory) in per_leaf.items():
            self.charge(queue, {"gpu": gpu, "cpu": cpu, "memory": memory}, preemptible=preemptible)
