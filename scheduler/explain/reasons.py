"""Why a pending gang was not placed, in words a user can act on.

The state looked at is the one *after* the cycle's assignments (they consume node capacity and
queue usage). A node's ``pods`` capacity counts like any other resource (one slot a pod).
For each gang the first rule that applies wins, the *never* reasons (nothing that frees up
helps) before those that clear up by themselves:

====================== ===============================================================
QueueMissing/Invalid,  the gang's queue cannot take jobs (see scheduler.fairness.findings)
NonLeafQueue
UnsupportedField       a pod uses a placement rule not supported yet (the field is named)
SchedulingGated        too few of the gang's pods are free of scheduling gates
GangIncomplete         fewer pods exist than the gang needs placed together
ExceedsQueueLimit,     *never*: the gang alone asks more than a limit (or, non-preemptible,
ExceedsQueueQuota      a quota) of its queue or an ancestor (:mod:`.never`)
NodeTooSmall           *never*: no matching node could hold a pod even when empty
ExceedsCluster         *never*: the matching nodes, empty, cannot hold the gang (pod slots,
                       GPUs, cpu, memory in total, or node by node)
QueueLimit             the gang's queue or an ancestor would pass its limit
OverQuota              non-preemptible work may only use its queue's quota
NoMatchingNode         no node accepts a pod on static grounds (selector, affinity, taints,
                       cordoned / NotReady)
InsufficientOnOneNode  no matching node has enough free for a pod right now
GangDoesNotFit         the gang's pods do not fit the free capacity together
PodAffinity,           pod (anti-)affinity or spread rules refuse every node with room
PodAntiAffinity,       (the pods are placed one by one on the cluster after the cycle,
TopologySpread         :mod:`.topology`)
CapacityTakenThisCycle any of the last three, but only because of this cycle's placements
NotPlacedThisCycle     the gang fits what is free now; it came too late in this cycle
====================== ===============================================================
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import Pod
from scheduler.cluster.podaffinity import PodAffinityTerm
from scheduler.cluster.snapshot import Snapshot
from scheduler.explain.capacity import FreeCapacity, Matching, Rules, pod_rules
from scheduler.explain.codes import (
    CAPACITY_TAKEN,
    GANG_DOES_NOT_FIT,
    GANG_INCOMPLETE,
    NO_MATCHING_NODE,
    NOT_PLACED_THIS_CYCLE,
)
from scheduler.explain.fit import gang_shortfall, pack, pod_misfit
from scheduler.explain.format import format_selector, format_taint, format_terms
from scheduler.explain.never import ClusterLimits, queue_never_problem
from scheduler.explain.topology import REASON_CODES, TopologyExplainer
from scheduler.fairness.admission import queue_admission_problem
from scheduler.fairness.findings import queue_problem
from scheduler.fairness.share import FairShareReport
from scheduler.fairness.usage import gang_need, gang_request, pending_pods

if TYPE_CHECKING:
    # Type only: scheduler.solver imports this package, so a runtime import would be circular.
    from scheduler.solver.placement import PodAssignment

__all__ = ["explain_unplaced"]


def _no_match_message(pod: Pod, m: Matching, node_count: int) -> str:
    if node_count == 0:
        return "the cluster has no nodes"
    if pod.node_selector and m.selector_ok == 0:
        return f"no node matches nodeSelector {format_selector(pod.node_selector)}"
    if pod.affinity and m.affinity_ok == 0:
        whose = (
            "the required node affinity of the pod and its persistentvolumes"
            if pod.volume_affinity
            else "the pod's required node affinity"
        )
        return f"no node matches {whose} ({format_terms(pod.affinity)})"
    taints = ", ".join(format_taint(t) for t, _ in m.blocking_taints.most_common(3))
    if m.blocking_taints and m.unschedulable:
        return (
            f"all matching nodes are cordoned or NotReady ({m.unschedulable}) or have taints "
            f"the pod does not tolerate: {taints}"
        )
    if m.blocking_taints:
        word = "taint" if len(m.blocking_taints) == 1 else "taints"
        return f"no node tolerates {word} {taints}; add a toleration or use other nodes"
    return f"all matching nodes are cordoned or NotReady ({m.unschedulable})"


class _Explainer:
    """State shared by all gangs of one call: free capacity, this cycle's queue charges."""

    def __init__(
        self,
        snapshot: Snapshot,
        report: FairShareReport,
        assignments: Sequence[PodAssignment],
        now: FreeCapacity | None = None,
        before: FreeCapacity | None = None,
        freed: Collection[str] = (),
        known: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.report = report
        self.assignments = assignments
        self.freed = freed
        self.known = known
        self.tree = snapshot.queue_tree
        self.now = now if now is not None else FreeCapacity(snapshot, assignments, freed)
        self._before: FreeCapacity | None = before
        self.limits = ClusterLimits(self.now)
        # Imported here: scheduler.solver imports this package.
        from scheduler.solver.queues import QueueBook

        #: Leaf queue -> pods placed in it this cycle.
        self.placed_in: Counter[str] = Counter()
        by_uid = snapshot.pod_by_uid
        # The same charges the solver's queue book made when it admitted the pods.
        charges: list[tuple[str, Pod, bool]] = []
        gangs = snapshot.gang_by_key
        for a in assignments:
            pod = by_uid.get(a.pod_uid)
            if pod is None:
                continue
            gang = gangs.get(pod.gang)
            queue = gang.queue if gang is not None else pod.queue  # pod_queue, inlined
            charges.append((queue, pod, gang is None or gang.preemptible))
        self.placed_in.update(queue for queue, _, _ in charges)
        book = QueueBook(self.tree, report)
        book.charge_pods(charges)
        self.charged: dict[str, dict[str, int]] = book.charged
        self.pinned: dict[str, dict[str, int]] = book.pinned  # non-preemptible part
        self._fit_cache: dict[tuple[object, ...], tuple[tuple[str, str] | None, str]] = {}
        #: gang class -> (code, message, names in the message) for the first gang of a class
        self._class_cache: dict[tuple[object, ...], tuple[str, str, list[str]]] = {}

    def _ruled(self, pods: Sequence[Pod]) -> bool:
        """True when pod (anti-)affinity or spread may decide where ``pods`` go: their own
        rules, or the anti-affinity of a pod on a node that selects one of them."""
        if any(p.topology_rules for p in pods):
            return True
        guards = self.anti_terms
        if not guards:
            return False
        for p in pods:
            labels = p.label_map
            for anchor in (None, *p.labels):
                if any(t.matches(p.namespace, labels) for t in guards.get(anchor, ())):
                    return True
        return False

    @functools.cached_property
    def anti_terms(self) -> dict[tuple[str, str] | None, list[PodAffinityTerm]]:
        """Anti-affinity terms of the pods on nodes (bound, or placed this cycle), by the
        label every pod they select carries (None: no such label)."""
        by_uid = self.snapshot.pod_by_uid
        owners = [p for p in self.snapshot.pods if p.bound and p.pod_anti_affinity]
        owners += [
            by_uid[a.pod_uid]
            for a in self.assignments
            if a.pod_uid in by_uid and by_uid[a.pod_uid].pod_anti_affinity
        ]
        out: dict[tuple[str, str] | None, list[PodAffinityTerm]] = {}
        for term in {t for p in owners for t in p.pod_anti_affinity}:
            if term.selector is not None:
                out.setdefault(term.selector.anchor, []).append(term)
        return out

    @functools.cached_property
    def topology(self) -> TopologyExplainer:
        """The cluster after the cycle, node by node (built for the first ruled gang)."""
        return TopologyExplainer(self.snapshot, self.assignments, self.freed)

    @property
    def before(self) -> FreeCapacity:
        """Free capacity as it was before this cycle's assignments."""
        if self._before is None:
            self._before = self.now if not self.assignments else FreeCapacity(self.snapshot, [])
        return self._before

    # --- per gang --------------------------------------------------------------------------

    def explain(self, key: str) -> tuple[str, str]:
        if self.known and key in self.known:
            return self.known[key]
        gang = self.snapshot.gang_by_key.get(key)
        if gang is None:
            return (GANG_INCOMPLETE, f"gang {key}: no PodGroup or pods for it are known")
        finding = self.report.gang_findings.get(key) or queue_problem(self.tree, gang.queue)
        if finding is not None:
            return finding
        pods = pending_pods(self.snapshot, gang)
        need = gang_need(self.snapshot, gang)
        if len(pods) < need or not pods:
            created = sum(1 for p in self.snapshot.pods_by_gang.get(key, []) if p.active)
            return (
                GANG_INCOMPLETE,
                f"gang {key}: {created}/{gang.min_member} pods created "
                f"(minMember {gang.min_member})",
            )
        to_place = pods[: max(need, 1)]
        # Everything below depends only on the queue, preemptibility and the pods' shapes and
        # rules (the state looked at is fixed for the call): answer once per such class and
        # re-render the names for the other gangs of the class. Except where other pods
        # run decides (the topology step, taken when capacity is no problem): those answers
        # are the gang's own.
        signature: tuple[object, ...] = (
            gang.queue,
            gang.preemptible,
            tuple((pod_rules(p), p.requests, p.gpu, p.volume_affinity) for p in to_place),
        )
        names = [key, *(p.key for p in to_place)]
        cached = self._class_cache.get(signature)
        if cached is not None and not (
            cached[0] == NOT_PLACED_THIS_CYCLE and self._ruled(to_place)
        ):
            code, message, first = cached
            return (code, _rename(message, first, names))
        code, message = self._explain_class(key, gang, to_place)
        if code not in REASON_CODES.values():
            self._class_cache[signature] = (code, message, names)
        return (code, message)

    def _explain_class(self, key: str, gang: Gang, to_place: list[Pod]) -> tuple[str, str]:
        ask = gang_request(to_place)
        never = queue_never_problem(
            self.tree, self.report, key, gang.queue, ask, preemptible=gang.preemptible
        )
        if never is not None:
            return never
        groups: dict[Rules, list[Pod]] = {}
        for p in to_place:
            groups.setdefault(pod_rules(p), []).append(p)
        never = self.limits.problem(key, groups)
        if never is not None:
            return never
        problem = queue_admission_problem(
            self.tree,
            self.report,
            gang.queue,
            ask,
            preemptible=gang.preemptible,
            charged=self.charged,
            charged_pinned=self.pinned,
        )
        if problem is not None:
            return problem
        for rules, group in groups.items():
            m = self.now.matching(rules)
            if not m.shapes:
                return (NO_MATCHING_NODE, _no_match_message(group[0], m, self.now.node_count))
        capacity_problem = self._capacity_problem(groups, self.now)
        if capacity_problem is None and self._ruled(to_place):
            topology_problem = self.topology.problem(to_place)
            if topology_problem is not None:
                return topology_problem
        if capacity_problem is None:
            return (
                NOT_PLACED_THIS_CYCLE,
                f"gang {key} fits what is free now but was not placed this cycle (it came "
                "after other gangs or the solver ran out of time); it is retried next cycle",
            )
        if self.assignments and self._capacity_problem(groups, self.before) is None:
            return (CAPACITY_TAKEN, f"{self._taken_by(gang)}; now {capacity_problem[1]}")
        return capacity_problem

    def _capacity_problem(
        self, groups: dict[Rules, list[Pod]], free: FreeCapacity
    ) -> tuple[str, str] | None:
        for rules, group in groups.items():
            m = free.matching(rules)
            for p in group:
                cache_key = (id(free), rules, p.requests, p.gpu)
                if cache_key not in self._fit_cache:
                    self._fit_cache[cache_key] = (pod_misfit(p, m), p.key)
                misfit, named = self._fit_cache[cache_key]
                if misfit is not None:
                    return (misfit[0], _rename(misfit[1], [named], [p.key]))
        pods = [p for g in groups.values() for p in g]
        for rules, group in groups.items():
            short = gang_shortfall(group, free.matching(rules), total_pods=len(pods))
            if short is not None:
                return (GANG_DOES_NOT_FIT, short)
        if not pack(groups, free):
            return (
                GANG_DOES_NOT_FIT,
                f"gang needs {len(pods)} pods placed together; matching nodes have enough free "
                "in total, but it is split across nodes and devices so they do not all fit",
            )
        return None

    def _taken_by(self, gang: Gang) -> str:
        """Name the queue whose gangs got the capacity this cycle, and why it went first."""
        base = "resources went to higher-priority or fairer gangs this cycle"
        if not self.placed_in:
            return base
        others = [q for q, _ in self.placed_in.most_common() if q != gang.queue]
        if not others:
            return f"{base} (earlier gangs of queue {gang.queue})"
        winner = others[0]
        status = self.report.queues.get(winner)
        mine = self.report.queues.get(gang.queue)
        if status is not None and status.below_fair_share():
            return f"{base} (queue {winner} below fair share)"
        if status is not None and mine is not None and status.priority > mine.priority:
            return f"{base} (queue {winner} has higher priority {status.priority})"
        return f"{base} (queue {winner})"


def _rename(message: str, first: list[str], names: list[str]) -> str:
    """``message`` written for names ``first`` (gang key, pod keys), for ``names`` instead.

    One pass, longest name first, so a gang key that prefixes its pods' keys is not
    replaced inside them.
    """
    found = [i for i, n in enumerate(first) if n in message and n != names[i]]
    if not found:
        return message
    if len(found) == 1:  # the common case: one name, not part of another one in the text
        return message.replace(first[found[0]], names[found[0]])
    mapping = {first[i]: names[i] for i in found}
    ordered = sorted(mapping, key=len, reverse=True)
    if "" in mapping:  # (never a key in practice; the scan below needs non-empty names)
        pattern = re.compile("|".join(re.escape(n) for n in ordered))
        return pattern.sub(lambda m: mapping[m.group(0)], message)
    # What a regular expression of the names, longest first, would replace (leftmost match;
    # at one position the longest name), without compiling one per gang class.
    out: list[str] = []
    pos = 0
    while True:
        at, name = -1, ""
        for n in ordered:
            j = message.find(n, pos)
            if j != -1 and (at == -1 or j < at):
                at, name = j, n
        if at == -1:
            break
        out += (message[pos:at], mapping[name])
        pos = at + len(name)
    out.append(message[pos:])
    return "".join(out)


def explain_unplaced(
    snapshot: Snapshot,
    report: FairShareReport,
    assignments: Sequence[PodAssignment],
    gangs: Iterable[str],
    *,
    now: FreeCapacity | None = None,
    before: FreeCapacity | None = None,
    freed: Collection[str] = (),
    known: Mapping[str, tuple[str, str]] | None = None,
) -> dict[str, tuple[str, str]]:
    """Gang key -> (reason_code, message) for each of ``gangs`` (pending, not placed).

    ``assignments`` are this cycle's placements: the explanation describes the cluster and
    queues after them. A caller that already knows the free capacity after the assignments
    (``now``) and before them (``before``) passes it (see :meth:`FreeCapacity.from_groups`)
    instead of having it recomputed from the snapshot. ``freed``: running pods whose room the
    assignments take (evictions and pods terminating for held gangs). ``known``: reasons the
    caller already has (the greedy pass's for gangs its topology check refused), used as
    they are.
    """
    explainer = _Explainer(snapshot, report, assignments, now, before, freed, known)
    return {key: explainer.explain(key) for key in gangs}
