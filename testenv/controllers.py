"""Real third-party controllers on the test control plane, for the e2e tests.

- :class:`VolcanoControllerManager`: Volcano's ``vc-controller-manager`` (job, queue and gc
  controllers) - Volcano Jobs get their PodGroup and, once the PodGroup is Inqueue, their pods.
- :class:`LongRunningKwok`: a second kwok for nodes annotated
  ``kwok.x-k8s.io/node=long-running``, whose pods turn Running and stay so until deleted. The
  control plane's kwok uses kwok's default pod stages, whose ``pod-complete`` makes every pod
  owned by a kind ``Job`` - Volcano's batch Jobs included - Succeeded right after it runs, so
  a Volcano job would finish before a test could evict a worker.
- :class:`LwsController`: the LeaderWorkerSet manager, with its admission webhooks served on
  127.0.0.1 with a certificate this module makes, registered with ``url`` + ``caBundle`` (no
  cert-manager, no Service), optionally with ``gangSchedulingManagement.schedulerProvider``.

Both are built by ``testenv/build_controllers.sh`` (``testenv/build.sh`` runs it) into
``.cache/testenv-bin/controllers/<name>/``, next to the CRDs, RBAC and webhook manifests of the
same module version, which are applied from there unchanged (the harness only fills in the
webhook address and CA, as a deployment's cert injector would). Each controller authenticates
as its upstream ServiceAccount bound to its upstream ClusterRole, runs without leader
election, on its own free loopback ports, in its own process group, and logs to
``<control plane log dir>/<name>.log``.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from testenv import nodes, process
from testenv.binaries import BinariesMissingError, repo_root
from testenv.controlplane import RUN_ENV, CommandError, ControlPlane, ControlPlaneError

__all__ = [
    "CONTROLLERS_ENV",
    "ControllerError",
    "LongRunningKwok",
    "LwsController",
    "VolcanoControllerManager",
    "apply_crds",
    "find_controller",
    "http_ok",
    "install_lws_crds",
    "install_volcano_crds",
    "live_log_tails",
]

#: Overrides ``.cache/testenv-bin/controllers`` (a folder holding ``volcano/`` and ``lws/``).
CONTROLLERS_ENV = "KAI_TESTENV_CONTROLLERS"

#: What each controller folder must hold (see testenv/build_controllers.sh).
_LAYOUT: dict[str, tuple[str, ...]] = {
    "volcano": ("vc-controller-manager", "crds", "rbac/volcano-development.yaml"),
    "lws": ("lws-manager", "crds", "webhook/manifests.yaml", "chart/lws/Chart.yaml"),
    "kwok-stages": ("pod-ready.yaml", "pod-delete.yaml"),
}

VOLCANO_NAMESPACE = "volcano-system"
LWS_NAMESPACE = "lws-system"  # LWS's default operator namespace outside a pod
#: Kept to the names the release's kustomize namePrefix gives them.
LWS_WEBHOOK_CONFIGS = {
    "MutatingWebhookConfiguration": "lws-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "lws-validating-webhook-configuration",
}


class ControllerError(ControlPlaneError):
    """A controller failed to start (its log tail is in the message)."""


def controllers_root() -> Path:
    """``$KAI_TESTENV_CONTROLLERS`` or ``.cache/testenv-bin/controllers`` under the repo."""
    override = os.environ.get(CONTROLLERS_ENV)
    if override:
        return Path(override).expanduser()
    return repo_root() / ".cache" / "testenv-bin" / "controllers"


def find_controller(name: str) -> Path:
    """The resolved folder of controller ``name`` (``volcano`` or ``lws``); raises
    BinariesMissingError naming the command that builds it."""
    folder = controllers_root() / name
    missing = [f for f in _LAYOUT[name] if not (folder / f).exists()]
    if missing:
        raise BinariesMissingError(
            f"controller {name} is not built ({', '.join(missing)} missing in {folder}): run "
            f"testenv/build_controllers.sh {name} (testenv/build.sh and scripts/setup.sh run it)"
        )
    return folder.resolve()


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if isinstance(d, dict)]


def _apply_objects(cp: ControlPlane, objs: Iterable[Mapping[str, Any]]) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": [dict(o) for o in objs]}
    cp.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=kai-testenv",
               "-f", "-", input=json.dumps(doc))  # fmt: skip


def _ensure_namespace(cp: ControlPlane, name: str) -> None:
    _apply_objects(cp, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])


# ----------------------------------------------------------------------------- CRDs

_crd_lock = threading.Lock()
_crds_applied: set[tuple[str, Path]] = set()


def apply_crds(cp: ControlPlane, files: Sequence[Path], *, timeout: float = 60.0) -> list[str]:
    """Server-side apply the CRDs in ``files`` (some exceed the client-side apply annotation
    limit) and wait until each is Established; returns their names. Idempotent per control
    plane (a second call only re-checks Established)."""
    names: list[str] = []
    for path in files:
        docs = _yaml_docs(path)
        names += [
            d["metadata"]["name"] for d in docs if d.get("kind") == "CustomResourceDefinition"
        ]
    with _crd_lock:
        todo = [f for f in files if (cp.run_id, f) not in _crds_applied]
        for path in todo:
            cp.kubectl("apply", "--server-side", "--force-conflicts",
                       "--field-manager=kai-testenv", "-f", str(path), timeout=120)  # fmt: skip
            _crds_applied.add((cp.run_id, path))
    deadline = time.monotonic() + timeout
    # Right after an apply the CRD may not be visible to `kubectl wait` yet: retry.
    while True:
        left = max(1, int(deadline - time.monotonic()))
        result = cp.kubectl(
            "wait", "--for=condition=Established", f"--timeout={left}s",
            *(f"crd/{n}" for n in names), check=False, timeout=left + 15,
        )  # fmt: skip
        if result.returncode == 0:
            return names
        if time.monotonic() > deadline:
            raise ControllerError(
                f"CRDs {', '.join(names)} not Established after {timeout:.0f}s:\n"
                f"{result.stdout}{result.stderr}"
            )
        time.sleep(0.5)


def install_volcano_crds(cp: ControlPlane) -> list[str]:
    """Volcano's CRDs (``config/crd/volcano/bases`` of the pinned module): Jobs, Commands,
    PodGroups, Queues, Numatopologies."""
    return apply_crds(cp, sorted((find_controller("volcano") / "crds").glob("*.yaml")))


def install_lws_crds(cp: ControlPlane) -> list[str]:
    """The LeaderWorkerSet CRD (``config/crd/bases`` of the pinned module)."""
    return apply_crds(cp, sorted((find_controller("lws") / "crds").glob("*.yaml")))


# ----------------------------------------------------------------------------- processes

_live: dict[int, ControllerProcess] = {}


def live_log_tails(lines: int = 40) -> list[tuple[str, str]]:
    """(title, log tail) of every controller process started and not yet stopped."""
    return [(f"{p.name} ({p.log_path})", p.log_tail(lines)) for p in list(_live.values())]


class ControllerProcess:
    """One controller binary in its own process group, logging to a file; stopped at
    interpreter exit and on SIGINT/SIGTERM too (testenv.process registry)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        run_id: str,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        # The marker scripts/test.sh looks for to catch processes that outlive pytest.
        env = {**os.environ, RUN_ENV: run_id, **(extra_env or {})}
        env.pop("KUBECONFIG", None)
        self._comp = process.Component(name, argv, log_path, env)

    @property
    def pid(self) -> int | None:
        """The process id once started."""
        return self._comp.pid

    def start(self) -> None:
        """Launch it."""
        process.register(self)
        _live[id(self)] = self
        self._comp.start()

    def running(self) -> bool:
        """Started and not exited."""
        return self._comp.running()

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 5 s) the whole process group. Idempotent."""
        self._comp.stop()
        _live.pop(id(self), None)
        process.unregister(self)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of its log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"<cannot read {self.log_path}: {exc}>"
        return "\n".join(text.splitlines()[-lines:])

    def wait(self, what: str, ready: Callable[[], bool], timeout: float) -> None:
        """Poll ``ready`` until true; raise ControllerError with the log tail if the process
        exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            code = self._comp.exit_code()
            if code is not None:
                raise ControllerError(
                    f"{self.name} exited with code {code} while waiting for {what}; "
                    f"log {self.log_path}:\n{self.log_tail(60)}"
                )
            with contextlib.suppress(OSError, ValueError, CommandError):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise ControllerError(
                    f"timed out after {timeout:.0f}s waiting for {what}; "
                    f"log {self.log_path}:\n{self.log_tail(60)}"
                )
            time.sleep(0.3)


