"""Kubernetes manifests as simulator input: the YAML users ``kubectl apply``, simulated as is.

Each document becomes part of a scenario (:mod:`scheduler.simulate.scenario`), the way the
cluster would read it, by the scheduler's own code:

==========================  ==============================================================
kind                        becomes
==========================  ==============================================================
Queue                       a ``queues`` entry (:func:`~scheduler.cluster.queuespec.queue_from_k8s`)
PodGroup                    a ``podGroups`` entry (``status`` dropped)
PriorityClass               a ``priorityClasses`` entry (value, preemptionPolicy)
Pod                         one pod; ``spec.nodeName`` set: already running there
Job (batch/v1)              ``min(parallelism, completions)`` pods ``<job>-<i>``
Deployment, StatefulSet     ``replicas`` pods ``<name>-<i>``
LeaderWorkerSet             ``replicas`` groups: leader ``<lws>-<g>``, workers ``<lws>-<g>-<w>``
Node, SimulatedNodes, List  nodes (a Node's ``status.allocatable``; SimulatedNodes holds
                            ``nodes:`` shapes as in a scenario); a List's ``items`` are read
==========================  ==============================================================

Which PodGroup a pod joins is decided as in a cluster: the pod's ``pod-group-name``
annotation names an explicit one; else the pod grouper's rules
(:func:`scheduler.podgrouper.groupers.group_pod`, the same code ``kai-scheduler podgrouper``
runs) make one per Job, per Deployment replica, per LWS group, ...; ``kai.scheduler/skip-
podgrouper`` leaves the pod a gang of one. Pods whose ``schedulerName`` is not
``kai-scheduler`` are left out (another scheduler would place them), with a note.

Pods arrive at the start and run until the end, unless the pod (template) or workload
annotates ``simulate.kai.scheduler/at`` and ``simulate.kai.scheduler/duration`` (durations
such as ``10m``). A queue named but not defined is added when it is one of the default queues
the install ships (``default-parent-queue``, ``default-queue``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.cache.nodespec import node_from_k8s
from scheduler.cluster.podspec import GANG_ANNOTATIONS, QUEUE_LABEL
from scheduler.cluster.queuespec import SpecError
from scheduler.cluster.resources import CPU, GPU, MEMORY, PODS
from scheduler.podgrouper.groupers import GroupingContext, group_pod
from scheduler.podgrouper.keys import (
    DEFAULT_QUEUE,
    LWS_GROUP_INDEX_LABEL,
    LWS_NAME_LABEL,
    LWS_SIZE_ANNOTATION,
    LWS_WORKER_INDEX_LABEL,
)
from scheduler.podgrouper.owners import ObjectInfo, skip_requested
from scheduler.podgrouper.spec import choose_priority_class, desired_podgroup
from scheduler.simulate.fields import (
    ScenarioError,
    read_list,
    read_mapping,
    read_name,
    read_string_map,
)
from scheduler.simulate.workload import SCHEDULER_NAME, priority_classes

__all__ = [
    "ARRIVAL_ANNOTATION",
    "DEFAULT_PARENT_QUEUE",
    "DURATION_ANNOTATION",
    "MANIFEST_KINDS",
    "Assembly",
    "Document",
    "assemble",
]

ARRIVAL_ANNOTATION = "simulate.kai.scheduler/at"
DURATION_ANNOTATION = "simulate.kai.scheduler/duration"
#: The install's default queues (manifests/chart/values.yaml ``defaultQueues``).
DEFAULT_PARENT_QUEUE = "default-parent-queue"
_OPEN = {"quota": 0, "limit": -1, "overQuotaWeight": 1}
_DEFAULT_QUEUES: tuple[dict[str, Any], ...] = (
    {"metadata": {"name": DEFAULT_PARENT_QUEUE}, "spec": {"resources": {
        "gpu": _OPEN, "cpu": _OPEN, "memory": _OPEN}}},
    {"metadata": {"name": DEFAULT_QUEUE}, "spec": {"parentQueue": DEFAULT_PARENT_QUEUE,
        "resources": {"gpu": _OPEN, "cpu": _OPEN, "memory": _OPEN}}},
)  # fmt: skip
_WORKLOADS = ("Pod", "Job", "Deployment", "StatefulSet", "LeaderWorkerSet")
#: Kinds a manifest set often carries that place nothing: read past.
_IGNORED = ("Namespace", "Service", "ConfigMap", "Secret", "ServiceAccount")
MANIFEST_KINDS = ("Queue", "PodGroup", "PriorityClass", *_WORKLOADS, "Node", "SimulatedNodes",
                  "List", *_IGNORED)  # fmt: skip


@dataclass(frozen=True)
class Document:
    """One YAML document and where it was read (``file.yaml document 2``)."""

    obj: Any
    where: str


@dataclass
class Assembly:
    """Scenario data assembled from documents, and where each list entry came from."""

    data: dict[str, Any]
    #: Per scenario list (``jobs``, ``queues``, ...): the origin of each entry, None for
    #: entries of a scenario document (their own path is right as it is).
    origins: dict[str, list[str | None]] = field(default_factory=dict)
    #: Things the user should know that are no error (left-out pods, grouper issues).
    notes: list[str] = field(default_factory=list)
    #: Per ``jobs`` entry made from a manifest: where its pod template sits in the workload
    #: (``spec.template.``; "" for a Pod), so errors give the manifest's own field path.
    template_paths: dict[int, str] = field(default_factory=dict)

    def add(self, section: str, entry: Any, origin: str | None) -> None:
        """Append ``entry`` to the scenario list ``section``."""
        self.data.setdefault(section, []).append(entry)
        self.origins.setdefault(section, []).append(origin)


def _uid(*parts: str) -> str:
    """A stable stand-in for the uid the API server would assign (PodGroup names use it)."""
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:8]


def _label(doc: Document, obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return f"{doc.where} ({obj.get('kind')} {name or '(no name)'})"


def _items(doc: Document) -> Iterator[tuple[Document, Mapping[str, Any]]]:
    """The document's objects; a List's items one by one."""
    obj = read_mapping(doc.obj, doc.where)
    if obj.get("kind") != "List":
        yield doc, obj
        return
    for i, item in enumerate(read_list(obj.get("items"), f"{doc.where}.items")):
        sub = Document(item, f"{doc.where} items[{i}]")
        yield from _items(sub)


def _node_shape(obj: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A Node object as a scenario node shape, read by the scheduler's Node parser."""
    # The live parser trusts the API server's shapes; a hand-written file is checked first.
    meta = read_mapping(obj.get("metadata"), f"{where}.metadata")
    read_string_map(meta.get("labels"), f"{where}.metadata.labels")
    spec = read_mapping(obj.get("spec"), f"{where}.spec")
    for i, taint in enumerate(read_list(spec.get("taints"), f"{where}.spec.taints")):
        read_mapping(taint, f"{where}.spec.taints[{i}]")
    status = read_mapping(obj.get("status"), f"{where}.status")
    read_mapping(status.get("allocatable"), f"{where}.status.allocatable")
    for i, cond in enumerate(read_list(status.get("conditions"), f"{where}.status.conditions")):
        read_mapping(cond, f"{where}.status.conditions[{i}]")
    try:
        node = node_from_k8s(obj)
    except SpecError as e:
        raise ScenarioError(f"{where}.{e.field}", e.message) from e
    except (AttributeError, TypeError, ValueError) as e:
        raise ScenarioError(
            where, f"not a valid Node object ({e}); see kubectl explain node"
        ) from e
    read_name(node.name, f"{where}.metadata.name")
    # A hand-written Node has no conditions: only a reported NotReady keeps pods off it.
    not_ready = bool(status.get("conditions")) and not node.ready
    shape: dict[str, Any] = {
        "name": node.name,
        "gpus": node.allocatable.get(GPU),
        "cpu": f"{node.allocatable.get(CPU)}m",
        "memory": node.allocatable.get(MEMORY),
        "pods": node.allocatable.get(PODS) or 110,
        "labels": dict(node.labels),
        "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in node.taints],
        "unschedulable": node.unschedulable or not_ready,
    }
    if node.gpu_memory_mib:
        shape["gpuMemory"] = node.gpu_memory_mib
    return shape


