"""Independent check of a placement before it leaves the solver.

Deliberately shares no code with the placement engines (no ortools, no ClusterState, no
greedy): it recomputes everything from the snapshot and the domain types, so a bug in the
engines cannot hide itself. Checks: pods are pending and placed once; nodes exist, are Ready
and schedulable; taints, nodeSelector and required affinity; every resource of every node;
device grants (right count, distinct devices, right share, no device over 1000 thousandths);
gang completeness (min_member or none); queue limits at every level; quota of every level
for non-preemptible gangs, against non-preemptible usage only; pod affinity, anti-affinity
and spread, replayed in assignment order (:mod:`.validate_topology`); devices of
ResourceClaims (:mod:`.validate_dra`).
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx

from scheduler.cluster.node import GPU_MILLI, Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import (
    QUEUE_RESOURCES,
    UNLIMITED,
    QueueTree,
    pod_queue_usage,
    pod_usage_triple,
)
from scheduler.cluster.resources import GPU, PODS
from scheduler.cluster.snapshot import Snapshot, bound_usage
from scheduler.solver.placement import PodAssignment
from scheduler.solver.validate_topology import topology_violations

__all__ = ["forget_passed", "validate"]

_Usage = dict[str, dict[str, int]]


def _expected_grant(pod: Pod, node_gpu_memory: int | None) -> tuple[int, int] | None:
    """(device count, thousandths each) the pod must get; None if it cannot be sized."""
    if pod.gpu is not None:
        if pod.gpu.memory_mib is None:
            return pod.gpu.count, min(pod.gpu.milli, GPU_MILLI)
        if not node_gpu_memory:
            return None
        milli = -(-pod.gpu.memory_mib * GPU_MILLI // node_gpu_memory)
        return (pod.gpu.count, milli) if milli <= GPU_MILLI else None
    if pod.requests[GPU] > 0:
        return pod.requests[GPU], GPU_MILLI
    return 0, 0


@dataclass
class _Totals:
    """What the assignments of one call add up to (see :func:`validate`)."""

    #: Free state of the nodes the assignments touch, before them (bound pods, evictions).
    used: dict[str, dict[str, int]]
    gpu_free: dict[str, list[int]]
    pod_count: dict[str, int]
    #: What the assignments add per node, per device and per gang (first-seen order).
    added: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    added_pods: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    device_take: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    per_gang: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seen: set[str] = field(default_factory=set)
    placed: list[tuple[Pod, PodAssignment]] = field(default_factory=list)
    #: Queue usage the placed pods add, per leaf queue (and its non-preemptible part).
    new_by_leaf: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(_zeros))
    new_np: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(_zeros))
    #: Some placed pod has or asks for ResourceClaims.
    claims: bool = False


@dataclass
class _Passed:
    """The last call that passed without evictions: its snapshot, assignments and totals."""

    snapshot: weakref.ref[Snapshot]
    assignments: Sequence[PodAssignment]
    totals: _Totals


#: See ``checked`` in :func:`validate`.
_last_passed: _Passed | None = None


def forget_passed() -> None:
    """Drop what the last call that passed remembers, once its caller is done with it: its
    totals hold every pod it placed and a row per node it touched (about 20,000 objects at
    5,000 nodes), which otherwise lived into the next cycle and were walked by the garbage
    collector's first pass after the solve."""
    global _last_passed
    _last_passed = None


def _zeros() -> dict[str, int]:
    return dict.fromkeys(QUEUE_RESOURCES, 0)


