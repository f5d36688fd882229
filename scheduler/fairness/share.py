"""Fair share of every queue, per resource, computed top-down through the queue tree.

At each level of the tree the parent's share (the cluster capacity for roots) is split among
the children in two stages, per resource:

1. *Quota*: each child gets ``min(quota, demand capped by limit)`` (``quota = -1`` deserves
   all of its capped demand). When the quotas of a level together exceed what the parent has,
   higher-priority children are served first and equal priorities share in proportion to what
   they deserve - the cluster never hands out more than it has.
2. *Over quota*: what remains goes to strictly higher queue priority first; among equal
   priorities it is water-filled by ``over_quota_weight``. A child never passes its limit or its
   demand; what a capped child cannot take is offered again to the others. Weight 0 gets
   nothing over quota.

Everything is integer arithmetic with a deterministic remainder rule (largest remainder, then
name), so the same snapshot always gives the same shares.

Demand of a leaf is what it holds (bound, active pods) plus what its pending pods ask for; a
parent's demand is the sum of its children's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.queue import QUEUE_RESOURCES, UNLIMITED, QueueFinding, QueueTree
from scheduler.cluster.resources import CPU, GPU, MEMORY
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness.findings import gang_findings
from scheduler.fairness.usage import QueueUsage, queue_usage

__all__ = [
    "FairShareReport",
    "QueueStatus",
    "ShareClaim",
    "cluster_capacity",
    "compute_fair_shares",
    "split_share",
    "water_fill",
]


def _zeros() -> dict[str, int]:
    return dict.fromkeys(QUEUE_RESOURCES, 0)


@dataclass(frozen=True)
class QueueStatus:
    """What one queue deserves and holds, per resource (gpu milli, cpu milli, memory bytes).

    ``requested`` is what the queue holds plus what its pending pods ask for (its demand);
    ``limit`` uses -1 for unlimited, ``quota`` -1 for "deserves all it asks".
    """

    name: str
    fair_share: dict[str, int] = field(default_factory=_zeros)
    allocated: dict[str, int] = field(default_factory=_zeros)
    requested: dict[str, int] = field(default_factory=_zeros)
    #: The part of ``allocated`` held by non-preemptible gangs (KAI: only this counts
    #: against quota when a non-preemptible gang asks; preemptible work can be reclaimed).
    allocated_non_preemptible: dict[str, int] = field(default_factory=_zeros)
    quota: dict[str, int] = field(default_factory=_zeros)
    limit: dict[str, int] = field(default_factory=lambda: dict.fromkeys(QUEUE_RESOURCES, -1))
    priority: int = 100
    #: Parent queue name ("" for a root); lets callers walk the hierarchy from the report.
    parent: str = ""
    children: tuple[str, ...] = ()
    over_quota_weight: dict[str, int] = field(default_factory=dict)
    creation_time: float = 0.0
    #: False for queues with a finding (broken tree); their fair share is zero.
    healthy: bool = True

    def _used(self, resource: str, extra: Mapping[str, int] | None) -> int:
        return self.allocated.get(resource, 0) + (extra.get(resource, 0) if extra else 0)

    def below_fair_share(self, extra: Mapping[str, int] | None = None) -> bool:
        """True when, with ``extra`` added, the queue is at or under its fair share in every
        resource and strictly under it in at least one."""
        under = False
        for r in QUEUE_RESOURCES:
            used, fair = self._used(r, extra), self.fair_share.get(r, 0)
            if used > fair:
                return False
            under = under or used < fair
        return under

    def within_fair_share(self, extra: Mapping[str, int] | None = None) -> bool:
        """True when, with ``extra`` added, no resource is over the queue's fair share."""
        return all(self._used(r, extra) <= self.fair_share.get(r, 0) for r in QUEUE_RESOURCES)

    def dominant_share(self, extra: Mapping[str, int] | None = None) -> float:
        """The largest ``used / fair_share`` over the resources (DRF relative to fair share).

        A resource the queue uses without any fair share of it counts as infinitely over.
        """
        worst = 0.0
        for r in QUEUE_RESOURCES:
            used, fair = self._used(r, extra), self.fair_share.get(r, 0)
            if used <= 0:
                continue
            if fair <= 0:
                return float("inf")
            worst = max(worst, used / fair)
        return worst


@dataclass(frozen=True)
class FairShareReport:
    """Fair shares of all queues plus everything that keeps gangs from being scheduled."""

    queues: dict[str, QueueStatus]
    capacity: dict[str, int]
    findings: tuple[QueueFinding, ...] = ()
    #: Gang key -> (reason_code, message) for pending gangs that must not be scheduled.
    gang_findings: dict[str, tuple[str, str]] = field(default_factory=dict)


def cluster_capacity(snapshot: Snapshot) -> dict[str, int]:
    """Allocatable of schedulable (Ready, not cordoned) nodes, in queue units."""
    total = _zeros()
    for node in snapshot.nodes:
        if not node.schedulable:
            continue
        total["gpu"] += node.allocatable[GPU] * GPU_MILLI
        total["cpu"] += node.allocatable[CPU]
        total["memory"] += node.allocatable[MEMORY]
    return total


