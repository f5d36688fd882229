"""Verdicts on the scheduler's own install: Deployment and pods, leader Lease, cycle age, CRDs,
default queues, PriorityClasses. Pure functions of API objects (JSON dicts) and the time, so
every verdict is unit-tested without a cluster; :mod:`.checks` fetches the objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from scheduler.cluster.queue import Queue, QueueTree
from scheduler.cluster.queuespec import SpecError, queue_from_k8s
from scheduler.doctor.install import Install, parse_time
from scheduler.doctor.result import CheckResult, Status
from scheduler.fairness.findings import queue_problem

__all__ = [
    "EXPECTED_CRDS",
    "EXPECTED_PRIORITY_CLASSES",
    "LAST_CYCLE_METRIC",
    "judge_crds",
    "judge_cycle_from_lease",
    "judge_cycle_from_metrics",
    "judge_deployment",
    "judge_leader",
    "judge_priority_classes",
    "judge_queues",
    "pod_problem",
]

#: CRD name -> the version the scheduler reads.
EXPECTED_CRDS: Mapping[str, str] = {
    "queues.scheduling.run.ai": "v2",
    "podgroups.scheduling.run.ai": "v2alpha2",
}
#: The PriorityClasses the chart ships (name -> value); below 100 is preemptible.
EXPECTED_PRIORITY_CLASSES: Mapping[str, int] = {
    "train": 50,
    "build-preemptible": 75,
    "build": 100,
    "inference": 125,
}
#: Gauge the scheduler sets at the end of every cycle (scheduler/metrics.py).
LAST_CYCLE_METRIC = "kai_last_cycle_timestamp_seconds"


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def pod_problem(pod: Mapping[str, Any]) -> str:
    """Why a pod is not Running and Ready ("" when it is)."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            detail = f": {waiting['message']}" if waiting.get("message") else ""
            return f"container {cs.get('name')} is waiting ({waiting['reason']}{detail})"
    if phase == "Pending" and not (pod.get("spec") or {}).get("nodeName"):
        scheduled = _condition(pod, "PodScheduled")
        why = scheduled.get("message") or scheduled.get("reason") or "no node chosen yet"
        return f"not placed on a node ({why})"
    if phase != "Running":
        return f"phase {phase}"
    if _condition(pod, "Ready").get("status") != "True":
        return "Running but not Ready (/readyz fails: the cache has not synced or the API is down)"
    return ""


def judge_deployment(install: Install, pods: Sequence[Mapping[str, Any]]) -> CheckResult:
    """The scheduler's Deployment exists, is not scaled to 0, and its pods are Running+Ready."""
    ns, name = install.namespace, install.name
    title = "scheduler Deployment and pods"
    if install.deployment is None:
        return CheckResult(
            "deployment", title, Status.FAIL,
            f"no scheduler Deployment in namespace {ns} (labels app.kubernetes.io/name="
            "kai-scheduler, app.kubernetes.io/component=scheduler)",
            f"install it: helm install kai-scheduler manifests/chart -n {ns} --create-namespace"
            " (or pass --namespace where it is installed)",
        )  # fmt: skip
    where = f"Deployment {ns}/{name}"
    if install.config_error:
        return CheckResult(
            "deployment", title, Status.FAIL, f"{where}: {install.config_error}",
            f"fix config.yaml in ConfigMap {ns}/{install.config_map or '?'} (the scheduler exits "
            "with code 2 on a bad config): kubectl edit configmap -n " + ns,
        )  # fmt: skip
    if install.replicas == 0:
        return CheckResult(
            "deployment", title, Status.FAIL,
            f"{where} is scaled to 0 replicas: nothing schedules pods",
            f"kubectl scale deployment/{name} -n {ns} --replicas=1 (helm: --set replicas=1)",
        )  # fmt: skip
    if install.replicas > 1 and not install.leader_elect:
        return CheckResult(
            "deployment", title, Status.FAIL,
            f"{where} runs {install.replicas} replicas with --leader-elect=false: "
            "several schedulers would bind at once",
            "turn leader election on (helm: --set leaderElection.enabled=auto) or scale to 1",
        )  # fmt: skip
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    problems = [(_name(p), pod_problem(p)) for p in sorted(live, key=_name)]
    ready = [n for n, why in problems if not why]
    details = tuple(f"pod {n}: {why or 'Running and Ready'}" for n, why in problems)
    extra = "" if install.found <= 1 else f" ({install.found} Deployments match; using {name})"
    if len(ready) >= install.replicas:
        return CheckResult(
            "deployment", title, Status.OK,
            f"{where}: {len(ready)}/{install.replicas} pods Running and Ready{extra}",
            details=details,
        )  # fmt: skip
    first = next(((n, why) for n, why in problems if why), None)
    found = f"pod {first[0]} {first[1]}" if first else "no pod exists yet"
    fix = (
        f"kubectl describe pod {first[0]} -n {ns}; kubectl logs {first[0]} -n {ns}"
        if first
        else f"kubectl describe deployment/{name} -n {ns} (look at the ReplicaSet's events)"
    )
    status = Status.WARN if ready else Status.FAIL
    return CheckResult(
        "deployment", title, status,
        f"{where}: {len(ready)}/{install.replicas} pods Running and Ready; {found}{extra}",
        fix, details,
    )  # fmt: skip


