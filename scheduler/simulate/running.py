"""Jobs already running when a scenario starts: check they fit their nodes, grant GPU devices.

A scenario's ``running`` job names the node of each pod; here every such pod is checked
against what its node offers (and what the running pods before it took), and gets a device
grant as a bound pod in a live cluster carries one (lowest free device indices first), so the
first snapshot accounts devices exactly. Mistakes raise :class:`ScenarioError` naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from scheduler.cluster.node import GPU_MILLI, Node
from scheduler.cluster.pod import Pod
from scheduler.cluster.resources import GPU, PODS
from scheduler.simulate.fields import ScenarioError
from scheduler.simulate.workload import JobArrival

__all__ = ["grant_running"]


class _NodeUse:
    """What the running pods placed so far take on one node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.used: dict[str, int] = {}
        self.free_milli = [GPU_MILLI] * node.gpu_count

    def take(self, pod: Pod, path: str) -> tuple[tuple[int, int], ...]:
        """Add ``pod``; returns its device grant."""
        node = self.node
        if not pod.accepts(node):
            raise ScenarioError(
                path,
                f"node {node.name} does not accept the pod (taints, nodeSelector or affinity); "
                "name another node or change the pod template",
            )
        wanted = {r: v for r, v in pod.requests.items() if r != GPU}
        wanted[PODS] = wanted.get(PODS, 0) + 1
        for resource, amount in wanted.items():
            have = node.allocatable[resource] - self.used.get(resource, 0)
            if amount > have:
                raise ScenarioError(
                    path,
                    f"node {node.name} has no room for pod {pod.key}: it asks {amount} {resource}, "
                    f"{have} left after the running pods named before it",
                )
        grant = self._devices(pod, path)
        for resource, amount in wanted.items():
            self.used[resource] = self.used.get(resource, 0) + amount
        for index, milli in grant:
            self.free_milli[index] -= milli
        return grant

    def _devices(self, pod: Pod, path: str) -> tuple[tuple[int, int], ...]:
        count = pod.gpu.count if pod.gpu is not None else pod.requests[GPU]
        if not count:
            return ()
        milli = GPU_MILLI if pod.gpu is None else pod.gpu.milli_on(self.node)
        if milli is None:
            raise ScenarioError(
                path,
                f"pod {pod.key} asks GPU memory, but node {self.node.name} has no gpuMemory "
                "(or too little per device)",
            )
        free = [i for i, left in enumerate(self.free_milli) if left >= milli]
        if len(free) < count:
            raise ScenarioError(
                path,
                f"node {self.node.name} has {len(free)} GPU device(s) with room left for pod "
                f"{pod.key}, which needs {count}",
            )
        return tuple((i, milli) for i in free[:count])


def grant_running(jobs: Sequence[JobArrival], nodes: Sequence[Node]) -> tuple[JobArrival, ...]:
    """``jobs`` (in file order, so ``jobs[i]`` names the field) with the pods of running jobs
    checked against their nodes and given device grants."""
    by_name = {n.name: n for n in nodes}
    use: dict[str, _NodeUse] = {}
    out: list[JobArrival] = []
    for i, job in enumerate(jobs):
        if not job.running:
            out.append(job)
            continue
        pods: list[Pod] = []
        for k, pod in enumerate(job.pods):
            path = f"jobs[{i}].running.nodes[{k}]"
            name = pod.node_name or ""
            node = by_name.get(name)
            if node is None:
                raise ScenarioError(
                    path, f"node {name!r} is not defined; node names are e.g. {_examples(nodes)}"
                )
            grant = use.setdefault(name, _NodeUse(node)).take(pod, path)
            pods.append(replace(pod, gpu_grant=grant))
        out.append(replace(job, pods=tuple(pods)))
    return tuple(out)


def _examples(nodes: Sequence[Node]) -> str:
    names = [n.name for n in nodes[:3]]
    return ", ".join(names) + (", …" if len(nodes) > 3 else "")
