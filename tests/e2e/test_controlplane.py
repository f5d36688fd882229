"""The test control plane itself: API ready fast, controllers run, kwok fakes nodes and pods,
RBAC is enforced for service-account tokens, our CRDs install, and stop() leaves nothing."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from testenv import ControlPlane
from testenv.controlplane import CommandError

pytestmark = pytest.mark.e2e

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"


def _poll(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value {last!r}")


def _pod_manifest(name: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                # No scheduler serves this name, so the pod stays unbound until we bind it.
                "schedulerName": "testenv-nobody",
                "containers": [{"name": "main", "image": "registry.invalid/fake:1"}],
            },
        }
    )


def _binding(pod: str, node: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
    )


def _pod(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    out = cp.kubectl("get", "pod", name, "-n", ns, "-o", "json").stdout
    pod: dict[str, Any] = json.loads(out)
    return pod


def _wait_running(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pod = _pod(cp, ns, name)
        return pod if pod.get("status", {}).get("phase") == "Running" else None

    result: dict[str, Any] = _poll(f"pod {ns}/{name} Running", running)
    return result


def test_api_ready_and_started_quickly(control_plane: ControlPlane) -> None:
    ready = control_plane.kubectl("get", "--raw", "/readyz")
    assert ready.stdout.strip() == "ok"
    assert control_plane.startup_seconds is not None
    assert control_plane.startup_seconds < 60, f"startup took {control_plane.startup_seconds}s"
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.")


def test_deployment_creates_pods(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.kubectl(
        "create", "deployment", "web", "--image=registry.invalid/web:1", "--replicas=3",
        "-n", namespace,
    )  # fmt: skip

    def pods() -> list[dict[str, Any]]:
        out = control_plane.kubectl("get", "pods", "-n", namespace, "-l", "app=web", "-o", "json")
        items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
        return items if len(items) == 3 else []

    items = _poll("3 pods of deployment web", pods)
    # Nothing schedules here, so they exist (controller-manager made them) but are unbound.
    assert all(not p["spec"].get("nodeName") for p in items)


def test_binding_makes_pod_running_on_kwok_node(
    control_plane: ControlPlane, namespace: str, make_gpu_nodes: Callable[..., list[str]]
) -> None:
    [node] = make_gpu_nodes(1, gpus=4, gpu_memory_mib=81920)
    node_obj = json.loads(control_plane.kubectl("get", "node", node, "-o", "json").stdout)
    assert node_obj["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert node_obj["metadata"]["labels"]["nvidia.com/gpu.memory"] == "81920"

    control_plane.kubectl("create", "-n", namespace, "-f", "-", input=_pod_manifest("p1"))
    assert _pod(control_plane, namespace, "p1")["status"]["phase"] == "Pending"
    control_plane.kubectl(
        "create", "--raw", f"/api/v1/namespaces/{namespace}/pods/p1/binding", "-f", "-",
        input=_binding("p1", node),
    )  # fmt: skip
    pod = _wait_running(control_plane, namespace, "p1")
    assert pod["spec"]["nodeName"] == node


def test_service_account_needs_rbac_to_bind(
    control_plane: ControlPlane, namespace: str, make_gpu_nodes: Callable[..., list[str]]
) -> None:
    [node] = make_gpu_nodes(1)
    cp = control_plane
    cp.kubectl("create", "serviceaccount", "binder", "-n", namespace)
    kubeconfig = cp.kubeconfig_for_token(cp.service_account_token(namespace, "binder"), "binder")
    cp.kubectl("create", "-n", namespace, "-f", "-", input=_pod_manifest("p2"))
    path = f"/api/v1/namespaces/{namespace}/pods/p2/binding"

    denied = cp.kubectl(
        "create", "--raw", path, "-f", "-", input=_binding("p2", node), check=False,
        kubeconfig=kubeconfig,
    )  # fmt: skip
    assert denied.returncode != 0
    assert "forbidden" in (denied.stderr + denied.stdout).lower(), denied.stderr
    can_i = cp.kubectl("auth", "can-i", "create", "pods/binding", "-n", namespace,
                       kubeconfig=kubeconfig, check=False)  # fmt: skip
    assert can_i.stdout.strip() == "no"

    role = f"{namespace}-binder"
    rbac = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": [
                    {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
                    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": role},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [{"kind": "ServiceAccount", "name": "binder", "namespace": namespace}],
            },
        ],
    }
    try:
        cp.kubectl("create", "-f", "-", input=json.dumps(rbac))

        def bound() -> bool:
            try:
                cp.kubectl("create", "--raw", path, "-f", "-", input=_binding("p2", node),
                           kubeconfig=kubeconfig)  # fmt: skip
            except CommandError as exc:
                if "forbidden" in exc.stderr.lower():
                    return False  # the RBAC cache has not caught up yet
                raise
            return True

        _poll("binding allowed after the ClusterRoleBinding", bound, timeout=20)
        got = cp.kubectl("get", "pod", "p2", "-n", namespace, "-o", "jsonpath={.spec.nodeName}",
                         kubeconfig=kubeconfig)  # fmt: skip
        assert got.stdout == node
        _wait_running(cp, namespace, "p2")
    finally:
        cp.kubectl("delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found",
                   check=False)  # fmt: skip


def _crd_files() -> list[Path]:
    return sorted(p for p in CRD_DIR.glob("*.y*ml") if p.suffix in (".yaml", ".yml"))


def test_every_crd_in_crds_folder_installs(control_plane: ControlPlane) -> None:
    files = _crd_files()
    assert files, f"no CRD manifests in {CRD_DIR}: the scheduler's Queue/PodGroup CRDs belong there"
    crds: list[str] = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                crds.append(doc["metadata"]["name"])
        # Server-side apply: big CRD schemas overflow client-side apply's annotation.
        control_plane.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(path), timeout=120,
        )  # fmt: skip
    assert crds, f"{CRD_DIR} has manifests but no CustomResourceDefinition"
    control_plane.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in crds),
        timeout=90,
    )  # fmt: skip
    for name in crds:
        # Established means served: listing the new resource must work.
        control_plane.kubectl("get", name, "--all-namespaces", "-o", "name")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead but unreaped: count it as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _pids_with_run_marker(run_id: str) -> list[int]:
    marker = f"KAI_TESTENV_RUN={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def test_second_control_plane_stops_cleanly(control_plane: ControlPlane) -> None:
    second = ControlPlane()
    try:
        second.start()
        assert second.server != control_plane.server
        assert second.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
        pids = second.pids
        assert len(pids) == 4
        assert all(_pid_alive(p) for p in pids)
        assert sorted(_pids_with_run_marker(second.run_id)) == sorted(pids)
    finally:
        second.stop()
    assert [p for p in pids if _pid_alive(p)] == []
    assert _pids_with_run_marker(second.run_id) == []
    # The first control plane is untouched.
    assert control_plane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
