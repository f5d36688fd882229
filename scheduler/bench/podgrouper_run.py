"""One ``podgrouper-diff`` run (:mod:`scheduler.bench.podgrouper_diff`): a grouper process
(ours or KAI's, :class:`Grouper`) started, every case's workload created, and the PodGroups
its pods name recorded once nothing changes (:func:`run_cases`).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scheduler.bench import e2e_peers as peers
from scheduler.bench.diff_plane import REPO, apply_kai_crds, apply_our_crds, log
from scheduler.bench.podgrouper_cases import Case
from scheduler.bench.podgrouper_manifests import LABEL_RUN, RunNames, workload_manifest
from scheduler.bench.podgrouper_results import name_substitutions, summarize
from testenv import ControlPlane, process
from testenv.controllers import http_ok

__all__ = [
    "OURS_SCHEDULER",
    "Grouper",
    "GrouperDied",
    "kai_grouper",
    "ours_grouper",
    "run_cases",
]

POD_GROUP_ANNOTATION = "pod-group-name"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
#: ``spec.schedulerName`` of each run's pods (KAI's grouper only groups one name).
OURS_SCHEDULER = "kai-scheduler"
PODGROUPS = "podgroups.scheduling.run.ai"
VOLCANO_PODGROUPS = "podgroups.scheduling.volcano.sh"
#: The top owner's resource (for kubectl) per case kind.
_RESOURCE = {
    "job": "jobs.batch",
    "cronjob": "cronjobs.batch",
    "deployment": "deployments.apps",
    "replicaset": "replicasets.apps",
    "statefulset": "statefulsets.apps",
    "leaderworkerset": "leaderworkersets.leaderworkerset.x-k8s.io",
    "volcano": "jobs.batch.volcano.sh",
}
#: The Job ``kubectl create job --from=cronjob/...`` makes for a CronJob case.
CRONJOB_JOB = "cronjob-run"


def _log(message: str) -> None:
    log("podgrouper-diff", message)


def _kubectl_json(cp: ControlPlane, *args: str) -> dict[str, Any]:
    out = cp.kubectl(*args, "-o", "json", timeout=60).stdout
    return dict(json.loads(out)) if out.strip() else {}


class GrouperDied(RuntimeError):
    """The grouper under test exited during a run."""


@dataclass
class Grouper:
    """One grouper process ready to start: its command, the pods' schedulerName and the URL
    that answers 200 once it is up."""

    name: str
    scheduler: str
    command: peers.Command
    ready_url: str
    component: process.Component | None = None

    def start(self, log_dir: Path) -> None:
        """Start it (own process group, log in ``log_dir``)."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.command.env}
        if "KUBECONFIG" not in self.command.env:
            env.pop("KUBECONFIG", None)
        self.component = process.Component(
            self.command.name, self.command.argv, log_dir / f"{self.command.name}.log", env
        )
        self.component.start()

    @property
    def log_path(self) -> Path | None:
        """Its log file once started."""
        return self.component.log_path if self.component else None

    def check_alive(self) -> None:
        """Raise :class:`GrouperDied` when the process has exited."""
        if self.component is None or not self.component.running():
            code = self.component.exit_code() if self.component else None
            raise GrouperDied(f"{self.name} grouper exited ({code}); log {self.log_path}")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until its probe answers 200."""
        deadline = time.monotonic() + timeout
        while not http_ok(self.ready_url):
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} grouper not ready after {timeout}s")
            time.sleep(0.3)

    def stop(self) -> None:
        """Stop it (idempotent)."""
        if self.component is not None:
            self.component.stop()


def ours_grouper(cp: ControlPlane, log_level: str) -> Grouper:
    """Ours with our CRDs and the shipped ServiceAccount + ClusterRole (manifests/70)."""
    apply_our_crds(cp)
    cp.kubectl("apply", "-f", str(REPO / "manifests" / "00-namespace.yaml"))
    docs = [
        d
        for d in yaml.safe_load_all((REPO / "manifests" / "70-podgrouper.yaml").read_text())
        if d and d["kind"] != "Deployment"
    ]
    peers.apply_objects(cp, docs)
    token = cp.service_account_token("kai-scheduler", "kai-podgrouper")
    kubeconfig = cp.kubeconfig_for_token(token, f"pgdiff-ours-{uuid.uuid4().hex[:6]}")
    port = peers.free_port()
    argv = [
        sys.executable, "-m", "scheduler", "podgrouper",
        f"--kube-config={kubeconfig}",
        f"--scheduler-name={OURS_SCHEDULER}",
        f"--metrics-address=127.0.0.1:{port}",
        "--log-format=json",
        f"--log-level={log_level}",
    ]  # fmt: skip
    # The grouper under test is this tree's, whatever the caller's working directory.
    command = peers.Command("ours-podgrouper", argv, {"PYTHONPATH": str(REPO)})
    return Grouper("ours", OURS_SCHEDULER, command, f"http://127.0.0.1:{port}/readyz")


def kai_grouper(cp: ControlPlane, path: Path) -> Grouper:
    """KAI's podgrouper with KAI's CRDs and its ClusterRole (scheduler and binder not run)."""
    apply_kai_crds(cp, path)
    kubeconfigs = peers.prepare_kai(cp, path)
    contender = peers.kai(path, kubeconfigs, unthrottled=False)
    (command,) = [c for c in contender.commands if c.name.endswith("-podgrouper")]
    probe = next(a for a in command.argv if a.startswith("--health-probe-bind-address="))
    address = probe.split("=", 1)[1]
    return Grouper("kai", contender.scheduler_name, command, f"http://{address}/readyz")


def _wait_default_service_accounts(
    cp: ControlPlane, namespaces: Iterable[str], timeout: float = 60.0
) -> None:
    """Pods are refused until the service-account controller has made ``default``."""
    wanted = set(namespaces)
    deadline = time.monotonic() + timeout
    while True:
        out = cp.kubectl(
            "get", "serviceaccounts", "-A", "--field-selector=metadata.name=default",
            "-o", "jsonpath={range .items[*]}{.metadata.namespace}{\"\\n\"}{end}",
        ).stdout  # fmt: skip
        missing = wanted - set(out.split())
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"no default ServiceAccount after {timeout}s in {sorted(missing)}")
        time.sleep(0.3)


def _create(cp: ControlPlane, cases: Sequence[Case], names: RunNames) -> None:
    namespaces = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": names.namespace(c), "labels": {LABEL_RUN: names.rid}},
        }
        for c in cases
    ]
    peers.apply_objects(cp, namespaces)
    _wait_default_service_accounts(cp, [names.namespace(c) for c in cases])
    peers.apply_objects(cp, [workload_manifest(c, names) for c in cases])
    for c in cases:
        if c.kind == "cronjob":
            cp.kubectl(
                "create", "job", CRONJOB_JOB, f"--from=cronjob/{c.workload}",
                "-n", names.namespace(c),
            )  # fmt: skip


def _enqueue_volcano(cp: ControlPlane, namespaces: set[str]) -> None:
    """Set the run's Volcano PodGroups ``Inqueue`` (what a scheduler would decide), so that
    Volcano's job controller creates the pods."""
    items = _kubectl_json(cp, "get", VOLCANO_PODGROUPS, "-A").get("items") or []
    for pg in items:
        meta = pg["metadata"]
        phase = (pg.get("status") or {}).get("phase") or ""
        if meta["namespace"] in namespaces and phase in ("", "Pending"):
            cp.kubectl(
                "patch", VOLCANO_PODGROUPS, meta["name"], "-n", meta["namespace"],
                "--type=merge", "-p", json.dumps({"status": {"phase": "Inqueue"}}),
                check=False,
            )  # fmt: skip


