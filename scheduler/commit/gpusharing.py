"""GPU sharing writes: hold a shared device before its sharers bind, tell them which device,
and collect reservation pods nobody shares any more (see :mod:`scheduler.cluster.gpusharing`).

Order, per gang with sharing members (:meth:`GpuSharing.hold`, called by the bind task
before any bind is sent): every (node, device) a sharer was granted gets its reservation pod
created unless the watch already shows a live one. A device that cannot be held (the API
refused the reservation pod) fails the whole gang's bind, so no sharer ever runs on a device the
kubelet does not keep for it. After a sharer's bind succeeded, :meth:`GpuSharing.fill`
writes its device ConfigMap (what the admission webhook pointed the env at).

:meth:`GpuSharing.collect` runs in its own loop (leader only): reservation pods whose device
no bound or assumed sharer uses are deleted once they were unused on two passes in a row (a
bind racing the watch never loses its device); a device whose sharers lost their reservation
pod (deleted by someone, or failed) gets it back. A device that still has no live reservation
pod after :data:`RESTORE_PASSES` passes in a row (the API refuses it, or the kubelet keeps
failing it because something else took the device) has its sharers evicted: they are placed
again rather than left running on a device nothing holds for them.

With ``scaling`` (``gpuSharing.scalingPods``), each cycle's unplaced sharing gangs that wait
for capacity (:data:`SCALE_FOR` reason codes, not quota, gates or affinity) are remembered by
:meth:`GpuSharing.note_cycle`, and each collection pass reconciles the scaling pods that show
their demand as whole devices (:func:`scheduler.cluster.gpusharing.scaling_groups`): missing
ones are created and marked ``PodScheduled=False, reason=Unschedulable`` (what Cluster
Autoscaler and Karpenter act on), ones no longer needed are deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import structlog

from scheduler.cluster.gpusharing import (
    RESERVATION_NAMESPACE,
    Reservation,
    ScalingPod,
    device_config_map,
    is_sharer,
    plan_reservations,
    pod_config_map,
    reservation_name,
    reservation_pod,
    scaling_groups,
    scaling_name,
    scaling_pod,
    shared_devices,
)
from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import Pod
from scheduler.cluster.snapshot import Snapshot
from scheduler.explain.codes import (
    CAPACITY_TAKEN,
    EXCEEDS_CLUSTER,
    GANG_DOES_NOT_FIT,
    HELD_TO_AVOID_STRANDING,
    INSUFFICIENT_ON_ONE_NODE,
    NO_MATCHING_NODE,
    NODE_TOO_SMALL,
)
from scheduler.k8s.errors import Conflict, KubeError
from scheduler.k8s.resources import CONFIG_MAP, POD
from scheduler.k8s.writer import Writer
from scheduler.solver.placement import Placement, PodAssignment

__all__ = ["RESTORE_PASSES", "SCALE_FOR", "GpuSharing", "ReservationSource"]

log = structlog.get_logger("scheduler.gpusharing")

#: Consecutive collection passes a used device may lack a live reservation pod before its
#: sharers are evicted (one pass recreates it; the rest let the watch and kubelet catch up).
RESTORE_PASSES = 3
_FINISHED = ("Failed", "Succeeded")
#: Why a gang waits when a new node would let it run: no node has room (also when this
#: cycle's placements took it: they are as real), or none matches its selector (the
#: autoscaler may have a node group that does). Not queue limits, gates, gangs still being
#: created or pod affinity - more nodes do not help those. A share held back rather than
#: strand an idle device waits because capacity is scarce: a new node is what it waits for.
SCALE_FOR = frozenset(
    {
        INSUFFICIENT_ON_ONE_NODE,
        HELD_TO_AVOID_STRANDING,
        GANG_DOES_NOT_FIT,
        CAPACITY_TAKEN,
        EXCEEDS_CLUSTER,
        NODE_TOO_SMALL,
        NO_MATCHING_NODE,
    }
)


class ReservationSource(Protocol):
    """What the cache tells GPU sharing (see :class:`scheduler.cache.Cache`)."""

    def reservations(self) -> tuple[Reservation, ...]:
        """Reservation pods the watch shows."""
        ...

    def shared_devices_in_use(self) -> set[tuple[str, int]]:
        """(node, device) pairs bound or assumed sharers use."""
        ...

    def sharers(self, node: str, device: int) -> tuple[Pod, ...]:
        """Bound, active sharing pods on ``device`` of ``node``."""
        ...

    def scaling_pods(self) -> tuple[ScalingPod, ...]:
        """Scaling pods the watch shows."""
        ...


class GpuSharing:
    """Reservation pods, device ConfigMaps and scaling pods for one scheduler (leader writes
    only)."""

    def __init__(
        self,
        cache: ReservationSource,
        writer: Writer,
        *,
        namespace: str = RESERVATION_NAMESPACE,
        is_leader: Callable[[], bool] = lambda: True,
        scaling: bool = False,
        scheduler_name: str = "kai-scheduler",
    ) -> None:
        self.cache = cache
        self.writer = writer
        #: Namespace of the reservation pods, and of the scaling pods.
        self.namespace = namespace
        self.is_leader = is_leader
        #: Show unplaceable sharing demand to autoscalers as scaling pods.
        self.scaling = scaling
        #: Named by scaling pods (this scheduler never places them; see scaling_pod).
        self.scheduler_name = scheduler_name
        #: Gang key -> its pending sharing pods, for gangs that last waited for capacity.
        self._demand: dict[str, tuple[Pod, ...]] = {}
        #: Reservation pod name -> consecutive collection passes it was found unused.
        self._unused: dict[str, int] = {}
        #: (node, device) -> consecutive passes its sharers had no live reservation pod.
        self._missing: dict[tuple[str, int], int] = {}

    def _ours(self) -> list[Reservation]:
        """Reservation pods in this scheduler's namespace: the only ones it may create or
        delete (and the only ones its RBAC reaches); any elsewhere are not its to manage."""
        return [r for r in self.cache.reservations() if r.namespace == self.namespace]

    def _live(self) -> dict[tuple[str, int], Reservation]:
        return {(r.node, r.device): r for r in self._ours() if not r.gone}

    async def _create(self, node: str, device: int) -> str | None:
        """Create the reservation pod of (node, device); None when it exists now."""
        body = reservation_pod(node, device, namespace=self.namespace)
        try:
            await self.writer.create_object(POD, self.namespace, body)
        except Conflict:
            # Made by an earlier attempt (or a GC pass) and not yet seen by the watch, or one
            # that is terminating or finished: those hold nothing, so the sharers must wait.
            name = reservation_name(node, device)
            try:
                existing = await self.writer.get_object(POD, self.namespace, name)
            except KubeError as e:
                return f"could not read the reservation pod {self.namespace}/{name}: {e.message}"
            meta = (existing or {}).get("metadata") or {}
            if meta.get("deletionTimestamp"):
                return f"the reservation pod of GPU {device} on {node} is being deleted"
            if ((existing or {}).get("status") or {}).get("phase") in _FINISHED:
                # restartPolicy Always: finished means the kubelet rejected or evicted it.
                # Delete it (this incarnation only); the next attempt creates it afresh.
                with contextlib.suppress(KubeError):
                    await self.writer.delete_object(POD, self.namespace, name, meta.get("uid", ""))
                return f"the reservation pod of GPU {device} on {node} had ended; replacing it"
            return None
        except KubeError as e:
            return (
                f"could not create the reservation pod of GPU {device} on {node} in namespace "
                f"{self.namespace}: {e.message} (the chart creates the namespace and grants "
                "create on pods there)"
            )
        log.info("gpu_reservation_created", node=node, device=device, namespace=self.namespace)
        return None

    async def hold(
        self, assignments: Sequence[PodAssignment], pods: Mapping[str, Pod]
    ) -> str | None:
        """Make sure every device granted to a sharer of ``assignments`` is held; the first
        problem (the gang must not bind) or None."""
        wanted: set[tuple[str, int]] = set()
        for a in assignments:
            pod = pods.get(a.pod_key)
            if pod is not None and is_sharer(pod):
                wanted.update((a.node, d) for d in shared_devices(pod, a.gpu_grant))
        live = self._live()
        missing = sorted(w for w in wanted if w not in live)
        problems = await asyncio.gather(*(self._create(n, d) for n, d in missing))
        return next((p for p in problems if p), None)

    async def fill(self, a: PodAssignment, pod: Pod) -> None:
        """Write the bound sharer's device ConfigMap (best effort: logged when refused)."""
        if not is_sharer(pod):
            return
        live = self._live()
        devices = []
        for d in shared_devices(pod, a.gpu_grant):
            # The kubelet's own id when the reservation pod reported it; else the index the
            # scheduler granted (the same thing on a node whose devices are counted in order).
            r = live.get((a.node, d))
            devices.append(r.real_index if r is not None and r.real_index else str(d))
        milli = max((m for _, m in a.gpu_grant), default=GPU_MILLI)
        name = pod_config_map(pod)
        body = device_config_map(
            name, pod.namespace, pod.name, pod.uid, devices, f"{milli / GPU_MILLI:g}"
        )
        try:
            try:
                await self.writer.create_object(CONFIG_MAP, pod.namespace, body)
            except Conflict:
                await self.writer.replace_object(CONFIG_MAP, pod.namespace, name, body)
        except KubeError as e:
            log.warning("gpu_share_config_map_failed", pod=pod.key, node=a.node, error=e.message)
            return
        log.info("gpu_share_config_map_written", pod=pod.key, node=a.node, devices=devices)

    async def collect(self) -> tuple[int, int]:
        """One garbage-collection pass; (deleted, recreated)."""
        if not self.is_leader():
            return 0, 0
        reservations = self._ours()
        plan = plan_reservations(reservations, self.cache.shared_devices_in_use())
        unused = {r.name for r in plan.delete}
        self._unused = {n: self._unused.get(n, 0) + 1 for n in unused}
        deleted = 0
        for r in plan.delete:
            # Asked again right before deleting: a gang may have been assumed onto this
            # device while an earlier delete of this pass was in flight.
            if self._unused[r.name] < 2 or (r.node, r.device) in self.cache.shared_devices_in_use():
                continue
            if await self._delete(r):
                deleted += 1
            self._unused.pop(r.name, None)
        self._missing = {k: self._missing.get(k, 0) + 1 for k in plan.recreate}
        if self.scaling:
            await self._scale()
        recreated = 0
        for node, device in plan.recreate:
            if self._missing[(node, device)] > RESTORE_PASSES:
                await self._evict_sharers(node, device)
                continue
            problem = await self._create(node, device)
            log.warning("gpu_reservation_missing", node=node, device=device, problem=problem)
            if problem is None:
                recreated += 1
        return deleted, recreated

    def note_cycle(self, snapshot: Snapshot, placement: Placement) -> None:
        """Remember which sharing gangs wait for capacity after this cycle (no I/O)."""
        if not self.scaling:
            return
        pending: dict[str, list[Pod]] = {}
        for pod in snapshot.pods:
            if pod.pending and is_sharer(pod):
                pending.setdefault(pod.gang, []).append(pod)
        for gang, outcome in placement.outcomes.items():
            if outcome.placed or outcome.reason_code not in SCALE_FOR or gang not in pending:
                self._demand.pop(gang, None)
            else:
                self._demand[gang] = tuple(pending[gang])
        # Gangs without an outcome this cycle (deferred) keep their demand while pending.
        for gang in [g for g in self._demand if g not in pending]:
            del self._demand[gang]

    def scaling_wanted(self) -> dict[str, Pod]:
        """Scaling pod name -> the sharing pod whose constraints it copies."""
        wanted: dict[str, Pod] = {}
        pods = [p for members in self._demand.values() for p in members]
        for group, (member, devices) in scaling_groups(pods).items():
            for i in range(devices):
                wanted[scaling_name(group, i)] = member
        return wanted

    async def _scale(self) -> None:
        """Create the scaling pods the demand needs; delete the others."""
        wanted = self.scaling_wanted()
        existing = {s.name: s for s in self.cache.scaling_pods()}
        for name, s in existing.items():
            if name not in wanted:
                with contextlib.suppress(KubeError):
                    if await self.writer.delete_object(POD, s.namespace, s.name, s.uid):
                        log.info("gpu_scaling_pod_deleted", pod=f"{s.namespace}/{s.name}")
        for name, member in wanted.items():
            if name not in existing:
                await self._create_scaling(name, member)

    async def _create_scaling(self, name: str, member: Pod) -> None:
        try:
            raw = await self.writer.get_pod(member.namespace, member.name)
            if raw is None:
                return  # gone: the next cycle drops it from the demand
            body = scaling_pod(name, self.namespace, raw, self.scheduler_name)
            try:
                await self.writer.create_object(POD, self.namespace, body)
            except Conflict:
                return  # made by an earlier pass; the watch has not shown it yet
            await self.writer.set_unschedulable(
                self.namespace,
                name,
                f"stands for GPU-sharing pods like {member.key} that no node has room for "
                "(one whole GPU; created by kai-scheduler for cluster autoscalers)",
            )
        except KubeError as e:
            log.warning("gpu_scaling_pod_failed", pod=name, error=e.message)
            return
        log.info("gpu_scaling_pod_created", pod=f"{self.namespace}/{name}", member=member.key)

    async def _evict_sharers(self, node: str, device: int) -> None:
        """Evict the sharers of a device nothing holds any more (see the module docstring)."""
        message = (
            f"GPU {device} on {node} lost its reservation pod and it could not be restored in "
            f"{RESTORE_PASSES} attempts; evicted to be placed again"
        )
        for pod in self.cache.sharers(node, device):
            outcome = await self.writer.evict(pod.namespace, pod.name, pod.uid, message=message)
            log.warning(
                "gpu_sharer_evicted",
                pod=pod.key,
                node=node,
                device=device,
                outcome=outcome.status,
            )

    async def _delete(self, r: Reservation) -> bool:
        try:
            gone = await self.writer.delete_object(POD, r.namespace, r.name, r.uid)
        except KubeError as e:
            log.warning(
                "gpu_reservation_delete_failed", pod=f"{r.namespace}/{r.name}", error=e.message
            )
            return False
        log.info("gpu_reservation_deleted", node=r.node, device=r.device, pod=r.name)
        return gone

    async def run(self, stop: asyncio.Event, interval: float, *, limit: int | None = None) -> None:
        """Collect every ``interval`` seconds until ``stop`` (``limit`` passes, for tests)."""
        passes = 0
        while not stop.is_set() and (limit is None or passes < limit):
            passes += 1
            try:
                await self.collect()
            except Exception:  # a bug here must not stop scheduling
                log.exception("gpu_reservation_collect_failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)