def validate(
    snapshot: Snapshot,
    assignments: Sequence[PodAssignment],
    *,
    evicted: Collection[str] = (),
    checked: int = 0,
) -> list[str]:
    """Every rule the placement breaks, as messages naming pod/node/gang/queue (empty = ok).

    ``evicted``: uids of running pods this cycle evicts; what they hold counts as free (the
    gangs placed in their room are held until they are gone).

    ``checked``: the first ``checked`` assignments already passed this function on the same
    snapshot (without ``evicted``; evicting only frees room). Their per-pod rules are not
    checked again; they still count for node, device, gang and queue totals. When they are
    the very assignments of the last call that passed (the solver validates its placement,
    then the same list extended by taking back), that call's totals are reused and only the
    nodes, devices, gangs and queues that the other assignments or the evictions change are
    checked again: the rest passed, and evicting only frees room.
    """
    global _last_passed
    last = _last_passed
    if (
        checked
        and last is not None
        and last.snapshot() is snapshot
        and len(last.assignments) == checked <= len(assignments)
        and all(a is b for a, b in zip(last.assignments, assignments, strict=False))
    ):
        return _validate_more(snapshot, last.totals, assignments, checked, evicted)
    out: list[str] = []
    pods = snapshot.pod_by_uid
    nodes = snapshot.node_by_name
    # Usage only of the nodes this placement touches: the snapshot's own accounting on a
    # sub-snapshot, so a 5,000-node cycle does not pay for nodes it leaves alone.
    touched = {a.node for a in assignments if a.node in nodes}
    used, gpu_free, pod_count, _ = bound_usage(snapshot, touched, pods=False)
    _evict(pods, evicted, touched, used, gpu_free, pod_count)
    totals = _Totals(used, gpu_free, pod_count)
    _count(snapshot, assignments, checked, totals, out)
    _check_nodes(nodes, totals, totals.added, totals.device_take, out)
    _check_gangs(snapshot, totals.per_gang, evicted, out)
    _leaf_usage(snapshot, totals.placed, totals, out)
    out.extend(_queue_violations(snapshot, totals.new_by_leaf, totals.new_np, evicted))
    out.extend(topology_violations(snapshot, assignments, evicted=evicted, checked=checked))
    if snapshot.dra is not None or totals.claims:
        # Imported here: it loads the CEL library, which clusters without claims never need.
        from scheduler.solver.validate_dra import dra_violations

        out.extend(dra_violations(snapshot.dra, assignments, pods, nodes))
    if not out and not evicted:
        _last_passed = _Passed(weakref.ref(snapshot), assignments, totals)
    return out


def _validate_more(
    snapshot: Snapshot,
    before: _Totals,
    assignments: Sequence[PodAssignment],
    checked: int,
    evicted: Collection[str],
) -> list[str]:
    """:func:`validate` of ``assignments`` whose first ``checked`` are those of ``before``
    (a call that passed, without evictions)."""
    out: list[str] = []
    pods = snapshot.pod_by_uid
    nodes = snapshot.node_by_name
    more = assignments[checked:]
    # The new assignments are counted on their own, then merged with what passed (copies:
    # ``before`` stays as it was) only where they land.
    mine = {a.node for a in more if a.node in nodes}
    fresh = mine - before.used.keys()
    used, gpu_free, pod_count, _ = bound_usage(snapshot, fresh, pods=False)
    for n in mine - fresh:
        used[n] = dict(before.used[n])
        gpu_free[n] = list(before.gpu_free[n])
        pod_count[n] = before.pod_count[n]
    _evict(pods, evicted, mine, used, gpu_free, pod_count)
    extra = _Totals(used, gpu_free, pod_count, seen=set(before.seen))
    _count(snapshot, more, 0, extra, out)
    # Node and device totals, in the order a full pass would meet them.
    added: dict[str, dict[str, int]] = {}
    for n in (*(n for n in before.added if n in mine), *extra.added):
        if n in added:
            continue
        row = dict(before.added.get(n, {}))
        for r, v in extra.added.get(n, {}).items():
            row[r] = row.get(r, 0) + v
        added[n] = row
        extra.added_pods[n] += before.added_pods.get(n, 0)
    device_take: dict[tuple[str, int], int] = {}
    for key in (*(k for k in before.device_take if k[0] in mine), *extra.device_take):
        if key not in device_take:
            device_take[key] = before.device_take.get(key, 0) + extra.device_take.get(key, 0)
    _check_nodes(nodes, extra, added, device_take, out)
    # Gangs: those with new pods, and those whose running pods are evicted.
    hit = {p.gang for uid in evicted if (p := pods.get(uid)) is not None}
    per_gang: dict[str, int] = {}
    for g in (*(g for g in before.per_gang if g in hit or g in extra.per_gang), *extra.per_gang):
        if g not in per_gang:
            per_gang[g] = before.per_gang.get(g, 0) + extra.per_gang.get(g, 0)
    _check_gangs(snapshot, per_gang, evicted, out)
    extra.new_by_leaf = _merged(before.new_by_leaf)
    extra.new_np = _merged(before.new_np)
    _leaf_usage(snapshot, extra.placed, extra, out)
    out.extend(_queue_violations(snapshot, extra.new_by_leaf, extra.new_np, evicted))
    out.extend(topology_violations(snapshot, assignments, evicted=evicted, checked=checked))
    if snapshot.dra is not None or before.claims or extra.claims:
        from scheduler.solver.validate_dra import dra_violations

        out.extend(dra_violations(snapshot.dra, assignments, pods, nodes))
    return out


