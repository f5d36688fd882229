"""The schedulers the end-to-end bench runs, each as its own processes with its own identity.

- ``ours``: ``python -m scheduler run`` with the shipped config (manifests/30-configmap.yaml)
  and the shipped ServiceAccount + ClusterRole (manifests/), as the e2e tests run it.
- ``kube-scheduler``: the pinned upstream kube-scheduler as user ``system:kube-scheduler`` (the
  bootstrap RBAC policy's scheduler identity, which API Priority and Fairness also classifies
  as a scheduler), one profile serving ``bench-kube-scheduler``. Twice: with its default client
  rate limit (QPS 50, burst 100) and unthrottled.
- ``kai``: NVIDIA KAI-Scheduler's scheduler, binder and podgrouper, each with its own
  ServiceAccount bound to the ClusterRole KAI ships for it, default scheduler configuration,
  the same default queues as ours. Twice as well: its default client limits (QPS 50, burst
  300 per process) and unthrottled.

A :class:`Contender` is what the bench needs to run one of them: the processes to start, the
``schedulerName`` its pods carry, whether it understands PodGroups, and the user names its
API requests appear under in the audit log.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testenv import ControlPlane, process

__all__ = [
    "KAI_NAMESPACE",
    "KUBE_SCHEDULER_USER",
    "OURS_NAMESPACE",
    "Command",
    "Contender",
    "apply_objects",
    "kai",
    "kube_scheduler",
    "ours",
    "scheduler_revision",
]

REPO = Path(__file__).resolve().parents[2]
OURS_NAMESPACE = "kai-scheduler"
KAI_NAMESPACE = "kai-reference"
KUBE_SCHEDULER_USER = "system:kube-scheduler"
#: Client limits meaning "no client-side throttling" for the Go clients (client-go treats a
#: token bucket this large as never empty at these request rates).
UNTHROTTLED_QPS = 100000


@dataclass(frozen=True)
class Command:
    """One process of a contender."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Contender:
    """A scheduler under test, prepared on one control plane and ready to start."""

    #: Short name used in the output (``ours``, ``kube-scheduler-unthrottled``, ...).
    key: str
    #: ``spec.schedulerName`` of the pods it is given.
    scheduler_name: str
    #: Whether gangs are created as PodGroups for it (kube-scheduler has no gang concept).
    gangs: bool
    #: Users whose requests (in the audit log) are this contender's.
    users: tuple[str, ...]
    commands: tuple[Command, ...]
    #: Anything the reader of the results should know about how it was run.
    notes: tuple[str, ...] = ()

    def spawn(self, log_dir: Path) -> list[process.Component]:
        """Start every process (own process group, output to ``log_dir/<name>.log``)."""
        started = []
        for cmd in self.commands:
            env = {**os.environ, "PYTHONUNBUFFERED": "1", **cmd.env}
            if "KUBECONFIG" not in cmd.env:
                env.pop("KUBECONFIG", None)
            comp = process.Component(cmd.name, cmd.argv, log_dir / f"{cmd.name}.log", env)
            comp.start()
            started.append(comp)
        return started


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def apply_objects(cp: ControlPlane, objs: Sequence[Mapping[str, Any]], *extra: str) -> None:
    """``kubectl apply`` the objects as one List (``extra``: more kubectl flags)."""
    doc = {"apiVersion": "v1", "kind": "List", "items": [dict(o) for o in objs]}
    cp.kubectl("apply", *extra, "-f", "-", input=json.dumps(doc), timeout=120)


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# ------------------------------------------------------------------------------------- ours


