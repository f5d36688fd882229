"""Verdicts on the cluster around the scheduler: RBAC of its ServiceAccount, GPU nodes, pods
stuck pending, and the optional Volcano and LeaderWorkerSet integrations. Pure functions of
API objects and access-review answers; :mod:`.checks` fetches them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.cluster.quantity import QuantityError, parse_quantity
from scheduler.doctor.install import parse_time
from scheduler.doctor.rbac import Permission
from scheduler.doctor.result import CheckResult, Status

__all__ = [
    "GPU_RESOURCE",
    "LWS_CRD",
    "VOLCANO_CRDS",
    "AccessAnswer",
    "judge_gpu_nodes",
    "judge_lws",
    "judge_pending_pods",
    "judge_rbac",
    "judge_volcano",
    "lws_provider",
    "stuck_pods",
]

GPU_RESOURCE = "nvidia.com/gpu"
VOLCANO_CRDS = ("podgroups.scheduling.volcano.sh", "queues.scheduling.volcano.sh")
LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
_SHOWN = 20


@dataclass(frozen=True, slots=True)
class AccessAnswer:
    """The API server's answer to one access review."""

    permission: Permission
    #: Namespace asked about (None: every namespace / cluster-scoped).
    namespace: str | None
    allowed: bool

    def describe(self) -> str:
        """``create pods/binding`` or ``create leases.coordination.k8s.io in kai-scheduler``."""
        where = f" in {self.namespace}" if self.namespace else ""
        return self.permission.describe() + where


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def judge_rbac(
    answers: Sequence[AccessAnswer],
    subject: str,
    *,
    via_self: bool,
    cluster_role: str,
) -> CheckResult:
    """Every permission the scheduler uses is granted to ``subject``.

    ``via_self``: the answers came from SelfSubjectAccessReviews because doctor may not create
    SubjectAccessReviews; they are about the scheduler only when doctor runs as ``subject``
    (the caller then passes ``via_self=False``), otherwise a gap is a warning.
    """
    title = "RBAC of the scheduler's ServiceAccount"
    missing = [a for a in answers if not a.allowed]
    method = "SelfSubjectAccessReview" if via_self else "SubjectAccessReview"
    if via_self:
        text = (
            f"doctor may not create SubjectAccessReviews, so it checked its own identity "
            f"instead of {subject}: {len(answers) - len(missing)}/{len(answers)} allowed"
        )
        return CheckResult(
            "rbac", title, Status.WARN, text,
            "run doctor as a cluster admin (create subjectaccessreviews) to check the "
            "scheduler's own rights",
            tuple(f"not allowed to doctor: {a.describe()}" for a in missing),
        )  # fmt: skip
    if not missing:
        return CheckResult(
            "rbac", title, Status.OK,
            f"{subject} may do all {len(answers)} things the scheduler does ({method})",
        )  # fmt: skip
    named = ", ".join(a.describe() for a in missing[:6])
    more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
    return CheckResult(
        "rbac", title, Status.FAIL, f"{subject} may not: {named}{more}",
        f"grant them in ClusterRole {cluster_role} / its leader-election Role: "
        "kubectl apply -f manifests/20-rbac.yaml (or helm upgrade the release)",
        tuple(f"missing: {a.describe()}" for a in missing),
    )  # fmt: skip


def _gpus(node: Mapping[str, Any], field: str) -> int:
    raw = ((node.get("status") or {}).get(field) or {}).get(GPU_RESOURCE)
    if raw is None:
        return 0
    try:
        return int(parse_quantity(raw))
    except QuantityError:
        return 0


def judge_gpu_nodes(nodes: Sequence[Mapping[str, Any]]) -> CheckResult:
    """Some node reports ``nvidia.com/gpu`` capacity (warn when none does)."""
    title = "nodes with GPUs"
    gpu_nodes = [n for n in nodes if _gpus(n, "capacity") > 0]
    fix_plugin = (
        "install the NVIDIA device plugin (or GPU Operator) on the GPU nodes; kubectl describe "
        "node NAME must list nvidia.com/gpu under Capacity"
    )
    if not gpu_nodes:
        return CheckResult(
            "gpu-nodes", title, Status.WARN,
            f"none of {len(nodes)} nodes has {GPU_RESOURCE} capacity: GPU pods will wait",
            fix_plugin,
        )  # fmt: skip
    ready = [n for n in gpu_nodes if _condition(n, "Ready").get("status") == "True"]
    allocatable = sum(_gpus(n, "allocatable") for n in ready)
    if not ready:
        return CheckResult(
            "gpu-nodes", title, Status.WARN,
            f"{len(gpu_nodes)} nodes have {GPU_RESOURCE} but none is Ready",
            "kubectl describe node on them (kubelet down, network, pressure)",
        )  # fmt: skip
    return CheckResult(
        "gpu-nodes", title, Status.OK,
        f"{len(gpu_nodes)} nodes with {GPU_RESOURCE} ({len(ready)} Ready, {allocatable} GPUs "
        "allocatable)",
    )  # fmt: skip


