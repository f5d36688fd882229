"""Running work as eviction candidates, and the rules that say who may evict whom.

A *unit* is what one eviction decision covers: a whole running gang (all its active pods:
gangs stay whole), or one pod of an elastic gang beyond ``minMember`` (a shrink). Units are
built once per solve from the snapshot; :func:`action_for` decides, per pending gang, whether
a unit may be taken for it and under which rule (docs/taking-back.md):

- ``preempt``: same leaf queue, strictly lower gang priority;
- ``reclaim``: another queue; compared where the two branches of the queue tree meet, the
  reclaimer's branch stays within its fair share with the gang added, and the victim's branch
  is above its own (the model then caps what is taken at that excess: no ping-pong); never
  from a queue that is not reclaimable, or below one on the victim's side of the branch
  (Volcano's ``reclaimable: false``);
- ``shrink``: a pod beyond ``minMember`` under either rule above;
- only preemptible gangs that have run at least their queue's min runtime are victims, and
  only pending gangs past their preemption delay, whose PriorityClass allows preemption,
  evict anyone.

Fairness is compared in the gang's dominant accelerator: GPUs for gangs that ask for GPUs,
else CPU and memory.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import cached_property

from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import QUEUE_RESOURCES, QueueTree, pod_queue_usage
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import FairShareReport
from scheduler.solver.greedy import GangRequest
from scheduler.solver.placement import EvictAction

__all__ = [
    "RESTART_SECONDS",
    "Unit",
    "action_for",
    "actions_for",
    "branch_pair",
    "build_units",
    "dominant",
    "may_evict",
    "queue_rule",
    "reclaimable",
]

#: What a restart costs a victim beyond the work it loses (image pull, checkpoint load), in
#: seconds of its resources: it keeps "evict the least work" from choosing a large gang that
#: has only just started over a small one.
RESTART_SECONDS = 300


@dataclass(frozen=True)
class Unit:
    """Pods that are evicted together (see module docstring)."""

    id: int
    gang: str
    queue: str
    priority: int
    pods: tuple[Pod, ...]
    #: True: every active pod of the gang; False: one elastic pod beyond minMember.
    whole: bool
    started: float
    usage: Mapping[str, int] = field(default_factory=dict)

    @cached_property
    def nodes(self) -> frozenset[str]:
        """Nodes this unit's pods run on (asked for per unit and per gang: computed once)."""
        return frozenset(p.node_name for p in self.pods if p.node_name)

    def work(self, now: float) -> int:
        """GPU-seconds (GPU tenths x seconds) of this unit, restart included; CPU-only units
        count CPU cores instead, so they are comparable within their kind."""
        # Asked once per unit and cycle (:func:`.takeback_model.unit_costs` keeps the costs
        # for every gang of the cycle): computed, not remembered.
        seconds = max(0.0, now - self.started) + RESTART_SECONDS
        usage = self.usage
        gpu_tenths = usage.get("gpu", 0) // 100
        amount = gpu_tenths if gpu_tenths > 0 else max(1, usage.get("cpu", 0) // 1000)
        return int(amount * seconds)


def dominant(ask: Mapping[str, int]) -> tuple[str, ...]:
    """Resources fairness is compared in for a gang asking ``ask``."""
    return ("gpu",) if ask.get("gpu", 0) > 0 else ("cpu", "memory")


def build_units(snapshot: Snapshot) -> list[Unit]:
    """Every running, preemptible, managed gang as a whole unit, plus one shrink unit per pod
    of an elastic gang beyond ``minMember`` (the most recently started pods go first)."""
    running: dict[str, list[Pod]] = defaultdict(list)
    # Gangs with a pod already being taken down, from the same pass (rather than a look at
    # each gang's pods afterwards: the snapshot holds every running pod of the cluster).
    deleting: set[str] = set()
    nodes = snapshot.node_by_name
    for p in snapshot.pods:
        if p.deleting:
            if p.gang:
                deleting.add(p.gang)
            continue
        # A pod whose node is gone frees nothing when evicted (see queue_usage).
        if p.managed and p.node_name in nodes and p.active and not p.nominated:
            running[p.gang].append(p)
    units: list[Unit] = []
    gangs = snapshot.gang_by_key
    new_unit, set_field = object.__new__, object.__setattr__
    for key in sorted(running):
        gang = gangs.get(key)
        if gang is None or not gang.preemptible:
            continue
        if key in deleting:
            continue  # already being taken down: its space is on its way back
        pods = running[key]
        if len(pods) == 1 and gang.min_member >= 1:
            # Most units of a cluster: a one-pod gang, no shrink unit. Built here as _unit
            # would (same fields), without its lists and copies: a cycle builds one per
            # running gang, tens of thousands.
            first = pods[0]
            unit = new_unit(Unit)
            fields = {
                "id": len(units),
                "gang": gang.key,
                "queue": gang.queue,
                "priority": gang.priority,
                "pods": (first,),
                "whole": True,
                "started": first.started,
                "usage": pod_queue_usage(first),  # a dict of its own (see pod_queue_usage)
                "nodes": frozenset((first.node_name,)),
            }
            set_field(unit, "__dict__", fields)
            units.append(unit)
            continue
        if len(pods) > 1:
            pods.sort(key=lambda p: (p.started, p.uid))
        # Each pod's usage once: it counts in its gang's unit and in its own shrink unit.
        uses = [pod_queue_usage(p) for p in pods]
        units.append(_unit(len(units), gang, pods, uses, whole=True))
        for i in reversed(range(len(pods))[gang.min_member :]):  # as pods[min_member:]
            units.append(_unit(len(units), gang, pods[i : i + 1], uses[i : i + 1], whole=False))
    return units


def _unit(
    uid: int,
    gang: Gang,
    pods: Sequence[Pod],
    uses: Sequence[Mapping[str, int]],
    *,
    whole: bool,
) -> Unit:
    if len(pods) == 1:  # most units: one pod (a one-pod gang, or a shrink)
        first = pods[0]
        usage = dict(uses[0])  # pod_queue_usage's keys, in QUEUE_RESOURCES order
        started = first.started
        nodes = frozenset((first.node_name,)) if first.node_name else frozenset()
    else:
        usage = dict.fromkeys(QUEUE_RESOURCES, 0)
        for use in uses:
            for r, v in use.items():
                usage[r] += v
        started = min(p.started for p in pods)
        nodes = frozenset(p.node_name for p in pods if p.node_name)
    # Built as the frozen dataclass's __init__ would (fields in the instance dict; no
    # __post_init__), at a third of its cost: a cycle builds one unit per running gang.
    # ``nodes`` is what the cached property computes on first use (it takes a lock per
    # first use, and every unit of a cycle is asked).
    unit = object.__new__(Unit)
    unit.__dict__.update(
        id=uid,
        gang=gang.key,
        queue=gang.queue,
        priority=gang.priority,
        pods=tuple(pods),
        whole=whole,
        started=started,
        usage=usage,
        nodes=nodes,
    )
    return unit


def branch_pair(tree: QueueTree, mine: str, theirs: str) -> tuple[str, str]:
    """The children of the lowest common ancestor on each side (the roots when the two
    queues share none): the level at which a reclaim between them is judged."""
    a = tree.ancestors(mine) if mine in tree else [mine]
    b = tree.ancestors(theirs) if theirs in tree else [theirs]
    common = set(a) & set(b)
    left = next((i for i, q in enumerate(a) if q in common), len(a))
    right = next((i for i, q in enumerate(b) if q in common), len(b))
    return a[max(0, left - 1)], b[max(0, right - 1)]


def used(
    report: FairShareReport, charged: Mapping[str, Mapping[str, int]], queue: str
) -> dict[str, int]:
    """What ``queue`` holds now in this solve: the report's allocation plus this cycle's
    admissions minus its evictions (``charged``, as :class:`~scheduler.solver.queues.QueueBook`
    keeps it)."""
    status = report.queues.get(queue)
    base = status.allocated if status is not None else {}
    extra = charged.get(queue, {})
    return {r: base.get(r, 0) + extra.get(r, 0) for r in QUEUE_RESOURCES}


def fair(report: FairShareReport, queue: str) -> dict[str, int]:
    status = report.queues.get(queue)
    share = status.fair_share if status is not None else {}
    return {r: share.get(r, 0) for r in QUEUE_RESOURCES}


def may_evict(gang: Gang, now: float) -> str | None:
    """Why the pending ``gang`` may not evict anyone now, or None when it may."""
    if not gang.may_preempt:
        return "its PriorityClass has preemptionPolicy: Never"
    waited = now - gang.creation_time
    if waited < gang.preemption_delay_seconds:
        return f"preemption delay: {gang.preemption_delay_seconds - waited:.0f}s left"
    return None


def action_for(
    g: GangRequest,
    unit: Unit,
    tree: QueueTree,
    report: FairShareReport,
    charged: Mapping[str, Mapping[str, int]],
    now: float,
    rules: dict[str, tuple[str | None, float]] | None = None,
) -> EvictAction | None:
    """Under which rule ``unit`` may be evicted for pending gang ``g`` (None: it may not).

    The victim side's cap (its branch stays at or above fair share) is a row of the model,
    not decided here; here a reclaim only needs the victim's branch to be above its share
    and the reclaimer's branch to stay within its own with the gang added. ``rules`` caches
    the per-queue part (rule, min runtime) for one gang: pass the same dict for all its units.
    """
    if unit.gang == g.key:
        return None
    rules = {} if rules is None else rules
    rule, least = rules.get(unit.queue) or _rule_of(rules, g, unit.queue, tree, report, charged)
    if rule is None or now - unit.started < least:
        return None
    if rule == "preempt" and unit.priority >= g.priority:
        return None
    if not unit.whole:
        return "shrink"
    return "preempt" if rule == "preempt" else "reclaim"


def _rule_of(
    rules: dict[str, tuple[str | None, float]],
    g: GangRequest,
    queue: str,
    tree: QueueTree,
    report: FairShareReport,
    charged: Mapping[str, Mapping[str, int]],
) -> tuple[str | None, float]:
    """The rule units of ``queue`` fall under for ``g`` and that rule's min runtime, kept
    in ``rules`` (the per-gang cache of :func:`action_for` and :func:`actions_for`)."""
    rule = queue_rule(g, queue, tree, report, charged)
    found = rules[queue] = (rule, tree.min_runtime(queue, rule) if rule is not None else 0.0)
    return found


def actions_for(
    g: GangRequest,
    units: Sequence[Unit],
    skip: AbstractSet[int],
    skip_gangs: AbstractSet[str],
    tree: QueueTree,
    report: FairShareReport,
    charged: Mapping[str, Mapping[str, int]],
    now: float,
) -> dict[int, EvictAction]:
    """Unit id -> :func:`action_for` of every unit of ``units`` (in their order) that may be
    taken for ``g``, leaving out the ids in ``skip`` and the units of the gangs in
    ``skip_gangs``. The same answers as calling :func:`action_for` per unit, in one pass:
    asked per pending gang for every running unit of the cluster (tens of thousands)."""
    rules: dict[str, tuple[str | None, float]] = {}
    out: dict[int, EvictAction] = {}
    key, priority = g.key, g.priority
    for u in units:
        if u.id in skip or u.gang in skip_gangs or u.gang == key:
            continue
        rule, least = rules.get(u.queue) or _rule_of(rules, g, u.queue, tree, report, charged)
        if rule is None or now - u.started < least:
            continue
        if rule == "preempt":
            if u.priority >= priority:
                continue
            out[u.id] = "preempt" if u.whole else "shrink"
        else:
            out[u.id] = "reclaim" if u.whole else "shrink"
    return out


def queue_rule(
    g: GangRequest,
    queue: str,
    tree: QueueTree,
    report: FairShareReport,
    charged: Mapping[str, Mapping[str, int]],
) -> str | None:
    """``preempt`` (same queue), ``reclaim`` (another queue, and fairness allows taking from
    it for ``g``) or None: the part of :func:`action_for` that depends on the queues only."""
    if queue == g.queue:
        return "preempt"
    mine, theirs = branch_pair(tree, g.queue, queue)
    if mine == theirs or not reclaimable(tree, queue, theirs):
        return None
    resources = dominant(g.ask)
    # Every queue from the reclaimer's leaf up to its branch stays within its fair share.
    chain = tree.ancestors(g.queue) if g.queue in tree else [g.queue]
    for q in chain[: chain.index(mine) + 1] if mine in chain else chain:
        have, share = used(report, charged, q), fair(report, q)
        if any(have[r] + g.ask.get(r, 0) > share[r] for r in resources):
            return None
    have, share = used(report, charged, theirs), fair(report, theirs)
    if not any(have[r] > share[r] for r in resources):
        return None
    return "reclaim"


def reclaimable(tree: QueueTree, queue: str, branch: str) -> bool:
    """False when ``queue`` or an ancestor up to ``branch`` (the victim's side of the
    comparison, see :func:`branch_pair`) says ``reclaimable: false``."""
    chain = tree.ancestors(queue) if queue in tree else [queue]
    side = chain[: chain.index(branch) + 1] if branch in chain else chain
    return all(tree.queues[q].reclaimable for q in side if q in tree.queues)


def victim_rooms(
    units: Sequence[Unit],
    actions: Mapping[int, EvictAction],
    g: GangRequest,
    tree: QueueTree,
    report: FairShareReport,
    charged: Mapping[str, Mapping[str, int]],
) -> dict[str, tuple[tuple[str, int], ...]]:
    """Victim branch -> (resource, how much may still be taken from it) for the units that
    are reclaimed (not preempted) for ``g``: a branch never goes below its fair share."""
    out: dict[str, tuple[tuple[str, int], ...]] = {}
    queues = {u.queue for u in units if u.id in actions and u.queue != g.queue}
    for queue in sorted(queues):
        _, theirs = branch_pair(tree, g.queue, queue)
        if theirs in out:
            continue
        have, share = used(report, charged, theirs), fair(report, theirs)
        out[theirs] = tuple((r, max(0, have[r] - share[r])) for r in dominant(g.ask))
    return out
