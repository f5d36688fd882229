"""Joining pods to their gangs and queues: the step between the store and a Snapshot.

Rules (the contract every stage shares):

- A pod names its gang with the annotation ``pod-group-name`` (KAI) or
  ``scheduling.k8s.io/group-name`` (Volcano); with neither it is an implicit gang of one,
  ``Gang(namespace, <pod name>, min_member=1, implicit=True)``. The PodGroup it joins is a KAI
  (``scheduling.run.ai``) or a Volcano (``scheduling.volcano.sh``) one: the cache hands over
  one object per name (KAI's when both exist), and its ``apiVersion`` decides how it is read
  (:mod:`scheduler.cache.volcano` for Volcano's).
- Queue: the PodGroup's ``spec.queue``, else the ``kai.scheduler/queue`` label (of the pod, or
  for a PodGroup of its oldest labelled member), else the configured default queue. A Volcano
  PodGroup without ``spec.queue`` is in Volcano's queue ``default``, whatever its pods say.
- Priority: the PodGroup's ``priorityClassName`` when set (members take it too), else the
  highest member priority. (A Volcano PodGroup naming an unknown class counts as naming none.)
- Preemptible: the PodGroup's ``spec.preemptibility``, else its label
  ``kai.scheduler/preemptibility`` (for an implicit gang: the pod's label), else priority < 100.
  A Volcano PodGroup: ``volcano.sh/preemptable``, else that label, else preemptible.
- Preemption delay: the PodGroup's ``spec.preemptionDelay``, else its annotation
  ``kai.scheduler/preemption-delay`` (for an implicit gang: the pod's annotation), else 0.
- May preempt: only if no member says ``spec.preemptionPolicy: Never``.
- A pending pod naming a missing or invalid PodGroup is left out (it cannot be scheduled) and
  becomes a :class:`Problem`; a bound one still occupies its node, in a stand-in gang.
- Pods of other schedulers only occupy nodes: they keep no gang (``gang == ""``).
- Volumes: an unbound pod of ours with a :class:`VolumeVerdict` (its PersistentVolumeClaims,
  judged by the cache from the claims, volumes and StorageClasses it holds) gets the
  restrictions ANDed into its required node affinity, or waits (:attr:`Pod.blocked`); see
  :mod:`scheduler.cluster.volumes`.

An implicit gang is keyed ``namespace/<pod name>``; when a PodGroup of that name exists in the
namespace, the implicit gang is ``<pod name>~pod`` instead, so the pod never joins a PodGroup
it did not name.

:class:`Resolver` keeps the result between calls and redoes only what changed: it compares
each pod record, overlay entry and PodGroup with what it saw last time (the store replaces a
record or PodGroup object whenever it changes, so an identity check is enough), recomputes
those pods, the gangs they belong to and the implicit pods a PodGroup's name may shadow, and
reassembles the sorted output from kept pieces. A cycle after a handful of changes then costs
one pass of identity checks over the pods, not a full resolution of tens of thousands of
them. A change of PriorityClasses or of the PodGroup API's presence redoes everything.
:func:`resolve` is the same computation from scratch.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.cache.grants import GpuGrant
from scheduler.cache.problems import Problem
from scheduler.cache.volcano import is_volcano, volcano_gang_from_k8s
from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import Pod
from scheduler.cluster.podspec import BUILD_PRIORITY, GangHints
from scheduler.cluster.queuespec import SpecError, gang_from_k8s, preemptibility_of
from scheduler.cluster.volumeobjects import PodClaim
from scheduler.cluster.volumes import VolumeVerdict, with_volumes
from scheduler.k8s.resources import POD, PODGROUP, VOLCANO_PODGROUP

__all__ = ["BUILD_PRIORITY", "PodRecord", "Resolution", "Resolver", "resolve"]

_NO_HINTS = GangHints()


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What the store keeps of one pod: the parsed pod plus the raw facts resolution needs."""

    uid: str
    namespace: str
    name: str
    #: None when the pod is unbound and its spec unreadable (it only yields a problem).
    pod: Pod | None
    #: PodGroup name from the gang annotation, "" for an implicit gang.
    group: str = ""
    #: The annotation that named the PodGroup (for the problem's field).
    group_annotation: str = ""
    priority_class: str = ""
    #: True when ``spec.priority`` was set (admission resolved the class already).
    has_priority: bool = True
    #: A problem found while parsing (bad annotation, bad quantity).
    problem: Problem | None = None
    #: What the pod says about its gang (preemption policy; for an implicit gang also its
    #: preemptibility label and preemption-delay annotation).
    hints: GangHints = _NO_HINTS
    #: The PersistentVolumeClaims of an unbound pod of ours (empty for every other pod).
    claims: tuple[PodClaim, ...] = ()


