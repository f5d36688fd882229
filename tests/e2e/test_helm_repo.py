"""The chart as admins install it: from a chart repository served over HTTP.

`scripts/chart-repo.sh` packages the chart (this version and, rebuilt from git, the previous
one) into a repository; a thread serves it on 127.0.0.1; the command blocks of docs/install.md
run through bash as they are written (the seed's `helm repo add kai-scheduler <url>/kai-scheduler/`
and `helm install kai-scheduler kai-scheduler/kai-scheduler -n kai-scheduler` among them), with
helm's state in a temp dir, against the real control plane. Then: an upgrade from the previous
chart version keeps Queues and PodGroups, and `helm uninstall` leaves them and the CRDs alone.

The release is `kai-scheduler` in namespace `kai-scheduler`, as in test_install.py: every test
here removes the release and the namespace before and after itself.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import subprocess
import tarfile
import threading
import time
import uuid
from collections.abc import Generator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from testenv.binaries import find_bin_dir
from testenv.controlplane import ControlPlane
from tests.e2e.scheduler_process import SCHEDULER_NAMESPACE, remove_install

__all__: list[str] = []

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "chart-repo.sh"
DOC = ROOT / "docs" / "install.md"
NS = "kai-scheduler"
RELEASE = "kai-scheduler"
DOC_HOST = "https://charts.example.org"
# The seed's two commands, character for character (the repository URL aside).
SEED_REPO_ADD = "helm repo add kai-scheduler {url}/kai-scheduler/"
SEED_INSTALL = "helm install kai-scheduler kai-scheduler/kai-scheduler -n kai-scheduler"
CRD_NAMES = ("queues.scheduling.run.ai", "podgroups.scheduling.run.ai")
PRIORITY_CLASSES = {"train": 50, "build-preemptible": 75, "build": 100, "inference": 125}
DEFAULT_QUEUES = ("default-parent-queue", "default-queue")


def _chart_version() -> str:
    version: str = yaml.safe_load((ROOT / "manifests/chart/Chart.yaml").read_text())["version"]
    return version


def _previous_versions() -> list[str]:
    """The versions in the script's RELEASES list (read from the script, so they agree)."""
    block = re.search(r"^RELEASES=\((.*?)^\)", SCRIPT.read_text(), re.S | re.M)
    assert block, "scripts/chart-repo.sh has no RELEASES=( ... ) list"
    return re.findall(r'"(\S+) [0-9a-f]+"', block.group(1))


def _doc_block(tag: str) -> list[str]:
    """The command lines of the bash block after `<!-- tested: TAG -->` in docs/install.md."""
    found = re.search(rf"<!-- tested: {tag} -->\n```bash\n(.*?)```", DOC.read_text(), re.S)
    assert found, f"docs/install.md has no tested {tag!r} block"
    return [line for line in found.group(1).splitlines() if line.strip()]