def _annotation(key: str, *objs: Mapping[str, Any]) -> Any:
    for obj in objs:
        value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
        if value is not None:
            return value
    return None


@dataclass(frozen=True)
class _PodDraft:
    """One pod a workload creates, before it is grouped."""

    obj: dict[str, Any]
    #: The owner chain the pod grouper reads (empty for a bare pod).
    chain: tuple[ObjectInfo, ...]
    origin: str
    #: Where the pod template sits in the workload, for error messages (``spec.template.``).
    template_path: str
    workload: Mapping[str, Any]


def _pod(name: str, namespace: str, template: Any, where: str, **extra: Any) -> dict[str, Any]:
    tmpl = read_mapping(template, where)
    meta = dict(read_mapping(tmpl.get("metadata"), f"{where}.metadata"))
    labels = {**read_mapping(meta.get("labels"), f"{where}.metadata.labels"),
              **extra.get("labels", {})}  # fmt: skip
    annotations = {**read_mapping(meta.get("annotations"), f"{where}.metadata.annotations"),
                   **extra.get("annotations", {})}  # fmt: skip
    meta.update(name=name, namespace=namespace, labels=labels, annotations=annotations)
    meta["uid"] = _uid("Pod", namespace, name)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": dict(read_mapping(tmpl.get("spec"), f"{where}.spec"))}  # fmt: skip


