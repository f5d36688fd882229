"""Gangs that can *never* be placed as the cluster and queues stand, told apart from gangs that
fit once something frees up.

Two questions, asked before any about what is free now:

- :func:`queue_never_problem`: the gang alone asks more than its queue's (or an ancestor's)
  limit - or, non-preemptible, more than the quota - so no amount of waiting admits it.
- :class:`ClusterLimits`: with nothing else running, the nodes the gang's pods may use cannot
  hold it: a pod larger than every such node (``NodeTooSmall``), the gang's total (pod slots,
  GPUs, cpu, memory, any resource) above what those nodes have, or no way to pack its pods
  onto them node by node.

Each message says what is asked and what there is, and what to change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import Pod
from scheduler.cluster.quantity import format_milli
from scheduler.cluster.queue import UNLIMITED, QueueTree
from scheduler.cluster.resources import GPU, PODS
from scheduler.explain.capacity import FreeCapacity, Matching, Rules, Shape, pod_fits, share_milli
from scheduler.explain.codes import EXCEEDS_CLUSTER, EXCEEDS_QUEUE_LIMIT, EXCEEDS_QUEUE_QUOTA
from scheduler.explain.fit import emptied, free_pod_slots, pack_group, pod_misfit
from scheduler.explain.format import format_amount, format_bytes, format_gpus
from scheduler.fairness.admission import format_queue_amount
from scheduler.fairness.share import FairShareReport

__all__ = ["ClusterLimits", "queue_never_problem"]


def _queue_ask(resource: str, value: int) -> str:
    """A queue amount with its resource: ``40 GPUs``, ``48 cpu``, ``4000MB memory``."""
    if resource == "gpu":
        return f"{format_milli(value)} GPU" + ("" if value == GPU_MILLI else "s")
    return f"{format_queue_amount(resource, value)} {resource}"


def queue_never_problem(
    tree: QueueTree,
    report: FairShareReport,
    key: str,
    queue: str,
    ask: Mapping[str, int],
    *,
    preemptible: bool,
) -> tuple[str, str] | None:
    """(code, message) when the gang's ``ask`` (queue units) alone is above the limit of
    ``queue`` or an ancestor, or - for non-preemptible work - above a quota; else None."""
    chain = tree.ancestors(queue) if queue in tree else [queue]
    for name in chain:
        status = report.queues.get(name)
        if status is None:
            continue
        for r, limit in sorted(status.limit.items()):
            need = ask.get(r, 0)
            if limit != UNLIMITED and need > limit:
                return (
                    EXCEEDS_QUEUE_LIMIT,
                    f"gang {key} can never be admitted: it asks {_queue_ask(r, need)}, queue "
                    f"{name}'s limit is {_queue_ask(r, limit)}; raise the limit or make the "
                    "gang smaller",
                )
    if preemptible or queue not in tree:
        return None
    for name in chain:
        if name not in tree:
            continue
        for r, settings in tree.queues[name].resources:
            need = ask.get(r, 0)
            if settings.quota != UNLIMITED and need > settings.quota:
                return (
                    EXCEEDS_QUEUE_QUOTA,
                    f"gang {key} can never be admitted: it is non-preemptible and asks "
                    f"{_queue_ask(r, need)}, queue {name}'s quota is "
                    f"{_queue_ask(r, settings.quota)} (non-preemptible work may only use "
                    "quota); raise the quota or make the gang preemptible",
                )
    return None


def _total(resource: str, value: int) -> str:
    """A cluster total in node units, named: ``12 pod slots``, ``32 GPUs``, ``128 cpu``."""
    if resource == PODS:
        return f"{value} pod slot" + ("" if value == 1 else "s")
    return format_amount(resource, value)


def _have(resource: str, value: int) -> str:
    if resource == GPU:
        return str(value)
    if resource == "cpu":
        return format_milli(value)
    if resource in ("memory", "ephemeral-storage"):
        return format_bytes(value)
    return str(value)


class ClusterLimits:
    """Answers "could this gang ever fit the nodes its pods may use?" for one cluster state
    (only the nodes' allocatable counts, so ``free`` before or after the cycle is the same).
    The emptied node shapes are computed once per set of placement rules."""

    def __init__(self, free: FreeCapacity) -> None:
        self.free = free
        self._empty: dict[Rules, Counter[Shape]] = {}
        #: Per set of placement rules: pod slots and devices of the matching nodes, and
        #: their allocatable totals by resource (filled as resources are asked about).
        self._totals: dict[Rules, tuple[int | None, int, dict[str, int]]] = {}

    def _shapes(self, rules: Rules, m: Matching) -> Counter[Shape]:
        found = self._empty.get(rules)
        if found is None:
            found = self._empty[rules] = emptied(m.shapes)
        return found

    def problem(self, key: str, groups: Mapping[Rules, Sequence[Pod]]) -> tuple[str, str] | None:
        """(code, message) when the gang of ``groups`` (its pods by placement rules) can
        never fit its matching nodes, else None. Groups without any matching node are left
        to the NoMatchingNode check (a node may come back or be labelled)."""
        for rules, group in groups.items():
            m = self.free.matching(rules)
            if not m.shapes:
                continue
            shapes = self._shapes(rules, m)
            for p in group:
                if not any(pod_fits(p, s) for s in shapes):
                    return pod_misfit(p, m)
            short = self._shortfall(key, group, m, shapes, rules)
            if short is not None:
                return (EXCEEDS_CLUSTER, short)
            if not pack_group(group, shapes):
                return (
                    EXCEEDS_CLUSTER,
                    f"gang {key} can never fit {self._where(m)}: its {len(group)} pods are "
                    "within the nodes' total capacity but cannot be packed onto them node by "
                    "node, even with nothing else running; use larger nodes or make the gang "
                    "smaller",
                )
        return None

    def _where(self, m: Matching) -> str:
        nodes = sum(m.shapes.values())
        if nodes + m.unschedulable >= self.free.node_count:
            return "this cluster"
        return f"the {nodes} nodes its pods may use"

    def _shortfall(
        self, key: str, group: Sequence[Pod], m: Matching, shapes: Counter[Shape], rules: Rules
    ) -> str | None:
        count = len(group)
        totals: Counter[str] = Counter()
        for p in group:
            for r, v in p.requests.items():
                if r != GPU:
                    totals[r] += v
        # What the matching nodes have depends on the rules only: once per set of rules
        # (asked for every class of gangs left out in a cycle).
        known = self._totals.get(rules)
        if known is None:
            known = self._totals[rules] = (
                free_pod_slots(m, empty=True),
                sum(n * len(s.gpu_free) for s, n in shapes.items()),
                {},
            )
        slots, devices, allocatable = known
        need: list[tuple[str, int, int]] = []  # (resource, asked, what the nodes have)
        if slots is not None:
            need.append((PODS, count, slots))
        whole = sum(
            p.requests[GPU] if p.gpu is None else p.gpu.count if p.gpu.whole else 0 for p in group
        )
        shared = 0
        for p in group:
            if p.gpu is not None and not p.gpu.whole:
                sizes = [share_milli(p.gpu, s.gpu_memory_mib) for s in shapes]
                shared += p.gpu.count * min((x for x in sizes if x is not None), default=0)
        for r, v in sorted(totals.items()):
            total = allocatable.get(r)
            if total is None:
                total = allocatable[r] = sum(n * s.allocatable_of(r) for s, n in shapes.items())
            need.append((r, v, total))
        where = self._where(m)
        holder, has = ("the cluster", "has") if where == "this cluster" else ("they", "have")
        off = ""
        if m.unschedulable:
            nodes = "node is" if m.unschedulable == 1 else "nodes are"
            off = f" ({m.unschedulable} more matching {nodes} cordoned or NotReady)"
        tail = "; add nodes or make the gang smaller"
        if whole > devices:
            return (
                f"gang {key} can never fit {where}: it needs {format_gpus(whole)} across {count} "
                f"pods together, {holder} {has} {devices}{off}{tail}"
            )
        if shared and whole * GPU_MILLI + shared > devices * GPU_MILLI:
            return (
                f"gang {key} can never fit {where}: it needs "
                f"{format_milli(whole * GPU_MILLI + shared)} GPUs across {count} pods together, "
                f"{holder} {has} {devices}{off}{tail}"
            )
        for r, asked, total in need:
            if asked > total:
                return (
                    f"gang {key} can never fit {where}: it needs {_total(r, asked)} across "
                    f"{count} pods together, {holder} {has} {_have(r, total)}{off}{tail}"
                )
        return None
