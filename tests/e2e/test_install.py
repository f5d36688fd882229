"""Installing KAI Scheduler on a real control plane: plain YAML and Helm, the shipped defaults,
least-privilege RBAC exercised with the ServiceAccount's own token, and the examples.

The plain-YAML install runs exactly what docs/api.md tells users to run.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testenv.controlplane import ControlPlane
from tests.e2e.scheduler_process import remove_install

__all__: list[str] = []

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "manifests" / "chart"
NS = "kai-scheduler"
SA = "kai-scheduler"
CRD_NAMES = ("crd/queues.scheduling.run.ai", "crd/podgroups.scheduling.run.ai")
PRIORITY_CLASSES = {"train": 50, "build-preemptible": 75, "build": 100, "inference": 125}
EXAMPLES = (
    "queues.yaml",
    "gang-training-job.yaml",
    "inference-deployment.yaml",
    "all-or-nothing.yaml",
)

MakeNodes = Callable[..., list[str]]


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _wait_established(cp: ControlPlane) -> None:
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", *CRD_NAMES, timeout=75)


def _assert_defaults_installed(cp: ControlPlane) -> None:
    # `kubectl get queue default-queue` is what users type first.
    got = cp.kubectl("get", "queue", "default-queue")
    assert "default-parent-queue" in got.stdout
    queues = json.loads(cp.kubectl("get", "queues", "-o", "json").stdout)["items"]
    by_name = {q["metadata"]["name"]: q["spec"] for q in queues}
    assert by_name["default-queue"]["parentQueue"] == "default-parent-queue"
    assert by_name["default-parent-queue"]["resources"]["gpu"]["limit"] == -1
    classes = json.loads(cp.kubectl("get", "priorityclasses", "-o", "json").stdout)["items"]
    values = {c["metadata"]["name"]: c["value"] for c in classes}
    assert {n: values.get(n) for n in PRIORITY_CLASSES} == PRIORITY_CLASSES


def _assert_scheduler_objects(cp: ControlPlane, leader_elect: str) -> None:
    deploy = json.loads(cp.kubectl("get", "deploy", "kai-scheduler", "-n", NS, "-o", "json").stdout)
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == SA
    (container,) = pod["containers"]
    assert f"--leader-elect={leader_elect}" in container["args"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    cp.kubectl("get", "service", "kai-scheduler-metrics", "-n", NS)
    # The ReplicaSet's pod passes admission (the plain install's namespace enforces the
    # "restricted" Pod Security level). Nothing here places it: there is no kube-scheduler.
    deadline = time.monotonic() + 60
    pods: list[Any] = []
    while time.monotonic() < deadline and not pods:
        pods = json.loads(
            cp.kubectl(
                "get", "pods", "-n", NS, "-l", "app.kubernetes.io/name=kai-scheduler", "-o", "json"
            ).stdout
        )["items"]
        time.sleep(0.5)
    assert pods, cp.kubectl("get", "events", "-n", NS).stdout
    assert pods[0]["spec"]["securityContext"]["runAsNonRoot"] is True
    config = cp.kubectl(
        "get", "configmap", "kai-scheduler-config", "-n", NS, "-o", "jsonpath={.data.config\\.yaml}"
    ).stdout
    assert yaml.safe_load(config)["defaultQueue"] == "default-queue"


def _can_i(cp: ControlPlane, kubeconfig: Path, verb: str, resource: str, ns: str | None) -> bool:
    """Ask the API server (SelfSubjectAccessReview) whether `kubeconfig`'s user may do
    `verb` on `resource` ("plural[.group][/subresource]") in namespace `ns` (None: all)."""
    name, _, subresource = resource.partition("/")
    plural, _, group = name.partition(".")
    attributes = {"verb": verb, "resource": plural, "group": group, "subresource": subresource}
    if ns:
        attributes["namespace"] = ns
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    result = cp.kubectl(
        "create",
        "--validate=false",
        "-f",
        "-",
        "-o",
        "json",
        input=json.dumps(review),
        kubeconfig=kubeconfig,
    )
    allowed: bool = json.loads(result.stdout)["status"]["allowed"]
    return allowed


def _assert_least_privilege(cp: ControlPlane, namespace: str, make_gpu_nodes: MakeNodes) -> None:
    """With the ServiceAccount's own token: binds a pod for real, cannot read Secrets or
    delete Nodes, and holds exactly the listed permissions."""
    token = cp.service_account_token(NS, SA)
    kubeconfig = cp.kubeconfig_for_token(token, f"sa-{uuid.uuid4().hex[:6]}")
    (node,) = make_gpu_nodes(1)

    # A Secret exists, and the scheduler's token may not read it.
    cp.kubectl("create", "secret", "generic", "s3-creds", "-n", namespace, "--from-literal=k=v")
    denied = cp.kubectl(
        "get", "secret", "s3-creds", "-n", namespace, kubeconfig=kubeconfig, check=False
    )
    assert denied.returncode != 0 and "Forbidden" in denied.stderr, denied.stderr
    denied = cp.kubectl("get", "secrets", "-A", kubeconfig=kubeconfig, check=False)
    assert denied.returncode != 0 and "Forbidden" in denied.stderr
    denied = cp.kubectl("delete", "node", node, kubeconfig=kubeconfig, check=False)
    assert denied.returncode != 0 and "Forbidden" in denied.stderr, denied.stderr
    cp.kubectl("get", "node", node)  # still there

    # Bind a pending pod the way the scheduler does: POST pods/<name>/binding.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bind-me", "namespace": namespace},
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [
                {
                    "name": "c",
                    "image": "busybox:1.36",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    cp.kubectl("create", "-f", "-", input=json.dumps(pod))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "bind-me", "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    cp.kubectl(
        "create", "--raw", f"/api/v1/namespaces/{namespace}/pods/bind-me/binding", "-f", "-",
        input=json.dumps(binding), kubeconfig=kubeconfig,
    )  # fmt: skip
    bound = cp.kubectl("get", "pod", "bind-me", "-n", namespace, "-o", "jsonpath={.spec.nodeName}")
    assert bound.stdout == node
    # kwok plays the kubelet: the bound pod turns Running.
    cp.kubectl(
        "wait", "--for=jsonpath={.status.phase}=Running", "pod/bind-me", "-n", namespace,
        "--timeout=60s", timeout=75,
    )  # fmt: skip

    allowed = [
        ("list", "pods", namespace), ("watch", "pods", None),
        ("delete", "pods", namespace), ("create", "pods/binding", namespace),
        ("create", "pods/eviction", namespace), ("patch", "pods/status", namespace),
        ("update", "pods/status", namespace), ("watch", "nodes", None),
        ("watch", "namespaces", None), ("create", "events", namespace),
        ("create", "events.events.k8s.io", namespace), ("watch", "queues.scheduling.run.ai", None),
        ("patch", "queues.scheduling.run.ai/status", None),
        ("watch", "podgroups.scheduling.run.ai", None),
        ("update", "podgroups.scheduling.run.ai/status", namespace),
        ("watch", "podgroups.scheduling.volcano.sh", None),
        ("patch", "queues.scheduling.volcano.sh/status", None),
        ("watch", "priorityclasses.scheduling.k8s.io", None),
        ("watch", "poddisruptionbudgets.policy", None),
        ("list", "poddisruptionbudgets.policy", namespace),
        ("watch", "persistentvolumeclaims", None), ("get", "persistentvolumeclaims", namespace),
        ("watch", "persistentvolumes", None), ("watch", "storageclasses.storage.k8s.io", None),
        ("patch", "persistentvolumes", None),
        ("watch", "deviceclasses.resource.k8s.io", None),
        ("watch", "resourceslices.resource.k8s.io", None),
        ("watch", "resourceclaims.resource.k8s.io", None),
        ("get", "resourceclaims.resource.k8s.io", namespace),
        ("update", "resourceclaims.resource.k8s.io", namespace),
        ("create", "resourceclaims.resource.k8s.io", namespace),
        ("delete", "resourceclaims.resource.k8s.io", namespace),
        ("update", "resourceclaims.resource.k8s.io/status", namespace),
        ("update", "resourceclaims.resource.k8s.io/binding", namespace),
        ("create", "leases.coordination.k8s.io", NS), ("update", "leases.coordination.k8s.io", NS),
    ]  # fmt: skip
    denied_list = [
        ("get", "secrets", namespace), ("list", "secrets", None), ("get", "configmaps", NS),
        ("create", "pods", namespace), ("patch", "pods", namespace),
        ("delete", "nodes", None), ("patch", "nodes", None),
        ("create", "queues.scheduling.run.ai", None), ("update", "queues.scheduling.run.ai", None),
        ("delete", "podgroups.scheduling.run.ai", namespace),
        ("create", "leases.coordination.k8s.io", namespace), ("create", "priorityclasses", None),
        ("delete", "poddisruptionbudgets.policy", namespace),
        ("update", "persistentvolumeclaims", namespace), ("update", "persistentvolumes", None),
        ("create", "persistentvolumes", None), ("delete", "storageclasses.storage.k8s.io", None),
        ("patch", "resourceclaims.resource.k8s.io", namespace),
        ("create", "resourceclaimtemplates.resource.k8s.io", namespace),
        ("create", "resourceslices.resource.k8s.io", None),
        ("update", "deviceclasses.resource.k8s.io", None),
        ("create", "clusterrolebindings", None), ("delete", "namespaces", None),
    ]  # fmt: skip
    wrong = [a for a in allowed if not _can_i(cp, kubeconfig, *a)]
    wrong += [d for d in denied_list if _can_i(cp, kubeconfig, *d)]
    assert not wrong, f"unexpected permissions (expected allowed then denied): {wrong}"


def test_plain_yaml_install(
    control_plane: ControlPlane, namespace: str, make_gpu_nodes: MakeNodes
) -> None:
    cp = control_plane
    remove_install(cp)
    try:
        # The documented sequence (docs/api.md, examples/README.md).
        cp.kubectl("apply", "-f", str(ROOT / "crds"), "-f", str(ROOT / "manifests"))
        _wait_established(cp)
        cp.kubectl("apply", "-f", str(ROOT / "manifests" / "defaults"))

        _assert_defaults_installed(cp)
        _assert_scheduler_objects(cp, leader_elect="false")
        _assert_least_privilege(cp, namespace, make_gpu_nodes)
        # Re-applying is a no-op, as `kubectl apply` users expect.
        again = cp.kubectl("apply", "-f", str(ROOT / "crds"), "-f", str(ROOT / "manifests"))
        assert "configured" not in again.stdout and "created" not in again.stdout, again.stdout
    finally:
        remove_install(cp)


@pytest.fixture(scope="module")
def helm_release(control_plane: ControlPlane) -> Generator[ControlPlane, None, None]:
    """The chart installed with `helm install` on a cluster without our CRDs."""
    cp = control_plane
    remove_install(cp)
    # Prove the chart installs the CRDs itself.
    cp.kubectl("delete", "--ignore-not-found", "--timeout=120s", *CRD_NAMES, timeout=135)
    cp.helm("install", "kai-scheduler", str(CHART), "-n", NS, "--create-namespace", timeout=180)
    try:
        yield cp
    finally:
        remove_install(cp)


def test_helm_install_creates_crds_defaults_and_scheduler(helm_release: ControlPlane) -> None:
    cp = helm_release
    _wait_established(cp)
    _assert_defaults_installed(cp)
    _assert_scheduler_objects(cp, leader_elect="false")
    status = json.loads(cp.helm("status", "kai-scheduler", "-n", NS, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"


def test_helm_service_account_has_least_privilege(
    helm_release: ControlPlane, namespace: str, make_gpu_nodes: MakeNodes
) -> None:
    _assert_least_privilege(helm_release, namespace, make_gpu_nodes)


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_applies_cleanly(helm_release: ControlPlane, namespace: str, example: str) -> None:
    cp = helm_release
    path = ROOT / "examples" / example
    try:
        result = cp.kubectl("apply", "--validate=strict", "-n", namespace, "-f", str(path))
        created = [line for line in result.stdout.splitlines() if line.endswith(" created")]
        assert len(created) == len(_docs(path.read_text())), result.stdout
    finally:
        cp.kubectl("delete", "-n", namespace, "-f", str(path), "--ignore-not-found", "--wait=false")


def test_example_queues_show_as_the_readme_says(helm_release: ControlPlane) -> None:
    cp = helm_release
    path = ROOT / "examples" / "queues.yaml"
    try:
        cp.kubectl("apply", "-f", str(path))
        out = cp.kubectl("get", "queues", "research", "team-a", "team-b").stdout.splitlines()
        assert out[0].split()[:8] == [
            "NAME", "PRIORITY", "PARENT", "GPU", "QUOTA", "GPU", "LIMIT", "GPU",
        ]  # fmt: skip
        rows = {line.split()[0]: line.split()[1:-1] for line in out[1:]}
        assert rows == {
            "research": ["100", "8", "12"],
            "team-a": ["100", "research", "4", "8"],
            "team-b": ["120", "research", "4", "-1"],
        }
        # The README's invalid queue is refused with the message it shows.
        broken = {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": "broken"},
            "spec": {"resources": {"gpu": {"quota": 4, "limit": 2}}},
        }
        result = cp.kubectl("apply", "-f", "-", input=json.dumps(broken), check=False)
        assert result.returncode != 0
        assert "spec.resources.gpu.limit" in result.stderr
        assert "limit is below quota; raise limit to at least the quota" in result.stderr
    finally:
        cp.kubectl("delete", "-f", str(path), "--ignore-not-found", "--wait=false")


def test_helm_lint_is_clean(control_plane: ControlPlane) -> None:
    result = control_plane.helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in result.stdout, result.stdout
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def _template(cp: ControlPlane, *sets: str, check: bool = True) -> Any:
    args = ["template", "kai-scheduler", str(CHART), "-n", NS, "--include-crds"]
    for s in sets:
        args += ["--set", s]
    return cp.helm(*args, check=check)


def _rendered(cp: ControlPlane, *sets: str) -> list[dict[str, Any]]:
    return _docs(_template(cp, *sets).stdout)


def _scheduler_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The scheduler's Deployment (the chart also renders the pod grouper's)."""
    (deploy,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == NS]
    return deploy


