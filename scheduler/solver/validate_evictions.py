"""Independent check of a cycle's evictions (docs/taking-back.md), before they leave the solver.

Shares no code with the take-back stage (:mod:`.takeback`, :mod:`.victims`): it recomputes
every rule from the snapshot, the fair-share report and the decisions. The gangs that
evict are replayed in the order they were decided (``waits_for`` keeps it), because each
reclaim is judged on the queue usage left by the decisions before it.

Checked: victims are running, managed, preemptible pods evicted once; gangs go whole (a
shrink keeps ``minMember``); every victim is waited for by the gang it is evicted for, and
that gang is placed; the evicting gang may preempt and is past its preemption delay;
preempt: same queue, strictly lower priority, past ``preemptMinRuntime``; reclaim: another
queue, past ``reclaimMinRuntime``, the reclaimer's branch (up from its leaf to below the
common ancestor) stays within fair share with the gang, the victim's branch stays at or
above its own, and no queue on the victim's side (its leaf up to below the common
ancestor) is marked not reclaimable; PodDisruptionBudgets; consolidation moves at most the
configured pods.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import QUEUE_RESOURCES, pod_queue_usage
from scheduler.cluster.snapshot import Snapshot
from scheduler.fairness import FairShareReport
from scheduler.solver.placement import Eviction, PlacementSettings, PodAssignment

__all__ = ["validate_evictions"]


def _chain(snapshot: Snapshot, queue: str) -> list[str]:
    tree = snapshot.queue_tree
    return tree.ancestors(queue) if queue in tree else [queue]


def _sides(snapshot: Snapshot, mine: str, theirs: str) -> tuple[list[str], str]:
    """Queues from ``mine`` up to just below the common ancestor, and the victim's queue
    just below it."""
    a, b = _chain(snapshot, mine), _chain(snapshot, theirs)
    common = [q for q in a if q in b]
    top = common[0] if common else None
    left = a[: a.index(top)] if top else a
    right = b[: b.index(top)] if top else b
    return left, (right[-1] if right else theirs)


def validate_evictions(
    snapshot: Snapshot,
    report: FairShareReport,
    placed: Sequence[PodAssignment],
    nominated: Sequence[PodAssignment],
    evictions: Sequence[Eviction],
    waits_for: Mapping[str, Sequence[str]],
    settings: PlacementSettings,
) -> list[str]:
    """Every rule the evictions break (empty = ok). ``placed``: the cycle's plain placements;
    ``nominated``: placements of the gangs that wait for evictions."""
    out: list[str] = []
    pods = snapshot.pod_by_uid
    gangs = snapshot.gang_by_key
    tree = snapshot.queue_tree
    now = snapshot.now
    seen: set[str] = set()
    by_victim_gang: dict[str, list[Eviction]] = defaultdict(list)
    for e in evictions:
        pod = pods.get(e.pod_uid)
        if pod is None:
            out.append(f"eviction of {e.pod_key}: pod not in the snapshot")
            continue
        if e.pod_uid in seen:
            out.append(f"pod {pod.key}: evicted twice")
        seen.add(e.pod_uid)
        if not (pod.node_name and pod.active and pod.managed) or pod.deleting or pod.nominated:
            out.append(f"pod {pod.key}: evicted but not a running pod of ours")
        victim = gangs.get(pod.gang)
        if victim is None or not victim.preemptible:
            out.append(f"pod {pod.key}: its gang {pod.gang} is not preemptible")
        if e.pod_uid not in waits_for.get(e.for_gang, ()):
            out.append(f"pod {pod.key}: evicted for {e.for_gang}, which does not wait for it")
        by_victim_gang[pod.gang].append(e)
    for key, uids in waits_for.items():
        for uid in uids:
            pod = pods.get(uid)
            if uid not in seen and not (pod is not None and pod.deleting and pod.node_name):
                out.append(f"gang {key}: waits for pod {uid}, neither evicted nor terminating")
    nominated_gangs = {a.gang for a in nominated}
    for key in waits_for:
        if key not in nominated_gangs:
            out.append(f"gang {key}: evicts pods but is not placed")

    # Gangs whole; shrink keeps minMember.
    for key, evs in by_victim_gang.items():
        gang = gangs.get(key)
        running = [
            p
            for p in snapshot.pods_by_gang.get(key, [])
            if p.node_name and p.active and not p.deleting and not p.nominated
        ]
        gone = {e.pod_uid for e in evs}
        if all(e.action == "shrink" for e in evs):
            if (
                gang is not None
                and len(running) - len(gone & {p.uid for p in running}) < gang.min_member
            ):
                out.append(f"gang {key}: shrunk below minMember {gang.min_member}")
        else:
            left = [p.key for p in running if p.uid not in gone]
            if left:
                out.append(f"gang {key}: evicted partly, {len(left)} pods left running")

    # Budgets.
    for b in snapshot.budgets:
        n = sum(1 for uid in b.pod_uids if uid in seen)
        if n > b.allowed:
            out.append(f"PodDisruptionBudget {b.key}: {n} pods evicted, {b.allowed} allowed")

    moved = sum(1 for e in evictions if e.action == "consolidate")
    if moved > settings.consolidation_max_pods:
        out.append(f"consolidation moves {moved} pods, at most {settings.consolidation_max_pods}")

    # Replay the decisions in order, for the per-decision rules.
    used: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(QUEUE_RESOURCES, 0))
    for q, status in report.queues.items():
        for r in QUEUE_RESOURCES:
            used[q][r] = status.allocated.get(r, 0)

    def charge(queue: str, amount: Mapping[str, int], sign: int) -> None:
        for q in _chain(snapshot, queue):
            for r in QUEUE_RESOURCES:
                used[q][r] += sign * amount.get(r, 0)

    def queue_of(pod: Pod) -> str:
        gang = gangs.get(pod.gang)
        return gang.queue if gang is not None else pod.queue

    # The plain placements summed per queue first, then charged up its chain once (the
    # same totals as pod by pod; a cycle places thousands of pods into a few queues).
    placed_in: dict[str, dict[str, int]] = {}
    for a in placed:
        pod = pods.get(a.pod_uid)
        if pod is not None:
            row = placed_in.setdefault(queue_of(pod), dict.fromkeys(QUEUE_RESOURCES, 0))
            use = pod_queue_usage(pod)
            for r in QUEUE_RESOURCES:
                row[r] += use.get(r, 0)
    for queue, total in placed_in.items():
        charge(queue, total, 1)
    nominated_by_gang: dict[str, list[PodAssignment]] = defaultdict(list)
    for a in nominated:
        nominated_by_gang[a.gang].append(a)
    evictions_for: dict[str, list[Eviction]] = defaultdict(list)
    for e in evictions:
        evictions_for[e.for_gang].append(e)
    for key in waits_for:
        gang = gangs.get(key)
        if gang is None:
            out.append(f"gang {key}: not in the snapshot")
            continue
        if not gang.may_preempt:
            out.append(f"gang {key}: evicts although its preemptionPolicy is Never")
        if now - gang.creation_time < gang.preemption_delay_seconds:
            out.append(f"gang {key}: evicts within its preemption delay")
        ask = dict.fromkeys(QUEUE_RESOURCES, 0)
        for a in nominated_by_gang[key]:
            if a.pod_uid in pods:
                for r, v in pod_queue_usage(pods[a.pod_uid]).items():
                    ask[r] += v
        resources = ("gpu",) if ask["gpu"] > 0 else ("cpu", "memory")
        reclaimed: Counter[tuple[str, str]] = Counter()
        for e in evictions_for[key]:
            pod = pods.get(e.pod_uid)
            victim = gangs.get(pod.gang) if pod is not None else None
            if pod is None or victim is None:
                continue
            runtime = now - (pod.start_time or pod.creation_time)
            if e.action == "consolidate":
                if runtime < tree.min_runtime(victim.queue, "preempt"):
                    out.append(f"pod {pod.key}: moved before its preemptMinRuntime")
                continue
            if victim.queue == gang.queue:
                if e.action not in ("preempt", "shrink"):
                    out.append(f"pod {pod.key}: same queue as {key}, but action {e.action}")
                if victim.priority >= gang.priority:
                    out.append(
                        f"pod {pod.key}: preempted by {key} of priority {gang.priority}, "
                        f"not above its own {victim.priority}"
                    )
                if runtime < tree.min_runtime(victim.queue, "preempt"):
                    out.append(f"pod {pod.key}: preempted before its preemptMinRuntime")
                continue
            if e.action not in ("reclaim", "shrink"):
                out.append(f"pod {pod.key}: another queue than {key}, but action {e.action}")
            if runtime < tree.min_runtime(victim.queue, "reclaim"):
                out.append(f"pod {pod.key}: reclaimed before its reclaimMinRuntime")
            mine, theirs = _sides(snapshot, gang.queue, victim.queue)
            if not mine or theirs in mine:
                out.append(f"pod {pod.key}: reclaimed within one branch by {key}")
                continue
            victim_side = _chain(snapshot, victim.queue)
            if theirs in victim_side:
                victim_side = victim_side[: victim_side.index(theirs) + 1]
            closed = [q for q in victim_side if q in tree.queues and not tree.queues[q].reclaimable]
            if closed:
                out.append(
                    f"pod {pod.key}: reclaimed by {key} from not reclaimable queue {closed[0]}"
                )
            for q in mine:
                share = report.queues[q].fair_share if q in report.queues else {}
                for r in resources:
                    if used[q][r] + ask[r] > share.get(r, 0):
                        out.append(
                            f"gang {key}: reclaiming takes queue {q} above its fair share of {r}"
                        )
            for r in resources:
                reclaimed[theirs, r] += pod_queue_usage(pod)[r]
        for (theirs, r), amount in reclaimed.items():
            share = report.queues[theirs].fair_share if theirs in report.queues else {}
            if used[theirs][r] - amount < share.get(r, 0):
                out.append(
                    f"queue {theirs}: reclaimed below its fair share of {r} "
                    f"({used[theirs][r] - amount} < {share.get(r, 0)})"
                )
        for e in evictions_for[key]:
            pod = pods.get(e.pod_uid)
            if pod is not None and e.action != "consolidate":  # moved pods are placed again
                charge(queue_of(pod), pod_queue_usage(pod), -1)
        charge(gang.queue, ask, 1)
    return list(dict.fromkeys(out))