def stuck_pods(
    pods: Sequence[Mapping[str, Any]], names: Sequence[str], now: float, minutes: float
) -> list[Mapping[str, Any]]:
    """Pods of our scheduler names, unbound, Pending for more than ``minutes``; oldest first."""
    out = []
    for p in pods:
        spec, meta = p.get("spec") or {}, p.get("metadata") or {}
        if spec.get("schedulerName") not in names or spec.get("nodeName"):
            continue
        if meta.get("deletionTimestamp") or (p.get("status") or {}).get("phase") != "Pending":
            continue
        created = parse_time(meta.get("creationTimestamp"))
        if created is not None and now - created > minutes * 60:
            out.append(p)
    return sorted(out, key=lambda p: (parse_time(p["metadata"].get("creationTimestamp")), _key(p)))


def _event_time(event: Mapping[str, Any]) -> float:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        t = parse_time(event.get(key))
        if t is not None:
            return t
    return parse_time((event.get("metadata") or {}).get("creationTimestamp")) or 0.0


def _why_pending(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> str:
    gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []]
    if gates:
        return f"scheduling gates {', '.join(str(g) for g in gates)} are not removed"
    cond = _condition(pod, "PodScheduled")
    if cond.get("status") == "False" and (cond.get("message") or cond.get("reason")):
        return f"{cond.get('reason') or 'Unschedulable'}: {cond.get('message') or ''}".strip()
    if events:
        latest = max(events, key=_event_time)
        return f"{latest.get('reason') or 'Event'}: {latest.get('message') or ''}".strip()
    return "no PodScheduled condition and no Event: the scheduler has not looked at it"


def judge_pending_pods(
    stuck: Sequence[Mapping[str, Any]],
    events: Mapping[str, Sequence[Mapping[str, Any]]],
    names: Sequence[str],
    now: float,
    minutes: float,
) -> CheckResult:
    """Pods from :func:`stuck_pods`, each with why (its PodScheduled message, else its latest
    Event; ``events`` maps pod uid to its Events)."""
    title = f"pods pending > {minutes:g} min"
    served = ", ".join(names)
    if not stuck:
        return CheckResult(
            "pending-pods", title, Status.OK,
            f"no pod with schedulerName {served} has waited longer than {minutes:g} min",
        )  # fmt: skip
    lines = []
    for p in stuck[:_SHOWN]:
        uid = str((p.get("metadata") or {}).get("uid") or "")
        age = (now - (parse_time(p["metadata"].get("creationTimestamp")) or now)) / 60
        lines.append(f"{_key(p)} ({age:.0f} min): {_why_pending(p, events.get(uid, ()))}")
    if len(stuck) > _SHOWN:
        lines.append(f"... and {len(stuck) - _SHOWN} more")
    return CheckResult(
        "pending-pods", title, Status.WARN,
        f"{len(stuck)} pod(s) with schedulerName {served} pending > {minutes:g} min; "
        f"oldest {lines[0]}",
        "act on each reason below (queue quota/limit, free GPUs, node selectors); "
        "kubectl describe pod NAME -n NAMESPACE shows the Events",
        tuple(lines),
    )  # fmt: skip


def _crd_ok(crd: Mapping[str, Any], version: str) -> bool:
    served = {
        v.get("name") for v in (crd.get("spec") or {}).get("versions") or [] if v.get("served")
    }
    return version in served and _condition(crd, "Established").get("status") == "True"