def _count(raw: Any, default: int, where: str) -> int:
    value = default if raw is None else raw
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ScenarioError(where, f"{value!r} must be a whole number >= 0")
    return value


#: Pods one workload object may expand to. Far above any cluster the simulator models, and
#: low enough that a mistyped count (replicas: 1000000) is an error naming the field rather
#: than minutes of building pods and gigabytes of memory.
MAX_WORKLOAD_PODS = 100_000


def _within_limit(pods: int, where: str) -> None:
    if pods > MAX_WORKLOAD_PODS:
        raise ScenarioError(
            where,
            f"makes {pods} pods; the simulator takes at most {MAX_WORKLOAD_PODS} from one object",
        )


def _workload_pods(doc: Document, obj: Mapping[str, Any]) -> list[_PodDraft]:
    """The pods a workload object creates, as its controller would."""
    kind = str(obj.get("kind"))
    origin = _label(doc, obj)
    meta = read_mapping(obj.get("metadata"), f"{origin}.metadata")
    name = read_name(meta.get("name"), f"{origin}.metadata.name")
    namespace = str(meta.get("namespace") or "default")
    spec = read_mapping(obj.get("spec"), f"{origin}.spec")
    if kind == "Pod":
        pod = _pod(name, namespace, {"metadata": meta, "spec": spec}, origin)
        return [_PodDraft(pod, (), origin, "", obj)]
    uid = meta.get("uid") or _uid(kind, namespace, name)
    owner = {**obj, "metadata": {**meta, "namespace": namespace, "uid": uid}}
    chain = (ObjectInfo.from_k8s(owner),)
    drafts: list[_PodDraft] = []
    if kind == "LeaderWorkerSet":
        lwt = read_mapping(spec.get("leaderWorkerTemplate"), f"{origin}.spec.leaderWorkerTemplate")
        base = "spec.leaderWorkerTemplate"
        size = _count(lwt.get("size"), 1, f"{origin}.{base}.size")
        groups = _count(spec.get("replicas"), 1, f"{origin}.spec.replicas")
        _within_limit(groups * size, f"{origin}.spec.replicas x {base}.size")
        worker = lwt.get("workerTemplate")
        leader = lwt.get("leaderTemplate") or worker
        for g in range(groups):
            for w in range(size):
                which = (
                    "leaderTemplate" if w == 0 and lwt.get("leaderTemplate") else "workerTemplate"
                )
                pod_name = f"{name}-{g}" if w == 0 else f"{name}-{g}-{w}"
                labels = {LWS_NAME_LABEL: name, LWS_GROUP_INDEX_LABEL: str(g),
                          LWS_WORKER_INDEX_LABEL: str(w)}  # fmt: skip
                pod = _pod(pod_name, namespace, leader if w == 0 else worker,
                           f"{origin}.{base}.{which}", labels=labels,
                           annotations={LWS_SIZE_ANNOTATION: str(size)})  # fmt: skip
                drafts.append(_PodDraft(pod, chain, origin, f"{base}.{which}.", obj))
        return drafts
    if kind == "Job":
        parallelism = _count(spec.get("parallelism"), 1, f"{origin}.spec.parallelism")
        completions = spec.get("completions")
        count = parallelism
        if completions is not None:
            count = min(parallelism, _count(completions, 1, f"{origin}.spec.completions"))
    else:
        count = _count(spec.get("replicas"), 1, f"{origin}.spec.replicas")
    _within_limit(count, f"{origin}.spec")
    for k in range(count):
        pod = _pod(f"{name}-{k}", namespace, spec.get("template"), f"{origin}.spec.template")
        drafts.append(_PodDraft(pod, chain, origin, "spec.template.", obj))
    return drafts


