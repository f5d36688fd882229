"""Pure domain types shared by every stage: no I/O, no solver, no Kubernetes client.

- :mod:`.quantity` / :mod:`.resources` - exact Kubernetes quantities and integer resource lists
- :mod:`.node`, :mod:`.pod`, :mod:`.gang`, :mod:`.queue` - the things being scheduled
- :mod:`.selectors` - taints/tolerations, nodeSelector, required node affinity
- :mod:`.podspec`, :mod:`.queuespec` - API objects (JSON form) to domain types
- :mod:`.unsupported` - placement fields not evaluated yet (the pod waits, named); gates
- :mod:`.hostports`, :mod:`.volumes` - host ports as node resources; where a pod's
  PersistentVolumeClaims let it run (node affinity ANDed in) or why it waits for them
- :mod:`.snapshot` - the immutable per-cycle view, JSON round-trip
"""

from scheduler.cluster.gang import Gang
from scheduler.cluster.node import GPU_MILLI, GpuDevice, Node, Taint
from scheduler.cluster.pod import GpuRequest, Pod, PodPhase
from scheduler.cluster.queue import (
    QUEUE_RESOURCES,
    UNLIMITED,
    Queue,
    QueueFinding,
    QueueResource,
    QueueTree,
    pod_queue_usage,
)
from scheduler.cluster.resources import CPU, GPU, MEMORY, PODS, Resources
from scheduler.cluster.selectors import (
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Toleration,
)
from scheduler.cluster.snapshot import NodeState, Snapshot

__all__ = [
    "CPU",
    "GPU",
    "GPU_MILLI",
    "MEMORY",
    "PODS",
    "QUEUE_RESOURCES",
    "UNLIMITED",
    "Gang",
    "GpuDevice",
    "GpuRequest",
    "Node",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "NodeState",
    "Pod",
    "PodPhase",
    "Queue",
    "QueueFinding",
    "QueueResource",
    "QueueTree",
    "Resources",
    "Snapshot",
    "Taint",
    "Toleration",
    "pod_queue_usage",
]