@dataclass(frozen=True)
class Resolution:
    """Pods (with gang, queue and priority filled in), their gangs, and what is wrong."""

    pods: tuple[Pod, ...]
    gangs: tuple[Gang, ...]
    problems: tuple[Problem, ...]


def _podgroup_problem(raw: Mapping[str, Any], error: SpecError) -> Problem:
    meta = raw.get("metadata") or {}
    return Problem(
        kind=PODGROUP.kind,
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        field=error.field,
        message=error.message,
        uid=meta.get("uid", ""),
        api_version=str(raw.get("apiVersion") or PODGROUP.api_version),
    )


def _pod_problem(rec: PodRecord, field: str, message: str, reason: str) -> Problem:
    return Problem(
        kind=POD.kind,
        namespace=rec.namespace,
        name=rec.name,
        field=field,
        message=message,
        uid=rec.uid,
        api_version=POD.api_version,
        reason=reason,
    )


def _stand_in(pod: Pod, name: str, hints: GangHints) -> Gang:
    """A gang of one for a pod without a usable PodGroup (implicit, or bound orphan)."""
    preemptible = (
        hints.preemptibility == "preemptible"
        if hints.preemptibility
        else pod.priority < BUILD_PRIORITY
    )
    return Gang(
        namespace=pod.namespace,
        name=name,
        min_member=1,
        queue=pod.queue,
        priority=pod.priority,
        preemptible=preemptible,
        creation_time=pod.creation_time,
        implicit=True,
        preemption_delay_seconds=hints.preemption_delay or 0.0,
        may_preempt=hints.may_preempt,
    )


@dataclass
class _PodState:
    """What the resolver keeps per pod uid."""

    rec: PodRecord
    extra: Any
    prio: int | None
    #: The verdict on the pod's claims (None when it has none); the store keeps the same
    #: object while the verdict does not change, so an identity check finds changes.
    volumes: VolumeVerdict | None = None
    #: Why the pod's ResourceClaims hold it back (reason code, message); None when they
    #: do not (or it has none).
    claims_wait: tuple[str, str] | None = None
    #: The pod after priority/overlay (None: left out of scheduling).
    ready: Pod | None = None
    #: ``namespace/group`` when the pod is a managed gang member, else "".
    group: str = ""
    #: Snapshot key under which the final pod is published ("" when not published).
    published: str = ""
    #: Implicit gang key this pod contributes a stand-in to ("" when none).
    implicit: str = ""