def _snapshot(
    cp: ControlPlane, cases: Sequence[Case], names: RunNames
) -> dict[str, dict[str, Any]]:
    """Per case: its pods (name -> PodGroup named, or None), the PodGroups in its namespace,
    and the raw pods and workloads (for the name patterns)."""
    by_ns = {names.namespace(c): c for c in cases}
    pods = _kubectl_json(cp, "get", "pods", "-A", "-l", f"{LABEL_RUN}={names.rid}")
    groups = _kubectl_json(cp, "get", PODGROUPS, "-A")
    kinds = sorted({_RESOURCE[c.kind] for c in cases if c.kind in _RESOURCE})
    workloads = (
        _kubectl_json(cp, "get", ",".join(kinds), "-A", "-l", f"{LABEL_RUN}={names.rid}")
        if kinds
        else {}
    )
    out: dict[str, dict[str, Any]] = {
        c.name: {"pods": {}, "podgroups": {}, "raw_pods": [], "workloads": []} for c in cases
    }
    for pod in pods.get("items") or []:
        meta = pod["metadata"]
        case = by_ns.get(meta["namespace"])
        if case is None or meta.get("deletionTimestamp"):
            continue
        annotations = meta.get("annotations") or {}
        out[case.name]["pods"][meta["name"]] = annotations.get(POD_GROUP_ANNOTATION)
        out[case.name]["raw_pods"].append(pod)
        if annotations.get(VOLCANO_GROUP_ANNOTATION):
            out[case.name].setdefault("volcano_group", annotations[VOLCANO_GROUP_ANNOTATION])
    for pg in groups.get("items") or []:
        meta = pg["metadata"]
        case = by_ns.get(meta["namespace"])
        if case is None:
            continue
        spec = pg.get("spec") or {}
        owners = meta.get("ownerReferences") or [{}]
        out[case.name]["podgroups"][meta["name"]] = {
            "minMember": spec.get("minMember"),
            "queue": spec.get("queue") or "",
            "priorityClassName": spec.get("priorityClassName") or "",
            "preemptibility": spec.get("preemptibility") or "",
            "owner": owners[0].get("kind", ""),
        }
    for obj in workloads.get("items") or []:
        case = by_ns.get(obj["metadata"].get("namespace", ""))
        if case is not None:
            out[case.name]["workloads"].append(obj)
    return out