def http_ok(url: str) -> bool:
    """True when ``url`` answers 200 within 3 s (False when it answers otherwise or cannot
    be reached yet)."""
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return bool(resp.status == 200)
    except OSError:  # urllib.error.URLError and HTTPError are OSErrors
        return False


class _Managed:
    """start()/stop()/with for the controller classes."""

    proc: ControllerProcess | None = None

    def start(self) -> _Managed:  # pragma: no cover - overridden
        raise NotImplementedError

    def stop(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self) -> _Managed:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        """The controller's log tail (empty before start)."""
        return self.proc.log_tail(lines) if self.proc is not None else ""


# ----------------------------------------------------------------------------- Volcano


class VolcanoControllerManager(_Managed):
    """Volcano's controller-manager against ``cp``.

    Identity: ServiceAccount ``volcano-system/volcano-controllers`` bound to the
    ``volcano-controllers`` ClusterRole, both taken unchanged from the module's rendered
    ``installer/volcano-development.yaml``. Flags: ``--leader-elect=false`` (else it waits for a
    Lease in volcano-system), a health server on a free loopback port, ``--scheduler-name`` for
    each of ``scheduler_names``, and ``--controllers`` = job, queue and gc: the pg-controller
    (PodGroups for plain pods of those schedulers) is left out - our pod grouper does that -
    and so are jobflow/jobtemplate, whose CRDs are not installed.
    """

    RBAC = (
        ("ServiceAccount", "volcano-controllers"),
        ("ClusterRole", "volcano-controllers"),
        ("ClusterRoleBinding", "volcano-controllers-role"),
    )

    def __init__(
        self,
        cp: ControlPlane,
        *,
        scheduler_names: Sequence[str] = ("kai-scheduler",),
        controllers: Sequence[str] = ("+job-controller", "+queue-controller", "+gc-controller"),
        verbosity: int = 3,
        name: str = "vc-controller-manager",
    ) -> None:
        self.cp = cp
        self.dir = find_controller("volcano")
        self.scheduler_names = list(scheduler_names)
        self.controllers = list(controllers)
        self.verbosity = verbosity
        self.name = name
        self.healthz_port = 0
        self.kubeconfig: Path | None = None
        self.startup_seconds: float | None = None

    def install_rbac(self) -> None:
        """Namespace volcano-system and the upstream SA, ClusterRole and binding."""
        docs = _yaml_docs(self.dir / "rbac" / "volcano-development.yaml")
        wanted = [
            d for d in docs
            if (d.get("kind"), d.get("metadata", {}).get("name")) in self.RBAC
        ]  # fmt: skip
        if len(wanted) != len(self.RBAC):
            found = [(d.get("kind"), d["metadata"]["name"]) for d in wanted]
            raise ControllerError(f"volcano-development.yaml: expected {self.RBAC}, found {found}")
        _ensure_namespace(self.cp, VOLCANO_NAMESPACE)
        _apply_objects(self.cp, wanted)

    def argv(self) -> list[str]:
        """The command line."""
        assert self.kubeconfig is not None
        return [
            str(self.dir / "vc-controller-manager"),
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--enable-healthz=true",
            f"--healthz-address=127.0.0.1:{self.healthz_port}",
            *(f"--scheduler-name={n}" for n in self.scheduler_names),
            f"--controllers={','.join(self.controllers)}",
            f"-v={self.verbosity}",
        ]

    def start(self, timeout: float = 60.0) -> VolcanoControllerManager:
        """CRDs, RBAC, start, and wait for /healthz."""
        began = time.monotonic()
        install_volcano_crds(self.cp)
        self.install_rbac()
        token = self.cp.service_account_token(VOLCANO_NAMESPACE, "volcano-controllers")
        self.kubeconfig = self.cp.kubeconfig_for_token(token, "volcano-controllers")
        (self.healthz_port,) = _free_ports(1)
        self.proc = ControllerProcess(
            self.name, self.argv(), self.cp.log_dir / f"{self.name}.log", self.cp.run_id
        )
        self.proc.start()
        try:
            self.proc.wait(
                "Volcano controller-manager /healthz",
                lambda: http_ok(f"http://127.0.0.1:{self.healthz_port}/healthz"),
                timeout,
            )
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stop the process (CRDs and RBAC stay)."""
        if self.proc is not None:
            self.proc.stop()


def ensure_volcano_queue(cp: ControlPlane, name: str = "default", weight: int = 1) -> None:
    """Create Volcano Queue ``name`` unless it exists (in a Volcano install the
    volcano-scheduler creates ``default``; here ours replaces that scheduler)."""
    queue = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"weight": weight, "reclaimable": True},
    }
    result = cp.kubectl("create", "-f", "-", input=json.dumps(queue), check=False)
    if result.returncode != 0 and "AlreadyExists" not in result.stderr:
        raise ControllerError(f"creating Volcano queue {name}: {result.stderr}")


# ----------------------------------------------------------------------------- kwok

LONG_RUNNING_ANNOTATION = ("kwok.x-k8s.io/node", "long-running")


class LongRunningKwok(_Managed):
    """A second kwok (the control plane's binary, admin kubeconfig like the first) managing
    only nodes annotated ``kwok.x-k8s.io/node=long-running``, with kwok's default node stages
    and, of its default pod stages, ``pod-ready`` and ``pod-delete`` (copied unchanged from the
    pinned kwok module by build_controllers.sh) - not ``pod-complete``: pods run until
    deleted, whoever owns them."""

    def __init__(self, cp: ControlPlane, *, name: str = "kwok-long-running") -> None:
        self.cp = cp
        self.stages = find_controller("kwok-stages")
        self.name = name
        self.workdir = Path(tempfile.mkdtemp(prefix="kai-testenv-kwok-"))
        self.port = 0

    def argv(self) -> list[str]:
        """The command line."""
        return [
            str(self.cp.bin_dir / "kwok"),
            f"--kubeconfig={self.cp.kubeconfig}",
            f"--config={self.stages / 'pod-ready.yaml'}",
            f"--config={self.stages / 'pod-delete.yaml'}",
            "--manage-nodes-with-annotation-selector=" + "=".join(LONG_RUNNING_ANNOTATION),
            f"--server-address=127.0.0.1:{self.port}",
            "--node-lease-duration-seconds=40",
            "--cidr=10.1.0.1/16",
        ]

    def start(self, timeout: float = 30.0) -> LongRunningKwok:
        """Start it and wait for /healthz."""
        (self.port,) = _free_ports(1)
        self.proc = ControllerProcess(
            self.name, self.argv(), self.cp.log_dir / f"{self.name}.log", self.cp.run_id,
            extra_env={"HOME": str(self.workdir)},
        )  # fmt: skip
        self.proc.start()
        try:
            self.proc.wait(
                "kwok /healthz", lambda: http_ok(f"http://127.0.0.1:{self.port}/healthz"), timeout
            )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop it (nodes it managed stay, no longer heartbeating)."""
        if self.proc is not None:
            self.proc.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def make_gpu_nodes(
        self,
        count: int,
        *,
        gpus: int = 8,
        cpu: str = "64",
        memory: str = "512Gi",
        labels: Mapping[str, str] | None = None,
        name_prefix: str = "long-running",
        timeout: float = 60.0,
    ) -> list[str]:
        """``count`` GPU nodes managed by this kwok (as :func:`testenv.nodes.make_gpu_nodes`
        makes them, but for the annotation), Ready; returns their names."""
        names = [f"{name_prefix}-{i}" for i in range(count)]
        items = []
        for n in names:
            node = nodes._node_manifest(
                n, gpus=gpus, cpu=cpu, memory=memory, pods=110, labels=dict(labels or {}),
                taints=(),
            )  # fmt: skip
            node["metadata"]["annotations"] = {
                LONG_RUNNING_ANNOTATION[0]: LONG_RUNNING_ANNOTATION[1]
            }
            items.append(node)
        if not items:
            return []
        body = {"apiVersion": "v1", "kind": "List", "items": items}
        self.cp.kubectl("create", "-f", "-", input=json.dumps(body))
        self.cp.kubectl(
            "wait", "--for=condition=Ready", f"--timeout={int(timeout)}s",
            *(f"node/{n}" for n in names), timeout=timeout + 15,
        )  # fmt: skip
        return names


# ----------------------------------------------------------------------------- LWS


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise ControllerError("the `openssl` command is missing (scripts/setup.sh installs it)")
    result = subprocess.run(
        [exe, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise ControllerError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def make_serving_cert(directory: Path, ip: str = "127.0.0.1") -> bytes:
    """A throwaway CA and a serving certificate for ``ip`` signed by it, written as
    ``tls.crt``/``tls.key`` (controller-runtime's default names) in ``directory``; returns the
    CA certificate (PEM), the webhook configurations' ``caBundle``."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
        "-subj", "/CN=kai-testenv-webhook-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=directory,
    )  # fmt: skip
    _openssl("req", "-new", *ec, "-keyout", "tls.key", "-out", "tls.csr",
             "-subj", f"/CN={ip}", cwd=directory)  # fmt: skip
    (directory / "tls.ext").write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        f"subjectAltName=IP:{ip}\n"
    )
    _openssl(
        "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "30", "-extfile", "tls.ext", "-out", "tls.crt",
        cwd=directory,
    )  # fmt: skip
    return (directory / "ca.crt").read_bytes()


def _json_patch(doc: dict[str, Any], ops: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Apply RFC 6902 ``add``/``replace``/``remove`` ops (what kustomize patch files use)."""
    out = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op["path"]).split("/")[1:]]
        parent: Any = out
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[index]
            else:
                raise ValueError(f"unsupported patch op {kind}")
        elif kind in ("add", "replace"):
            parent[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[last]
        else:
            raise ValueError(f"unsupported patch op {kind}")
    return out


def lws_webhook_configurations(
    webhook_dir: Path, *, port: int, ca_bundle: bytes
) -> list[dict[str, Any]]:
    """The release's webhook configurations - ``manifests.yaml`` with the kustomize patches
    (``mutating-patch.yaml``, ``validating-patch.yaml``: the pod webhooks' objectSelector) -
    each webhook pointed at ``https://127.0.0.1:<port><path>`` with ``caBundle``."""
    patches = {
        "MutatingWebhookConfiguration": webhook_dir / "mutating-patch.yaml",
        "ValidatingWebhookConfiguration": webhook_dir / "validating-patch.yaml",
    }
    out = []
    for doc in _yaml_docs(webhook_dir / "manifests.yaml"):
        kind = doc["kind"]
        patch = patches.get(kind)
        if patch is not None and patch.exists():
            with patch.open() as f:
                doc = _json_patch(doc, yaml.safe_load(f) or [])
        doc["metadata"] = {"name": LWS_WEBHOOK_CONFIGS[kind]}
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
            hook.setdefault("timeoutSeconds", 10)
        out.append(doc)
    return out


class LwsController(_Managed):
    """The LeaderWorkerSet manager against ``cp``.

    ``gang_scheduler_provider="volcano"`` writes ``gangSchedulingManagement.schedulerProvider:
    volcano`` into its config (it then makes a Volcano PodGroup per group and annotates the
    pods with it; the Volcano CRDs are installed first); ``None`` leaves gang scheduling out.

    Identity: ServiceAccount ``lws-system/lws-controller-manager`` with the RBAC of the
    module's Helm chart (``templates/rbac/``, rendered with ``helm template`` and the same
    provider value, which adds the podgroups rule). Config: no leader election, internal cert
    management off, metrics off, health probes and webhooks on free loopback ports, the webhook
    certificate from :func:`make_serving_cert`. Its webhooks are required (without them LWS
    v0.8.0 does not default LeaderWorkerSets nor label the pods), so the webhook
    configurations are registered with ``url`` + ``caBundle`` and removed by :meth:`stop`
    (before the process goes: their failurePolicy is Fail). Only one may run at a time on a
    control plane (the configurations are cluster-wide).
    """

    def __init__(
        self,
        cp: ControlPlane,
        *,
        gang_scheduler_provider: str | None = "volcano",
        name: str = "lws-manager",
    ) -> None:
        self.cp = cp
        self.dir = find_controller("lws")
        self.provider = gang_scheduler_provider
        self.name = name
        self.workdir = Path(tempfile.mkdtemp(prefix="kai-testenv-lws-"))
        self.kubeconfig: Path | None = None
        self.webhook_port = 0
        self.health_port = 0
        self.config_path = self.workdir / "config.yaml"
        self.startup_seconds: float | None = None
        self._webhooks_registered = False

    def config(self) -> dict[str, Any]:
        """The manager's Configuration file (config.lws.x-k8s.io/v1alpha1)."""
        cfg: dict[str, Any] = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {
                "host": "127.0.0.1",
                "port": self.webhook_port,
                "certDir": str(self.workdir / "certs"),
            },
            "metrics": {"bindAddress": "0"},  # off: its secure serving wants TokenReviews
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
        }
        if self.provider is not None:
            cfg["gangSchedulingManagement"] = {"schedulerProvider": self.provider}
        return cfg

    def rbac_objects(self) -> list[dict[str, Any]]:
        """The chart's ServiceAccount, ClusterRoles, bindings and Role, rendered for this
        provider."""
        values = [] if self.provider is None else [
            "--set", f"gangSchedulingManagement.schedulerProvider={self.provider}"
        ]  # fmt: skip
        shows = []
        for t in ("serviceaccount", "clusterrole", "clusterrolebinding", "role", "rolebinding"):
            shows += ["--show-only", f"templates/rbac/{t}.yaml"]
        out = self.cp.helm(
            "template", "lws", str(self.dir / "chart" / "lws"), "--namespace", LWS_NAMESPACE,
            *values, *shows,
        ).stdout  # fmt: skip
        return [d for d in yaml.safe_load_all(out) if isinstance(d, dict)]

    def argv(self) -> list[str]:
        """The command line."""
        return [
            str(self.dir / "lws-manager"),
            f"--kubeconfig={self.kubeconfig}",
            f"--config={self.config_path}",
            "--leader-elect=false",
            "--zap-log-level=info",
        ]

    def start(self, timeout: float = 60.0) -> LwsController:
        """CRDs, RBAC, certificate, config; start; wait for /readyz; register the webhooks
        and wait until the API server reaches them (a server-side dry-run create)."""
        began = time.monotonic()
        install_lws_crds(self.cp)
        if self.provider == "volcano":
            install_volcano_crds(self.cp)
        _ensure_namespace(self.cp, LWS_NAMESPACE)
        _apply_objects(self.cp, self.rbac_objects())
        token = self.cp.service_account_token(LWS_NAMESPACE, "lws-controller-manager")
        self.kubeconfig = self.cp.kubeconfig_for_token(token, "lws-controller-manager")
        ca = make_serving_cert(self.workdir / "certs")
        self.webhook_port, self.health_port = _free_ports(2)
        self.config_path.write_text(yaml.safe_dump(self.config()))
        self.proc = ControllerProcess(
            self.name, self.argv(), self.cp.log_dir / f"{self.name}.log", self.cp.run_id
        )
        self.proc.start()
        try:
            self.proc.wait(
                "LWS manager /readyz",
                lambda: http_ok(f"http://127.0.0.1:{self.health_port}/readyz"),
                timeout,
            )
            hooks = lws_webhook_configurations(
                self.dir / "webhook", port=self.webhook_port, ca_bundle=ca
            )
            self._webhooks_registered = True
            _apply_objects(self.cp, hooks)
            self.proc.wait(
                "the LWS webhooks (server-side dry-run of a LeaderWorkerSet)",
                self._dry_run_ok,
                max(10.0, timeout - (time.monotonic() - began)),
            )
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _dry_run_ok(self) -> bool:
        probe = {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {"name": "webhook-probe", "namespace": "default"},
            "spec": {
                "leaderWorkerTemplate": {
                    "size": 1,
                    "workerTemplate": {
                        "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]}
                    },
                }
            },
        }
        result = self.cp.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe),
            check=False,
        )  # fmt: skip
        # Both webhooks fail closed (failurePolicy Fail): success means they answered.
        return result.returncode == 0

    def stop(self) -> None:
        """Remove the webhook configurations, then stop the process. Idempotent."""
        if self._webhooks_registered:
            for kind, name in LWS_WEBHOOK_CONFIGS.items():
                with contextlib.suppress(ControlPlaneError):
                    self.cp.kubectl("delete", kind.lower(), name, "--ignore-not-found", check=False)
            self._webhooks_registered = False
        if self.proc is not None:
            self.proc.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