def _lease_times(lease: Mapping[str, Any]) -> tuple[str, float | None, float]:
    spec = lease.get("spec") or {}
    holder = str(spec.get("holderIdentity") or "")
    renewed = parse_time(spec.get("renewTime"))
    duration = float(spec.get("leaseDurationSeconds") or 15)
    return holder, renewed, duration


def judge_leader(
    install: Install,
    lease: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    now: float,
) -> CheckResult:
    """A leader holds the Lease and renews it (or leader election is off with one replica)."""
    title = "leader Lease"
    lease_ns, lease_name = install.lease
    logs = f"kubectl logs deployment/{install.name} -n {install.namespace}"
    if not install.leader_elect:
        return CheckResult(
            "leader", title, Status.OK,
            "leader election is off (--leader-elect=false): the single replica schedules "
            "without a Lease",
        )  # fmt: skip
    if lease is None:
        return CheckResult(
            "leader", title, Status.FAIL,
            f"no Lease {lease_ns}/{lease_name}: no replica has become leader",
            f"{logs} (look for leader_acquired or a Forbidden on leases in {lease_ns})",
        )  # fmt: skip
    holder, renewed, duration = _lease_times(lease)
    if not holder or renewed is None:
        return CheckResult(
            "leader", title, Status.FAIL,
            f"Lease {lease_ns}/{lease_name} has no holder: no replica leads",
            f"{logs} (look for leader_acquired)",
        )  # fmt: skip
    age = max(0.0, now - renewed)
    if age > duration:
        return CheckResult(
            "leader", title, Status.FAIL,
            f"leader {holder} last renewed Lease {lease_ns}/{lease_name} {age:.0f}s ago "
            f"(it lasts {duration:.0f}s): it stopped renewing",
            f"{logs}; another replica takes over once the Lease expires",
        )  # fmt: skip
    pod_names = {_name(p) for p in pods}
    pod = holder.rsplit("_", 1)[0]
    if pod not in pod_names:
        return CheckResult(
            "leader", title, Status.WARN,
            f"Lease {lease_ns}/{lease_name} is held by {holder}, which is not a pod of "
            f"Deployment {install.namespace}/{install.name} (renewed {age:.0f}s ago)",
            "another scheduler uses the same Lease: stop it or give it its own "
            "leaderElection.leaseName",
        )  # fmt: skip
    return CheckResult(
        "leader", title, Status.OK,
        f"{holder} (pod {pod}) holds Lease {lease_ns}/{lease_name}, renewed {age:.1f}s ago",
    )  # fmt: skip


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels:
                out[sample.name] = float(sample.value)
    return out