def _job_entry(
    draft: _PodDraft, asm: Assembly, groups: dict[str, str], classes: Mapping[str, int]
) -> dict[str, Any]:
    """The scenario ``jobs`` entry of one pod, with its PodGroup found or made."""
    pod = draft.obj
    meta, spec = pod["metadata"], pod["spec"]
    name, namespace = meta["name"], meta["namespace"]
    info = ObjectInfo.from_k8s(pod)
    entry: dict[str, Any] = {"name": name, "namespace": namespace}
    explicit = next((meta["annotations"][k] for k in GANG_ANNOTATIONS
                     if meta["annotations"].get(k)), "")  # fmt: skip
    if explicit:
        key = f"{namespace}/{explicit}"
        if key not in groups:
            raise ScenarioError(
                f"{draft.origin}: pod {name}",
                f"names PodGroup {key} (annotation pod-group-name), which no document defines; "
                "add the PodGroup or remove the annotation to let the pod grouper make one",
            )
        entry["podGroup"] = key
    elif skip_requested(info, draft.chain) is not None:
        entry["queue"] = meta["labels"].get(QUEUE_LABEL) or DEFAULT_QUEUE
    else:
        grouping = group_pod(info, draft.chain, GroupingContext(default_queue=DEFAULT_QUEUE))
        pc, issues = choose_priority_class(grouping, lambda n: n in classes)
        for issue in grouping.issues + issues:
            asm.notes.append(f"{draft.origin}: {issue.reason}: {issue.message}")
        group = desired_podgroup(grouping, pc)
        key = f"{grouping.namespace}/{grouping.name}"
        if key not in groups:
            group["metadata"].pop("ownerReferences", None)
            groups[key] = grouping.queue
            asm.add("podGroups", {"metadata": group["metadata"], "spec": group["spec"]},
                    f"{draft.origin}: the PodGroup the pod grouper makes")  # fmt: skip
        entry["podGroup"] = key
    pc_name = spec.get("priorityClassName")
    if pc_name:
        if not isinstance(pc_name, str) or pc_name not in classes:
            raise ScenarioError(
                f"{draft.origin}: {draft.template_path}spec.priorityClassName",
                f"PriorityClass {pc_name!r} does not exist (the API server would reject the pod); "
                f"add a PriorityClass document or use one of {', '.join(sorted(classes))}",
            )
        entry["priorityClassName"] = pc_name
    for key, annotation in (("at", ARRIVAL_ANNOTATION), ("duration", DURATION_ANNOTATION)):
        value = _annotation(annotation, pod, draft.workload)
        if value is not None:
            entry[key] = value
    if spec.get("nodeName"):
        entry["running"] = {"nodes": [spec["nodeName"]], "startTime": 0}
    spec = {k: v for k, v in spec.items() if k not in ("nodeName", "schedulerName")}
    entry["pods"] = {"count": 1, "template": {"metadata": {
        "labels": meta["labels"], "annotations": meta["annotations"]}, "spec": spec}}  # fmt: skip
    return entry