def _signature(snap: Mapping[str, Mapping[str, Any]]) -> str:
    return json.dumps(
        {c: {"pods": s["pods"], "podgroups": s["podgroups"]} for c, s in snap.items()},
        sort_keys=True,
    )


def _probe(cp: ControlPlane, grouper: Grouper, names: RunNames, timeout: float = 60.0) -> float:
    """A bare pod in a namespace of its own, until the grouper has annotated it: proof that
    the grouper is up and watching. Returns the seconds it took."""
    began = time.monotonic()
    case = Case("probe", "pod", "readiness probe")
    ns = names.namespace(case)
    peers.apply_objects(
        cp,
        [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {LABEL_RUN: names.rid}},
            }
        ],
    )
    _wait_default_service_accounts(cp, [ns])
    peers.apply_objects(cp, [workload_manifest(case, names)])
    deadline = began + timeout
    while True:
        grouper.check_alive()
        pod = _kubectl_json(cp, "get", "pod", case.workload, "-n", ns)
        if (pod.get("metadata", {}).get("annotations") or {}).get(POD_GROUP_ANNOTATION):
            return round(time.monotonic() - began, 2)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{grouper.name} grouper did not group a bare pod in {timeout}s")
        time.sleep(0.3)


def run_cases(
    cp: ControlPlane,
    grouper: Grouper,
    cases: Sequence[Case],
    log_dir: Path,
    *,
    settle: float = 3.0,
    timeout: float = 90.0,
) -> dict[str, dict[str, Any]]:
    """Start ``grouper``, create every case's workload, wait until every case has all its pods
    and nothing changed for ``settle`` seconds, stop the grouper. Per case: ``pods``,
    ``podgroups``, ``summary`` (:func:`summarize`), ``missing`` (PodGroups named but absent),
    ``unclaimed`` (PodGroups no pod names) and ``error`` (when the run did not settle)."""
    names = RunNames(f"{grouper.name[0]}{uuid.uuid4().hex[:4]}", grouper.scheduler)
    volcano_ns = {names.namespace(c) for c in cases if c.kind == "volcano"}
    began = time.monotonic()
    grouper.start(log_dir)
    error: str | None = None
    snap: dict[str, dict[str, Any]] = {}
    try:
        grouper.wait_ready()
        probe_seconds = _probe(cp, grouper, names)
        _log(f"{grouper.name}: grouper up, a bare pod grouped in {probe_seconds}s")
        _create(cp, cases, names)
        created = time.monotonic()
        last_sig, last_change = "", time.monotonic()
        while True:
            grouper.check_alive()
            if volcano_ns:
                _enqueue_volcano(cp, volcano_ns)
            snap = _snapshot(cp, cases, names)
            sig = _signature(snap)
            now = time.monotonic()
            if sig != last_sig:
                last_sig, last_change = sig, now
            short = [c.name for c in cases if len(snap[c.name]["pods"]) < c.pods]
            if not short and now - last_change >= settle:
                break
            if now - created > timeout:
                error = f"not settled after {timeout}s; cases short of pods: {short}"
                break
            time.sleep(0.5)
    except (GrouperDied, TimeoutError) as e:
        error = str(e)
    finally:
        grouper.stop()
    _log(f"{grouper.name}: {len(cases)} cases in {time.monotonic() - began:.1f}s")
    results: dict[str, dict[str, Any]] = {}
    for c in cases:
        s = snap.get(c.name) or {"pods": {}, "podgroups": {}, "raw_pods": [], "workloads": []}
        named = {pg for pg in s["pods"].values() if pg}
        subs = name_substitutions(c, s["raw_pods"], s["workloads"])
        results[c.name] = {
            "namespace": names.namespace(c),
            "scheduler_name": names.scheduler,
            "pods": s["pods"],
            "podgroups": s["podgroups"],
            "volcano_group": s.get("volcano_group"),
            "summary": summarize(s["pods"], s["podgroups"], subs) if s["pods"] else None,
            "missing": sorted(named - set(s["podgroups"])),
            "unclaimed": sorted(set(s["podgroups"]) - named),
            "error": error,
            "log": str(grouper.log_path),
        }
    return results
