r"""The scheduler's in-memory view of the cluster, fed by watch events.

:class:`Cache` keeps the latest API object of every watched kind, parsed once on arrival, and
hands out an immutable :class:`Snapshot` per cycle. Pods the scheduler is binding are
*assumed*: counted as bound (with their GPU grant) before the watch reports them::

    pending --assume--> assumed(binding) --bind ok--------> assumed(bound)
                           |       \--no answer---------> assumed(uncertain)
                           |--bind refused: forget--> pending
    assumed(*) --watch or read-back shows it bound--> bound (confirmed)
    assumed(bound|uncertain) --read-back shows it unbound--> pending

An assumption never expires on a timer: a slow watch must not make a bound pod look pending
(it would be placed again and its devices granted twice). Instead :meth:`Cache.due_checks`
names the assumptions the watch has not confirmed for a while, the live backend reads those
pods back, and hands what it read to :meth:`Cache.observe_pod`; only a pod *seen* unbound after
its bind finished is pending again.

Pod events older than what the cache already holds (a lower resourceVersion, e.g. a slow watch
delivering the pre-bind state after a read-back) are ignored, as kube-scheduler's assume cache
does, so a read-back is never undone by a late event.

A pod's GPU grant annotation counts only once the pod is bound: a pending pod's leftover grant
(from an old attempt, or written by hand) never beats the assumption of a new placement.

Taking back: pods the commit *nominated* (a place held while the pods evicted for them
terminate) and pods it just *evicted* are overlaid on the snapshot (see
:mod:`scheduler.cache.holds`); PodDisruptionBudgets are resolved against the stored pods into
``Snapshot.budgets`` (see :mod:`scheduler.cache.budgets`).

Bad input never raises: an object the scheduler cannot read is left out of scheduling and
reported by :meth:`Cache.problems`; a bound pod still occupies its node as far as it can be read.

Volumes (:mod:`scheduler.cache.volumes`): PersistentVolumeClaims, PersistentVolumes and
StorageClasses are stored as they are; an unbound pod of ours that uses claims gets a verdict
on them, recomputed when one of them changes (a changed verdict wakes the cycle loop), and the
resolver ANDs the volumes' node affinity into the pod's or makes it wait
(:mod:`scheduler.cluster.volumes`). When the scheduler may not read one of these kinds, only
pods that use claims wait, saying what to grant. :attr:`Cache.volumes` reserves the volumes
chosen for the WaitForFirstConsumer claims of pods being committed until the watch shows
them bound (:mod:`scheduler.commit.volumebind` writes the bindings).

Volcano (:mod:`scheduler.cache.volcano`): Volcano's Queues and PodGroups are stored beside
KAI's and translated into the same queues and gangs. Names are shared: a queue is a queue
whichever API defines it, and a PodGroup ``namespace/name`` is one gang. When both APIs define
the same name, KAI's object is used and the Volcano one is reported (a Warning Event on it)
and ignored. While Volcano's Queue API is installed, Volcano's ``root`` and ``default`` queues
exist even without objects (``default`` below ``root``, weight 1; every Volcano queue without
a parent hangs below ``root``), as with Volcano's own scheduler. Without Volcano's CRDs
nothing of this appears.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from scheduler.cache.budgets import BudgetIndex
from scheduler.cache.dra_store import DRA_KIND_NAMES, StoreDra
from scheduler.cache.grants import (
    GPU_GRANT_ANNOTATION,
    GpuGrant,
    GrantError,
    normalize_grant,
    parse_gpu_grant,
)
from scheduler.cache.holds import Holds, Nomination
from scheduler.cache.nodespec import node_from_k8s
from scheduler.cache.problems import Problem
from scheduler.cache.resolve import PodRecord, Resolution, Resolver
from scheduler.cache.restoring import RestoringGangs
from scheduler.cache.volcano import DEFAULT_QUEUE as VOLCANO_DEFAULT_QUEUE
from scheduler.cache.volcano import (
    PREEMPTABLE_KEY,
    default_queue,
    root_queue,
    volcano_queue_from_k8s,
)
from scheduler.cache.volumes import VolumeIndex
from scheduler.cluster.gpusharing import (
    Reservation,
    ScalingPod,
    devices_in_use,
    is_sharer,
    reservation_from_k8s,
    scaling_from_k8s,
)
from scheduler.cluster.hostports import HOST_PORT_PREFIX, with_host_ports
from scheduler.cluster.node import Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.podspec import (
    GANG_ANNOTATIONS,
    PREEMPTIBILITY_LABEL,
    PREEMPTION_DELAY_ANNOTATION,
    PodSpecError,
    effective_requests,
    gang_hints,
    pod_from_k8s,
)
from scheduler.cluster.queue import Queue
from scheduler.cluster.queuespec import SpecError, queue_from_k8s
from scheduler.cluster.snapshot import Snapshot
from scheduler.cluster.volumes import pod_claims
from scheduler.k8s.resources import (
    CLUSTER_SCOPED_KINDS,
    KINDS,
    PODGROUP,
    QUEUE,
    VOLCANO_KINDS,
    VOLCANO_PODGROUP,
    VOLCANO_QUEUE,
    VOLUME_KINDS,
    WATCHED_KINDS,
)

if TYPE_CHECKING:
    from scheduler.cache.dra import DraIndex
    from scheduler.cache.dra_reservations import DraReservations
    from scheduler.cluster.dra import DeviceId

__all__ = ["DEFAULT_ASSUME_TTL", "EVENT_TYPES", "Cache"]

log = structlog.get_logger("scheduler.cache")

#: Seconds after a successful bind before a pod the watch has not confirmed is read back.
DEFAULT_ASSUME_TTL = 30.0
#: Seconds after a bind without an answer before the pod is read back.
DEFAULT_UNCERTAIN_RECHECK = 2.0
EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED")


@dataclass(slots=True)
class _Assumption:
    node: str
    grant: GpuGrant
    #: "binding" (request in flight), "bound" (bind succeeded) or "uncertain" (no answer).
    state: str
    #: When the bind finished (or the last read-back found nothing to settle).
    checked: float


def _resource_version(obj: Mapping[str, Any]) -> int | None:
    """The object's resourceVersion as a number (etcd revisions are), None when not one."""
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    if raw is None:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def _key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