def _section(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A Queue or PodGroup as the scenario reads it: metadata and spec."""
    return {"metadata": obj.get("metadata"), "spec": obj.get("spec")}


def assemble(scenario: Mapping[str, Any] | None, documents: list[Document]) -> Assembly:
    """Scenario data from an optional scenario document plus manifests."""
    data = {k: (list(v) if isinstance(v, list) else v) for k, v in (scenario or {}).items()}
    asm = Assembly(data)
    for section in ("nodes", "queues", "podGroups", "jobs"):
        if section in data:
            data[section] = list(read_list(data[section], section))
            asm.origins[section] = [None] * len(data[section])
    drafts: list[_PodDraft] = []
    pcs = dict(read_mapping(data.get("priorityClasses"), "priorityClasses"))
    for doc in documents:
        for sub, obj in _items(doc):
            kind = obj.get("kind")
            where = _label(sub, obj)
            if kind not in MANIFEST_KINDS:
                raise ScenarioError(
                    f"{sub.where}.kind",
                    f"{kind!r} is not a kind the simulator reads; use one of "
                    f"{', '.join(k for k in MANIFEST_KINDS if k not in _IGNORED)}",
                )
            if kind in ("Queue", "PodGroup"):
                asm.add("queues" if kind == "Queue" else "podGroups", _section(obj), where)
            elif kind == "PriorityClass":
                pc_meta = read_mapping(obj.get("metadata"), f"{where}.metadata")
                name = read_name(pc_meta.get("name"), f"{where}.metadata.name")
                policy = obj.get("preemptionPolicy") or "PreemptLowerPriority"
                pcs[name] = {"value": obj.get("value"), "preemptionPolicy": policy}
            elif kind == "Node":
                asm.add("nodes", _node_shape(obj, where), where)
            elif kind == "SimulatedNodes":
                for i, shape in enumerate(read_list(obj.get("nodes"), f"{where}.nodes")):
                    asm.add("nodes", shape, f"{where} nodes[{i}]")
            elif kind in _WORKLOADS:
                drafts.extend(_workload_pods(sub, obj))
    if pcs:
        data["priorityClasses"] = pcs
    classes = priority_classes(pcs)
    groups: dict[str, str] = {}
    for entry in data.get("podGroups") or []:
        meta = entry.get("metadata") if isinstance(entry, Mapping) else None
        if isinstance(meta, Mapping) and meta.get("name"):
            spec = entry.get("spec") if isinstance(entry.get("spec"), Mapping) else {}
            groups[f"{meta.get('namespace') or 'default'}/{meta['name']}"] = str(
                (spec or {}).get("queue") or ""
            )
    for draft in drafts:
        if draft.obj["spec"].get("schedulerName") != SCHEDULER_NAME:
            asm.notes.append(
                f"{draft.origin}: pod {draft.obj['metadata']['name']} left out: its "
                f"schedulerName is not {SCHEDULER_NAME} (set spec.schedulerName: {SCHEDULER_NAME})"
            )
            continue
        entry = _job_entry(draft, asm, groups, classes)
        asm.template_paths[len(asm.data.get("jobs") or [])] = draft.template_path
        asm.add("jobs", entry, draft.origin)
    _add_default_queues(asm, groups)
    return asm


def _add_default_queues(asm: Assembly, groups: Mapping[str, str]) -> None:
    """Add the install's default queues when something names them and no document does."""
    defined = {
        str(q["metadata"].get("name"))
        for q in asm.data.get("queues") or []
        if isinstance(q, Mapping) and isinstance(q.get("metadata"), Mapping)
    }
    jobs = asm.data.get("jobs") or []
    named = set(groups.values()) | {str(j.get("queue")) for j in jobs if isinstance(j, Mapping)}
    if DEFAULT_QUEUE in named and DEFAULT_QUEUE not in defined:
        for q in _DEFAULT_QUEUES:
            if q["metadata"]["name"] not in defined:
                asm.add("queues", q, "the default queues the install ships")
        asm.notes.append(
            f"added the install's default queues {DEFAULT_PARENT_QUEUE} and {DEFAULT_QUEUE} "
            "(quota 0, unlimited), which the pods name"
        )