def _merged(rows: Mapping[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(_zeros)
    for k, row in rows.items():
        out[k] = dict(row)
    return out


def _evict(
    pods: Mapping[str, Pod],
    evicted: Collection[str],
    touched: Collection[str],
    used: dict[str, dict[str, int]],
    gpu_free: dict[str, list[int]],
    pod_count: dict[str, int],
) -> None:
    """Free what the evicted pods on ``touched`` nodes hold."""
    for uid in evicted:
        victim = pods.get(uid)
        if victim is None or victim.node_name is None or not victim.active:
            continue
        name = victim.node_name
        if name not in touched:
            continue
        for r, v in victim.requests.items():
            used[name][r] = used[name].get(r, 0) - v
        pod_count[name] -= 1
        for i, milli in victim.gpu_grant:
            if 0 <= i < len(gpu_free[name]):
                gpu_free[name][i] += milli


def _count(
    snapshot: Snapshot,
    assignments: Sequence[PodAssignment],
    checked: int,
    totals: _Totals,
    out: list[str],
) -> None:
    """The per-pod rules of each assignment (not of the first ``checked``), and what it adds
    to ``totals``."""
    pods = snapshot.pod_by_uid
    nodes = snapshot.node_by_name
    added, added_pods, device_take = totals.added, totals.added_pods, totals.device_take
    per_gang, seen, placed = totals.per_gang, totals.seen, totals.placed
    start = len(placed)
    accepts: dict[tuple[object, ...], bool] = {}
    for k, a in enumerate(assignments):
        pod = pods.get(a.pod_uid)
        if pod is None:
            out.append(f"pod {a.pod_key}: not in the snapshot")
            continue
        if a.pod_uid in seen:
            out.append(f"pod {pod.key}: placed twice")
            continue
        seen.add(a.pod_uid)
        # Extended resources the node gives through DRA: the claim's devices, not allocatable.
        by_claim = {m[1] for g in a.claims for m in g.mappings} if a.claims else ()
        if k < checked:
            # Counted only (see ``checked``): the node exists, the grant is right.
            for i, milli in a.gpu_grant:
                device_take[(a.node, i)] += milli
            row = added[a.node]
            for r, v in pod.requests.items():
                if r not in by_claim:
                    row[r] = row.get(r, 0) + v
            added_pods[a.node] += 1
            per_gang[pod.gang] += 1
            placed.append((pod, a))
            continue
        if not pod.pending:
            out.append(f"pod {pod.key}: is not pending (bound, finished or not ours)")
        if a.gang != pod.gang:
            out.append(f"pod {pod.key}: assignment names gang {a.gang}, pod is in {pod.gang}")
        node = nodes.get(a.node)
        if node is None:
            out.append(f"pod {pod.key}: node {a.node} does not exist")
            continue
        if not node.schedulable:
            out.append(f"pod {pod.key}: node {node.name} is cordoned or NotReady")
        # Same rules on nodes with the same labels and taints give the same answer.
        by_name = bool(pod.affinity) and any(
            r.key == "metadata.name" for t in pod.affinity for r in t.requirements
        )
        rule_key = (
            pod.tolerations,
            pod.node_selector,
            pod.affinity,
            node.labels,
            node.taints,
            node.name if by_name else "",
        )
        ok = accepts.get(rule_key)
        if ok is None:
            ok = accepts[rule_key] = pod.accepts(node)
        if not ok:
            out.append(f"pod {pod.key}: node {node.name} fails its taints/selector/affinity")
        expected = (0, 0) if GPU in by_claim else _expected_grant(pod, node.gpu_memory_mib)
        indices = [i for i, _ in a.gpu_grant]
        if expected is None:
            out.append(f"pod {pod.key}: GPU share cannot be sized on node {node.name}")
        elif len(indices) != expected[0] or len(set(indices)) != len(indices):
            out.append(
                f"pod {pod.key}: needs {expected[0]} distinct devices on {node.name}, "
                f"granted {list(a.gpu_grant)}"
            )
        else:
            devices = node.gpu_count if a.gpu_grant else 0
            for i, milli in a.gpu_grant:
                if milli != expected[1]:
                    out.append(f"pod {pod.key}: device {i} granted {milli}, needs {expected[1]}")
                if not 0 <= i < devices:
                    out.append(f"pod {pod.key}: node {node.name} has no device {i}")
        for i, milli in a.gpu_grant:
            device_take[(node.name, i)] += milli
        row = added[node.name]
        for r, v in pod.requests.items():
            if r not in by_claim:
                row[r] = row.get(r, 0) + v
        added_pods[node.name] += 1
        per_gang[pod.gang] += 1
        placed.append((pod, a))

    totals.claims = totals.claims or any(
        (p.resource_claims and p.pending) or a.claims for p, a in placed[start:]
    )


def _check_nodes(
    nodes: Mapping[str, Node],
    free: _Totals,
    added: Mapping[str, Mapping[str, int]],
    device_take: Mapping[tuple[str, int], int],
    out: list[str],
) -> None:
    """Every resource of every node in ``added``, and every device in ``device_take``, within
    what is free (``free``'s rows)."""
    used, gpu_free, pod_count = free.used, free.gpu_free, free.pod_count
    added_pods = free.added_pods
    for name, extra in added.items():
        have = used[name]
        alloc = nodes[name].allocatable
        for r, v in extra.items():
            if v > 0 and have.get(r, 0) + v > alloc[r]:
                out.append(f"node {name}: {r} over capacity ({have.get(r, 0) + v} > {alloc[r]})")
        if alloc[PODS] > 0 and pod_count[name] + added_pods[name] > alloc[PODS]:
            out.append(f"node {name}: more pods than allocatable pods ({alloc[PODS]})")
    for (name, i), milli in device_take.items():
        devices = gpu_free[name]
        if 0 <= i < len(devices) and milli > devices[i]:
            out.append(f"node {name}: device {i} over capacity ({milli} > {devices[i]} free)")


def _check_gangs(
    snapshot: Snapshot, per_gang: Mapping[str, int], evicted: Collection[str], out: list[str]
) -> None:
    """Each gang of ``per_gang`` (pods placed) gets at least what it needs (all or none)."""
    gangs = snapshot.gang_by_key
    for key, count in per_gang.items():
        gang = gangs.get(key)
        if gang is None:
            out.append(f"gang {key}: not in the snapshot")
            continue
        running = sum(
            1
            for p in snapshot.pods_by_gang.get(key, [])
            if p.bound and p.active and p.uid not in evicted
        )
        need = max(0, gang.min_member - running)
        if count < need:
            out.append(f"gang {key}: {count} pods placed, needs at least {need} (all or none)")


def _queue_of(snapshot: Snapshot, pod: Pod) -> str:
    gang = snapshot.gang_by_key.get(pod.gang)
    return gang.queue if gang is not None else pod.queue


def _leaf_usage(
    snapshot: Snapshot, placed: list[tuple[Pod, PodAssignment]], totals: _Totals, out: list[str]
) -> None:
    """Add what ``placed`` pods use to their leaf queues in ``totals``; a pod whose queue is
    not a usable leaf is a violation."""
    tree = snapshot.queue_tree
    new_by_leaf, new_np = totals.new_by_leaf, totals.new_np
    usable: dict[str, bool] = {}  # per queue: exists, valid and a leaf
    gangs = snapshot.gang_by_key
    for pod, a in placed:
        gang = gangs.get(pod.gang)
        queue = gang.queue if gang is not None else pod.queue  # _queue_of, inlined
        ok = usable.get(queue)
        if ok is None:
            ok = usable[queue] = queue in tree and queue not in tree.broken and tree.is_leaf(queue)
        if not ok:
            out.append(f"pod {pod.key}: queue {queue!r} is missing, invalid or not a leaf")
            continue
        use = pod_queue_usage(pod)
        if a.gpu_grant:  # what the pod will hold is its grant (as pod_queue_usage counts it)
            use["gpu"] = sum(m for _, m in a.gpu_grant)
        row = new_by_leaf[queue]
        for r, v in use.items():
            row[r] += v
        if gang is not None and not gang.preemptible:
            for r, v in use.items():
                new_np[queue][r] += v


def _queue_violations(
    snapshot: Snapshot,
    new_by_leaf: Mapping[str, Mapping[str, int]],
    new_np: Mapping[str, Mapping[str, int]],
    evicted: Collection[str],
) -> list[str]:
    """Queue limits at every level, and quotas for non-preemptible work, with the usage
    ``new_by_leaf`` (``new_np``: its non-preemptible part) placed and ``evicted`` gone."""
    tree = snapshot.queue_tree
    # Only queues with a limit or quota on the way up from a queue that received pods need
    # their current usage; only leaves below those matter.
    out: list[str] = []
    bounded: set[str] = set()
    for queue in new_by_leaf:
        for q in tree.ancestors(queue):
            rows = tree.queues[q].resources
            if any(s.limit != UNLIMITED or s.quota != UNLIMITED for _, s in rows):
                bounded.add(q)
    relevant = {leaf for q in bounded for leaf in (q, *nx.descendants(tree.graph, q))}
    by_leaf: dict[str, dict[str, int]] = {}
    np_by_leaf: dict[str, dict[str, int]] = {}
    if relevant:
        running, running_np = _running_usage(snapshot)
        by_leaf = {q: dict(running[q]) for q in relevant if q in running}
        np_by_leaf = {q: dict(running_np[q]) for q in relevant if q in running_np}
        pods = snapshot.pod_by_uid
        for uid in set(evicted):  # their usage is leaving
            p = pods.get(uid)
            if p is None or p.node_name is None or not p.managed or not p.active:
                continue
            queue = _queue_of(snapshot, p)
            if queue not in by_leaf:
                continue
            gang = snapshot.gang_by_key.get(p.gang)
            np_row = np_by_leaf.get(queue) if gang is not None and not gang.preemptible else None
            for r, v in pod_queue_usage(p).items():
                by_leaf[queue][r] -= v
                if np_row is not None:
                    np_row[r] -= v
    before = _up_the_tree(tree, by_leaf)
    before_np = _up_the_tree(tree, np_by_leaf)
    new: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(QUEUE_RESOURCES, 0))
    for leaf, use in new_by_leaf.items():
        for q in tree.ancestors(leaf):
            for r, v in use.items():
                new[q][r] += v
    for q, use in new.items():
        queue_obj = tree.queues[q]
        for r in QUEUE_RESOURCES:
            limit = queue_obj.resource(r).limit
            if use[r] > 0 and limit != UNLIMITED and before[q][r] + use[r] > limit:
                out.append(f"queue {q}: {r} limit exceeded ({before[q][r] + use[r]} > {limit})")
    # Non-preemptible work fits the quota of its queue and of every ancestor, counting only
    # non-preemptible usage (preemptible work in the way can be taken back).
    for q, use in _up_the_tree(tree, new_np).items():
        for r, settings in tree.queues[q].resources:
            over = before_np[q][r] + use.get(r, 0) > settings.quota
            if use.get(r, 0) > 0 and settings.quota != UNLIMITED and over:
                out.append(
                    f"queue {q}: non-preemptible work over {r} quota "
                    f"({before_np[q][r] + use[r]} > {settings.quota})"
                )
    return out


#: The last snapshot's running usage (a cycle validates its snapshot more than once).
_running_cache: tuple[weakref.ref[Snapshot], _Usage, _Usage] | None = None


def _running_usage(snapshot: Snapshot) -> tuple[_Usage, _Usage]:
    """Per leaf queue: what its bound active pods use, and the non-preemptible part of it.
    Read-only; remembered for the last snapshot asked about."""
    global _running_cache
    cached = _running_cache
    if cached is not None and cached[0]() is snapshot:
        return cached[1], cached[2]
    by_leaf: _Usage = defaultdict(lambda: dict.fromkeys(QUEUE_RESOURCES, 0))
    np_by_leaf: _Usage = defaultdict(lambda: dict.fromkeys(QUEUE_RESOURCES, 0))
    gangs = snapshot.gang_by_key
    for p in snapshot.pods:
        if p.node_name is None or not p.managed or not p.active:
            continue
        gang = gangs.get(p.gang)
        queue = gang.queue if gang is not None else p.queue  # _queue_of, inlined
        row = by_leaf[queue]
        np_row = np_by_leaf[queue] if gang is not None and not gang.preemptible else None
        gpu, cpu, memory = pod_usage_triple(p)
        row["gpu"] += gpu
        row["cpu"] += cpu
        row["memory"] += memory
        if np_row is not None:
            np_row["gpu"] += gpu
            np_row["cpu"] += cpu
            np_row["memory"] += memory
    _running_cache = (weakref.ref(snapshot), by_leaf, np_by_leaf)
    return by_leaf, np_by_leaf


def _up_the_tree(
    tree: QueueTree, by_leaf: Mapping[str, Mapping[str, int]]
) -> defaultdict[str, dict[str, int]]:
    """Per-leaf usage summed into every queue on the way to the root."""
    out: defaultdict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(QUEUE_RESOURCES, 0))
    for leaf, use in by_leaf.items():
        for q in tree.ancestors(leaf) if leaf in tree else []:
            for r, v in use.items():
                out[q][r] += v
    return out
