"""Cluster set-up for chaos runs: install the scheduler's CRDs and RBAC, point a kubeconfig at
the relay, and wait until the API server calls the bind webhook."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from testenv import ControlPlane
from testenv.chaos import WEBHOOK_PROBE_PREFIX
from tests.chaos.api import ApiError, KubeApi

__all__ = ["install_kai", "relay_kubeconfig", "wait_webhook_live"]

REPO = Path(__file__).resolve().parents[2]


def install_kai(cp: ControlPlane) -> Path:
    """CRDs, the scheduler's namespace, ServiceAccount and RBAC, default queues (as the e2e
    ``kai_cluster`` fixture does); returns a kubeconfig with the ServiceAccount's token."""
    cp.kubectl("apply", "-f", str(REPO / "crds"))
    cp.kubectl(
        "wait", "--for", "condition=Established", "--timeout=60s",
        "crd/queues.scheduling.run.ai", "crd/podgroups.scheduling.run.ai",
    )  # fmt: skip
    for manifest in ("00-namespace.yaml", "10-serviceaccount.yaml", "20-rbac.yaml"):
        cp.kubectl("apply", "-f", str(REPO / "manifests" / manifest))
    cp.kubectl("apply", "-f", str(REPO / "manifests" / "defaults"))
    token = cp.service_account_token("kai-scheduler", "kai-scheduler")
    return cp.kubeconfig_for_token(token, "kai-scheduler-chaos")


def relay_kubeconfig(source: Path, server: str, dest: Path) -> Path:
    """A copy of the kubeconfig ``source`` whose every cluster points at ``server``."""
    config = json.loads(source.read_text())  # testenv writes kubeconfigs as JSON
    for cluster in config.get("clusters") or []:
        cluster["cluster"]["server"] = server
    dest.write_text(json.dumps(config, indent=2))
    dest.chmod(0o600)
    return dest


async def wait_webhook_live(api: KubeApi, namespace: str) -> dict[str, Any]:
    """Bind probe pods until the webhook denies one: from then on the API server calls it."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    made: list[str] = []
    try:
        for attempt in range(150):
            name = f"{WEBHOOK_PROBE_PREFIX}-{attempt}"
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "schedulerName": "chaos-probe",  # no scheduler touches it
                    "containers": [{"name": "c", "image": "registry.invalid/none:1"}],
                },
            }
            await api.request("POST", pods, body=body)
            made.append(name)
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "chaos-probe-nowhere"},
            }
            try:
                await api.request("POST", f"{pods}/{name}/binding", body=binding)
            except ApiError as e:
                if "chaos webhook probe" in e.body:
                    return {"attempts": attempt + 1, "denial_status": e.status}
                raise
            await asyncio.sleep(0.2)
        raise AssertionError("the API server never called the bind webhook")
    finally:
        for name in made:
            # Grace 0: a pod bound to a node nobody runs would otherwise never go away.
            with contextlib.suppress(ApiError):
                await api.request("DELETE", f"{pods}/{name}", body={"gracePeriodSeconds": 0})