def judge_cycle_from_metrics(text: str, now: float, cycle_period: float, where: str) -> CheckResult:
    """The age of the last cycle from the scheduler's ``/metrics`` text (read at ``where``)."""
    title = "last scheduling cycle"
    try:
        samples = _samples(text)
    except (ValueError, TypeError, IndexError) as e:
        return CheckResult(
            "cycle", title, Status.WARN, f"{where} is not Prometheus text ({e})",
            "point --metrics-url at the scheduler's /metrics (port 8080)", source="metrics",
        )  # fmt: skip
    stale = max(30.0, 10 * cycle_period)
    last = samples.get(LAST_CYCLE_METRIC)
    cycles = samples.get("kai_cycles_total")
    if last is None and cycles is None:
        return CheckResult(
            "cycle", title, Status.WARN, f"{where} has no kai_* cycle metrics",
            "point --metrics-url at the KAI scheduler's /metrics", source="metrics",
        )  # fmt: skip
    if not last:
        leading = samples.get("kai_leader", 1.0)
        why = "this replica is not the leader" if leading == 0 else "no cycle has run yet"
        status = Status.WARN if leading == 0 or (cycles or 0) > 0 else Status.FAIL
        return CheckResult(
            "cycle", title, status, f"{why} ({where}: kai_cycles_total {cycles or 0:.0f})",
            "scrape the leader's /metrics, or read the logs for cache_synced / cycle_failed",
            source="metrics",
        )  # fmt: skip
    age = max(0.0, now - last)
    if age > stale:
        return CheckResult(
            "cycle", title, Status.FAIL,
            f"last cycle finished {age:.0f}s ago (cycles run every {cycle_period:g}s; "
            f"from {where})",
            "the cycle loop is stuck or the replica lost leadership: read its logs "
            "(cycle_failed, leader_lost) and restart the pod",
            source="metrics",
        )  # fmt: skip
    return CheckResult(
        "cycle", title, Status.OK,
        f"last cycle finished {age:.1f}s ago, {cycles or 0:.0f} cycles so far (from {where})",
        source="metrics",
    )  # fmt: skip


def judge_cycle_from_lease(
    install: Install, lease: Mapping[str, Any] | None, now: float, metrics_error: str
) -> CheckResult:
    """When ``/metrics`` cannot be reached: a leader renewing its Lease is alive and cycling."""
    title = "last scheduling cycle"
    port_forward = (
        f"kubectl port-forward -n {install.namespace} deployment/{install.name} "
        f"{install.metrics_port}, then doctor --metrics-url "
        f"http://127.0.0.1:{install.metrics_port}/metrics"
    )
    unreachable = f"/metrics not reachable ({metrics_error})"
    if not install.leader_elect or lease is None:
        why = "leader election is off" if not install.leader_elect else "there is no Lease"
        return CheckResult(
            "cycle", title, Status.WARN, f"cycle age unknown: {unreachable} and {why}",
            port_forward, source="none",
        )  # fmt: skip
    holder, renewed, duration = _lease_times(lease)
    if renewed is None or now - renewed > duration:
        return CheckResult(
            "cycle", title, Status.FAIL,
            f"no sign of cycles: {unreachable} and the Lease is not being renewed",
            f"kubectl logs deployment/{install.name} -n {install.namespace}", source="lease",
        )  # fmt: skip
    return CheckResult(
        "cycle", title, Status.OK,
        f"leader {holder} renewed the Lease {max(0.0, now - renewed):.1f}s ago; the exact "
        f"cycle age needs /metrics ({metrics_error})",
        details=(f"for the cycle age: {port_forward}",),
        source="lease",
    )  # fmt: skip


def judge_crds(crds: Mapping[str, Mapping[str, Any] | None]) -> CheckResult:
    """Every :data:`EXPECTED_CRDS` entry is installed, Established and serves its version."""
    title = "CRDs (Queue, PodGroup)"
    bad: list[str] = []
    fine: list[str] = []
    for name, version in EXPECTED_CRDS.items():
        crd = crds.get(name)
        if crd is None:
            bad.append(f"{name} is not installed")
            continue
        served = [
            str(v.get("name"))
            for v in (crd.get("spec") or {}).get("versions") or []
            if v.get("served")
        ]
        if version not in served:
            bad.append(f"{name} does not serve {version} (serves {', '.join(served) or 'none'})")
        elif _condition(crd, "Established").get("status") != "True":
            why = _condition(crd, "Established").get("message") or "no Established condition"
            bad.append(f"{name} is not Established ({why})")
        else:
            fine.append(f"{name} {version}")
    if bad:
        return CheckResult(
            "crds", title, Status.FAIL, "; ".join(bad),
            "kubectl apply -f crds/ (Helm installs CRDs only on the first install), then "
            "kubectl wait --for condition=Established crd --all",
        )  # fmt: skip
    return CheckResult("crds", title, Status.OK, "Established: " + ", ".join(fine))


