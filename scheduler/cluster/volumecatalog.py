"""Which PersistentVolumes could bind an unbound claim: the volumes indexed by StorageClass
and by the claim their ``claimRef`` names (:class:`VolumeCatalog`), whether one fits a claim
(:func:`volume_fits`), and a claim's candidates (:func:`claim_candidates`), as kube-scheduler's
VolumeBinding finds them for a ``WaitForFirstConsumer`` claim.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from scheduler.cluster.volumeobjects import ClaimNeeds, VolumeFacts

__all__ = ["VolumeCatalog", "claim_candidates", "volume_fits"]


class VolumeCatalog:
    """PersistentVolumes parsed into :class:`VolumeFacts`, indexed by StorageClass and by the
    claim (``namespace/name``) their ``claimRef`` names, so finding the candidates of a claim
    looks at the volumes of its class only. The cache :meth:`update`\\ s it as volumes change;
    :meth:`of` indexes a plain mapping."""

    def __init__(self) -> None:
        self._facts: dict[str, VolumeFacts] = {}
        self._by_class: dict[str, set[str]] = {}
        self._by_claim: dict[str, set[str]] = {}

    @classmethod
    def of(cls, pvs: Mapping[str, Mapping[str, Any]]) -> VolumeCatalog:
        """A catalog of the volumes ``pvs`` (by name)."""
        catalog = cls()
        for name, pv in pvs.items():
            catalog.update(name, pv)
        return catalog

    @staticmethod
    def _claim_key(facts: VolumeFacts) -> str | None:
        ref = facts.claim_ref
        return f"{ref[0]}/{ref[1]}" if ref is not None and ref[1] else None

    def update(
        self, name: str, pv: Mapping[str, Any] | None
    ) -> tuple[VolumeFacts | None, VolumeFacts | None]:
        """The volume ``name`` is now ``pv`` (None: deleted); (old facts, new facts)."""
        old = self._facts.pop(name, None)
        if old is not None:
            self._by_class.get(old.storage_class, set()).discard(name)
            key = self._claim_key(old)
            if key is not None:
                names = self._by_claim.get(key, set())
                names.discard(name)
                if not names:
                    self._by_claim.pop(key, None)
        new = VolumeFacts.of(name, pv) if pv is not None else None
        if new is not None:
            self._facts[name] = new
            self._by_class.setdefault(new.storage_class, set()).add(name)
            key = self._claim_key(new)
            if key is not None:
                self._by_claim.setdefault(key, set()).add(name)
        return old, new

    def get(self, name: str) -> VolumeFacts | None:
        """The facts of the volume ``name``."""
        return self._facts.get(name)

    def in_class(self, storage_class: str) -> Collection[str]:
        """Names of the volumes of a StorageClass."""
        return self._by_class.get(storage_class, set())

    def claimed_by(self, claim: str) -> Collection[str]:
        """Names of the volumes whose ``claimRef`` names ``namespace/name``."""
        return self._by_claim.get(claim, set())

    def __len__(self) -> int:
        return len(self._facts)


def volume_fits(pv: VolumeFacts, need: ClaimNeeds) -> bool:
    """Whether an unclaimed volume could bind the claim, as kube-scheduler's
    FindMatchingVolume decides for a WaitForFirstConsumer claim (the node aside): no
    ``claimRef``, phase ``Available``, not being deleted, the claim's StorageClass, capacity at
    least the claim's request, the same ``volumeMode`` (default ``Filesystem``), every access
    mode of the claim, and labels matching the claim's ``selector``."""
    return (
        pv.claim_ref is None
        and pv.phase == "Available"
        and not pv.deleting
        and pv.storage_class == need.storage_class
        and pv.capacity is not None
        and pv.capacity >= need.request
        and pv.volume_mode == need.volume_mode
        and need.access_modes <= pv.access_modes
        and need.selector.matches(pv.labels)
    )


def claim_candidates(
    need: ClaimNeeds,
    catalog: VolumeCatalog,
    reserved: Mapping[str, str],
    reserved_claims: Mapping[str, str],
    taken: Collection[str] = (),
) -> tuple[list[VolumeFacts], tuple[str, str] | None]:
    """The volumes that could bind ``need``, smallest first (then by name), and the problem of
    a volume left out because its restrictions cannot be evaluated.

    A volume the scheduler chose for the claim (``reserved_claims``: claim -> volume, not yet
    seen bound) or whose ``claimRef`` names the claim (pre-bound) is its only candidate, as in
    kube-scheduler; volumes chosen for other claims (``reserved``: volume -> claim) and the
    ``taken`` ones are left out."""
    own = reserved_claims.get(need.key)
    if own is not None:
        facts = catalog.get(own)
        return ([facts] if facts is not None and not facts.deleting else []), None
    for name in sorted(catalog.claimed_by(need.key)):
        facts = catalog.get(name)
        if facts is None or name in taken or reserved.get(name, need.key) != need.key:
            continue
        if (
            not facts.names(need.namespace, need.name, need.uid)
            or facts.deleting
            or facts.capacity is None
            or facts.capacity < need.request
            or facts.volume_mode != need.volume_mode
        ):
            continue
        if facts.problem is not None:
            return [], facts.problem
        return [facts], None
    out: list[VolumeFacts] = []
    problem: tuple[str, str, str] | None = None
    for name in catalog.in_class(need.storage_class):
        facts = catalog.get(name)
        if facts is None or name in reserved or name in taken or not volume_fits(facts, need):
            continue
        if facts.problem is not None:
            if problem is None or name < problem[0]:
                problem = (name, *facts.problem)
            continue
        out.append(facts)
    out.sort(key=lambda f: (f.capacity, f.name))
    return out, (problem[1], problem[2]) if problem is not None else None