def _ready_pod(
    rec: PodRecord,
    extra: Any,
    prio: int | None,
    volumes: VolumeVerdict | None = None,
    claims_wait: tuple[str, str] | None = None,
) -> Pod | None:
    """A record's pod with class priority, assumption, volume verdict and ResourceClaim wait
    applied; None when left out."""
    pod = rec.pod
    if pod is None or (not pod.managed and not (pod.bound and pod.active)):
        # Unreadable and unbound, or another scheduler's pending or finished pod:
        # it holds nothing and is not ours to place.
        return None
    if not pod.active and not rec.group:
        # A finished pod of ours outside a PodGroup matters to nobody; a finished gang
        # member stays, inactive, so its gang's progress and status count it.
        return None
    changes: dict[str, Any] = {}
    if prio is not None:
        changes["priority"] = prio
    if extra is not None and (pod.node_name is None or pod.node_name == extra[0]):
        if pod.node_name is None:
            changes["node_name"] = extra[0]
        if not pod.gpu_grant:
            changes["gpu_grant"] = extra[1]
    if not pod.managed:
        changes["gang"] = ""
    ready = dataclasses.replace(pod, **changes) if changes else pod
    if volumes is not None and ready.managed and ready.node_name is None:
        ready = with_volumes(ready, volumes)
    if claims_wait is not None and ready.managed and ready.node_name is None and not ready.blocked:
        ready = dataclasses.replace(ready, blocked=claims_wait)
    return ready


