"""The strand guard over a cycle's whole answer (``placement.holdStrandingShares``).

The greedy asks the scorer before it takes an idle device for a share
(:class:`~scheduler.framework.scoring.HoldsShares`); the CP-SAT stage chooses devices by
node patterns and does not. So the chosen answer is checked once more, against the cluster
as it was when the cycle started: a gang whose pod takes an idle device alone (no other pod
of the answer shares that device), where the guard says to wait, is taken out of the answer
whole and waits with the guard's reason. Removing whole gangs only frees room, so what is
left stays valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.snapshot import Snapshot
from scheduler.framework.scoring import HoldsShares
from scheduler.plugins.fragmentation import allowed_models
from scheduler.plugins.strand_guard import HELD_CODE
from scheduler.solver.placement import PodAssignment
from scheduler.solver.state import ClusterState, room_of

__all__ = ["ShareHold"]


@dataclass(frozen=True)
class ShareHold:
    """What the guard needs from the start of a cycle."""

    holder: HoldsShares
    #: node -> indices of its devices that were idle (whole device free)
    idle: Mapping[str, frozenset[int]]
    #: GPU model -> (free, total) thousandths on placeable nodes
    rooms: Mapping[str | None, tuple[int, int]]

    @classmethod
    def at_start(cls, state: ClusterState, holder: HoldsShares) -> ShareHold:
        """Read ``state`` before anything of the cycle is placed on it."""
        idle = {
            name: frozenset(i for i, f in enumerate(s.gpu_free) if f >= GPU_MILLI)
            for name, s in state.nodes.items()
            if s.placeable and GPU_MILLI in s.gpu_free
        }
        rooms = {m: (r[0], r[1]) for m, r in state.gpu_rooms().items()}
        return cls(holder, idle, rooms)

    def held(
        self, snapshot: Snapshot, assignments: Sequence[PodAssignment]
    ) -> dict[str, tuple[str, str]]:
        """Gang -> (code, message) for the gangs of ``assignments`` the guard holds back."""
        users: dict[tuple[str, int], int] = {}
        for a in assignments:
            for device, _ in a.gpu_grant:
                users[(a.node, device)] = users.get((a.node, device), 0) + 1
        pods = snapshot.pod_by_uid
        nodes = snapshot.node_by_name
        out: dict[str, tuple[str, str]] = {}
        for a in assignments:
            if a.gang in out or len(a.gpu_grant) != 1:
                continue
            device, milli = a.gpu_grant[0]
            if device not in self.idle.get(a.node, ()) or users[(a.node, device)] > 1:
                continue
            pod, node = pods.get(a.pod_uid), nodes.get(a.node)
            if pod is None or node is None or not self.holder.may_hold(pod):
                continue
            room = room_of(self.rooms, allowed_models(pod))
            reason = self.holder.held(node.gpu_model, 1, milli, GPU_MILLI, room)
            if reason is not None:
                out[a.gang] = (HELD_CODE, f"pod {a.pod_key}: {reason}")
        return out
