"""Scenario files for ``kai-scheduler simulate``: YAML in, validated domain objects out.

A scenario reads like the Kubernetes objects a KAI user already writes::

    name: quickstart
    settings: {cyclePeriod: 10s, end: 40m, gpuStrategy: binpack, scoring: packing,
               solver: cpsat, takeBack: true, terminationGracePeriod: 0s}
    nodes:                       # shapes x counts
      - {name: dgx, count: 2, gpus: 8, cpu: 64, memory: 512Gi, labels: {...}, taints: [...]}
    queues:                      # Queue CRD objects (metadata + spec)
      - metadata: {name: team-a}
        spec: {parentQueue: research, resources: {gpu: {quota: 8}},
               preemptMinRuntime: 5m, reclaimMinRuntime: 10m}
    podGroups:                   # optional PodGroup CRD objects shared by several jobs
      - metadata: {name: train, namespace: team-b}
        spec: {queue: team-b, minMember: 5}
    jobs:                        # pods by template x count, arriving at ``at``
      - name: pretrain
        namespace: team-a
        queue: team-a
        at: 0s
        duration: 30m            # each pod runs this long once bound (omit: runs forever)
        podGroup: {minMember: 4, preemptionDelay: 1m}  # inline PodGroup spec, or the name
                                                        # of a podGroups entry
        running:                 # optional: already running at the start,
          nodes: [dgx-0, dgx-0, dgx-1, dgx-1]           # on these nodes (one per pod),
          startTime: -10m        # since 10 minutes before it (so 20 minutes are left)
        pods:
          count: 4
          template: {metadata: {annotations: {...}}, spec: {containers: [...]}}
          # or the shorthand ``resources: {nvidia.com/gpu: 2, cpu: 4}`` for one container
    deviceClasses: [...]         # optional DRA objects (resource.k8s.io/v1), see
    resourceSlices: [...]        # :mod:`scheduler.simulate.scenario_dra`; pod templates
    resourceClaims: [...]        # use them in spec.resourceClaims
    resourceClaimTemplates: [...]

Every problem raises :class:`ScenarioError` naming the field path (``jobs[2].pods.count``) and
what to change; nothing here returns half-checked data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scheduler.cluster.node import GPU_MEMORY_LABEL, Node, Taint
from scheduler.cluster.quantity import QuantityError, parse_quantity
from scheduler.cluster.queue import Queue
from scheduler.cluster.queuespec import SpecError, queue_from_k8s
from scheduler.cluster.resources import CPU, GPU, MEMORY, PODS, Resources
from scheduler.simulate.checks import check_queue_resources, check_queue_tree
from scheduler.simulate.fields import (
    ScenarioError,
    check_known,
    read_choice,
    read_count,
    read_list,
    read_mapping,
    read_name,
    read_seconds,
    read_string_map,
)
from scheduler.simulate.loader import load_documents
from scheduler.simulate.running import grant_running
from scheduler.simulate.workload import JobArrival, parse_jobs, pod_groups, priority_classes
from scheduler.solver.placement import PlacementSettings, Strategy

if TYPE_CHECKING:  # DRA types pull in the CEL library: imported only for scenarios with devices
    from scheduler.cluster.dra import ResourceClaim
    from scheduler.cluster.draview import DraView

__all__ = [
    "MIN_CYCLE_PERIOD",
    "JobArrival",
    "Scenario",
    "ScenarioError",
    "ScenarioSettings",
    "load_scenario",
    "parse_scenario",
]

#: Guards against typos that would eat the machine's memory (devices are tracked one by one).
MAX_NODES_PER_SHAPE = 100_000
MAX_GPUS_PER_NODE = 256
#: Shorter periods only multiply cycles without changing outcomes.
MIN_CYCLE_PERIOD = 0.1
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_STRATEGIES = ("binpack", "spread")
_SOLVERS = ("cpsat", "greedy")
_SCORINGS = ("packing", "fragmentation")
_TOP_FIELDS = ("apiVersion", "kind", "name", "description", "settings", "nodes", "queues",
               "priorityClasses", "podGroups", "jobs", "deviceClasses", "resourceSlices",
               "resourceClaims", "resourceClaimTemplates")  # fmt: skip
_DRA_FIELDS = ("deviceClasses", "resourceSlices", "resourceClaims", "resourceClaimTemplates")
_NODE_FIELDS = ("name", "count", "gpus", "cpu", "memory", "pods", "gpuMemory", "labels", "taints",
                "unschedulable")  # fmt: skip


@dataclass(frozen=True)
class ScenarioSettings:
    """How the simulation runs."""

    #: Simulated seconds between scheduling cycles.
    cycle_period: float = 10.0
    #: Simulated time at which the run stops; None runs until nothing more can change.
    end: float | None = None
    #: Placement settings handed to every cycle (same type the live scheduler uses).
    placement: PlacementSettings = field(default_factory=PlacementSettings)
    #: Seconds an evicted pod keeps its resources before it is gone (unless its template sets
    #: ``terminationGracePeriodSeconds``).
    termination_grace: float = 0.0


@dataclass(frozen=True)
class Scenario:
    """A validated scenario: cluster, queues and the work that arrives over time."""

    name: str
    settings: ScenarioSettings
    nodes: tuple[Node, ...]
    queues: tuple[Queue, ...]
    jobs: tuple[JobArrival, ...]
    #: DeviceClasses, ResourceSlices and ResourceClaims; None when the scenario has none.
    dra: DraView | None = None
    #: ResourceClaimTemplates, as claims named like the templates.
    claim_templates: tuple[ResourceClaim, ...] = ()

    @property
    def last_arrival(self) -> float:
        """When the last job arrives (0 for an empty scenario)."""
        return max((j.at for j in self.jobs), default=0.0)


def _strategy(data: Mapping[str, Any], key: str) -> Strategy:
    value = read_choice(data.get(key, "binpack"), f"settings.{key}", _STRATEGIES)
    return "spread" if value == "spread" else "binpack"


def _settings(raw: Any) -> ScenarioSettings:
    data = read_mapping(raw, "settings")
    check_known(
        data,
        "settings",
        (
            "cyclePeriod",
            "end",
            "gpuStrategy",
            "cpuStrategy",
            "scoring",
            "solver",
            "solverTimeLimit",
            "takeBack",
            "terminationGracePeriod",
        ),
    )
    period = read_seconds(data.get("cyclePeriod", "10s"), "settings.cyclePeriod")
    if period < MIN_CYCLE_PERIOD:
        raise ScenarioError(
            "settings.cyclePeriod", f"must be at least {MIN_CYCLE_PERIOD}s; KAI's default is 1s"
        )
    end = None if data.get("end") is None else read_seconds(data["end"], "settings.end")
    limit = read_seconds(data.get("solverTimeLimit", "0.5s"), "settings.solverTimeLimit")
    solver = read_choice(data.get("solver", "cpsat"), "settings.solver", _SOLVERS)
    take_back = data.get("takeBack", True)
    if not isinstance(take_back, bool):
        raise ScenarioError("settings.takeBack", "must be true (reclaim and preempt) or false")
    grace = read_seconds(
        data.get("terminationGracePeriod", "0s"), "settings.terminationGracePeriod"
    )
    placement = PlacementSettings(
        gpu_strategy=_strategy(data, "gpuStrategy"),
        cpu_strategy=_strategy(data, "cpuStrategy"),
        scoring="fragmentation"
        if read_choice(data.get("scoring", "packing"), "settings.scoring", _SCORINGS)
        == "fragmentation"
        else "packing",
        time_limit_seconds=limit,
        greedy_only=solver == "greedy",
        take_back=take_back,
    )
    return ScenarioSettings(
        cycle_period=period, end=end, placement=placement, termination_grace=grace
    )


def _quantity_field(raw: Any, path: str) -> Any:
    try:
        parse_quantity(raw)
    except (QuantityError, TypeError) as e:
        raise ScenarioError(path, f"{raw!r} is not a quantity such as 8, 500m or 64Gi") from e
    return raw


def _gpu_memory_mib(raw: Any, path: str) -> int:
    try:
        value = parse_quantity(raw)
    except (QuantityError, TypeError) as e:
        raise ScenarioError(path, f"{raw!r} is not MiB (e.g. 81920) or a size like 80Gi") from e
    # A bare number is MiB (the nvidia.com/gpu.memory label's unit); a size is in bytes.
    mib = value if isinstance(raw, int | float) or str(raw).isdigit() else value / 2**20
    if mib <= 0:
        raise ScenarioError(path, "must be positive")
    return int(mib)


def _taints(raw: Any, path: str) -> tuple[Taint, ...]:
    out = []
    for i, t in enumerate(read_list(raw, path)):
        tp = f"{path}[{i}]"
        data = read_mapping(t, tp)
        check_known(data, tp, ("key", "value", "effect"))
        effect = read_choice(data.get("effect", "NoSchedule"), f"{tp}.effect", _EFFECTS)
        out.append(
            Taint(
                key=read_name(data.get("key"), f"{tp}.key"),
                value=str(data.get("value") or ""),
                effect="NoExecute"
                if effect == "NoExecute"
                else "PreferNoSchedule"
                if effect == "PreferNoSchedule"
                else "NoSchedule",
            )
        )
    return tuple(out)


def _nodes(raw: Any) -> tuple[Node, ...]:
    nodes: list[Node] = []
    seen: set[str] = set()
    items = read_list(raw, "nodes")
    if not items:
        raise ScenarioError("nodes", "a scenario needs at least one node shape")
    for i, entry in enumerate(items):
        path = f"nodes[{i}]"
        data = read_mapping(entry, path)
        check_known(
            data,
            path,
            _NODE_FIELDS,
        )
        name = read_name(data.get("name"), f"{path}.name")
        count = read_count(data.get("count", 1), f"{path}.count")
        gpus = read_count(data.get("gpus", 0), f"{path}.gpus", allow_zero=True)
        if count > MAX_NODES_PER_SHAPE:
            raise ScenarioError(f"{path}.count", f"at most {MAX_NODES_PER_SHAPE} nodes per shape")
        if gpus > MAX_GPUS_PER_NODE:
            raise ScenarioError(f"{path}.gpus", f"at most {MAX_GPUS_PER_NODE} GPUs per node")
        quantities = {
            CPU: _quantity_field(data.get("cpu", 64), f"{path}.cpu"),
            MEMORY: _quantity_field(data.get("memory", "512Gi"), f"{path}.memory"),
            PODS: read_count(data.get("pods", 110), f"{path}.pods"),
            GPU: gpus,
        }
        try:
            allocatable = Resources.from_k8s(quantities, field=path)
        except QuantityError as e:
            raise ScenarioError(path, str(e)) from e
        labels = read_string_map(data.get("labels"), f"{path}.labels")
        gpu_mib = None
        if data.get("gpuMemory") is not None:
            gpu_mib = _gpu_memory_mib(data["gpuMemory"], f"{path}.gpuMemory")
            labels.setdefault(GPU_MEMORY_LABEL, str(gpu_mib))
        taints = _taints(data.get("taints"), f"{path}.taints")
        unschedulable = data.get("unschedulable", False)
        if not isinstance(unschedulable, bool):
            raise ScenarioError(f"{path}.unschedulable", "must be true or false")
        for k in range(count):
            node_name = name if count == 1 else f"{name}-{k}"
            if node_name in seen:
                raise ScenarioError(f"{path}.name", f"node name {node_name!r} is used twice")
            seen.add(node_name)
            node_labels = {"kubernetes.io/hostname": node_name, **labels}
            nodes.append(
                Node(
                    name=node_name,
                    allocatable=allocatable,
                    labels=tuple(sorted(node_labels.items())),
                    taints=taints,
                    unschedulable=unschedulable,
                    gpu_memory_mib=gpu_mib,
                )
            )
    return tuple(nodes)


def _queues(raw: Any) -> tuple[Queue, ...]:
    queues: list[Queue] = []
    names: set[str] = set()
    items = read_list(raw, "queues")
    if not items:
        raise ScenarioError("queues", "a scenario needs at least one queue (Queue CRD objects)")
    for i, entry in enumerate(items):
        path = f"queues[{i}]"
        data = dict(read_mapping(entry, path))
        data.pop("apiVersion", None)
        data.pop("kind", None)
        check_known(data, path, ("metadata", "spec"))
        meta = read_mapping(data.get("metadata"), f"{path}.metadata")
        name = read_name(meta.get("name"), f"{path}.metadata.name")
        if name in names:
            raise ScenarioError(f"{path}.metadata.name", f"queue {name!r} is defined twice")
        names.add(name)
        check_queue_resources(read_mapping(data.get("spec"), f"{path}.spec"), path)
        try:
            queues.append(queue_from_k8s(data))
        except SpecError as e:
            raise ScenarioError(f"{path}.{e.field}", e.message) from e
    check_queue_tree(queues, [f"queues[{i}]" for i in range(len(queues))])
    return tuple(queues)


def parse_scenario(data: Any, *, default_name: str = "scenario") -> Scenario:
    """Validate already-loaded YAML data into a :class:`Scenario`."""
    root = read_mapping(data, "(top level)")
    check_known(root, "", _TOP_FIELDS)
    settings = _settings(root.get("settings"))
    nodes = _nodes(root.get("nodes"))
    queues = _queues(root.get("queues"))
    jobs = parse_jobs(
        root.get("jobs"),
        {q.name for q in queues},
        pod_groups(root.get("podGroups")),
        priority_classes(root.get("priorityClasses")),
    )
    jobs = grant_running(jobs, nodes)
    dra = None
    templates: list[ResourceClaim] = []
    if any(root.get(f) is not None for f in _DRA_FIELDS) or any(j.claims for j in jobs):
        from scheduler.simulate.scenario_dra import (
            check_job_claims,
            parse_claim_templates,
            parse_dra,
        )

        dra = parse_dra(root, {n.name for n in nodes})
        templates = parse_claim_templates(root, dra)
        check_job_claims(jobs, dra, templates)
    name = str(root.get("name") or default_name)
    return Scenario(name, settings, nodes, queues, jobs, dra, tuple(templates))


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; errors raise :class:`ScenarioError`.

    The file is one scenario document, or Kubernetes manifests (see
    :mod:`scheduler.simulate.manifests`, which :func:`scheduler.simulate.inputs.load_inputs`
    reads together with other files)."""
    p = Path(path)
    docs = load_documents(p)
    if not docs:
        raise ScenarioError(str(p), "the file is empty; see examples/simulate/quickstart.yaml")
    if len(docs) > 1:
        raise ScenarioError(
            str(p),
            f"has {len(docs)} YAML documents; a scenario is one (Kubernetes manifests are "
            "read by kai-scheduler simulate FILE... --nodes NODES.yaml)",
        )
    return parse_scenario(docs[0], default_name=p.stem)
