"""What each queue holds and asks for, in queue units (gpu milli, cpu milli, memory bytes)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.cluster.gang import Gang
from scheduler.cluster.pod import Pod
from scheduler.cluster.queue import QUEUE_RESOURCES, pod_usage_triple
from scheduler.cluster.snapshot import Snapshot

__all__ = [
    "QueueUsage",
    "add_usage",
    "gang_need",
    "gang_request",
    "pending_pods",
    "pod_queue",
    "queue_usage",
]


def _zeros() -> dict[str, int]:
    return dict.fromkeys(QUEUE_RESOURCES, 0)


@dataclass(frozen=True)
class QueueUsage:
    """Per queue name: usage of active bound pods, and the asks of pending pods.

    Both maps return zeros for queues that hold nothing.
    """

    allocated: defaultdict[str, dict[str, int]]
    pending: defaultdict[str, dict[str, int]]
    #: The part of ``allocated`` held by non-preemptible gangs (what counts against quota
    #: when a non-preemptible gang asks to be admitted).
    non_preemptible: defaultdict[str, dict[str, int]]


def add_usage(into: dict[str, int], amount: dict[str, int]) -> None:
    """Add ``amount`` to ``into`` per queue resource, in place."""
    for r in QUEUE_RESOURCES:
        into[r] = into.get(r, 0) + amount.get(r, 0)


def pod_queue(snapshot: Snapshot, pod: Pod) -> str:
    """The queue a pod counts against: its gang's queue (PodGroup ``spec.queue`` wins)."""
    gang = snapshot.gang_by_key.get(pod.gang)
    return gang.queue if gang is not None else pod.queue


def queue_usage(snapshot: Snapshot) -> QueueUsage:
    """Sum bound (active) and pending usage of the pods this scheduler manages, per queue.

    Pods of other schedulers take node capacity but are not charged to any queue. Pods that
    cannot be placed whatever their queue's share - gated ones, and pending ones with a
    placement rule that is not supported yet or waiting for their volumes - ask for nothing.
    A pod bound to a node the cluster no longer has holds nothing either: its node left the
    capacity fair shares divide, and the pod is only waiting for the garbage collector
    (orphaned pods are force-deleted a minute or so after their node goes). Charging it kept
    a queue's share of the remaining nodes pinned until then.
    """
    allocated: defaultdict[str, dict[str, int]] = defaultdict(_zeros)
    pending: defaultdict[str, dict[str, int]] = defaultdict(_zeros)
    non_preemptible: defaultdict[str, dict[str, int]] = defaultdict(_zeros)
    gangs = snapshot.gang_by_key
    nodes = snapshot.node_by_name
    for pod in snapshot.pods:
        if not pod.managed or not pod.active:
            continue
        if pod.bound:
            if pod.node_name not in nodes:
                continue
            into = allocated
        elif pod.pending and not pod.unsupported and not pod.blocked:
            into = pending
        else:
            continue
        gang = gangs.get(pod.gang)  # pod_queue, inlined: this loop sees every pod
        queue = gang.queue if gang is not None else pod.queue
        gpu, cpu, memory = pod_usage_triple(pod)
        row = into[queue]
        row["gpu"] += gpu
        row["cpu"] += cpu
        row["memory"] += memory
        if into is allocated and gang is not None and not gang.preemptible:
            row = non_preemptible[queue]
            row["gpu"] += gpu
            row["cpu"] += cpu
            row["memory"] += memory
    return QueueUsage(allocated, pending, non_preemptible)


def pending_pods(snapshot: Snapshot, gang: Gang) -> list[Pod]:
    """The gang's pods still waiting for a node, oldest first (then by name)."""
    return list(snapshot.pending_by_gang.get(gang.key, ()))


def gang_need(snapshot: Snapshot, gang: Gang) -> int:
    """Pods the gang still needs placed together: ``min_member`` minus active bound members."""
    bound = sum(1 for p in snapshot.pods_by_gang.get(gang.key, []) if p.bound and p.active)
    return max(0, gang.min_member - bound)


def gang_request(pods: Iterable[Pod]) -> dict[str, int]:
    """Queue usage of the given pods together."""
    # add_usage per pod, written out: asked for every pending gang in every cycle.
    gpu = cpu = memory = 0
    for p in pods:
        g, c, m = pod_usage_triple(p)
        gpu += g
        cpu += c
        memory += m
    return {"gpu": gpu, "cpu": cpu, "memory": memory}  # QUEUE_RESOURCES, in order
