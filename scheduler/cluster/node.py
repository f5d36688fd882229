"""Nodes, their taints and their GPU devices."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from scheduler.cluster.resources import GPU, Resources

__all__ = [
    "GPU_MEMORY_LABEL",
    "GPU_MODEL_LABEL",
    "GpuDevice",
    "Labelled",
    "Node",
    "Taint",
    "TaintEffect",
]

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]

#: Label set by NVIDIA GPU feature discovery: memory of one device in MiB.
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
#: Label set by NVIDIA GPU feature discovery: the device model.
GPU_MODEL_LABEL = "nvidia.com/gpu.product"

#: A GPU device split into this many portions; fractional pods take a number of them.
GPU_MILLI = 1000


@dataclass(frozen=True, slots=True)
class Taint:
    """A node taint; pods must tolerate NoSchedule/NoExecute taints to land there."""

    key: str
    value: str = ""
    effect: TaintEffect = "NoSchedule"


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU of a node at a given cycle: its index and the thousandths still free."""

    index: int
    free_milli: int = GPU_MILLI


_NO_LABELS: Mapping[str, str] = MappingProxyType({})


class Labelled:
    """Base of the frozen, slotted :class:`Node` and :class:`~scheduler.cluster.pod.Pod`:
    :attr:`label_map` of their ``labels``, built on first use (hot loops ask for it object by
    object, and the cache hands the same objects to every cycle).

    What is derived lives in slots that are not dataclass fields, so equality, hashing,
    ``repr``, ``dataclasses.replace``, pickling and the JSON codec ignore it (a copy derives
    it again). It is set through ``object.__setattr__``: the objects are frozen.
    """

    __slots__ = ("_label_map",)
    _label_map: Mapping[str, str]
    labels: tuple[tuple[str, str], ...]

    @property
    def label_map(self) -> Mapping[str, str]:
        """Labels as a read-only mapping, shared by every caller."""
        if not self.labels:
            return _NO_LABELS
        labels: Mapping[str, str] | None = getattr(self, "_label_map", None)  # None: unset
        if labels is None:
            labels = MappingProxyType(dict(self.labels))
            object.__setattr__(self, "_label_map", labels)
        return labels


@dataclass(frozen=True, slots=True)
class Node(Labelled):
    """A node as the scheduler sees it.

    ``allocatable`` is what pods may use in total; what is free is derived from the pods bound
    to the node (see :class:`scheduler.cluster.snapshot.Snapshot`), so the snapshot never holds
    two versions of the same truth.
    """

    name: str
    allocatable: Resources = field(default_factory=Resources)
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    #: Memory of one GPU device in MiB (from the ``nvidia.com/gpu.memory`` label), if known.
    gpu_memory_mib: int | None = None

    @property
    def gpu_count(self) -> int:
        """Number of whole GPU devices the node offers."""
        return self.allocatable[GPU]

    @property
    def gpu_model(self) -> str | None:
        """The GPU model label, if set."""
        return self.label_map.get(GPU_MODEL_LABEL)

    @property
    def schedulable(self) -> bool:
        """False when cordoned or not Ready: no new pod may land here."""
        return self.ready and not self.unschedulable