def judge_queues(queues: Sequence[Mapping[str, Any]] | None, default_queue: str) -> CheckResult:
    """The default queue exists and can take jobs, and the queue tree has no findings.

    ``queues`` is None when the Queue kind is not served (its CRD is missing).
    """
    title = "default queues and queue tree"
    create = (
        "kubectl apply -f manifests/defaults/ (helm: upgrade with defaultQueues.enabled=true)"
        if default_queue == "default-queue"
        else f"create the leaf Queue {default_queue} (the config's defaultQueue)"
    )
    if queues is None:
        return CheckResult(
            "queues", title, Status.FAIL,
            "cannot list queues: the Queue CRD (scheduling.run.ai/v2) is not served",
            "kubectl apply -f crds/, then " + create,
        )  # fmt: skip
    parsed: list[Queue] = []
    errors: dict[str, str] = {}
    for obj in queues:
        try:
            parsed.append(queue_from_k8s(obj))
        except SpecError as e:
            errors[_name(obj)] = str(e)
    tree = QueueTree.build(parsed)
    findings = [f"queue {n}: {msg}" for n, msg in sorted(errors.items())]
    findings += [f"queue {f.queue}: {f.field}: {f.message}" for f in tree.findings]
    if default_queue in errors:
        problem = f"default queue {default_queue} is invalid ({errors[default_queue]})"
        fix = f"fix Queue {default_queue}: kubectl edit queue {default_queue}"
    else:
        found = queue_problem(tree, default_queue)
        problem = f"default {found[1]}" if found else ""
        fix = (create if found and found[0] == "QueueMissing" else
               f"fix the queue named above: kubectl edit queue {default_queue}")  # fmt: skip
    if problem:
        return CheckResult(
            "queues", title, Status.FAIL, problem, fix, tuple(findings),
        )  # fmt: skip
    if findings:
        return CheckResult(
            "queues", title, Status.FAIL,
            f"{len(findings)} queue finding(s): jobs in those queues are never scheduled; "
            f"first: {findings[0]}",
            "fix each queue listed (kubectl edit queue NAME): parents must exist, no cycles",
            tuple(findings),
        )  # fmt: skip
    chain = " <- ".join(tree.ancestors(default_queue))
    return CheckResult(
        "queues",
        title,
        Status.OK,
        f"default queue {chain}; {len(tree.queues)} queues, no findings",
    )


def judge_priority_classes(classes: Sequence[Mapping[str, Any]]) -> CheckResult:
    """KAI's PriorityClasses exist with their values."""
    title = "PriorityClasses"
    values = {_name(c): c.get("value") for c in classes}
    missing = [n for n in EXPECTED_PRIORITY_CLASSES if n not in values]
    if missing:
        return CheckResult(
            "priorityclasses", title, Status.FAIL,
            f"missing: {', '.join(missing)} (pod groups name them; the pod grouper defaults "
            "to train and inference)",
            "kubectl apply -f manifests/60-priorityclasses.yaml (helm: "
            "--set priorityClasses.enabled=true)",
        )  # fmt: skip
    changed = [
        f"{n}={values[n]} (expected {v})"
        for n, v in EXPECTED_PRIORITY_CLASSES.items()
        if values[n] != v
    ]
    if changed:
        return CheckResult(
            "priorityclasses", title, Status.WARN,
            f"different values: {', '.join(changed)}; below 100 means preemptible",
            "restore the values from manifests/60-priorityclasses.yaml unless the change is "
            "deliberate",
        )  # fmt: skip
    listed = ", ".join(f"{n}={v}" for n, v in EXPECTED_PRIORITY_CLASSES.items())
    return CheckResult("priorityclasses", title, Status.OK, listed)