def _deployment_args(docs: list[dict[str, Any]]) -> list[str]:
    deploy = _scheduler_deployment(docs)
    args: list[str] = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        ((), "false"),
        (("replicas=3",), "true"),
        (("replicas=2", "leaderElection.enabled=true"), "true"),
        (("leaderElection.enabled=true",), "true"),
    ],
)
def test_helm_leader_election_follows_replicas(
    control_plane: ControlPlane, sets: tuple[str, ...], expected: str
) -> None:
    assert f"--leader-elect={expected}" in _deployment_args(_rendered(control_plane, *sets))


def test_helm_values_reach_the_pod_and_config(control_plane: ControlPlane) -> None:
    docs = _rendered(
        control_plane,
        "image.repository=registry.example/kai", "image.tag=1.2.3", "logLevel=debug",
        "placementStrategy=spread", "placement.gpu=binpack", "placement.scoring=fragmentation",
        "nodeSelector.pool=system",
        "tolerations[0].key=dedicated", "tolerations[0].operator=Exists",
        "resources.requests.cpu=2", "defaultQueues.enabled=false",
    )  # fmt: skip
    deploy = _scheduler_deployment(docs)
    pod = deploy["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example/kai:1.2.3"
    assert "--log-level=debug" in pod["containers"][0]["args"]
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert pod["containers"][0]["resources"]["requests"]["cpu"] == 2
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert config["placement"] == {"gpu": "binpack", "cpu": "spread", "scoring": "fragmentation"}
    assert not [d for d in docs if d["kind"] == "Queue"]
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"} == {
        "queues.scheduling.run.ai", "podgroups.scheduling.run.ai",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("placementStrategy=random",), "placementStrategy"),
        (("placement.scoring=fgd",), "scoring"),
        (("logLevel=loud",), "logLevel"),
        (("replicas=2", "leaderElection.enabled=false"), "several active schedulers"),
    ],
)
def test_helm_rejects_bad_values(
    control_plane: ControlPlane, sets: tuple[str, ...], message: str
) -> None:
    result = _template(control_plane, *sets, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_chart_and_plain_manifests_grant_the_same_rules(control_plane: ControlPlane) -> None:
    def rules(docs: list[dict[str, Any]], kind: str) -> list[Any]:
        # The scheduler's roles (the pod grouper's are compared in test_podgrouper.py).
        (role,) = [
            d for d in docs if d["kind"] == kind and "podgrouper" not in d["metadata"]["name"]
        ]
        found: list[Any] = role["rules"]
        return found

    chart = _rendered(control_plane)
    plain = _docs((ROOT / "manifests" / "20-rbac.yaml").read_text())
    for kind in ("ClusterRole", "Role"):
        assert rules(chart, kind) == rules(plain, kind)