def scheduler_revision() -> str | None:
    """The commit of the scheduler under test, ``+dirty`` when scheduler/ (benchmarks aside)
    has local changes: ours runs from the working tree, which may differ from any commit."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "scheduler", ":(exclude)scheduler/bench"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def ours(
    cp: ControlPlane, work: Path, config_overrides: Mapping[str, Any], log_level: str
) -> Contender:
    """Our scheduler with the shipped ServiceAccount, RBAC and config (plus overrides)."""
    for manifest in ("00-namespace.yaml", "10-serviceaccount.yaml", "20-rbac.yaml"):
        cp.kubectl("apply", "-f", str(REPO / "manifests" / manifest))
    token = cp.service_account_token(OURS_NAMESPACE, "kai-scheduler")
    kubeconfig = cp.kubeconfig_for_token(token, "bench-ours")
    shipped = _yaml_docs(REPO / "manifests" / "30-configmap.yaml")[0]["data"]["config.yaml"]
    # Only the scheduler runs here, no pod grouper: a pod that names no PodGroup is a gang
    # of one (as kube-scheduler sees it), instead of waiting for a grouper that never comes.
    config = {**yaml.safe_load(shipped), "podGrouper": False, **config_overrides}
    config_path = work / "ours-config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    argv = [
        sys.executable, "-m", "scheduler", "run",
        f"--kube-config={kubeconfig}",
        f"--config={config_path}",
        f"--metrics-address=127.0.0.1:{free_port()}",
        "--log-format=json",
        f"--log-level={log_level}",
    ]  # fmt: skip
    return Contender(
        key="ours",
        scheduler_name="kai-scheduler",
        gangs=True,
        users=(f"system:serviceaccount:{OURS_NAMESPACE}:kai-scheduler",),
        commands=(Command("ours", argv, {}),),
        notes=(
            f"revision {scheduler_revision()} (at start)",
            f"config: {json.dumps(config, sort_keys=True)}",
        ),
    )


# --------------------------------------------------------------------------- kube-scheduler


def kube_scheduler(cp: ControlPlane, work: Path, binary: Path, *, unthrottled: bool) -> Contender:
    """Upstream kube-scheduler with one profile; client QPS 50/burst 100 or unthrottled."""
    key = "kube-scheduler-unthrottled" if unthrottled else "kube-scheduler"
    qps, burst = (UNTHROTTLED_QPS, UNTHROTTLED_QPS) if unthrottled else (50, 100)
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        # With --config, kube-scheduler ignores --kube-api-qps/--kube-api-burst: set them here.
        "clientConnection": {
            "kubeconfig": str(cp.kubeconfig_for_user(KUBE_SCHEDULER_USER)),
            "qps": qps,
            "burst": burst,
        },
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": "bench-kube-scheduler"}],
    }
    config_path = work / f"{key}.json"
    config_path.write_text(json.dumps(config, indent=2))
    argv = [
        str(binary),
        f"--config={config_path}",
        "--bind-address=127.0.0.1",
        f"--secure-port={free_port()}",
    ]
    return Contender(
        key=key,
        scheduler_name="bench-kube-scheduler",
        gangs=False,
        users=(KUBE_SCHEDULER_USER,),
        commands=(Command(key, argv, {}),),
        notes=(f"client qps {qps} burst {burst}",),
    )


# -------------------------------------------------------------------------------------- KAI

_KAI_COMPONENTS = ("scheduler", "binder", "podgrouper")


def prepare_kai(cp: ControlPlane, kai_dir: Path) -> dict[str, Path]:
    """Install KAI's CRDs (server-side, taking over the Queue/PodGroup CRDs from ours), a
    ServiceAccount per component bound to KAI's ClusterRole for it (renamed ``kai-reference-*``
    so ours keeps its own ``kai-scheduler`` ClusterRole), and the namespaces its binder uses.
    Returns each component's kubeconfig."""
    cp.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(kai_dir / "crds"), timeout=120
    )
    cp.kubectl(
        "wait", "--for", "condition=Established", "--timeout=60s",
        "crd/bindrequests.scheduling.run.ai", "crd/podgroups.scheduling.run.ai",
        "crd/queues.scheduling.run.ai", "crd/topologies.kai.scheduler",
        timeout=90,
    )  # fmt: skip
    objs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        for ns in (KAI_NAMESPACE, "kai-resource-reservation", "kai-scale-adjust")
    ]
    for comp in _KAI_COMPONENTS:
        objs.append(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": comp, "namespace": KAI_NAMESPACE},
            }
        )
        for role in _yaml_docs(kai_dir / "rbac" / f"{comp}.yaml"):
            name = f"kai-reference-{role['metadata']['name']}"
            objs.append({**role, "metadata": {"name": name}})
            objs.append(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": name},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": name,
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": comp, "namespace": KAI_NAMESPACE}
                    ],
                }
            )
    apply_objects(cp, objs)
    return {
        comp: cp.kubeconfig_for_token(
            cp.service_account_token(KAI_NAMESPACE, comp), f"bench-kai-{comp}"
        )
        for comp in _KAI_COMPONENTS
    }


def kai(kai_dir: Path, kubeconfigs: Mapping[str, Path], *, unthrottled: bool) -> Contender:
    """KAI-Scheduler's scheduler, binder and podgrouper serving ``kai-reference``."""
    key = "kai-unthrottled" if unthrottled else "kai"
    name = "kai-reference"
    limits = (
        [f"--qps={UNTHROTTLED_QPS}", f"--burst={UNTHROTTLED_QPS}"] if unthrottled else []
    )  # the defaults otherwise: QPS 50, burst 300 for each component
    scheduler = [
        str(kai_dir / "scheduler"),
        f"--scheduler-name={name}",
        f"--listen-address=127.0.0.1:{free_port()}",
        f"--plugin-server-port={free_port()}",
        *limits,
    ]
    binder = [
        str(kai_dir / "binder"),
        f"--scheduler-name={name}",
        f"--metrics-bind-address=127.0.0.1:{free_port()}",
        f"--health-probe-bind-address=127.0.0.1:{free_port()}",
        *limits,
    ]
    podgrouper = [
        str(kai_dir / "podgrouper"),
        f"--scheduler-name={name}",
        f"--metrics-bind-address=127.0.0.1:{free_port()}",
        f"--health-probe-bind-address=127.0.0.1:{free_port()}",
        *limits,
    ]
    argvs = {"scheduler": scheduler, "binder": binder, "podgrouper": podgrouper}
    commands = tuple(
        Command(f"{key}-{comp}", argvs[comp], {"KUBECONFIG": str(kubeconfigs[comp])})
        for comp in _KAI_COMPONENTS
    )
    return Contender(
        key=key,
        scheduler_name=name,
        gangs=True,
        users=tuple(f"system:serviceaccount:{KAI_NAMESPACE}:{c}" for c in _KAI_COMPONENTS),
        commands=commands,
        notes=(
            "scheduler + binder + podgrouper; default scheduler configuration; "
            + ("client qps/burst unthrottled" if unthrottled else "client qps 50 burst 300 each"),
        ),
    )