def _run_script(
    out: Path, *args: str, helm: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM": str(helm or find_bin_dir() / "helm")}
    return subprocess.run(
        [str(SCRIPT), str(out), *args], capture_output=True, text=True, env=env, timeout=120,
        check=False,
    )  # fmt: skip


@dataclass
class ChartRepo:
    """The repository built by scripts/chart-repo.sh, served over HTTP on 127.0.0.1."""

    out: Path
    base_url: str
    requests: list[str] = field(default_factory=list)

    @property
    def dir(self) -> Path:
        return self.out / "kai-scheduler"


@pytest.fixture(scope="module")
def chart_repo(tmp_path_factory: pytest.TempPathFactory) -> Generator[ChartRepo, None, None]:
    out = tmp_path_factory.mktemp("chart-repo")
    built = _run_script(out)
    assert built.returncode == 0, built.stderr
    repo = ChartRepo(out=out, base_url="")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            repo.requests.append(self.path)  # what helm fetched, for the asserts

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=out))
    thread = threading.Thread(target=server.serve_forever, name="chart-repo", daemon=True)
    thread.start()
    repo.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield repo
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class Shell:
    """Runs an admin's command lines through bash: `helm` and `kubectl` are the built ones on
    PATH, KUBECONFIG is the control plane's admin, and helm keeps its repositories, cache,
    config and data in a temp dir (nothing read from or written to the real home)."""

    def __init__(self, cp: ControlPlane, home: Path, repo: ChartRepo) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
        env.update(
            PATH=f"{cp.bin_dir}{os.pathsep}{env.get('PATH', '')}",
            KUBECONFIG=str(cp.kubeconfig),
            HELM_REPOSITORY_CONFIG=str(home / "config" / "repositories.yaml"),
            HELM_CACHE_HOME=str(home / "cache"),
            HELM_CONFIG_HOME=str(home / "config"),
            HELM_DATA_HOME=str(home / "data"),
        )
        self.env = env
        self.home = home
        self.repo = repo

    def run(self, line: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run one command line (docs/install.md's host replaced by the served repo's)."""
        line = line.replace(DOC_HOST, self.repo.base_url)
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", line], capture_output=True, text=True,
            env=self.env, timeout=180, check=False,
        )  # fmt: skip
        if check:
            assert result.returncode == 0, (
                f"{line}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
            )
        return result

    def block(self, tag: str) -> None:
        for line in _doc_block(tag):
            self.run(line)


def _remove_release(cp: ControlPlane) -> None:
    """Uninstall the release and delete its namespace (CRDs stay, as after any uninstall), and
    whatever an earlier plain-YAML install in this session left there (Helm would refuse to
    adopt its ClusterRole or namespace)."""
    assert (RELEASE, NS) == ("kai-scheduler", SCHEDULER_NAMESPACE)
    remove_install(cp)


@pytest.fixture
def shell(
    control_plane: ControlPlane, chart_repo: ChartRepo, tmp_path: Path
) -> Generator[Shell, None, None]:
    """A fresh helm home and no release before the test; release and namespace removed after."""
    _remove_release(control_plane)
    try:
        yield Shell(control_plane, tmp_path / "helm-home", chart_repo)
    finally:
        _remove_release(control_plane)


def _json(cp: ControlPlane, *args: str) -> Any:
    return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)


def _release(cp: ControlPlane) -> dict[str, Any]:
    """The release as `helm list` shows it: chart version, revision, status."""
    (listed,) = json.loads(cp.helm("list", "-n", NS, "-o", "json").stdout)
    return {
        "version": listed["chart"].removeprefix("kai-scheduler-"),
        "revision": int(listed["revision"]),
        "status": listed["status"],
    }


def _uid(cp: ControlPlane, *args: str) -> str:
    uid: str = _json(cp, *args)["metadata"]["uid"]
    return uid


# --------------------------------------------------------------------------------- the repo


def test_script_indexes_every_version_with_relative_urls(chart_repo: ChartRepo) -> None:
    index = yaml.safe_load((chart_repo.dir / "index.yaml").read_text())
    entries = {e["version"]: e for e in index["entries"]["kai-scheduler"]}
    expected = [*_previous_versions(), _chart_version()]
    assert sorted(entries) == sorted(expected) and len(expected) >= 2, sorted(entries)
    app_version = yaml.safe_load((ROOT / "manifests/chart/Chart.yaml").read_text())["appVersion"]
    assert entries[_chart_version()]["appVersion"] == app_version
    for version, entry in entries.items():
        archive = chart_repo.dir / f"kai-scheduler-{version}.tgz"
        assert entry["urls"] == [archive.name]
        assert entry["digest"] == hashlib.sha256(archive.read_bytes()).hexdigest()
        with tarfile.open(archive) as tar:
            member = tar.extractfile("kai-scheduler/Chart.yaml")
            assert member is not None
            assert yaml.safe_load(member.read())["version"] == version
    assert sorted(p.name for p in chart_repo.dir.iterdir()) == sorted(
        ["index.yaml", *(f"kai-scheduler-{v}.tgz" for v in expected)]
    )


def test_script_writes_absolute_urls_and_refuses_foreign_folders(tmp_path: Path) -> None:
    built = _run_script(tmp_path, "--url", "https://charts.example.org/")
    assert built.returncode == 0, built.stderr
    index = yaml.safe_load((tmp_path / "kai-scheduler" / "index.yaml").read_text())
    urls = sorted(u for e in index["entries"]["kai-scheduler"] for u in e["urls"])
    assert urls == sorted(
        f"https://charts.example.org/kai-scheduler/kai-scheduler-{v}.tgz"
        for v in [*_previous_versions(), _chart_version()]
    )
    # Running it again replaces its own output; a file it did not write stops it (exit 2).
    assert _run_script(tmp_path).returncode == 0
    (tmp_path / "kai-scheduler" / "notes.txt").write_text("mine")
    refused = _run_script(tmp_path)
    assert refused.returncode == 2 and "notes.txt" in refused.stderr, refused.stderr
    assert (tmp_path / "kai-scheduler" / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------------- install, upgrade


def test_seed_commands_install_from_the_served_repo(
    control_plane: ControlPlane, shell: Shell
) -> None:
    cp = control_plane
    lines = _doc_block("install")
    assert SEED_REPO_ADD.format(url=DOC_HOST) in lines and SEED_INSTALL in lines, lines

    # Without its namespace the seed's install stops, naming it (why the doc creates it first).
    shell.run(SEED_REPO_ADD.format(url=DOC_HOST))
    refused = shell.run(SEED_INSTALL, check=False)
    assert refused.returncode != 0
    assert f'namespaces "{NS}" not found' in refused.stderr, refused.stderr

    shell.block("install")
    assert "kai-scheduler" in (shell.home / "config" / "repositories.yaml").read_text()
    assert "/kai-scheduler/index.yaml" in shell.repo.requests
    assert f"/kai-scheduler/kai-scheduler-{_chart_version()}.tgz" in shell.repo.requests
    assert _release(cp) == {"version": _chart_version(), "revision": 1, "status": "deployed"}

    deploy = _json(cp, "deployment", "kai-scheduler", "-n", NS)
    assert deploy["metadata"]["labels"]["helm.sh/chart"] == f"kai-scheduler-{_chart_version()}"
    for crd in CRD_NAMES:
        cp.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s", timeout=75)
    queues = {q["metadata"]["name"]: q["spec"] for q in _json(cp, "queues")["items"]}
    assert queues["default-queue"]["parentQueue"] == "default-parent-queue"
    assert "default-parent-queue" in queues
    classes = {c["metadata"]["name"]: c["value"] for c in _json(cp, "priorityclasses")["items"]}
    assert {n: classes.get(n) for n in PRIORITY_CLASSES} == PRIORITY_CLASSES
    # The ReplicaSet's pod passes the namespace's "restricted" Pod Security admission.
    selector = "app.kubernetes.io/component=scheduler"
    deadline = time.monotonic() + 60
    while not _json(cp, "pods", "-n", NS, "-l", selector)["items"]:
        assert time.monotonic() < deadline, cp.kubectl("get", "events", "-n", NS).stdout
        time.sleep(0.5)


def test_upgrade_from_previous_version_keeps_queues_and_podgroups_and_uninstall_leaves_them(
    control_plane: ControlPlane, shell: Shell, namespace: str
) -> None:
    cp = control_plane
    previous = _previous_versions()[-1]
    shell.run(SEED_REPO_ADD.format(url=DOC_HOST))
    shell.run(f"kubectl create namespace {NS}")
    shell.run(f"{SEED_INSTALL} --version {previous}")
    assert _release(cp)["version"] == previous

    queue = f"helm-upgrade-{uuid.uuid4().hex[:6]}"
    objects = [
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": queue},
            "spec": {"parentQueue": "default-parent-queue", "resources": {"gpu": {"quota": 2}}},
        },
        {
            "apiVersion": "scheduling.run.ai/v2alpha2",
            "kind": "PodGroup",
            "metadata": {"name": "trainer", "namespace": namespace},
            "spec": {"queue": queue, "minMember": 2},
        },
    ]
    cp.kubectl(
        "create",
        "-f",
        "-",
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": objects}),
    )
    try:
        kept = {
            "queue": _uid(cp, "queue", queue),
            "podgroup": _uid(cp, "podgroup", "trainer", "-n", namespace),
        }
        defaults = {name: _uid(cp, "queue", name) for name in DEFAULT_QUEUES}

        shell.block("upgrade")
        assert _release(cp) == {"version": _chart_version(), "revision": 2, "status": "deployed"}
        deploy = _json(cp, "deployment", "kai-scheduler", "-n", NS)
        assert deploy["metadata"]["labels"]["helm.sh/chart"] == f"kai-scheduler-{_chart_version()}"
        after = {
            "queue": _uid(cp, "queue", queue),
            "podgroup": _uid(cp, "podgroup", "trainer", "-n", namespace),
        }
        assert after == kept
        assert {name: _uid(cp, "queue", name) for name in DEFAULT_QUEUES} == defaults
        assert _json(cp, "queue", queue)["spec"]["resources"]["gpu"]["quota"] == 2

        shell.block("uninstall")
        gone = cp.kubectl("get", "deployment", "kai-scheduler", "-n", NS, check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stderr
        for crd in CRD_NAMES:
            cp.kubectl("get", "crd", crd)  # Helm never deletes crds/
        assert {
            "queue": _uid(cp, "queue", queue),
            "podgroup": _uid(cp, "podgroup", "trainer", "-n", namespace),
        } == kept
        # The chart's own objects go with the release, as docs/install.md says.
        names = {q["metadata"]["name"] for q in _json(cp, "queues")["items"]}
        assert not names & set(DEFAULT_QUEUES), names
        classes = {c["metadata"]["name"] for c in _json(cp, "priorityclasses")["items"]}
        assert not classes & set(PRIORITY_CLASSES), classes
    finally:
        cp.kubectl("delete", "queue", queue, "--ignore-not-found", "--wait=false")