def _strip(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """A shallow copy without managedFields (large, never read), with kind/apiVersion set."""
    out = dict(obj)
    meta = out.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    rk = KINDS[kind]
    out.setdefault("kind", rk.kind)
    out.setdefault("apiVersion", rk.api_version)
    return out


def _slim_pod(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the store keeps of a pod's API object once it is parsed: identity, metadata and
    phase. The spec and the rest of the status (most of a pod's ~10-20 KB) live on only as
    the parsed :class:`PodRecord`, which is what a 50,000-pod cluster has to fit in memory."""
    return {
        "kind": obj.get("kind", "Pod"),
        "apiVersion": obj.get("apiVersion", "v1"),
        "metadata": obj.get("metadata") or {},
        "status": {"phase": (obj.get("status") or {}).get("phase")},
    }


#: Label that takes a pod out of the pod grouper's hands (and out of waiting for it).
SKIP_POD_GROUPER = "kai.scheduler/skip-podgrouper"


class Cache:
    """Watch events in, :class:`Snapshot` out (see the module docstring).

    ``scheduler_name`` (one name, or several) decides which pods are ``managed``: those whose
    ``spec.schedulerName`` is one of them; ``default_queue`` is the queue of pods and KAI
    PodGroups that name none; ``clock`` gives wall-clock seconds (tests pass a fake).
    Not thread-safe: use it from the event loop only.
    """

    def __init__(
        self,
        scheduler_name: str | Iterable[str],
        default_queue: str = "default-queue",
        clock: Callable[[], float] = time.time,
        *,
        assume_ttl: float = DEFAULT_ASSUME_TTL,
        uncertain_recheck: float = DEFAULT_UNCERTAIN_RECHECK,
        wait_for_pod_grouper: bool = False,
    ) -> None:
        names = (scheduler_name,) if isinstance(scheduler_name, str) else tuple(scheduler_name)
        #: A pod grouper makes every gang: a pending pod that names no PodGroup yet waits for
        #: it instead of running alone (it would otherwise be bound as a gang of one in the
        #: moment before the grouper annotates it). ``kai.scheduler/skip-podgrouper: "true"``
        #: on the pod opts out.
        self.wait_for_pod_grouper = wait_for_pod_grouper
        if not names:
            raise ValueError("at least one scheduler name is needed")
        #: The first name (what this scheduler calls itself).
        self.scheduler_name = names[0]
        #: Every ``spec.schedulerName`` this scheduler serves.
        self.scheduler_names: frozenset[str] = frozenset(names)
        self.default_queue = default_queue
        self.assume_ttl = assume_ttl
        self.uncertain_recheck = uncertain_recheck
        self._clock = clock
        self._raw: dict[str, dict[str, dict[str, Any]]] = {
            k: {} for k in (*WATCHED_KINDS, *VOLCANO_KINDS)
        }
        self._pods: dict[str, PodRecord] = {}  # by uid
        self._pod_uid: dict[str, str] = {}  # namespace/name -> uid
        self._nodes: dict[str, Node] = {}
        self._queues: dict[str, Queue] = {}
        #: Volcano's queues, parsed (by name; those shadowed by a KAI queue included).
        self._volcano_queues: dict[str, Queue] = {}
        self._priorities: dict[str, int] = {}
        self._parse_problems: dict[tuple[str, str], Problem] = {}  # (kind, key), nodes/queues
        self._assumed: dict[str, _Assumption] = {}
        #: Newest resourceVersion applied per pod uid (older events are ignored).
        self._pod_rv: dict[str, int] = {}
        #: Kinds whose API (CRD) is not installed, as the watcher found.
        self._absent: set[str] = set()
        #: Kinds listed or seen at least once (their API exists unless in ``_absent``).
        self._seen: set[str] = set()
        #: Keys of the Volcano PodGroups in use as gangs at the last resolution.
        self._volcano_gangs: frozenset[str] = frozenset()
        #: Pods of other schedulers that name a PodGroup: uid -> ``namespace/group``.
        self._foreign_member: dict[str, str] = {}
        #: Pod uid -> the host port resources it asks for (pods that ask for any only).
        self._host_ports: dict[str, tuple[str, ...]] = {}
        #: ``namespace/group`` -> how many pods of other schedulers name it.
        self._foreign_groups: dict[str, int] = {}
        self._generation = 0
        self._resolved: tuple[int, Resolution] | None = None
        #: Nominated and freshly evicted pods (see :mod:`scheduler.cache.holds`).
        self._holds = Holds()
        #: The resolved pods with :attr:`_holds` applied, for the generation they are of.
        self._held: tuple[int, tuple[Pod, ...]] | None = None
        self._budgets = BudgetIndex()
        self._volumes = VolumeIndex(
            self._raw["PersistentVolumeClaim"],
            self._raw["PersistentVolume"],
            self._raw["StorageClass"],
            nodes=self._nodes,
            on_change=lambda wake: self._changed(wake=wake),
        )
        self._resolver = Resolver(default_queue)
        #: DeviceClasses, ResourceSlices, ResourceClaims, the claim verdicts of pending pods
        #: and the devices of commits in flight (:mod:`scheduler.cache.dra_store`).
        self._dra = StoreDra()
        #: Gangs consolidation moved, admitted first until they run again (:mod:`.restoring`).
        self._restoring = RestoringGangs()
        #: GPU reservation pods (see :mod:`scheduler.cluster.gpusharing`), by namespace/name.
        #: Kept out of the pods: the device they hold is already counted by its sharers.
        self._reservations: dict[str, Reservation] = {}
        #: Scaling pods (whole-GPU stand-ins for autoscalers), by namespace/name: never placed.
        self._scaling: dict[str, ScalingPod] = {}
        self.pending_changed = asyncio.Event()
        """Set whenever something changed that may let a pending pod be placed (new pending
        pod, freed capacity, node/queue/PodGroup change, a forgotten or expired assumption).
        The runner clears it before a cycle and waits on it (debounced) for the next one."""

    # --- events ------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """Increases whenever the scheduling view changes (status-only updates do not count)."""
        return self._generation

    def set_absent(self, kind: str, absent: bool) -> None:
        """The watcher found ``kind``'s API missing (``absent``) or installed again; pods that
        need it wait with a reason that says so."""
        before = kind in self._absent
        if absent:
            self._absent.add(kind)
        else:
            self._absent.discard(kind)
        if before != absent:
            if kind in VOLUME_KINDS:
                self._volumes.absent = self._absent & set(VOLUME_KINDS)
                self._volumes.everything_changed()
            if kind in DRA_KIND_NAMES:
                self._dra.set_absent(self._absent)
            self._changed()

    def _changed(self, *, wake: bool = True) -> None:
        """The scheduling view changed; ``wake`` the cycle loop unless the change can neither
        add pending work nor free capacity (a bind confirmed, a running pod's status)."""
        self._generation += 1
        if wake:
            self.pending_changed.set()

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """Apply one watch event (``ADDED``/``MODIFIED``/``DELETED``) of ``kind``.

        ``obj`` is the object in its API JSON form. Never raises for bad objects: they become
        problems. An unknown kind or event type is logged and ignored.
        """
        if kind not in self._raw or event_type not in EVENT_TYPES:
            log.warning("cache_event_ignored", kind=kind, event_type=event_type)
            return
        self._seen.add(kind)
        meta = obj.get("metadata") or {}
        key = _key(meta.get("namespace") or "", meta.get("name") or "")
        try:
            if event_type == "DELETED":
                self._delete(kind, key, obj)
            else:
                self._upsert(kind, key, _strip(obj, kind))
        except Exception:
            # A bug here must not stop the watch; the object is left as it was.
            log.exception("cache_apply_failed", kind=kind, key=key, event_type=event_type)

    def relisted(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """Replace every object of ``kind`` with the result of a fresh list."""
        listed: set[tuple[str, str]] = set()
        for obj in objs:
            meta = obj.get("metadata") or {}
            listed.add((meta.get("namespace") or "", meta.get("name") or ""))
            self.apply(kind, "MODIFIED", obj)
        self.relist_done(kind, listed)

    def relist_done(self, kind: str, listed: AbstractSet[tuple[str, str]]) -> None:
        """A list of ``kind``, applied page by page, has ended: what it did not name is gone."""
        if kind in self._raw and kind not in self._seen:
            self._seen.add(kind)
            self._changed(wake=False)  # e.g. Volcano's root and default queues appear
        keep = {_key(namespace, name) for namespace, name in listed}
        for key in [k for k in self._raw.get(kind, {}) if k not in keep]:
            self.apply(kind, "DELETED", self._raw[kind][key])
        if kind == "Pod":
            for key in [k for k in self._reservations if k not in keep]:
                del self._reservations[key]
            for key in [k for k in self._scaling if k not in keep]:
                del self._scaling[key]

    def _upsert(self, kind: str, key: str, obj: dict[str, Any]) -> None:
        if kind == "Pod":
            reservation = reservation_from_k8s(obj)
            if reservation is not None:
                self._reservations[key] = reservation
                return
            scaling = scaling_from_k8s(obj)
            if scaling is not None:
                self._scaling[key] = scaling
                return
            self._upsert_pod(key, obj)
            return
        if kind == "PodDisruptionBudget":
            self._raw[kind][key] = obj
            if self._budgets.budget_changed(key, obj):
                self.pending_changed.set()  # a plan a budget held back may work now
            return
        if kind in VOLUME_KINDS:
            self._raw[kind][key] = obj
            self._volume_changed(kind, key, obj)
            return
        if kind in DRA_KIND_NAMES:
            self._raw[kind][key] = obj
            if self._dra.upsert(kind, key, obj):
                self._changed()  # devices published, taken or freed; a verdict may change
            return
        old = self._raw[kind].get(key)
        self._raw[kind][key] = obj
        if kind == "Node":
            self._upsert_parsed(kind, key, obj, self._nodes, node_from_k8s)
        elif kind == "Queue":
            self._upsert_parsed(kind, key, obj, self._queues, queue_from_k8s)
        elif kind == VOLCANO_QUEUE.key:
            self._upsert_parsed(kind, key, obj, self._volcano_queues, volcano_queue_from_k8s)
        elif kind in ("PodGroup", VOLCANO_PODGROUP.key):
            if old is None or _gang_facts(old) != _gang_facts(obj):
                self._changed()
        elif kind == "PriorityClass":
            value = obj.get("value")
            if isinstance(value, int) and self._priorities.get(key) != value:
                self._priorities[key] = value
                self._changed()

    def _delete(self, kind: str, key: str, obj: Mapping[str, Any]) -> None:
        if kind == "Pod":
            if self._reservations.pop(key, None) is not None:
                return
            if self._scaling.pop(key, None) is not None:
                return
            uid = (obj.get("metadata") or {}).get("uid") or self._pod_uid.get(key, "")
            self._drop_pod(uid, key)
            return
        if kind == "PodDisruptionBudget":
            self._raw[kind].pop(key, None)
            if self._budgets.budget_removed(key):
                self.pending_changed.set()
            return
        if kind in VOLUME_KINDS:
            if self._raw[kind].pop(key, None) is not None:
                self._volume_changed(kind, key, None)
            return
        if kind in DRA_KIND_NAMES:
            self._raw[kind].pop(key, None)
            if self._dra.delete(kind, key):
                self._changed()
            return
        if self._raw[kind].pop(key, None) is None:
            return
        self._parse_problems.pop((kind, key), None)
        if kind == "Node":
            self._nodes.pop(key, None)
        elif kind == "Queue":
            self._queues.pop(key, None)
        elif kind == VOLCANO_QUEUE.key:
            self._volcano_queues.pop(key, None)
        elif kind == "PriorityClass":
            self._priorities.pop(key, None)
        self._changed()

    def _volume_changed(self, kind: str, key: str, obj: Mapping[str, Any] | None) -> None:
        """A claim, volume or StorageClass changed: re-judge the pods it may concern, and
        wake the cycle loop when a verdict changed (see :mod:`scheduler.cache.volumes`)."""
        if kind == "PersistentVolumeClaim":
            changed = self._volumes.claim_changed(key)
        elif kind == "PersistentVolume":
            changed = self._volumes.volume_changed(key, obj)
        else:
            changed = self._volumes.everything_changed()
        if changed:
            self._changed()

    def _upsert_parsed(
        self,
        kind: str,
        key: str,
        obj: Mapping[str, Any],
        store: dict[str, Any],
        parse: Callable[[Mapping[str, Any]], Any],
    ) -> None:
        try:
            value = parse(obj)
        except SpecError as e:
            meta = obj.get("metadata") or {}
            rk = KINDS[kind]
            problem = Problem(
                rk.kind, "", key, e.field, e.message, meta.get("uid", ""), rk.api_version
            )
            if self._parse_problems.get((kind, key)) != problem or key in store:
                log.warning("object_skipped", kind=kind, name=key, field=e.field, error=e.message)
                self._parse_problems[(kind, key)] = problem
                store.pop(key, None)
                self._changed()
            return
        had_problem = self._parse_problems.pop((kind, key), None) is not None
        if store.get(key) != value or had_problem:
            store[key] = value
            self._changed()

    # --- pods --------------------------------------------------------------------------

    def _drop_pod(self, uid: str, key: str) -> None:
        if self._pod_uid.get(key) == uid:
            del self._pod_uid[key]
            self._raw["Pod"].pop(key, None)
        self._assumed.pop(uid, None)
        self._pod_rv.pop(uid, None)
        self._budgets.pod_removed(uid)
        self._note_foreign(uid, "")
        self._host_ports.pop(uid, None)
        self._volumes.pod_removed(uid)
        self._dra.pod_removed(uid)
        held = self._holds.forget(uid)
        if self._pods.pop(uid, None) is not None:
            self._changed()
        elif held:
            self._generation += 1

    def _note_foreign(self, uid: str, group: str) -> None:
        """Count pod ``uid`` as another scheduler's member of ``group`` ("" for none)."""
        before = self._foreign_member.get(uid, "")
        if before == group:
            return
        if before:
            left = self._foreign_groups[before] - 1
            if left:
                self._foreign_groups[before] = left
            else:
                del self._foreign_groups[before]
            del self._foreign_member[uid]
        if group:
            self._foreign_member[uid] = group
            self._foreign_groups[group] = self._foreign_groups.get(group, 0) + 1

    def _upsert_pod(self, key: str, obj: dict[str, Any]) -> bool:
        """Store a pod unless it is older than what we hold; True when stored."""
        meta = obj.get("metadata") or {}
        uid = meta.get("uid") or key
        rv = _resource_version(obj)
        held = self._pod_rv.get(uid)
        if rv is not None and held is not None and rv < held:
            log.debug("pod_event_stale", pod=key, resource_version=rv, held=held)
            return False
        if rv is not None:
            self._pod_rv[uid] = rv
        previous_uid = self._pod_uid.get(key)
        if previous_uid is not None and previous_uid != uid:
            # Deleted and re-created under the same name while we were not watching.
            self._drop_pod(previous_uid, key)
        self._pod_uid[key] = uid
        record = self._parse_pod(uid, obj)
        pod = record.pod
        confirmed = False
        dropped: _Assumption | None = None
        if pod is not None and pod.node_name is not None:
            assumption = dropped = self._assumed.pop(uid, None)
            confirmed = assumption is not None and assumption.node == pod.node_name
            if assumption is not None:
                log.debug("pod_confirmed", pod=key, node=pod.node_name)
                if assumption.node != pod.node_name:
                    log.warning(
                        "pod_bound_elsewhere", pod=key, node=pod.node_name, assumed=assumption.node
                    )
        ours = (obj.get("spec") or {}).get("schedulerName") in self.scheduler_names
        foreign = record.group and not ours
        self._note_foreign(uid, f"{record.namespace}/{record.group}" if foreign else "")
        ports = tuple(r for r in pod.requests if r.startswith(HOST_PORT_PREFIX)) if pod else ()
        if ports:
            self._host_ports[uid] = ports
        else:
            self._host_ports.pop(uid, None)
        slim = self._raw["Pod"][key] = _slim_pod(obj)
        self._budgets.pod_changed(slim)
        held = self._holds.observe(uid, pod)
        self._volumes.pod_changed(uid, record)
        claims_changed = self._dra.track_claims(uid, pod, obj)
        old = self._pods.get(uid)
        if claims_changed and old == record:
            self._changed()  # e.g. the claim controller named the claim made from a template
        if old != record:
            self._pods[uid] = record
            # A confirmed assumption changes nothing the last snapshot did not already count.
            self._changed(wake=not confirmed and _may_free_or_add_work(old, record))
        elif dropped is not None or held:
            self._generation += 1  # the overlay changed even though the record did not
        return True

    def _parse_pod(self, uid: str, obj: Mapping[str, Any]) -> PodRecord:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        annotations = meta.get("annotations") or {}
        group_annotation = next((a for a in GANG_ANNOTATIONS if annotations.get(a)), "")
        node_name = spec.get("nodeName") or None
        managed = spec.get("schedulerName") in self.scheduler_names
        problem: Problem | None = None
        pod = None
        grant: GpuGrant = ()
        # Only a bound pod's grant is a fact; see the module docstring.
        raw_grant = annotations.get(GPU_GRANT_ANNOTATION) if node_name else None
        if raw_grant is not None:
            try:
                grant = parse_gpu_grant(str(raw_grant))
            except GrantError as e:
                problem = self._pod_problem(
                    uid, namespace, name, f"metadata.annotations[{GPU_GRANT_ANNOTATION}]", str(e)
                )
        try:
            # strict: a bad spec is reported for bound pods too.
            pod = pod_from_k8s(
                obj,
                scheduler_name=self.scheduler_names,
                default_queue=self.default_queue,
                strict=True,
                gpu_grant=grant,
            )
        except PodSpecError as e:
            problem = self._pod_problem(uid, namespace, name, e.field, e.message)
            if node_name:
                pod = self._bound_fallback(obj, grant)
        if (
            self.wait_for_pod_grouper
            and managed
            and not node_name
            and not group_annotation
            and problem is None
            and not any(
                str((meta.get(where) or {}).get(SKIP_POD_GROUPER, "")).lower() == "true"
                for where in ("labels", "annotations")
            )
        ):
            field = f"metadata.annotations[{GANG_ANNOTATIONS[0]}]"
            message = (
                "waiting for the pod grouper (kai-scheduler podgrouper) to make this pod's "
                f"PodGroup; to schedule it alone, label it {SKIP_POD_GROUPER}=true"
            )
            problem = dataclasses.replace(
                self._pod_problem(uid, namespace, name, field, message), reason="WaitingForPodGroup"
            )
            pod = None  # not placed until its gang is known
        return PodRecord(
            uid=uid,
            namespace=namespace,
            name=name,
            pod=pod,
            group=str(annotations.get(group_annotation, "")) if group_annotation else "",
            group_annotation=group_annotation,
            priority_class=str(spec.get("priorityClassName") or ""),
            has_priority=spec.get("priority") is not None,
            problem=problem if managed else None,
            hints=gang_hints(obj, strict=False),
            claims=pod_claims(spec, name) if managed and not node_name and pod else (),
        )

    def _pod_problem(self, uid: str, namespace: str, name: str, field: str, msg: str) -> Problem:
        return Problem("Pod", namespace, name, field, msg, uid, KINDS["Pod"].api_version)

    def _bound_fallback(self, obj: Mapping[str, Any], grant: GpuGrant) -> Any:
        """A bound pod with an unreadable spec: keep the requests we can still compute."""
        pod = pod_from_k8s(
            obj,
            scheduler_name=self.scheduler_names,
            default_queue=self.default_queue,
            gpu_grant=grant,
        )
        try:
            return dataclasses.replace(pod, requests=effective_requests(obj.get("spec") or {}))
        except PodSpecError:
            return pod

    # --- assume / confirm / forget -----------------------------------------------------

    def assume(
        self,
        pod_uid: str,
        node: str,
        gpu_grant: Mapping[int, int] | Iterable[tuple[int, int]] = (),
    ) -> None:
        """Count ``pod_uid`` as bound to ``node`` (with its device grant) until the watch or a
        read-back shows it bound, or :meth:`forget` is called (see the module docstring)."""
        grant = normalize_grant(gpu_grant)
        self._assumed[pod_uid] = _Assumption(node, grant, "binding", self._clock())
        self._generation += 1  # capacity shrank: no new pending work, so no trigger

    def bind_finished(self, pod_uid: str, *, uncertain: bool = False) -> None:
        """The bind of an assumed pod ended: it succeeded, or (``uncertain``) it may have."""
        a = self._assumed.get(pod_uid)
        if a is not None:
            a.state = "uncertain" if uncertain else "bound"
            a.checked = self._clock()

    def forget(self, pod_uid: str) -> None:
        """Undo :meth:`assume`: the bind was refused, or the pod was read back unbound; it is
        pending again and its GPUs are free."""
        if self._assumed.pop(pod_uid, None) is not None:
            self._changed()

    def assumed(self) -> dict[str, str]:
        """Pods assumed but not yet confirmed: uid -> node."""
        return {uid: a.node for uid, a in self._assumed.items()}

    def due_checks(self, now: float | None = None) -> list[tuple[str, str, str]]:
        """Assumed pods to read back now, as (uid, namespace, name): binds without an answer
        after ``uncertain_recheck`` seconds, successful binds the watch has not confirmed
        after ``assume_ttl``. Each is named again only after the same wait."""
        now = self._clock() if now is None else now
        due: list[tuple[str, str, str]] = []
        for uid, a in self._assumed.items():
            wait = self.uncertain_recheck if a.state == "uncertain" else self.assume_ttl
            if a.state == "binding" or now - a.checked < wait:
                continue
            record = self._pods.get(uid)
            if record is None:
                continue
            a.checked = now
            due.append((uid, record.namespace, record.name))
        return due

    def observe_pod(self, obj: Mapping[str, Any]) -> None:
        """Apply a pod just read from the API server (a read-back or a 409's answer).

        A pod read back unbound after its bind finished is pending again: its assumption is
        dropped. Stale reads (older than what the cache holds) change nothing.
        """
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        key = _key(meta.get("namespace") or "", meta.get("name") or "")
        if not self._upsert_pod(key, _strip(obj, "Pod")):
            return
        a = self._assumed.get(uid)
        unbound = not (obj.get("spec") or {}).get("nodeName")
        if a is not None and unbound and a.state != "binding":
            log.info("assumed_pod_unbound", pod=key, node=a.node, state=a.state)
            self.forget(uid)

    def pod_gone(self, uid: str, namespace: str, name: str) -> None:
        """A read-back found no such pod: drop it (the watch will agree)."""
        self._drop_pod(uid, _key(namespace, name))

    # --- nominations and evictions (taking back) ---------------------------------------

    def nominate(
        self,
        pod_uid: str,
        node: str,
        gpu_grant: Mapping[int, int] | Iterable[tuple[int, int]] = (),
    ) -> None:
        """Hold ``node`` (and the device grant) for a pending pod while the pods evicted for
        it terminate: the snapshot shows it there with ``nominated=True`` until
        :meth:`unnominate`, its bind, or its deletion."""
        if pod_uid not in self._pods:
            return
        self._holds.nominated[pod_uid] = Nomination(node, normalize_grant(gpu_grant))
        self._generation += 1  # capacity shrank: no new pending work, so no trigger

    def unnominate(self, pod_uid: str, *, wake: bool = True) -> None:
        """Drop a nomination: the pod is pending again (``wake`` the cycle loop to re-plan;
        not when it is about to be bound)."""
        if self._holds.nominated.pop(pod_uid, None) is not None:
            self._changed(wake=wake)

    def nominated(self) -> dict[str, str]:
        """Nominated pods: uid -> node."""
        return {uid: n.node for uid, n in self._holds.nominated.items()}

    def evicted(self, pod_uid: str) -> None:
        """An eviction of ``pod_uid`` is being sent or was accepted: show the pod terminating
        until the watch does (or :meth:`unevict`), so no cycle plans to evict it again."""
        record = self._pods.get(pod_uid)
        if record is None or (record.pod is not None and record.pod.deleting):
            return
        self._holds.evicted[pod_uid] = f"{record.namespace}/{record.name}"
        self._generation += 1

    def unevict(self, pod_uid: str) -> None:
        """The eviction of ``pod_uid`` did not happen after all (refused, failed, not tried)."""
        if self._holds.evicted.pop(pod_uid, None) is not None:
            self._generation += 1

    def gone(self, pod_uid: str) -> bool:
        """True when the cache holds no such pod, or it has finished (holds nothing)."""
        record = self._pods.get(pod_uid)
        if record is None:
            return True
        return record.pod is not None and not record.pod.active

    @property
    def dra(self) -> DraIndex:
        """The DRA objects and the claim verdicts of pending pods (see
        :mod:`scheduler.cache.dra`); made on first use."""
        return self._dra.index

    @property
    def volumes(self) -> VolumeIndex:
        """Volumes chosen for the claims of pods being committed (reserve, release, done;
        see :mod:`scheduler.cache.volumes`)."""
        return self._volumes

    # --- reading -----------------------------------------------------------------------

    def _resolve(self) -> Resolution:
        if self._resolved is not None and self._resolved[0] == self._generation:
            return self._resolved[1]
        overlay = self._holds.overlay()
        overlay.update({uid: (a.node, a.grant) for uid, a in self._assumed.items()})
        podgroups: Mapping[str, Mapping[str, Any]] = self._raw["PodGroup"]
        volcano = self.volcano_podgroups()
        if volcano:
            # One gang per name: KAI's PodGroup wins (see the module docstring).
            podgroups = {**volcano, **podgroups}
        self._volcano_gangs = frozenset(volcano)
        self._volumes.refresh()  # verdicts marked by volume events since the last snapshot
        resolution = self._resolver.resolve(
            self._pods,
            podgroups,
            priorities=self._priorities,
            overlay=overlay,
            podgroup_api="PodGroup" not in self._absent or self._api_present(VOLCANO_PODGROUP.key),
            volumes=self._volumes.verdicts,
            claims_waits=self._dra.claims_waits(),
        )
        self._resolved = (self._generation, resolution)
        return resolution

    @property
    def dra_reservations(self) -> DraReservations:
        """Devices chosen by commits whose claims the watch does not show allocated yet
        (:mod:`scheduler.cache.dra_reservations`; the commit reserves and releases them,
        a claim event settles them)."""
        return self._dra.reservations

    def dra_reserved_devices(self) -> frozenset[DeviceId]:
        """Devices chosen by commits whose claim status the watch does not show yet."""
        return self._dra.reserved_devices()

    def snapshot(self, now: float | None = None) -> Snapshot:
        """An immutable view for one cycle, assumed pods counted as bound."""
        now = self._clock() if now is None else now
        resolution = self._resolve()
        queues = self._queue_table(resolution)
        nodes = tuple(self._nodes[k] for k in sorted(self._nodes))
        if self._host_ports:  # every node has one of each host port in use
            nodes = with_host_ports(nodes, (r for rs in self._host_ports.values() for r in rs))
        pods, dra = self._dra.view(self._held_pods(resolution))
        return Snapshot(
            nodes=nodes,
            pods=pods,
            dra=dra,
            gangs=resolution.gangs,
            queues=tuple(queues[k] for k in sorted(queues)),
            now=now,
            budgets=self._budgets.budgets(self._pod_objects),
            restoring=self._restoring.current(now),
        )

    def note_moved(self, gangs: Iterable[str]) -> None:
        """Consolidation evicted ``gangs`` to restart elsewhere: admit them first for a while."""
        self._restoring.moved(gangs, self._clock())

    def restored(self, gang: str) -> None:
        """A moved gang is being bound again."""
        self._restoring.bound(gang)

    def reservations(self) -> tuple[Reservation, ...]:
        """The GPU reservation pods the watch shows, by name."""
        return tuple(self._reservations[k] for k in sorted(self._reservations))

    def scaling_pods(self) -> tuple[ScalingPod, ...]:
        """The scaling pods the watch shows, by name."""
        return tuple(self._scaling[k] for k in sorted(self._scaling))

    def shared_devices_in_use(self) -> set[tuple[str, int]]:
        """(node, device) pairs that sharing pods use: bound ones as the watch shows them,
        plus assumed ones (their binds may be in flight), so a reservation pod created for a
        gang being bound is never collected under it."""
        used = devices_in_use(r.pod for r in self._pods.values() if r.pod is not None)
        for uid, assumption in self._assumed.items():
            record = self._pods.get(uid)
            if record is not None and record.pod is not None and is_sharer(record.pod):
                used.update((assumption.node, i) for i, _ in assumption.grant)
        return used

    def sharers(self, node: str, device: int) -> tuple[Pod, ...]:
        """Bound, active sharing pods on ``device`` of ``node`` (whose reservation pod could
        not be restored are evicted: see :mod:`scheduler.commit.gpusharing`)."""
        return tuple(
            r.pod
            for r in self._pods.values()
            if r.pod is not None
            and r.pod.node_name == node
            and (node, device) in devices_in_use((r.pod,))
        )

    def _api_present(self, kind: str) -> bool:
        """True when ``kind``'s API was listed (or an object of it seen) and is not absent."""
        return kind in self._seen and kind not in self._absent

    def _queue_table(self, resolution: Resolution) -> dict[str, Queue]:
        """Every queue of the snapshot by name: KAI's, Volcano's not shadowed by KAI's,
        Volcano's ``root``/``default`` while its Queue API is installed, and an implicit open
        leaf for each queue a gang names whose API is not installed (no quotas to enforce
        then, so pods and gangs still run)."""
        queues = dict(self._queues)
        for name, queue in self._volcano_queues.items():
            if name not in self._raw["Queue"]:
                queues.setdefault(name, queue)
        volcano_api = self._api_present(VOLCANO_QUEUE.key)
        if volcano_api:
            queues.setdefault(root_queue().name, root_queue())
            queues.setdefault(VOLCANO_DEFAULT_QUEUE, default_queue())
        implicit: set[str] = set()
        if "Queue" in self._absent:
            implicit |= {g.queue for g in resolution.gangs if g.queue} | {self.default_queue}
        elif not volcano_api and self._volcano_gangs:
            implicit |= {g.queue for g in resolution.gangs if g.key in self._volcano_gangs}
        for name in implicit:
            queues.setdefault(name, Queue(name))
        return queues

    # --- Volcano (for the status step, scheduler.commit.volcano) -------------------------

    def volcano_podgroups(self) -> dict[str, dict[str, Any]]:
        """Volcano PodGroups in use as gangs (not shadowed by a KAI PodGroup), by
        ``namespace/name``. Do not modify the objects."""
        kai = self._raw["PodGroup"]
        return {k: v for k, v in self._raw[VOLCANO_PODGROUP.key].items() if k not in kai}

    def volcano_queues(self) -> dict[str, dict[str, Any]]:
        """Volcano Queue objects in use (not shadowed by a KAI Queue), by name."""
        kai = self._raw["Queue"]
        return {k: v for k, v in self._raw[VOLCANO_QUEUE.key].items() if k not in kai}

    def foreign_podgroups(self) -> frozenset[str]:
        """PodGroups (``namespace/name``) that pods of other schedulers name."""
        return frozenset(self._foreign_groups)

    def volcano_queue_api(self) -> bool:
        """True while Volcano's Queue API is installed (its queues are in use)."""
        return self._api_present(VOLCANO_QUEUE.key)

    def kai_queue_names(self) -> frozenset[str]:
        """Names of the KAI (``scheduling.run.ai``) Queue objects."""
        return frozenset(self._raw["Queue"])

    def _shadowed(self) -> list[Problem]:
        """Volcano objects ignored because KAI's object of the same name is used."""
        out = []
        for kind, kai in ((VOLCANO_QUEUE, QUEUE), (VOLCANO_PODGROUP, PODGROUP)):
            for key, obj in self._raw[kind.key].items():
                if key not in self._raw[kai.key]:
                    continue
                meta = obj.get("metadata") or {}
                out.append(
                    Problem(
                        kind.kind,
                        meta.get("namespace") or "",
                        meta.get("name") or "",
                        "metadata.name",
                        f"a {kai.kind} {key} of {kai.api_version} exists as well and is used "
                        f"instead of this {kind.api_version} one (a name means one "
                        f"{kind.kind}); rename one of them",
                        meta.get("uid", ""),
                        kind.api_version,
                        reason="NameConflict",
                    )
                )
        return out

    def _pod_objects(self) -> Iterable[dict[str, Any]]:
        return self._raw["Pod"].values()

    def _held_pods(self, resolution: Resolution) -> tuple[Pod, ...]:
        """The resolved pods with nominations and fresh evictions marked (see holds)."""
        if not self._holds:
            return resolution.pods
        if self._held is not None and self._held[0] == self._generation:
            return self._held[1]
        keys = {}
        for uid in (*self._holds.nominated, *self._holds.evicted):
            record = self._pods.get(uid)
            if record is not None:
                keys[uid] = f"{record.namespace}/{record.name}"
        pods = self._holds.apply(resolution.pods, keys)
        self._held = (self._generation, pods)
        return pods

    def problems(self) -> list[Problem]:
        """Everything currently skipped and why: unreadable pods, nodes, queues, PodGroups,
        and pending pods whose PodGroup is missing or invalid."""
        parse = [self._parse_problems[k] for k in sorted(self._parse_problems)]
        parse += self._dra.problems()
        return parse + self._shadowed() + list(self._resolve().problems)

    def raw(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The latest API object (JSON form, without managedFields), or None if unknown.

        ``namespace`` is ignored for cluster-scoped kinds. Do not modify the result.
        """
        store = self._raw.get(kind)
        if store is None:
            return None
        if kind in CLUSTER_SCOPED_KINDS:
            return store.get(name)
        return store.get(_key(namespace, name))

    def objects(self, kind: str) -> list[dict[str, Any]]:
        """Every stored object of ``kind`` (for status writers and debugging)."""
        return list(self._raw.get(kind, {}).values())

    def counts(self) -> dict[str, int]:
        """Number of stored objects per kind (for metrics)."""
        return {kind: len(objs) for kind, objs in self._raw.items()}


def _may_free_or_add_work(old: PodRecord | None, new: PodRecord) -> bool:
    """Whether a pod's change may let a pending pod be placed: it is or was pending, it
    stopped holding resources, or it holds them elsewhere. A pod that stays bound and active
    on the same node (its bind confirmed, kubelet status updates) changes nothing a cycle
    could act on; waking the loop for each of those made a backlog of binds run an empty
    cycle per watch event."""
    a, b = (old.pod if old is not None else None), new.pod
    if a is None or b is None:
        return True
    if a.pending or b.pending:
        return True
    return (a.active and not b.active) or a.node_name != b.node_name or a.deleting != b.deleting


def _gang_facts(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a PodGroup (KAI's or Volcano's) affects scheduling (status writes by us do
    not)."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return (
        obj.get("spec"),
        meta.get("creationTimestamp"),
        labels.get(PREEMPTIBILITY_LABEL),
        annotations.get(PREEMPTION_DELAY_ANNOTATION),
        labels.get(PREEMPTABLE_KEY),
        annotations.get(PREEMPTABLE_KEY),
    )