def judge_volcano(
    crds: Mapping[str, Mapping[str, Any] | None], names: Sequence[str]
) -> CheckResult:
    """Volcano's PodGroup and Queue CRDs, when installed, are Established at v1beta1."""
    title = "Volcano CRDs (optional)"
    present = {n: c for n, c in crds.items() if n in VOLCANO_CRDS and c is not None}
    if not present:
        return CheckResult(
            "volcano", title, Status.OK, "not installed (optional: Volcano PodGroups and "
            "Queues are read when their CRDs exist)",
        )  # fmt: skip
    absent = [n for n in VOLCANO_CRDS if n not in present]
    if absent:
        return CheckResult(
            "volcano", title, Status.WARN,
            f"only part of Volcano's CRDs: {', '.join(absent)} missing",
            "install both Volcano CRDs (podgroups and queues.scheduling.volcano.sh) from the "
            "Volcano release you run",
        )  # fmt: skip
    broken = [n for n, c in present.items() if not _crd_ok(c, "v1beta1")]
    if broken:
        return CheckResult(
            "volcano", title, Status.WARN,
            f"{', '.join(broken)} not Established at v1beta1: Volcano gangs are not read",
            "install Volcano's v1beta1 CRDs (kubectl get crd NAME -o yaml shows the versions)",
        )  # fmt: skip
    note = "" if "volcano" in names else (
        "; pods with schedulerName volcano go to another scheduler (add "
        "--scheduler-name=volcano to serve them)"
    )  # fmt: skip
    return CheckResult(
        "volcano",
        title,
        Status.OK,
        f"Volcano PodGroup and Queue v1beta1 Established; the scheduler reads them{note}",
    )


def lws_provider(config_maps: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(ConfigMap name, gang scheduler provider or "") of the first LWS manager Configuration
    (``config.lws.x-k8s.io``) found in ``config_maps``' data; None when there is none."""
    import yaml

    for cm in sorted(config_maps, key=_name):
        for text in (cm.get("data") or {}).values():
            try:
                doc = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            if not isinstance(doc, Mapping) or doc.get("kind") != "Configuration":
                continue
            if not str(doc.get("apiVersion", "")).startswith("config.lws.x-k8s.io/"):
                continue
            gang = doc.get("gangSchedulingManagement") or {}
            provider = gang.get("schedulerProvider") if isinstance(gang, Mapping) else ""
            return _name(cm), str(provider or "")
    return None


def judge_lws(
    lws_crd: Mapping[str, Any] | None,
    provider: tuple[str, str] | None,
    *,
    lws_namespace: str,
    volcano_podgroups: bool,
    podgrouper_ready: bool,
) -> CheckResult:
    """How LeaderWorkerSet groups become gangs, when LWS is installed: LWS's own Volcano
    provider (needs the Volcano PodGroup CRD) or our pod grouper."""
    title = "LeaderWorkerSet gangs (optional)"
    if lws_crd is None:
        return CheckResult("lws", title, Status.OK, "LeaderWorkerSet is not installed (optional)")
    enable = (
        "run the pod grouper (helm: --set podgrouper.enabled=true) or set "
        "gangSchedulingManagement.schedulerProvider: volcano in the LWS config"
    )
    where = f"ConfigMap {lws_namespace}/{provider[0]}" if provider else ""
    if provider and provider[1] == "volcano":
        if volcano_podgroups:
            return CheckResult(
                "lws", title, Status.OK,
                f"LWS makes a Volcano PodGroup per group (schedulerProvider: volcano in "
                f"{where}); the scheduler reads them",
            )  # fmt: skip
        return CheckResult(
            "lws", title, Status.WARN,
            f"LWS's gang provider is volcano ({where}) but the Volcano PodGroup CRD is "
            "missing: LWS cannot create the groups",
            "install Volcano's CRDs, or drop schedulerProvider and run the pod grouper",
        )  # fmt: skip
    if provider and provider[1]:
        return CheckResult(
            "lws", title, Status.WARN,
            f"LWS's gang provider is {provider[1]} ({where}): the scheduler does not read its "
            "gang objects",
            enable,
        )  # fmt: skip
    if podgrouper_ready:
        told = f"no gang provider in {where}" if provider else "LWS config not found"
        return CheckResult(
            "lws", title, Status.OK,
            f"{told}; the pod grouper makes one PodGroup per LWS group",
        )  # fmt: skip
    told = (
        f"no gang provider in {where}"
        if provider
        else f"no LWS Configuration in the ConfigMaps of {lws_namespace}"
    )
    return CheckResult(
        "lws", title, Status.WARN,
        f"{told} and no pod grouper running: each LWS pod is scheduled alone, not as a gang",
        enable + (" (or pass --lws-namespace)" if not provider else ""),
    )  # fmt: skip
