"""An invariant checker for a GPU scheduler, independent of the scheduler's own code.

It is fed API objects (the JSON dicts the API server returns: pods, nodes, PodGroups) in the
order a watch delivers them, and it records a :class:`Violation` - with the checker's time and
the evidence - whenever one of these stops holding:

``gpu_device``
    No GPU device holds more than 1000 thousandths: per node and device index, the grants
    (annotation ``kai.scheduler/gpu-grant: {"<index>": <thousandths>}``) of bound,
    non-terminated pods add up to at most 1000, and every bound GPU pod has a grant that
    matches its request (a whole-GPU pod holds 1000 on each of its devices) on devices the
    node has.
``node_capacity``
    No node is over its allocatable ``cpu``, ``memory``, ``nvidia.com/gpu`` or ``pods``,
    counting the requests of its bound, non-terminated pods (terminating pods still hold
    what they had, as they do in Kubernetes).
``gang_min_member``
    No gang (PodGroup) has between 1 and ``minMember - 1`` bound active members for longer
    than its ``stalenessGracePeriod`` plus a slack.
``bound_once``
    A pod's ``spec.nodeName``, once set, never changes (nor is cleared) for that uid.
``pod_lost``
    At the end every pod of the stream is bound, finished, deleted by the test, evicted
    (seen by the admission webhook) or reported unschedulable (``PodScheduled=False`` with a
    message); a pod that vanished otherwise, or waits without a reason, is lost.
``eventually_bound``
    Recorded by the harness (:meth:`InvariantChecker.record`) when the stream's gangs are not
    all bound once the faults stop.

Nothing here imports the scheduler; objects are read by :mod:`tests.chaos.podview`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import Any

from tests.chaos.podview import (
    DEVICE_MILLI,
    GPU_RESOURCE,
    PodView,
    node_allocatable,
    parse_duration,
    parse_pod,
    show_quantity,
)

__all__ = ["CHECKED_RESOURCES", "Invariant", "InvariantChecker", "Violation"]

#: Resources whose node totals are checked against allocatable.
CHECKED_RESOURCES = ("cpu", "memory", GPU_RESOURCE, "pods")
#: Violations kept per invariant; later ones are only counted (a broken run can spam).
MAX_RECORDED = 200


class Invariant(StrEnum):
    """The invariants the checker asserts (see the module docstring)."""

    GPU_DEVICE = "gpu_device"
    NODE_CAPACITY = "node_capacity"
    GANG_MIN_MEMBER = "gang_min_member"
    BOUND_ONCE = "bound_once"
    POD_LOST = "pod_lost"
    EVENTUALLY_BOUND = "eventually_bound"


@dataclass(frozen=True)
class Violation:
    """One broken invariant: when (checker clock and wall clock), what, and the evidence."""

    invariant: Invariant
    at: float
    wall: str
    subject: str
    message: str
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "invariant": str(self.invariant),
            "at": round(self.at, 3),
            "wall": self.wall,
            "subject": self.subject,
            "message": self.message,
            "evidence": dict(self.evidence),
        }


# ---------------------------------------------------------------------------- checker


@dataclass
class _Gang:
    min_member: int
    grace: float


class InvariantChecker:
    """Holds the observed cluster and the violations found so far (module docstring).

    ``namespaces``: where the stream's pods and PodGroups live (gang and lost checks);
    ``nodes``: nodes whose capacity is checked (None: every node seen); ``default_grace``:
    the scheduler's staleness grace for PodGroups that set none; ``gang_slack``: extra
    seconds a gang may stay partial (faults delay the scheduler's reaction). Times passed to
    the methods are seconds on any monotonic clock.
    """

    def __init__(
        self,
        *,
        namespaces: Collection[str],
        nodes: Collection[str] | None = None,
        scheduler_name: str = "kai-scheduler",
        default_grace: float = 60.0,
        gang_slack: float = 30.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.namespaces = frozenset(namespaces)
        self.node_filter = None if nodes is None else frozenset(nodes)
        self.scheduler_name = scheduler_name
        self.default_grace = default_grace
        self.gang_slack = gang_slack
        self._wall = wall_clock
        self.violations: list[Violation] = []
        #: Violations per invariant, including those past MAX_RECORDED.
        self.counts: dict[str, int] = defaultdict(int)
        self._pods: dict[str, PodView] = {}
        self._uid_by_key: dict[str, str] = {}
        self._by_node: dict[str, set[str]] = defaultdict(set)
        self._by_gang: dict[str, set[str]] = defaultdict(set)
        self._nodes: dict[str, dict[str, Fraction]] = {}
        self._gangs: dict[str, _Gang] = {}
        self._first_node: dict[str, str] = {}
        self._stream: dict[str, PodView] = {}
        self._gone: dict[str, tuple[PodView, float]] = {}
        self._deleted_by_test: set[str] = set()
        self._evicted: set[str] = set()
        self._retired: set[str] = set()
        self._partial: dict[str, float] = {}
        self._partial_reported: set[tuple[str, float]] = set()
        self._open: dict[str, set[tuple[Any, ...]]] = defaultdict(set)
        self.unparsable: dict[str, str] = {}
        #: Stream pods ever seen waiting with a PodScheduled=False reason.
        self.reported: set[str] = set()
        self._usage: dict[str, dict[str, Fraction]] = {}
        #: Highest cluster-wide use seen per resource (``gpu_milli``: granted thousandths),
        #: to judge how hard a run pushed the scheduler.
        self.peak: dict[str, Fraction] = defaultdict(Fraction)

    # ------------------------------------------------------------------ recording

    def record(
        self,
        invariant: Invariant,
        now: float,
        subject: str,
        message: str,
        evidence: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a violation (also used by the harness for ``eventually_bound``)."""
        self.counts[str(invariant)] += 1
        if self.counts[str(invariant)] > MAX_RECORDED:
            return
        wall = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self._wall()))
        self.violations.append(
            Violation(invariant, now, wall, subject, message, dict(evidence or {}))
        )

    def _episodes(
        self, scope: str, now: float, found: Mapping[tuple[Any, ...], tuple[str, str, Any]]
    ) -> None:
        """Record each violation of ``scope`` once per episode: while the same condition
        (same key) persists it is not recorded again; once it clears, it may recur."""
        for key, (subject, message, evidence) in found.items():
            if key not in self._open[scope]:
                self.record(Invariant(key[0]), now, subject, message, evidence)
        self._open[scope] = set(found)

    # ------------------------------------------------------------------ feeding

    def node_upsert(self, obj: Mapping[str, Any], now: float) -> None:
        """A Node was added or changed."""
        name = (obj.get("metadata") or {}).get("name") or ""
        if self.node_filter is not None and name not in self.node_filter:
            return
        self._nodes[name] = node_allocatable(obj)
        self._check_node(name, now)

    def node_deleted(self, obj: Mapping[str, Any], now: float) -> None:
        """A Node is gone: its capacity is no longer checked."""
        name = (obj.get("metadata") or {}).get("name") or ""
        self._nodes.pop(name, None)
        self._usage.pop(name, None)
        self._open.pop(f"node/{name}", None)

    def podgroup_upsert(self, obj: Mapping[str, Any], now: float) -> None:
        """A PodGroup was added or changed."""
        meta = obj.get("metadata") or {}
        if meta.get("namespace") not in self.namespaces:
            return
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        spec = obj.get("spec") or {}
        raw_grace = spec.get("stalenessGracePeriod")
        try:
            grace = parse_duration(str(raw_grace)) if raw_grace else self.default_grace
        except ValueError:
            grace = self.default_grace
        self._gangs[key] = _Gang(max(1, int(spec.get("minMember") or 1)), grace)
        self._check_gang(key, now)

    def podgroup_deleted(self, obj: Mapping[str, Any], now: float) -> None:
        """A PodGroup is gone: its gang is no longer checked."""
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        self._gangs.pop(key, None)
        self._partial.pop(key, None)

    def pod_upsert(self, obj: Mapping[str, Any], now: float) -> None:
        """A Pod was added or changed."""
        self._check(*self._set_pod(obj, now), now)

    def pod_deleted(self, obj: Mapping[str, Any], now: float) -> None:
        """A Pod is gone."""
        self._check(*self._unset_pod((obj.get("metadata") or {}).get("uid") or "", now), now)

    def _set_pod(self, obj: Mapping[str, Any], now: float) -> tuple[set[str], set[str]]:
        """Store a pod; the nodes and gangs to check again."""
        try:
            view = parse_pod(obj)
        except ValueError as e:
            meta = obj.get("metadata") or {}
            self.unparsable[str(meta.get("uid"))] = str(e)
            return set(), set()
        old = self._pods.get(view.uid)
        first = self._first_node.get(view.uid)
        if view.node is not None and first is None:
            self._first_node[view.uid] = view.node
        elif first is not None and view.node != first:
            self.record(
                Invariant.BOUND_ONCE,
                now,
                f"pod/{view.key}",
                f"pod {view.key} was bound to {first}, now "
                + (f"to {view.node}" if view.node else "has no node"),
                {"uid": view.uid, "first_node": first, "node": view.node},
            )
        self._pods[view.uid] = view
        self._uid_by_key[view.key] = view.uid
        if self._in_stream(view):
            self._stream[view.uid] = view
            if view.unschedulable_message and view.node is None:
                self.reported.add(view.uid)
        return self._reindex(old, view)

    def _unset_pod(self, uid: str, now: float) -> tuple[set[str], set[str]]:
        """Forget a pod; the nodes and gangs to check again."""
        old = self._pods.pop(uid, None)
        if old is None:
            return set(), set()
        if self._uid_by_key.get(old.key) == uid:
            del self._uid_by_key[old.key]
        if uid in self._stream:
            self._gone[uid] = (old, now)
        return self._reindex(old, None)

    def relisted(self, kind: str, objs: Iterable[Mapping[str, Any]], now: float) -> None:
        """A full list of ``kind`` (Pod, Node, PodGroup): upsert all, delete the missing."""
        objs = list(objs)
        if kind == "Pod":
            # Apply the whole list before checking: a half-applied list mixes old and new
            # states and could show an overbooking that never existed.
            seen = {(o.get("metadata") or {}).get("uid") for o in objs}
            nodes: set[str] = set()
            gangs: set[str] = set()
            for uid in [u for u in self._pods if u not in seen]:
                n, g = self._unset_pod(uid, now)
                nodes |= n
                gangs |= g
            for o in objs:
                n, g = self._set_pod(o, now)
                nodes |= n
                gangs |= g
            self._check(nodes, gangs, now)
        elif kind == "Node":
            names = {(o.get("metadata") or {}).get("name") for o in objs}
            for o in objs:
                self.node_upsert(o, now)
            for name in [n for n in self._nodes if n not in names]:
                self.node_deleted({"metadata": {"name": name}}, now)
        elif kind == "PodGroup":
            keys = set()
            for o in objs:
                meta = o.get("metadata") or {}
                keys.add(f"{meta.get('namespace')}/{meta.get('name')}")
                self.podgroup_upsert(o, now)
            for key in [k for k in self._gangs if k not in keys]:
                ns, name = key.split("/", 1)
                self.podgroup_deleted({"metadata": {"namespace": ns, "name": name}}, now)
        else:
            raise ValueError(f"unknown kind {kind!r}")

    # ------------------------------------------------------------------ what the test did

    def mark_deleted_by_test(self, uid: str) -> None:
        """The test is about to delete this pod: its disappearance is expected."""
        self._deleted_by_test.add(uid)

    def mark_evicted(self, namespace: str, name: str) -> None:
        """An eviction of this pod was admitted (seen by the admission webhook)."""
        self._evicted.add(f"{namespace}/{name}")

    def retire_gang(self, key: str) -> None:
        """The test deletes this gang: it is no longer held to minMember."""
        self._retired.add(key)
        self._partial.pop(key, None)

    # ------------------------------------------------------------------ reading

    def pod(self, namespace: str, name: str) -> PodView | None:
        """The current view of a pod, None if it does not exist (now)."""
        uid = self._uid_by_key.get(f"{namespace}/{name}")
        return None if uid is None else self._pods.get(uid)

    def gang_pods(self, key: str) -> list[PodView]:
        """Current pods of gang ``namespace/podgroup``."""
        return [self._pods[u] for u in sorted(self._by_gang.get(key, ())) if u in self._pods]

    def stream_pods(self) -> list[PodView]:
        """The last view of every stream pod ever seen (present or gone)."""
        return list(self._stream.values())

    def capacity(self) -> dict[str, Fraction]:
        """Allocatable of the checked nodes together, plus ``gpu_milli`` (1000 per GPU)."""
        total: dict[str, Fraction] = defaultdict(Fraction)
        for alloc in self._nodes.values():
            for r in CHECKED_RESOURCES:
                total[r] += alloc.get(r, Fraction(0))
        total["gpu_milli"] = total[GPU_RESOURCE] * DEVICE_MILLI
        return dict(total)

    def bound_count(self) -> int:
        """Stream pods ever seen bound."""
        return sum(1 for uid in self._stream if uid in self._first_node)

    # ------------------------------------------------------------------ checks

    def _in_stream(self, view: PodView) -> bool:
        return view.namespace in self.namespaces and view.scheduler_name == self.scheduler_name

    def _reindex(self, old: PodView | None, new: PodView | None) -> tuple[set[str], set[str]]:
        nodes: set[str] = set()
        gangs: set[str] = set()
        for view, add in ((old, False), (new, True)):
            if view is None:
                continue
            if view.node is not None:
                (self._by_node[view.node].add if add else self._by_node[view.node].discard)(
                    view.uid
                )
                nodes.add(view.node)
            if view.gang is not None:
                (self._by_gang[view.gang].add if add else self._by_gang[view.gang].discard)(
                    view.uid
                )
                gangs.add(view.gang)
        return nodes, gangs

    def _check(self, nodes: Iterable[str], gangs: Iterable[str], now: float) -> None:
        for node in sorted(nodes):
            self._check_node(node, now)
        for gang in sorted(gangs):
            self._check_gang(gang, now)

    def _check_node(self, name: str, now: float) -> None:
        alloc = self._nodes.get(name)
        if alloc is None:
            return
        holders = sorted(
            (self._pods[u] for u in self._by_node.get(name, ()) if u in self._pods),
            key=lambda p: p.key,
        )
        holders = [p for p in holders if p.holds]
        found: dict[tuple[Any, ...], tuple[str, str, Any]] = {}
        used: dict[str, Fraction] = defaultdict(Fraction)
        for p in holders:
            for r in CHECKED_RESOURCES:
                used[r] += p.requests.get(r, Fraction(0))
        for r in CHECKED_RESOURCES:
            cap = alloc.get(r, Fraction(0))
            if used[r] > cap:
                pods = [(p.key, show_quantity(p.requests.get(r, Fraction(0)))) for p in holders]
                found[(Invariant.NODE_CAPACITY, name, r, tuple(k for k, _ in pods))] = (
                    f"node/{name}",
                    f"node {name} is over its allocatable {r}: "
                    f"{show_quantity(used[r])} > {show_quantity(cap)}",
                    {"node": name, "resource": r, "used": show_quantity(used[r]),
                     "allocatable": show_quantity(cap), "pods": pods},
                )  # fmt: skip
        gpu_count = int(alloc.get(GPU_RESOURCE, Fraction(0)))
        devices: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for p in holders:
            problem = _grant_problem(p, gpu_count)
            if problem:
                found[(Invariant.GPU_DEVICE, name, "grant", p.uid)] = (
                    f"pod/{p.key}",
                    f"pod {p.key} on {name}: {problem}",
                    {"pod": p.key, "uid": p.uid, "node": name, "grant": p.grant,
                     "need": None if p.gpu is None else vars(p.gpu), "node_gpus": gpu_count},
                )  # fmt: skip
            for index, milli in (p.grant or {}).items():
                devices[index].append((p.key, milli))
        for index, grants in sorted(devices.items()):
            total = sum(m for _, m in grants)
            if total > DEVICE_MILLI:
                found[(Invariant.GPU_DEVICE, name, index, tuple(k for k, _ in grants))] = (
                    f"node/{name}/gpu/{index}",
                    f"GPU {index} of node {name} is granted {total}/1000 thousandths",
                    {"node": name, "device": index, "total": total, "grants": grants},
                )
        self._episodes(f"node/{name}", now, found)
        self._usage[name] = {
            **used,
            "gpu_milli": Fraction(sum(m for g in devices.values() for _, m in g)),
        }
        for r in self._usage[name]:
            self.peak[r] = max(
                self.peak[r],
                sum((u.get(r, Fraction(0)) for u in self._usage.values()), Fraction(0)),
            )

    def _check_gang(self, key: str, now: float) -> None:
        gang = self._gangs.get(key)
        if gang is None or key in self._retired:
            self._partial.pop(key, None)
            return
        bound = [p for p in self.gang_pods(key) if p.holds and not p.deleting]
        if 0 < len(bound) < gang.min_member:
            self._partial.setdefault(key, now)
        else:
            self._partial.pop(key, None)

    def tick(self, now: float) -> None:
        """Check the gang clocks (call every fraction of a second)."""
        for key, since in list(self._partial.items()):
            gang = self._gangs.get(key)
            if gang is None or (key, since) in self._partial_reported:
                continue
            limit = gang.grace + self.gang_slack
            if now - since <= limit:
                continue
            self._partial_reported.add((key, since))
            members = self.gang_pods(key)
            self.record(
                Invariant.GANG_MIN_MEMBER,
                now,
                f"podgroup/{key}",
                f"gang {key} has had {sum(1 for p in members if p.holds and not p.deleting)}"
                f"/{gang.min_member} members bound for {now - since:.1f}s "
                f"(grace {gang.grace:g}s + slack {self.gang_slack:g}s)",
                {
                    "gang": key,
                    "min_member": gang.min_member,
                    "partial_since": round(since, 3),
                    "members": [
                        {"pod": p.name, "node": p.node, "phase": p.phase, "deleting": p.deleting}
                        for p in members
                    ],
                },
            )

    def outcome(self, uid: str) -> str:
        """Where a stream pod ended: bound, finished, deleted_by_test, evicted, reported, lost."""
        view = self._pods.get(uid)
        gone = view is None
        view = view or self._gone[uid][0]
        if not gone and view.node is not None and view.active:
            return "bound"
        if not view.active:
            return "finished"
        if uid in self._deleted_by_test:
            return "deleted_by_test"
        if view.key in self._evicted:
            return "evicted"
        if not gone and view.unschedulable_message:
            return "reported"
        return "lost"

    def finish(self, now: float) -> list[Violation]:
        """Final checks (gang clocks, no pod lost); returns every violation recorded."""
        self.tick(now)
        for uid, view in sorted(self._stream.items(), key=lambda kv: kv[1].key):
            if self.outcome(uid) != "lost":
                continue
            gone = self._gone.get(uid)
            self.record(
                Invariant.POD_LOST,
                now,
                f"pod/{view.key}",
                f"pod {view.key} vanished at {gone[1]:.1f}s, deleted by neither the test nor "
                "an eviction"
                if gone
                else f"pod {view.key} is pending with no PodScheduled=False reason",
                {"uid": uid, "node": view.node, "phase": view.phase, "gone": gone is not None},
            )
        return list(self.violations)

    def outcomes(self) -> dict[str, int]:
        """How many stream pods ended each way (see :meth:`outcome`)."""
        out: dict[str, int] = defaultdict(int)
        for uid in self._stream:
            out[self.outcome(uid)] += 1
        return dict(out)


def _grant_problem(p: PodView, gpu_count: int) -> str:
    """Why a bound pod's grant does not match its GPU request ('' when it does)."""
    if p.grant_error:
        return p.grant_error
    if p.gpu is None:
        return f"holds a grant {p.grant} but asks for no GPU" if p.grant else ""
    if p.grant is None:
        return "is bound and asks for GPUs but has no grant annotation"
    if len(p.grant) != p.gpu.devices:
        return f"asks for {p.gpu.devices} device(s) but was granted {p.grant}"
    for index, milli in p.grant.items():
        if not 0 <= index < gpu_count:
            return f"granted device {index} but the node has {gpu_count} GPUs"
        if not 0 < milli <= DEVICE_MILLI:
            return f"granted {milli} thousandths of device {index}"
        if p.gpu.milli is not None and milli < p.gpu.milli:
            return f"asks for {p.gpu.milli} thousandths per device but was granted {p.grant}"
    return ""