class Resolver:
    """Incremental resolution (see the module docstring). Not thread-safe."""

    def __init__(self, default_queue: str) -> None:
        self.default_queue = default_queue
        self._pods: dict[str, _PodState] = {}
        self._podgroups: dict[str, Mapping[str, Any]] = {}
        self._priorities: dict[str, int] = {}
        self._podgroup_api = True
        self._uid_by_key: dict[str, str] = {}
        self._members: dict[str, set[str]] = defaultdict(set)
        # Published pods by snapshot key, and their keys in sorted order.
        self._final: dict[str, Pod] = {}
        self._final_keys: list[str] = []
        # Gang contributors by gang key, in precedence order: PodGroup, implicit pod, orphan.
        self._pg_gang: dict[str, Gang] = {}
        self._implicit: dict[str, Gang] = {}
        self._orphan: dict[str, Gang] = {}
        self._gangs: dict[str, Gang] = {}
        self._gang_keys: list[str] = []
        # Problems: of records, of PodGroups, of pending members of unusable PodGroups.
        self._rec_problem: dict[str, Problem] = {}
        self._group_problem: dict[str, Problem] = {}
        self._member_problem: dict[str, Problem] = {}
        self._gang_memo: dict[str, tuple[Mapping[str, Any], Gang | SpecError]] = {}
        self._result: Resolution | None = None

    def resolve(
        self,
        records: Mapping[str, PodRecord],
        podgroups: Mapping[str, Mapping[str, Any]],
        *,
        priorities: Mapping[str, int],
        overlay: Mapping[str, tuple[str, GpuGrant]] | None = None,
        podgroup_api: bool = True,
        volumes: Mapping[str, VolumeVerdict] | None = None,
        claims_waits: Mapping[str, tuple[str, str]] | None = None,
    ) -> Resolution:
        """The resolution of ``records`` (by uid) and ``podgroups`` (by ``namespace/name``);
        arguments as for :func:`resolve`."""
        overlay = overlay or {}
        volumes = volumes or {}
        claims_waits = claims_waits or {}
        everything = dict(priorities) != self._priorities or podgroup_api != self._podgroup_api
        if everything:
            self._priorities = dict(priorities)
            self._podgroup_api = podgroup_api
            self._gang_memo.clear()
        dirty_groups: set[str] = set()
        dirty_gangs: set[str] = set()
        dirty_pods: list[str] = []
        # PodGroups that appeared, changed or went away.
        for key, raw in podgroups.items():
            if everything or self._podgroups.get(key) is not raw:
                dirty_groups.add(key)
        for key in self._podgroups.keys() - podgroups.keys():
            dirty_groups.add(key)
        if dirty_groups:
            self._podgroups = dict(podgroups)
            # A PodGroup's existence decides the implicit gang name of a pod of that name.
            for key in dirty_groups:
                uid = self._uid_by_key.get(key)
                if uid is not None:
                    dirty_pods.append(uid)
        # Pods that appeared, changed or went away.
        pods = self._pods
        for uid, rec in records.items():
            state = pods.get(uid)
            extra = overlay.get(uid)
            prio = None if rec.has_priority else priorities.get(rec.priority_class)
            verdict = volumes.get(uid) if rec.claims else None
            wait = claims_waits.get(uid) if claims_waits else None
            if (
                everything
                or state is None
                or state.rec is not rec
                or state.extra != extra
                or state.prio != prio
                or state.volumes is not verdict
                or state.claims_wait != wait
            ):
                if state is None:
                    pods[uid] = _PodState(rec, extra, prio, verdict, wait)
                else:
                    state.rec, state.extra, state.prio = rec, extra, prio
                    state.volumes = verdict
                    state.claims_wait = wait
                dirty_pods.append(uid)
        removed = [u for u in pods if u not in records]
        for uid in removed:
            self._remove_pod(uid, dirty_groups, dirty_gangs)
        if not (dirty_pods or dirty_groups or removed) and self._result is not None:
            return self._result
        for uid in dict.fromkeys(dirty_pods):
            if uid in pods:
                self._update_pod(uid, dirty_groups, dirty_gangs)
        for key in dirty_groups:
            self._update_group(key, dirty_gangs)
        for key in dirty_gangs:
            self._update_gang(key)
        self._result = Resolution(
            pods=tuple(map(self._final.__getitem__, self._final_keys)),
            gangs=tuple(map(self._gangs.__getitem__, self._gang_keys)),
            problems=self._problems(),
        )
        return self._result

    # --- pods --------------------------------------------------------------------------

    def _publish(self, state: _PodState, pod: Pod | None) -> None:
        """Put ``pod`` in the output under its key (or take the pod's entry out)."""
        key = pod.key if pod is not None else ""
        if state.published and state.published != key:
            self._final.pop(state.published, None)
            i = bisect.bisect_left(self._final_keys, state.published)
            if i < len(self._final_keys) and self._final_keys[i] == state.published:
                del self._final_keys[i]
        if pod is not None:
            if key not in self._final:
                bisect.insort(self._final_keys, key)
            self._final[key] = pod
        state.published = key

    def _remove_pod(self, uid: str, dirty_groups: set[str], dirty_gangs: set[str]) -> None:
        state = self._pods.pop(uid)
        self._publish(state, None)
        self._rec_problem.pop(uid, None)
        self._member_problem.pop(uid, None)
        if state.group:
            self._members[state.group].discard(uid)
            dirty_groups.add(state.group)
        if state.implicit:
            self._implicit.pop(state.implicit, None)
            dirty_gangs.add(state.implicit)
        key = f"{state.rec.namespace}/{state.rec.name}"
        if self._uid_by_key.get(key) == uid:
            del self._uid_by_key[key]

    def _update_pod(self, uid: str, dirty_groups: set[str], dirty_gangs: set[str]) -> None:
        state = self._pods[uid]
        rec = state.rec
        self._uid_by_key[f"{rec.namespace}/{rec.name}"] = uid
        if rec.problem is not None:
            self._rec_problem[uid] = rec.problem
        else:
            self._rec_problem.pop(uid, None)
        pod = _ready_pod(rec, state.extra, state.prio, state.volumes, state.claims_wait)
        state.ready = pod
        group = (
            f"{rec.namespace}/{rec.group}" if pod is not None and pod.managed and rec.group else ""
        )
        if state.group != group:
            if state.group:
                self._members[state.group].discard(uid)
                dirty_groups.add(state.group)
                self._member_problem.pop(uid, None)
            state.group = group
        if group:
            self._members[group].add(uid)
            dirty_groups.add(group)
        implicit = ""
        if pod is not None and pod.managed and not rec.group:
            name = rec.name
            if pod.gang in self._podgroups:
                # A PodGroup shares this pod's name; the pod did not ask to join it. "~"
                # cannot appear in a Kubernetes name, so the implicit gang's key stays unique.
                name = f"{rec.name}~pod"
                pod = dataclasses.replace(pod, gang=f"{rec.namespace}/{name}")
            implicit = pod.gang
            self._implicit[implicit] = _stand_in(pod, name, rec.hints)
            dirty_gangs.add(implicit)
        if state.implicit and state.implicit != implicit:
            self._implicit.pop(state.implicit, None)
            dirty_gangs.add(state.implicit)
        state.implicit = implicit
        if not group:
            self._publish(state, pod)

    # --- gangs -------------------------------------------------------------------------

    def _parse_group(self, key: str, raw: Mapping[str, Any]) -> Gang | SpecError:
        hit = self._gang_memo.get(key)
        if hit is not None and hit[0] is raw:
            return hit[1]
        parsed: Gang | SpecError
        try:
            if is_volcano(raw):
                parsed = volcano_gang_from_k8s(raw, priorities=self._priorities)
            else:
                parsed = gang_from_k8s(
                    raw, default_queue=self.default_queue, priorities=self._priorities
                )
        except SpecError as e:
            parsed = e
        self._gang_memo[key] = (raw, parsed)
        return parsed

    def _update_group(self, key: str, dirty_gangs: set[str]) -> None:
        raw = self._podgroups.get(key)
        uids = self._members.get(key) or set()
        states = sorted(
            (self._pods[u] for u in uids if self._pods[u].ready is not None),
            key=lambda st: (st.ready.creation_time, st.ready.key),  # type: ignore[union-attr]
        )
        members = [st.ready for st in states if st.ready is not None]
        may_preempt = all(st.rec.hints.may_preempt for st in states)
        gang: Gang | None = None
        self._group_problem.pop(key, None)
        if raw is not None:
            parsed = self._parse_group(key, raw)
            if isinstance(parsed, SpecError):
                self._group_problem[key] = _podgroup_problem(raw, parsed)
            else:
                gang = _with_members(
                    parsed, raw, members, self.default_queue, may_preempt, self._priorities
                )
        if gang is not None:
            self._pg_gang[key] = gang
        else:
            self._pg_gang.pop(key, None)
        dirty_gangs.add(key)
        if not uids:
            self._members.pop(key, None)
            self._orphan.pop(key, None)
            return
        orphan: Gang | None = None
        group_name = key.split("/", 1)[1]
        for st in states:
            pod = st.ready
            assert pod is not None
            if gang is not None:
                self._member_problem.pop(pod.uid, None)
                changes: dict[str, Any] = {}
                if pod.queue != gang.queue:
                    changes["queue"] = gang.queue
                if (
                    raw is not None
                    and _class_priority(raw, self._priorities)
                    and (pod.priority != gang.priority)
                ):
                    changes["priority"] = gang.priority
                self._publish(st, dataclasses.replace(pod, **changes) if changes else pod)
                continue
            if pod.bound:
                # Still holds its node (e.g. its PodGroup was deleted while it runs).
                self._member_problem.pop(pod.uid, None)
                if orphan is None:
                    orphan = _stand_in(pod, group_name, GangHints(may_preempt))
                self._publish(st, pod)
            else:
                self._member_problem[pod.uid] = self._missing_group(st.rec, key, raw)
                self._publish(st, None)
        if orphan is not None:
            self._orphan[key] = orphan
        else:
            self._orphan.pop(key, None)

    def _missing_group(self, rec: PodRecord, key: str, raw: Mapping[str, Any] | None) -> Problem:
        if raw is not None:
            message = (
                f"PodGroup {key} is invalid (see its events); fix the PodGroup so this "
                "pod can be scheduled"
            )
            reason = "PodGroupInvalid"
        elif not self._podgroup_api:
            message = (
                f"this pod names PodGroup {rec.group!r}, but the PodGroup CRD "
                f"({PODGROUP.plural}.{PODGROUP.group}, or Volcano's "
                f"{VOLCANO_PODGROUP.plural}.{VOLCANO_PODGROUP.group}) is not installed; "
                "install one (kubectl apply -f crds/) or remove the annotation"
            )
            reason = "PodGroupNotFound"
        else:
            message = (
                f"PodGroup {rec.group!r} does not exist in namespace {rec.namespace}; "
                "create it or correct the annotation"
            )
            reason = "PodGroupNotFound"
        return _pod_problem(rec, f"metadata.annotations[{rec.group_annotation}]", message, reason)

    def _update_gang(self, key: str) -> None:
        gang = self._pg_gang.get(key) or self._implicit.get(key) or self._orphan.get(key)
        present = key in self._gangs
        if gang is None:
            if present:
                del self._gangs[key]
                i = bisect.bisect_left(self._gang_keys, key)
                del self._gang_keys[i]
            return
        if not present:
            bisect.insort(self._gang_keys, key)
        self._gangs[key] = gang

    def _problems(self) -> tuple[Problem, ...]:
        out = list(self._rec_problem.values())
        out += self._group_problem.values()
        out += self._member_problem.values()
        out.sort(key=lambda p: (p.kind, p.namespace, p.name, p.field))
        return tuple(out)