def water_fill(amount: int, weights: Mapping[str, int], rooms: Mapping[str, int]) -> dict[str, int]:
    """Split ``amount`` by ``weights`` without giving anyone more than its ``room``.

    What a full member cannot take is split again among the others until the amount is gone
    or nobody has room. Integer rounding uses the largest remainder, ties broken by name.
    """
    given = dict.fromkeys(weights, 0)
    left = amount
    while left > 0:
        active = sorted(n for n, w in weights.items() if w > 0 and rooms[n] - given[n] > 0)
        if not active:
            break
        total_w = sum(weights[n] for n in active)
        portion = {n: left * weights[n] // total_w for n in active}
        spare = left - sum(portion.values())
        # Largest remainder first; all remainders share the denominator total_w.
        for n in sorted(active, key=lambda n: (-(left * weights[n] % total_w), n))[:spare]:
            portion[n] += 1
        capped = False
        for n in active:
            room = rooms[n] - given[n]
            take = min(room, portion[n])
            capped = capped or portion[n] >= room
            given[n] += take
            left -= take
        if not capped:
            break
    return given


@dataclass(frozen=True, slots=True)
class ShareClaim:
    """One child's standing in a split: what it deserves, its weight, its ceiling."""

    name: str
    quota: int
    weight: int
    cap: int
    priority: int


def split_share(total: int, claims: Iterable[ShareClaim]) -> dict[str, int]:
    """Split ``total`` among sibling queues (quota stage, then over-quota stage)."""
    items = list(claims)
    given = {c.name: 0 for c in items}
    left = total
    by_priority: dict[int, list[ShareClaim]] = defaultdict(list)
    for c in items:
        by_priority[c.priority].append(c)
    levels = sorted(by_priority, reverse=True)
    for prio in levels:
        want = {
            c.name: c.cap if c.quota == UNLIMITED else min(c.quota, c.cap)
            for c in by_priority[prio]
        }
        # Weighting by the amount deserved: all get it in full when it fits, else pro rata.
        got = water_fill(left, want, want)
        for n, v in got.items():
            given[n] += v
            left -= v
    for prio in levels:
        if left <= 0:
            break
        group = by_priority[prio]
        got = water_fill(
            left, {c.name: c.weight for c in group}, {c.name: c.cap - given[c.name] for c in group}
        )
        for n, v in got.items():
            given[n] += v
            left -= v
    return given


def _cap(demand: int, limit: int) -> int:
    return demand if limit == UNLIMITED else max(0, min(demand, limit))


def _fair_shares(
    tree: QueueTree, capacity: Mapping[str, int], demand: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, int]]:
    shares: dict[str, dict[str, int]] = {name: _zeros() for name in tree.queues}

    def claim(name: str, resource: str) -> ShareClaim:
        q = tree.queues[name].resource(resource)
        return ShareClaim(
            name=name,
            quota=q.quota,
            weight=max(0, q.over_quota_weight),
            cap=_cap(demand[name][resource], q.limit),
            priority=tree.queues[name].priority,
        )

    for resource in QUEUE_RESOURCES:
        level: list[tuple[int, list[str]]] = [(capacity[resource], tree.roots())]
        while level:
            total, names = level.pop()
            got = split_share(total, (claim(n, resource) for n in names))
            for n, v in got.items():
                shares[n][resource] = v
                kids = tree.children(n)
                if kids:
                    level.append((v, kids))
    return shares


def _demand(tree: QueueTree, usage: QueueUsage) -> dict[str, dict[str, int]]:
    """Leaf demand = held + pending asks; parent demand = its children's plus what it holds
    itself (pods wrongly submitted to a parent still occupy the cluster)."""
    out: dict[str, dict[str, int]] = {}

    def visit(name: str) -> dict[str, int]:
        kids = tree.children(name)
        if not kids:
            d = {r: usage.allocated[name][r] + usage.pending[name][r] for r in QUEUE_RESOURCES}
        else:
            d = dict(usage.allocated[name])
            for k in kids:
                kd = visit(k)
                for r in QUEUE_RESOURCES:
                    d[r] += kd[r]
        out[name] = d
        return d

    for root in tree.roots():
        visit(root)
    return out


def compute_fair_shares(snapshot: Snapshot) -> FairShareReport:
    """Fair share, usage and findings of every queue in ``snapshot``."""
    tree = snapshot.queue_tree
    capacity = cluster_capacity(snapshot)
    usage = queue_usage(snapshot)
    demand = _demand(tree, usage)
    shares = _fair_shares(tree, capacity, demand)
    broken = tree.broken
    statuses: dict[str, QueueStatus] = {}
    for name, q in tree.queues.items():
        healthy = name not in broken
        kids = tuple(tree.children(name)) if healthy else ()
        if kids:
            allocated, requested, pinned = _zeros(), _zeros(), _zeros()
            for k in _subtree(tree, name):
                leaf = not tree.children(k)
                for r in QUEUE_RESOURCES:
                    allocated[r] += usage.allocated[k][r]
                    pinned[r] += usage.non_preemptible[k][r]
                    requested[r] += usage.allocated[k][r] + (usage.pending[k][r] if leaf else 0)
        else:
            allocated = dict(usage.allocated[name])
            pinned = dict(usage.non_preemptible[name])
            requested = {
                r: usage.allocated[name][r] + usage.pending[name][r] for r in QUEUE_RESOURCES
            }
        statuses[name] = QueueStatus(
            name=name,
            fair_share=shares[name] if healthy else _zeros(),
            allocated=allocated,
            requested=requested,
            allocated_non_preemptible=pinned,
            quota={r: q.resource(r).quota for r in QUEUE_RESOURCES},
            limit={r: q.resource(r).limit for r in QUEUE_RESOURCES},
            priority=q.priority,
            parent=q.parent,
            children=kids,
            over_quota_weight={r: q.resource(r).over_quota_weight for r in QUEUE_RESOURCES},
            creation_time=q.creation_time,
            healthy=healthy,
        )
    return FairShareReport(
        queues=statuses,
        capacity=capacity,
        findings=tree.findings,
        gang_findings=gang_findings(snapshot),
    )


def _subtree(tree: QueueTree, name: str) -> list[str]:
    """``name`` and every queue below it (only called on healthy queues: no cycles)."""
    out: list[str] = []
    stack = [name]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(tree.children(n))
    return out
