"""Pods: what they request, where they may go, and where they are."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache

from scheduler.cluster.node import GPU_MILLI, Labelled, Node
from scheduler.cluster.podaffinity import (
    HOSTNAME_LABEL,
    PodAffinityTerm,
    Preferences,
    SpreadConstraint,
)
from scheduler.cluster.resources import CPU, GPU, MEMORY, Resources
from scheduler.cluster.selectors import NodeSelectorTerm, Toleration, node_accepts

__all__ = ["ContainerExtended", "GpuRequest", "Pod", "PodPhase", "queue_usage_of"]


class PodPhase(StrEnum):
    """The Kubernetes pod phase."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """GPU devices a pod needs: ``count`` devices, each with ``milli`` thousandths free.

    A whole-GPU pod asking for 2 GPUs is ``GpuRequest(2, 1000)``; a pod with
    ``gpu-fraction: 0.5`` is ``GpuRequest(1, 500)``. ``memory_mib`` is set for pods that ask by
    GPU memory (``gpu-memory``); their portion depends on the node's device memory.
    """

    count: int = 1
    milli: int = GPU_MILLI
    memory_mib: int | None = None

    @property
    def whole(self) -> bool:
        """True when every device is taken entirely (no sharing)."""
        return self.memory_mib is None and self.milli >= GPU_MILLI

    def milli_on(self, node: Node) -> int | None:
        """Thousandths of one device this pod takes on ``node``; None if it cannot fit there."""
        if self.memory_mib is None:
            return self.milli
        if not node.gpu_memory_mib:
            return None
        milli = -(-self.memory_mib * GPU_MILLI // node.gpu_memory_mib)  # ceil division
        return milli if milli <= GPU_MILLI else None

    @property
    def total_milli(self) -> int:
        """Total thousandths when the portion is known up front (not for memory requests)."""
        return self.count * self.milli


#: Phases of a pod that holds nothing any more. A module constant: looking enum members up
#: on their class costs more than the test itself, and every pass over the pods asks.
_FINISHED = frozenset({PodPhase.SUCCEEDED, PodPhase.FAILED})


@lru_cache(maxsize=4096)
def _node_label_keys(
    selector: tuple[tuple[str, str], ...], affinity: tuple[NodeSelectorTerm, ...]
) -> frozenset[str]:
    """:attr:`Pod.node_label_keys` (the pods of a workload share their rules, and the keys)."""
    return frozenset([k for k, _ in selector] + [r.key for t in affinity for r in t.requirements])


class _PodMemo(Labelled):
    """Slots for the rest of what :class:`Pod` derives on first use (see :class:`Labelled`)."""

    __slots__ = ("_node_label_keys", "_one_per_node", "_queue_usage", "_task_type")
    _node_label_keys: frozenset[str]
    _one_per_node: bool
    #: The fragmentation scorer's view of the pod
    #: (:func:`scheduler.plugins.fragmentation.task_type`): every cycle with that scorer
    #: reads it for every live pod.
    _task_type: object
    #: (gpu, cpu, memory) as :func:`scheduler.cluster.queue.pod_queue_usage` counts them.
    _queue_usage: tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class ContainerExtended:
    """One container's extended resource requests (integers), where it sits in the pod: what
    a claim for extended resources backed by DRA is made of
    (:mod:`scheduler.cluster.dra_extended`)."""

    #: Index among init containers followed by containers.
    index: int
    name: str
    #: A non-sidecar init container (runs to completion before the others start).
    short_lived: bool
    #: (resource, count) for every resource the container requests, extended or not, so the
    #: resource's position among the container's sorted names is known; counts of other
    #: resources are 0.
    requests: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Pod(_PodMemo):
    """A pod as the scheduler sees it.

    ``requests`` are the effective requests Kubernetes would compute (see
    :mod:`scheduler.cluster.podspec`). Fractional GPU pods carry their GPU need in ``gpu`` and
    have no ``nvidia.com/gpu`` in ``requests``; whole-GPU pods have both.
    """

    uid: str
    namespace: str
    name: str
    requests: Resources = field(default_factory=Resources)
    gpu: GpuRequest | None = None
    priority: int = 0
    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[NodeSelectorTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    #: ``namespace/name`` of the gang (PodGroup) this pod belongs to.
    gang: str = ""
    queue: str = ""
    phase: PodPhase = PodPhase.PENDING
    node_name: str | None = None
    #: Device index -> thousandths, for pods bound with GPUs.
    gpu_grant: tuple[tuple[int, int], ...] = ()
    creation_time: float = 0.0
    #: True for pods this scheduler places; others only use capacity.
    managed: bool = True
    deleting: bool = False
    #: When the pod started (``status.startTime``; the bind time for pods we bound); 0 when
    #: unknown (then ``creation_time`` stands in). Min-runtime and eviction cost use it.
    start_time: float = 0.0
    #: Held for this pod on ``node_name`` while the pods evicted for it terminate: counts
    #: against the node like a bound pod, but is not bound yet (the commit binds it once
    #: the victims are gone).
    nominated: bool = False
    #: Names of ``spec.schedulingGates``: the pod is neither scheduled nor pending work until
    #: they are removed (see :mod:`scheduler.cluster.unsupported`).
    scheduling_gates: tuple[str, ...] = ()
    #: Placement rules of an unbound pod the scheduler does not evaluate yet (field paths,
    #: :func:`scheduler.cluster.unsupported.unsupported_fields`): its gang waits, named.
    unsupported: tuple[str, ...] = ()
    #: (reason code, message) why an unbound pod cannot be placed yet although its spec is
    #: fine - its PersistentVolumeClaims (:mod:`scheduler.cluster.volumes`); set when the
    #: snapshot's pods are resolved. Its gang waits with that reason.
    blocked: tuple[str, str] | None = None
    #: True when :attr:`affinity` includes the node affinity of the pod's PersistentVolumes
    #: (so a message about it can say where it comes from).
    volume_affinity: bool = False
    #: The pod's own required node affinity when :attr:`volume_affinity` (then
    #: :attr:`affinity` is combined with its volumes'): spread constraints with
    #: ``nodeAffinityPolicy: Honor`` read only the pod's own, as kube-scheduler does.
    spec_affinity: tuple[NodeSelectorTerm, ...] = ()
    #: The pod's labels (pod affinity, anti-affinity and spread constraints select by them).
    labels: tuple[tuple[str, str], ...] = ()
    #: Required pod affinity / anti-affinity terms and DoNotSchedule spread constraints
    #: (:mod:`scheduler.cluster.podaffinity`). Anti-affinity is read for bound pods too:
    #: it keeps matching pods out of their domain (the rule is symmetric).
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    #: Preferred pod (anti-)affinity, ScheduleAnyway spread and preferred node affinity of
    #: an unbound pod (None: none); applied among the best-packed nodes that fit.
    preferences: Preferences | None = None
    #: Terms (with weights) by which this pod, once on a node, draws or repels the pods they
    #: match (:func:`~scheduler.cluster.podaffinity.scoring_terms`); read for bound pods
    #: too, as kube-scheduler scores nodes by the pods running there.
    scoring_affinity: tuple[tuple[PodAffinityTerm, int], ...] = ()
    #: How many ``spec.resourceClaims`` entries the pod has (DRA): a pending pod with claims
    #: is placed only where its claims can be allocated (:mod:`scheduler.solver.dra_state`).
    resource_claims: int = 0
    #: GPU-class devices its ResourceClaims hold or ask for, set when the snapshot is built
    #: (:mod:`scheduler.cache.dra_usage`): they count as whole GPUs toward its queue.
    claim_gpus: int = 0
    #: An unbound pod's containers that request extended resources (names with a domain
    #: outside kubernetes.io): on a node that does not advertise one, a DeviceClass may serve
    #: it through DRA (:mod:`scheduler.cluster.dra_extended`).
    extended_containers: tuple[ContainerExtended, ...] = ()

    def __post_init__(self) -> None:
        # What the pod counts against its queue, once per pod object: every cycle reads it
        # for every pod (fair shares, validators, taking back). Made here, it is paid when
        # the cache parses a pod's change, not by the first cycle to read it.
        object.__setattr__(self, "_queue_usage", queue_usage_of(self))

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def node_label_keys(self) -> frozenset[str]:
        """Node label keys that :attr:`node_selector` and the required node affinity
        (:attr:`affinity`, ``metadata.name`` of ``matchFields`` included) read."""
        if not (self.node_selector or self.affinity):
            return frozenset()
        keys: frozenset[str] | None = getattr(self, "_node_label_keys", None)
        if keys is None:
            keys = _node_label_keys(self.node_selector, self.affinity)
            object.__setattr__(self, "_node_label_keys", keys)
        return keys

    @property
    def own_affinity(self) -> tuple[NodeSelectorTerm, ...]:
        """The required node affinity the pod's spec gives (without its volumes')."""
        return self.spec_affinity if self.volume_affinity else self.affinity

    @property
    def one_per_node(self) -> bool:
        """True when the pod's own anti-affinity keeps pods like it one per node (a term on
        the hostname label that selects the pod itself): at most one per node, whatever
        else the rules say."""
        if not self.pod_anti_affinity:
            return False
        one: bool | None = getattr(self, "_one_per_node", None)
        if one is None:
            labels = self.label_map
            one = any(
                t.topology_key == HOSTNAME_LABEL and t.matches(self.namespace, labels)
                for t in self.pod_anti_affinity
            )
            object.__setattr__(self, "_one_per_node", one)
        return one

    @property
    def topology_rules(self) -> bool:
        """True when where other pods run decides where this pod may go."""
        return bool(self.pod_affinity or self.pod_anti_affinity or self.spread)

    @property
    def started(self) -> float:
        """:attr:`start_time`, or :attr:`creation_time` when the start is unknown."""
        return self.start_time or self.creation_time

    @property
    def bound(self) -> bool:
        """True once the pod has a node."""
        return self.node_name is not None

    @property
    def active(self) -> bool:
        """True while the pod holds or will hold node resources."""
        return self.phase not in _FINISHED

    @property
    def pending(self) -> bool:
        """True for a managed pod that still waits for a node (and is not gated)."""
        # bound and active written out: every pass over the pods asks this of each one
        return (
            self.managed
            and self.node_name is None
            and self.phase not in _FINISHED
            and not self.deleting
            and not self.scheduling_gates
        )

    @property
    def gated(self) -> bool:
        """True for a managed pod that would be pending but for its scheduling gates."""
        return (
            bool(self.scheduling_gates)
            and self.managed
            and not self.bound
            and self.active
            and not self.deleting
        )

    def accepts(self, node: Node) -> bool:
        """True when taints, nodeSelector and required affinity allow ``node``."""
        return node_accepts(node, self.tolerations, self.node_selector, self.affinity)


def queue_usage_of(pod: Pod) -> tuple[int, int, int]:
    """(gpu thousandths, cpu milli, memory bytes) the pod counts against its queue (see
    :func:`scheduler.cluster.queue.pod_usage_triple`)."""
    if pod.gpu_grant:
        gpu = sum(m for _, m in pod.gpu_grant)
    elif pod.gpu is not None and pod.gpu.memory_mib is None:
        gpu = pod.gpu.total_milli
    elif pod.gpu is not None:
        gpu = pod.gpu.count * GPU_MILLI  # memory-sized share of unknown node: assume a device
    else:
        gpu = pod.requests.get(GPU) * GPU_MILLI
    # GPU-class devices of its ResourceClaims count as whole GPUs (see Pod.claim_gpus).
    gpu += pod.claim_gpus * GPU_MILLI
    requests = pod.requests
    return (gpu, requests.get(CPU), requests.get(MEMORY))
