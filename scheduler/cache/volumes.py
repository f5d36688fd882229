"""The verdicts on pending pods' PersistentVolumeClaims, kept current as claims, volumes and
StorageClasses change (:mod:`scheduler.cluster.volumes` says what a verdict is), and the
volumes chosen for the claims of pods being committed.

Only unbound pods of this scheduler that use claims are tracked. A claim event re-judges the
pods that use the claim; a PersistentVolume event the pods whose claims name it (or that it
names in ``spec.claimRef``, before or after the event) at once, and - when what decides
whether it can bind a claim changed - marks for judging the pods with an unbound claim of
its StorageClass, which are judged when the next snapshot is taken (:meth:`refresh`; a relist
of thousands of volumes then costs one judgement per pod, not one per volume and pod). A
StorageClass event, or a kind's API going missing or coming back, re-judges every tracked pod
(both are rare). The store wakes the cycle loop only when a verdict changed (or may have), so
claims and volumes of other pods cost no cycle.

Reservations (kube-scheduler's assumed volumes): when a pod with unbound WaitForFirstConsumer
claims is committed, :meth:`VolumeIndex.reserve` chooses a volume for each on the pod's node
(:func:`scheduler.cluster.volumes.choose_volumes`) and keeps it *reserved* for the claim: no
other claim gets it, and the claim gets no other, until the watch shows the volume's
``claimRef`` set (or the volume deleted), or the commit :meth:`~VolumeIndex.release`\\ s it
because writing it failed. Two gangs of one cycle therefore never get the same volume. A pod
for which no volume is left on its node gets that node *avoided* (``metadata.name NotIn``) until
the volumes of its claims' classes change, so a pod whose node cannot hold all its claims is
placed elsewhere next time instead of on the same node again.

When the scheduler may not write volumes (403), :meth:`VolumeIndex.forbid_writes` makes the
pods with such claims wait naming the permission until :meth:`~VolumeIndex.allow_writes`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from scheduler.cache.resolve import PodRecord
from scheduler.cluster.node import Node
from scheduler.cluster.volumecatalog import VolumeCatalog
from scheduler.cluster.volumeobjects import VolumeBinding, claim_class
from scheduler.cluster.volumes import VolumeVerdict, choose_volumes, volume_verdict

__all__ = ["VolumeIndex"]


class VolumeIndex:
    """Verdicts by pod uid, from the store's raw claims, volumes and classes (by key), and
    the volumes reserved for claims being bound. ``nodes`` are the store's nodes (by name);
    ``on_change(wake)`` is called when reserving or releasing volumes changed verdicts
    (``wake``: the cycle loop may have new work)."""

    def __init__(
        self,
        pvcs: Mapping[str, Mapping[str, Any]],
        pvs: Mapping[str, Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        *,
        nodes: Mapping[str, Node] | None = None,
        on_change: Callable[[bool], None] = lambda wake: None,
    ) -> None:
        self._pvcs = pvcs
        self._pvs = pvs
        self._classes = classes
        self._nodes: Mapping[str, Node] = nodes if nodes is not None else {}
        self._on_change = on_change
        #: The volumes, parsed and indexed (kept in step with ``pvs`` by volume_changed).
        self.catalog = VolumeCatalog.of(pvs)
        #: Kinds whose objects cannot be read (API missing or forbidden).
        self.absent: set[str] = set()
        #: Why volumes cannot be bound at all (the scheduler may not write them), or None.
        self.write_problem: str | None = None
        self._write_token = 0
        #: The verdict of every tracked pod (replaced only when it changes).
        self.verdicts: dict[str, VolumeVerdict] = {}
        self._records: dict[str, PodRecord] = {}
        #: ``namespace/claim`` -> uids of the tracked pods that use it.
        self._users: defaultdict[str, set[str]] = defaultdict(set)
        #: StorageClass -> uids of the tracked pods with an unbound claim of it.
        self._class_users: defaultdict[str, set[str]] = defaultdict(set)
        self._pod_classes: dict[str, frozenset[str]] = {}
        #: Tracked pods to judge again before the next snapshot.
        self._dirty: set[str] = set()
        #: Volume -> ``namespace/claim`` it is reserved for, and the reverse.
        self._reserved: dict[str, str] = {}
        self._reserved_claims: dict[str, str] = {}
        #: Volume -> uids of the pods whose commit uses the reservation.
        self._holders: dict[str, set[str]] = {}
        #: Pod uid -> the volumes chosen for its claims (until its commit settles them).
        self._by_pod: dict[str, tuple[VolumeBinding, ...]] = {}
        #: Pod uid -> nodes where no volume was left for its claims.
        self._avoid: dict[str, set[str]] = {}

    # --- verdicts ------------------------------------------------------------------------

    def _judge(self, uid: str) -> bool:
        """Recompute one tracked pod's verdict; True when it changed."""
        rec = self._records[uid]
        self._dirty.discard(uid)
        verdict = volume_verdict(
            rec.namespace,
            rec.name,
            rec.uid,
            rec.claims,
            pvcs=self._pvcs,
            pvs=self._pvs,
            classes=self._classes,
            absent=self.absent,
            catalog=self.catalog,
            reserved=self._reserved,
            reserved_claims=self._reserved_claims,
            avoid=self._avoid.get(uid, ()),
            write_problem=self.write_problem,
        )
        self._track_classes(uid, rec)
        if self.verdicts.get(uid) == verdict:
            return False
        self.verdicts[uid] = verdict
        return True

    def _track_classes(self, uid: str, rec: PodRecord | None) -> None:
        """Remember the StorageClasses of the pod's unbound claims."""
        classes: set[str] = set()
        for claim in rec.claims if rec is not None else ():
            pvc = self._pvcs.get(f"{rec.namespace}/{claim.name}") if rec is not None else None
            if pvc is not None and not (pvc.get("spec") or {}).get("volumeName"):
                classes.add(claim_class(pvc))
        before = self._pod_classes.get(uid, frozenset())
        if before == classes:
            return
        for name in before - classes:
            users = self._class_users.get(name)
            if users is not None:
                users.discard(uid)
                if not users:
                    del self._class_users[name]
        for name in classes - before:
            self._class_users[name].add(uid)
        if classes:
            self._pod_classes[uid] = frozenset(classes)
        else:
            self._pod_classes.pop(uid, None)

    def _mark(self, uids: Iterable[str]) -> bool:
        """Judge these tracked pods before the next snapshot; True when there is any."""
        marked = {uid for uid in uids if uid in self._records}
        self._dirty |= marked
        return bool(marked)

    def _class_members(self, classes: Iterable[str]) -> set[str]:
        out: set[str] = set()
        for name in classes:
            out |= self._class_users.get(name, set())
        return out

    def _volumes_moved(self, classes: Iterable[str]) -> bool:
        """What may bind claims of ``classes`` changed: judge their pods again, and forget
        the nodes they avoided (a volume may be free there now)."""
        uids = self._class_members(classes)
        for uid in uids:
            self._avoid.pop(uid, None)
        return self._mark(uids)

    def refresh(self) -> bool:
        """Judge the pods marked since the last call; True when a verdict changed. The store
        calls it before resolving a snapshot."""
        changed = False
        for uid in sorted(self._dirty):
            if uid in self._records:
                changed = self._judge(uid) or changed
        self._dirty.clear()
        return changed

    def pod_changed(self, uid: str, rec: PodRecord) -> None:
        """A pod's new record: track it while it has claims (its verdict is recomputed)."""
        old = self._records.get(uid)
        if old is not None and (old.claims, old.namespace) != (rec.claims, rec.namespace):
            self.pod_removed(uid)
        if not rec.claims:
            self.pod_removed(uid)
            return
        self._records[uid] = rec
        for claim in rec.claims:
            self._users[f"{rec.namespace}/{claim.name}"].add(uid)
        self._judge(uid)

    def pod_removed(self, uid: str) -> None:
        """The pod is gone or bound (its reservations stay until its commit settles them)."""
        rec = self._records.pop(uid, None)
        self.verdicts.pop(uid, None)
        self._avoid.pop(uid, None)
        self._dirty.discard(uid)
        self._track_classes(uid, None)
        if rec is None:
            return
        for claim in rec.claims:
            key = f"{rec.namespace}/{claim.name}"
            users = self._users.get(key)
            if users is not None:
                users.discard(uid)
                if not users:
                    del self._users[key]

    def _judge_all(self, uids: set[str] | list[str]) -> bool:
        changed = False
        for uid in uids:
            if uid in self._records:
                changed = self._judge(uid) or changed
        return changed

    def claim_changed(self, key: str) -> bool:
        """The claim ``namespace/name`` appeared, changed or went away; True when a tracked
        pod's verdict changed."""
        users = self._users.get(key)
        return self._judge_all(list(users)) if users else False

    def volume_changed(self, name: str, obj: Mapping[str, Any] | None) -> bool:
        """The PersistentVolume ``name`` (``obj``, None when deleted) changed; True when a
        tracked pod's verdict changed or may have (then it is judged at :meth:`refresh`)."""
        old, new = self.catalog.update(name, obj)
        if name in self._reserved and (new is None or new.claim_ref is not None):
            # Seen bound (or gone): the volume's own state now keeps it from other claims.
            self._drop_reservation(name)
        if not self._records:
            return False
        uids: set[str] = set()
        for facts in (old, new):
            ref = facts.claim_ref if facts is not None else None
            if ref is not None:
                uids |= self._users.get(f"{ref[0]}/{ref[1]}", set())
        for key, users in self._users.items():
            pvc = self._pvcs.get(key)
            if pvc is not None and (pvc.get("spec") or {}).get("volumeName") == name:
                uids |= users
        changed = self._judge_all(uids)
        if old != new:
            classes = {f.storage_class for f in (old, new) if f is not None}
            changed = self._volumes_moved(classes) or changed
        return changed

    def everything_changed(self) -> bool:
        """A StorageClass or a kind's presence changed: re-judge every tracked pod."""
        return self._judge_all(list(self._records))

    # --- reservations (see the module docstring) -----------------------------------------

    def reserve(self, pod_uid: str, node: str) -> tuple[VolumeBinding, ...] | str:
        """Choose and reserve a volume on ``node`` for each unbound WaitForFirstConsumer claim
        of the pod (none for a pod without such claims); a message when a claim has none
        left there (the pod then avoids the node until the volumes change)."""
        rec = self._records.get(pod_uid)
        if rec is None:
            return ()
        self.release(pod_uid)
        known = self._nodes.get(node)
        chosen = (
            choose_volumes(
                rec.namespace,
                rec.name,
                rec.uid,
                rec.claims,
                node,
                known.label_map,
                pvcs=self._pvcs,
                classes=self._classes,
                catalog=self.catalog,
                reserved=self._reserved,
                reserved_claims=self._reserved_claims,
            )
            if known is not None
            else f"node {node} is gone"
        )
        if isinstance(chosen, str):
            self._avoid.setdefault(pod_uid, set()).add(node)
            if self._judge(pod_uid):
                self._on_change(True)
            return chosen
        if not chosen:
            return ()
        self._by_pod[pod_uid] = chosen
        classes: set[str] = set()
        for b in chosen:
            if b.prebound:
                continue
            self._reserved[b.volume] = b.claim_key
            self._reserved_claims[b.claim_key] = b.volume
            self._holders.setdefault(b.volume, set()).add(pod_uid)
            facts = self.catalog.get(b.volume)
            if facts is not None:
                classes.add(facts.storage_class)
        if classes and self._mark(self._class_members(classes)):
            self._on_change(False)  # fewer volumes for others: no new work
        return chosen

    def reserve_gang(self, members: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
        """:meth:`reserve` for every (pod uid, node) of a gang, or for none: (pod uid, why)
        of the first member with no volume left (the others' reservations are undone).

        Members that already avoid nodes go first: they failed because a gang mate took the
        volumes they needed, so this time they choose before it (a gang of two on a node
        with one volume then ends on two nodes, not stuck with both avoiding it)."""
        order = sorted(
            range(len(members)), key=lambda i: (-len(self._avoid.get(members[i][0], ())), i)
        )
        done: list[str] = []
        for i in order:
            uid, node = members[i]
            chosen = self.reserve(uid, node)
            if isinstance(chosen, str):
                for other in done:
                    self.release(other, undo=True)
                return uid, chosen
            if chosen:
                done.append(uid)
        return None

    def reserved(self, pod_uid: str) -> tuple[VolumeBinding, ...]:
        """The volumes reserved for the pod's claims (until :meth:`release` or
        :meth:`done`)."""
        return self._by_pod.get(pod_uid, ())

    def release(self, pod_uid: str, *, undo: bool = False) -> None:
        """The pod's commit failed: its volumes are free again, unless another pod's commit
        uses them too (or the watch already shows them bound). ``undo``: they were reserved
        by the same commit a moment ago, so the nodes other pods avoid stay avoided."""
        classes: set[str] = set()
        for b in self._by_pod.pop(pod_uid, ()):
            holders = self._holders.get(b.volume)
            if holders is None:
                continue
            holders.discard(pod_uid)
            if not holders and self._reserved.get(b.volume) == b.claim_key:
                self._drop_reservation(b.volume)
                facts = self.catalog.get(b.volume)
                if facts is not None:
                    classes.add(facts.storage_class)
        if not classes:
            return
        if undo:
            if self._mark(self._class_members(classes)):
                self._on_change(True)
        elif self._volumes_moved(classes):
            self._on_change(True)

    def done(self, pod_uid: str) -> None:
        """The pod's claims are bound to its volumes: its commit needs them no more (each
        stays reserved until the watch shows its ``claimRef``)."""
        for b in self._by_pod.pop(pod_uid, ()):
            holders = self._holders.get(b.volume)
            if holders is not None:
                holders.discard(pod_uid)

    def _drop_reservation(self, volume: str) -> None:
        claim = self._reserved.pop(volume, None)
        if claim is not None and self._reserved_claims.get(claim) == volume:
            del self._reserved_claims[claim]
        self._holders.pop(volume, None)

    def reservations(self) -> dict[str, str]:
        """Reserved volumes: volume -> ``namespace/claim``."""
        return dict(self._reserved)

    def claim(self, key: str) -> Mapping[str, Any] | None:
        """The claim ``namespace/name`` as the watch last showed it."""
        return self._pvcs.get(key)

    # --- permission to write volumes -----------------------------------------------------

    def forbid_writes(self, message: str) -> int:
        """Volumes cannot be bound (``message`` says why): pods with unbound
        WaitForFirstConsumer claims wait saying so. The token is for :meth:`allow_writes`."""
        self._write_token += 1
        if self.write_problem != message:
            self.write_problem = message
            if self.everything_changed():
                self._on_change(True)
        return self._write_token

    def allow_writes(self, token: int) -> None:
        """Try binding volumes again, unless writes were forbidden again since ``token``."""
        if token == self._write_token and self.write_problem is not None:
            self.write_problem = None
            if self.everything_changed():
                self._on_change(True)
