"""What the commit holds on top of the watched state: nominations and fresh evictions.

- A *nominated* pod has a place held on a node while the pods evicted for it terminate. The
  snapshot shows it there (``node_name`` set, ``nominated=True``, its GPU grant counted), so
  nobody else is given that capacity, but it is not bound: the commit binds it once its
  victims are gone, or drops the nomination and it is pending again.
- An *evicted* pod was accepted by the Eviction API; until the watch shows it terminating the
  snapshot marks it ``deleting``, so the next cycle does not plan to evict it again.

Both are dropped when the pod goes away; a nomination also when the pod turns out bound (by
us through the normal bind path, or by someone else), an eviction mark once the watch shows
the pod terminating or finished. Neither survives a restart, by design: a new leader finds the
victims terminating and places the waiting gang again.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter

from scheduler.cache.grants import GpuGrant
from scheduler.cluster.pod import Pod

__all__ = ["Holds", "Nomination"]

_KEY = attrgetter("key")


@dataclass(frozen=True, slots=True)
class Nomination:
    """Where a nominated pod is held, with its device grant."""

    node: str
    grant: GpuGrant = ()


class Holds:
    """Nominated and freshly evicted pods by uid (see the module docstring)."""

    def __init__(self) -> None:
        self.nominated: dict[str, Nomination] = {}
        #: Evicted pod uid -> its ``namespace/name``.
        self.evicted: dict[str, str] = {}

    def __bool__(self) -> bool:
        return bool(self.nominated or self.evicted)

    def observe(self, uid: str, pod: Pod | None) -> bool:
        """A pod's new record: drop what the API now shows for itself; True when changed."""
        changed = False
        if pod is not None and pod.node_name is not None and uid in self.nominated:
            del self.nominated[uid]
            changed = True
        if uid in self.evicted and (pod is None or pod.deleting or not pod.active):
            del self.evicted[uid]
            changed = True
        return changed

    def forget(self, uid: str) -> bool:
        """The pod is gone; True when something was held for it."""
        a = self.nominated.pop(uid, None) is not None
        b = self.evicted.pop(uid, None) is not None
        return a or b

    def overlay(self) -> dict[str, tuple[str, GpuGrant]]:
        """Nominated pods as the resolver's overlay: uid -> (node, grant)."""
        return {uid: (n.node, n.grant) for uid, n in self.nominated.items()}

    def apply(self, pods: tuple[Pod, ...], keys: Mapping[str, str]) -> tuple[Pod, ...]:
        """``pods`` (sorted by key, as the resolver publishes them) with nominated pods marked
        ``nominated`` and evicted ones ``deleting``; ``keys`` maps uid -> ``namespace/name``.

        Costs one copy of the tuple plus a binary search per held pod.
        """
        if not self:
            return pods
        out = list(pods)
        for uid in {**self.nominated, **self.evicted}:
            key = keys.get(uid)
            if key is None:
                continue
            i = bisect_left(out, key, key=_KEY)
            if i >= len(out) or out[i].uid != uid:
                continue
            pod = out[i]
            held = self.nominated.get(uid)
            nominated = pod.nominated or (held is not None and pod.node_name == held.node)
            deleting = pod.deleting or uid in self.evicted
            if (nominated, deleting) != (pod.nominated, pod.deleting):
                out[i] = dataclasses.replace(pod, nominated=nominated, deleting=deleting)
        return tuple(out)