def _class_priority(raw: Mapping[str, Any], priorities: Mapping[str, int]) -> bool:
    """True when the PodGroup's own PriorityClass decides its priority (KAI: whenever it
    names one, an unknown one being an error; Volcano: when the class exists)."""
    pc = (raw.get("spec") or {}).get("priorityClassName")
    if not pc:
        return False
    return not is_volcano(raw) or pc in priorities


def _with_members(
    gang: Gang,
    raw: Mapping[str, Any],
    members: Sequence[Pod],
    default_queue: str,
    may_preempt: bool = True,
    priorities: Mapping[str, int] | None = None,
) -> Gang:
    """A PodGroup's gang completed from its members (oldest first): the queue of the first
    labelled member when a KAI PodGroup names none, the highest member priority when it names
    no PriorityClass, and ``may_preempt`` (False when a member's preemption policy is Never)."""
    spec = raw.get("spec") or {}
    volcano = is_volcano(raw)
    changes: dict[str, Any] = {}
    if gang.may_preempt != may_preempt:
        changes["may_preempt"] = may_preempt
    if not spec.get("queue") and not volcano:
        labelled = [p.queue for p in members if p.queue != default_queue]
        if labelled:
            changes["queue"] = labelled[0]
    if not _class_priority(raw, priorities or {}) and members:
        priority = max(p.priority for p in members)
        changes["priority"] = priority
        if not volcano and not preemptibility_of(raw):
            changes["preemptible"] = priority < BUILD_PRIORITY
    return dataclasses.replace(gang, **changes) if changes else gang


def resolve(
    records: Iterable[PodRecord],
    podgroups: Mapping[str, Mapping[str, Any]],
    *,
    default_queue: str,
    priorities: Mapping[str, int],
    overlay: Mapping[str, tuple[str, GpuGrant]] | None = None,
    podgroup_api: bool = True,
    volumes: Mapping[str, VolumeVerdict] | None = None,
) -> Resolution:
    """Pods, gangs and problems from the store's contents, from scratch.

    ``podgroups`` maps ``namespace/name`` to the raw PodGroup; ``overlay`` maps pod uid to the
    (node, device grant) of pods assumed bound but not yet seen bound. ``podgroup_api`` False
    means the PodGroup CRD is not installed, which the reason of a pod naming a PodGroup then
    says. ``volumes`` maps the uid of a pod with :attr:`PodRecord.claims` to the verdict on
    them (the store replaces a verdict only when it changes).
    """
    return Resolver(default_queue).resolve(
        {r.uid: r for r in records},
        podgroups,
        priorities=priorities,
        overlay=overlay,
        podgroup_api=podgroup_api,
        volumes=volumes,
    )
