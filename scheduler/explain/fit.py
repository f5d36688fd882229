"""Fit questions on grouped free capacity: can one pod fit a node, can a gang fit in total,
and can its pods be packed together (first-fit decreasing, best node first)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from scheduler.cluster.node import GPU_MILLI
from scheduler.cluster.pod import Pod
from scheduler.cluster.quantity import format_milli
from scheduler.cluster.resources import CPU, EPHEMERAL_STORAGE, GPU, MEMORY, PODS, Resources
from scheduler.explain.capacity import (
    FreeCapacity,
    Matching,
    Rules,
    Shape,
    pod_fits,
    pod_slots,
    share_milli,
)
from scheduler.explain.codes import INSUFFICIENT_ON_ONE_NODE, NODE_TOO_SMALL
from scheduler.explain.format import format_amount, format_bytes, format_gpus

__all__ = [
    "emptied",
    "first_fit_decreasing",
    "free_pod_slots",
    "gang_shortfall",
    "pack",
    "pack_group",
    "pod_misfit",
]


def _value(resource: str, value: int) -> str:
    """An amount without its resource name (for "at most 8 free")."""
    if resource == GPU:
        return str(value)
    if resource == CPU:
        return format_milli(value)
    if resource in (MEMORY, EPHEMERAL_STORAGE):
        return format_bytes(value)
    return str(value)


def _devices_with(shape: Shape, milli: int, empty: bool) -> int:
    if empty:
        return shape.allocatable_of(GPU)
    return sum(1 for f in shape.gpu_free if f >= milli)


def _gpu_misfit(pod: Pod, shapes: Sequence[Shape], empty: bool) -> str | None:
    gpu = pod.gpu
    if gpu is None:
        return None
    name = pod.key
    if gpu.whole:
        best = max((_devices_with(s, GPU_MILLI, empty) for s in shapes), default=0)
        if best >= gpu.count:
            return None
        if empty:
            return (
                f"pod {name} needs {format_gpus(gpu.count)} on one node; "
                f"the largest matching node has {best}"
            )
        return (
            f"pod {name} needs {format_gpus(gpu.count)} on one node; largest free block is {best}"
        )
    shares = [(s, share_milli(gpu, s.gpu_memory_mib)) for s in shapes]
    sized = [(s, m) for s, m in shares if m is not None]
    if not sized:
        return (
            f"pod {name} asks for {gpu.memory_mib} MiB of GPU memory, but no matching node "
            "reports a GPU that large (label nvidia.com/gpu.memory)"
        )
    best_count = max(_devices_with(s, m, empty) for s, m in sized)
    if best_count >= gpu.count:
        return None
    milli = min(m for _, m in sized)
    ask = (
        f"{gpu.memory_mib} MiB of GPU memory ({format_milli(milli)} of a GPU)"
        if gpu.memory_mib is not None
        else f"{format_milli(milli)} of one GPU"
    )
    if empty:
        return f"pod {name} needs {ask} on {gpu.count} devices; matching nodes have {best_count}"
    if gpu.count > 1:
        return (
            f"pod {name} needs {ask} on each of {gpu.count} devices of one node; at most "
            f"{best_count} such shares are free on one node"
        )
    largest = max((max(s.gpu_free, default=0) for s, _ in sized), default=0)
    return f"pod {name} needs {ask}; the largest free share on a matching node is " + (
        format_milli(max(largest, 0))
    )


def pod_misfit(pod: Pod, m: Matching) -> tuple[str, str] | None:
    """(code, message) when no matching node can hold ``pod`` now, else None."""
    shapes = list(m.shapes)
    if any(pod_fits(pod, s) for s in shapes):
        return None
    empty = not any(pod_fits(pod, s, empty=True) for s in shapes)
    code = NODE_TOO_SMALL if empty else INSUFFICIENT_ON_ONE_NODE
    gpu = _gpu_misfit(pod, shapes, empty)
    if gpu is not None:
        return (code, gpu)
    for r, need in sorted(pod.requests.items()):
        if r == GPU:
            continue
        best = max(s.allocatable_of(r) if empty else s.free_of(r) for s in shapes)
        if best < need:
            tail = (
                f"the largest matching node has {_value(r, best)}"
                if empty
                else f"at most {_value(r, max(best, 0))} free"
            )
            return (code, f"pod {pod.key} needs {format_amount(r, need)} on one node; {tail}")
    slots = [pod_slots(s, empty=empty) for s in shapes]
    if all(n is not None and n < 1 for n in slots):
        return (
            code,
            f"pod {pod.key} needs a free pod slot; every matching node is at its pods "
            "capacity (allocatable pods)",
        )
    asks = [format_amount(r, v) for r, v in sorted(pod.requests.items())]
    if pod.gpu is not None and not pod.gpu.whole:
        asks.append("a GPU share")
    if any(n is not None for n in slots):
        asks.append("a pod slot")
    return (
        code,
        f"pod {pod.key}: no matching node has {', '.join(asks)} free at the same time",
    )


def gang_shortfall(group: Sequence[Pod], m: Matching, *, total_pods: int) -> str | None:
    """A message when the pods of ``group`` ask for more, in total, than matching nodes have
    free (per resource); None when the totals fit."""
    count = len(group)
    whole = sum(p.gpu.count for p in group if p.gpu is not None and p.gpu.whole)
    totals_of = _totals(m)
    free_whole = totals_of.whole_gpus
    if whole > free_whole:
        return (
            f"gang needs {format_gpus(whole)} across {count} pods together; only "
            f"{free_whole} GPUs are free on matching nodes"
        )
    shared = 0
    for p in group:
        if p.gpu is None or p.gpu.whole:
            continue
        sizes = [share_milli(p.gpu, s.gpu_memory_mib) for s in m.shapes]
        shared += p.gpu.count * min((x for x in sizes if x is not None), default=0)
    free_milli = totals_of.gpu_milli
    if shared and whole * GPU_MILLI + shared > free_milli:
        return (
            f"gang needs {format_milli(whole * GPU_MILLI + shared)} GPUs across {count} pods "
            f"together; only {format_milli(free_milli)} GPUs are free on matching nodes"
        )
    totals: Counter[str] = Counter()
    for p in group:
        for r, v in p.requests.items():
            if r != GPU:
                totals[r] += v
    for r, need in sorted(totals.items()):
        free = totals_of.free(r)
        if need > free:
            return (
                f"gang needs {format_amount(r, need)} across {count} pods together; only "
                f"{_value(r, free)} free on matching nodes"
            )
    slots = totals_of.pod_slots
    if slots is not None and count > slots:
        return (
            f"gang needs {count} pod slots across {count} pods together; only {slots} free "
            "on matching nodes (allocatable pods)"
        )
    del total_pods  # the same message serves gangs whose pods have different rules
    return None


class _Totals:
    """What all matching nodes of a :class:`Matching` have free together, as
    :func:`gang_shortfall` reads it. The same Matching is asked about by gang after gang
    (one per distinct placement rules), each time summed over its shapes: summed once."""

    __slots__ = ("_free", "gpu_milli", "m", "pod_slots", "whole_gpus")

    def __init__(self, m: Matching) -> None:
        self.m = m
        shapes = m.shapes.items()
        self.whole_gpus = sum(n * sum(1 for f in s.gpu_free if f >= GPU_MILLI) for s, n in shapes)
        self.gpu_milli = sum(n * sum(max(f, 0) for f in s.gpu_free) for s, n in shapes)
        self.pod_slots = free_pod_slots(m)
        self._free: dict[str, int] = {}

    def free(self, resource: str) -> int:
        known = self._free.get(resource)
        if known is None:
            shapes = self.m.shapes.items()
            known = self._free[resource] = sum(n * max(0, s.free_of(resource)) for s, n in shapes)
        return known


def _totals(m: Matching) -> _Totals:
    """:class:`_Totals` of ``m``, kept on it (a Matching is not changed once
    :class:`~scheduler.explain.capacity.FreeCapacity` has built it)."""
    known: _Totals | None = m.__dict__.get("_totals")
    if known is None:
        known = m.__dict__["_totals"] = _Totals(m)
    return known


def free_pod_slots(m: Matching, *, empty: bool = False) -> int | None:
    """Pods the matching nodes can still take in total (all they could take if ``empty``);
    None when some matching node has no ``pods`` capacity (no limit)."""
    total = 0
    for shape, n in m.shapes.items():
        slots = pod_slots(shape, empty=empty)
        if slots is None:
            return None
        total += n * max(slots, 0)
    return total


def _take(shape: Shape, pod: Pod) -> Shape:
    free = dict(shape.free)
    for r, v in pod.requests.items():
        free[r] = free.get(r, 0) - v
    if shape.allocatable_of(PODS) > 0:
        free[PODS] = free.get(PODS, 0) - 1
    devices = list(shape.gpu_free)
    if pod.gpu is not None:
        milli = share_milli(pod.gpu, shape.gpu_memory_mib) or GPU_MILLI
        for _ in range(pod.gpu.count):
            # Best fit: the fullest device that still has room, as packing would choose.
            fitting = [i for i, f in enumerate(devices) if f >= milli]
            if not fitting:
                break
            i = min(fitting, key=lambda i: devices[i])
            devices[i] -= milli
    return Shape(
        free=tuple(sorted(free.items())),
        gpu_free=tuple(sorted(devices, reverse=True)),
        gpu_memory_mib=shape.gpu_memory_mib,
        allocatable=shape.allocatable,
    )


def _size(pod: Pod) -> tuple[int, int, int]:
    gpu = pod.gpu.count * pod.gpu.milli if pod.gpu is not None else 0
    return (gpu, pod.requests[CPU], pod.requests[MEMORY])


def _room(shape: Shape) -> tuple[int, int, int]:
    return (sum(max(f, 0) for f in shape.gpu_free), shape.free_of(CPU), shape.free_of(MEMORY))


def emptied(shapes: Mapping[Shape, int]) -> Counter[Shape]:
    """The same nodes with nothing running on them: free = allocatable, every device free."""
    out: Counter[Shape] = Counter()
    for shape, n in shapes.items():
        empty = Shape(
            free=shape.allocatable,
            gpu_free=(GPU_MILLI,) * len(shape.gpu_free),
            gpu_memory_mib=shape.gpu_memory_mib,
            allocatable=shape.allocatable,
        )
        out[empty] += n
    return out


def _one_per_node_fits(group: Sequence[Pod], shapes: Mapping[Shape, int]) -> bool:
    """True when the pods of ``group`` are all alike and at least as many nodes as there are
    pods take one each: first-fit decreasing then places them all (each pod touches one
    node, so while pods are left some node that takes one is untouched), without running
    it. Most gangs are alike pods, and most fit the cluster as it was before a cycle (which
    the explainer asks of every gang the cycle's placements crowded out)."""
    if not group:
        return True
    first = group[0]
    if any(p.requests != first.requests or p.gpu != first.gpu for p in group):
        return False
    need = len(group)
    for s, n in shapes.items():
        if n > 0 and pod_fits(first, s):
            need -= n
            if need <= 0:
                return True
    return False


def pack_group(group: Sequence[Pod], shapes: Mapping[Shape, int]) -> bool:
    """True when first-fit decreasing (onto the fullest node that fits) places every pod of
    ``group`` on nodes of ``shapes`` (shape -> how many nodes)."""
    return _one_per_node_fits(group, shapes) or first_fit_decreasing(group, shapes)


def first_fit_decreasing(group: Sequence[Pod], shapes: Mapping[Shape, int]) -> bool:
    """:func:`pack_group`'s answer, by running first-fit decreasing."""
    work = Counter(shapes)
    # The pods of a group mostly share their size, and a shape's answer stays the same while
    # it is in ``work``: fits and rooms are remembered per (pod size, shape), the shape known
    # by identity (kept in the entry, so a recycled id is never mistaken for it).
    fits: dict[tuple[Resources, tuple[int, int, int | None] | None], dict[int, tuple[Shape, bool]]]
    fits = {}
    rooms: dict[int, tuple[Shape, tuple[int, int, int]]] = {}
    # What taking a pod of one size from a shape leaves (the same for every such pod).
    taken: dict[tuple[object, int], tuple[Shape, Shape]] = {}

    def room(shape: Shape) -> tuple[int, int, int]:
        known = rooms.get(id(shape))
        if known is not None and known[0] is shape:
            return known[1]
        value = _room(shape)
        rooms[id(shape)] = (shape, value)
        return value

    for pod in sorted(group, key=_size, reverse=True):
        gpu = pod.gpu
        size = (gpu.count, gpu.milli, gpu.memory_mib) if gpu is not None else None
        size_key = (pod.requests, size)
        memo = fits.setdefault(size_key, {})
        fitting: list[Shape] = []
        for s, n in work.items():
            if n <= 0:
                continue
            known = memo.get(id(s))
            if known is None or known[0] is not s:
                known = memo[id(s)] = (s, pod_fits(pod, s))
            if known[1]:
                fitting.append(s)
        if not fitting:
            return False
        best = min(fitting, key=room)
        work[best] -= 1
        left = taken.get((size_key, id(best)))
        if left is None or left[0] is not best:
            left = taken[size_key, id(best)] = (best, _take(best, pod))
        work[left[1]] += 1
    return True


def pack(groups: Mapping[Rules, Sequence[Pod]], free: FreeCapacity) -> bool:
    """True when :func:`pack_group` places every group on its matching nodes.

    Pods with different rules are packed per group, each on the full free capacity: an
    optimistic shortcut, so a failure here is certain while a success is only likely.
    """
    return all(pack_group(group, free.matching(rules).shapes) for rules, group in groups.items())
