"""Watch events -> in-memory store -> immutable :class:`~scheduler.cluster.snapshot.Snapshot`.

- :mod:`.store` - :class:`Cache`: apply/relisted, assume/confirm/forget, snapshot, problems
- :mod:`.resolve` - joining pods to gangs, queues and priorities
- :mod:`.nodespec` - API Node -> :class:`~scheduler.cluster.node.Node`
- :mod:`.grants` - the ``kai.scheduler/gpu-grant`` pod annotation
- :mod:`.problems` - :class:`Problem`, an object skipped and why
"""

from scheduler.cache.grants import (
    GPU_GRANT_ANNOTATION,
    GpuGrant,
    GrantError,
    format_gpu_grant,
    normalize_grant,
    parse_gpu_grant,
)
from scheduler.cache.nodespec import node_from_k8s
from scheduler.cache.problems import Problem
from scheduler.cache.store import DEFAULT_ASSUME_TTL, Cache

__all__ = [
    "DEFAULT_ASSUME_TTL",
    "GPU_GRANT_ANNOTATION",
    "Cache",
    "GpuGrant",
    "GrantError",
    "Problem",
    "format_gpu_grant",
    "node_from_k8s",
    "normalize_grant",
    "parse_gpu_grant",
]
