"""The verdicts on pending pods' PersistentVolumeClaims, kept current as claims, volumes and
StorageClasses change (:mod:`scheduler.cluster.volumes` says what a verdict is).

Only unbound pods of this scheduler that use claims are tracked. A claim event re-judges the
pods that use the claim; a PersistentVolume event the pods whose claims name it (or that it
names in ``spec.claimRef``); a StorageClass event, or a kind's API going missing or coming
back, re-judges every tracked pod (both are rare). The store wakes the cycle loop only when a
verdict changed, so claims and volumes of other pods cost no cycle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from scheduler.cache.resolve import PodRecord
from scheduler.cluster.volumes import VolumeVerdict, volume_verdict

__all__ = ["VolumeIndex"]


class VolumeIndex:
    """Verdicts by pod uid, from the store's raw claims, volumes and classes (by key)."""

    def __init__(
        self,
        pvcs: Mapping[str, Mapping[str, Any]],
        pvs: Mapping[str, Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
    ) -> None:
        self._pvcs = pvcs
        self._pvs = pvs
        self._classes = classes
        #: Kinds whose objects cannot be read (API missing or forbidden).
        self.absent: set[str] = set()
        #: The verdict of every tracked pod (replaced only when it changes).
        self.verdicts: dict[str, VolumeVerdict] = {}
        self._records: dict[str, PodRecord] = {}
        #: ``namespace/claim`` -> uids of the tracked pods that use it.
        self._users: defaultdict[str, set[str]] = defaultdict(set)

    def _judge(self, uid: str) -> bool:
        """Recompute one tracked pod's verdict; True when it changed."""
        rec = self._records[uid]
        verdict = volume_verdict(
            rec.namespace,
            rec.name,
            rec.uid,
            rec.claims,
            pvcs=self._pvcs,
            pvs=self._pvs,
            classes=self._classes,
            absent=self.absent,
        )
        if self.verdicts.get(uid) == verdict:
            return False
        self.verdicts[uid] = verdict
        return True

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
        rec = self._records.pop(uid, None)
        self.verdicts.pop(uid, None)
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
        """The PersistentVolume ``name`` (``obj``, None when deleted) changed."""
        if not self._records:
            return False
        uids: set[str] = set()
        spec = obj.get("spec") if obj is not None else None
        ref = spec.get("claimRef") if isinstance(spec, Mapping) else None
        if isinstance(ref, Mapping):
            uids |= self._users.get(f"{ref.get('namespace') or ''}/{ref.get('name') or ''}", set())
        for key, users in self._users.items():
            pvc = self._pvcs.get(key)
            if pvc is not None and (pvc.get("spec") or {}).get("volumeName") == name:
                uids |= users
        return self._judge_all(uids)

    def everything_changed(self) -> bool:
        """A StorageClass or a kind's presence changed: re-judge every tracked pod."""
        return self._judge_all(list(self._records))
