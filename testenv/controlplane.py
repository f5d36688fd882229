"""ControlPlane: etcd + kube-apiserver + kube-controller-manager + kwok on loopback ports.

Authentication is by static tokens (an admin in system:masters), authorization is Node,RBAC,
service-account tokens are signed and verifiable, and kwok fakes every node annotated
``kwok.x-k8s.io/node=fake`` (Ready nodes, bound pods move to Running).

Two opt-in extras for benchmarks (off by default, so tests see exactly the plane above):
``static_users`` adds token-authenticated users (e.g. ``system:kube-scheduler``, whom the
bootstrap RBAC policy already grants a scheduler's permissions) and ``audit_policy`` turns on
kube-apiserver's JSON audit log (``audit_log``), which is how a benchmark counts the requests
each client made.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import secrets
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from testenv import process
from testenv.binaries import find_bin_dir, repo_root
from testenv.pki import make_pki

__all__ = ["CommandError", "ControlPlane", "ControlPlaneError"]

LOG_DIR_ENV = "KAI_TESTENV_LOG_DIR"
RUN_ENV = "KAI_TESTENV_RUN"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node=fake"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
_KEEP_LOG_RUNS = 30
_counter = itertools.count(1)


class ControlPlaneError(RuntimeError):
    """The control plane failed to start, or a command against it failed."""


class CommandError(ControlPlaneError):
    """A kubectl/helm command exited non-zero (its output is in the message)."""

    def __init__(self, message: str, result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(message)
        self.result = result
        self.returncode = result.returncode
        self.stdout = result.stdout
        self.stderr = result.stderr


def _free_ports(count: int) -> list[int]:
    # Hold every socket open until all are picked so the ports are distinct.
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


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 256 * 1024))
            data = f.read().decode(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(data.splitlines()[-lines:])


def _default_log_dir(run: str) -> Path:
    override = os.environ.get(LOG_DIR_ENV)
    base = Path(override) if override else repo_root() / ".cache" / "testenv-logs"
    base.mkdir(parents=True, exist_ok=True)
    if not override:  # keep the default folder from growing without bound
        old = sorted((p for p in base.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        for stale in old[: max(0, len(old) - _KEEP_LOG_RUNS)]:
            shutil.rmtree(stale, ignore_errors=True)
    return base / run


def _check_token_field(value: str) -> None:
    # tokens.csv is comma separated with the group list quoted: keep every field parseable.
    if not value or any(c in value for c in ',"\n'):
        raise ValueError(
            f'static user or group {value!r}: must be non-empty, without , " or newline'
        )


def _token_line(token: str, user: str, uid: str, groups: Sequence[str]) -> str:
    """One line of kube-apiserver's --token-auth-file."""
    return f'{token},{user},{uid},"{",".join(groups)}"\n' if groups else f"{token},{user},{uid}\n"


def _sweep_orphaned_work_dirs() -> None:
    """Delete data dirs left by interpreters that died without stop() (e.g. SIGKILL)."""
    for path in Path(tempfile.gettempdir()).glob("kai-testenv-*-*"):
        owner = path.name.split("-")[2]
        if not owner.isdigit():
            continue
        try:
            os.kill(int(owner), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass


class ControlPlane:
    """A throwaway Kubernetes control plane for tests. Use ``start()``/``stop()`` or ``with``.

    Attributes known right after construction: ``server`` (https URL), ``ca_file``,
    ``admin_token``, ``kubeconfig`` (admin), ``log_dir``, ``bin_dir``. ``startup_seconds`` is
    set by ``start()``.
    """

    def __init__(
        self,
        *,
        bin_dir: Path | None = None,
        log_dir: Path | None = None,
        startup_timeout: float = 60.0,
        static_users: Mapping[str, Sequence[str]] | None = None,
        audit_policy: Mapping[str, Any] | None = None,
    ) -> None:
        """``static_users`` maps extra user names to their groups; each gets a token in
        ``user_tokens``. ``audit_policy`` is an ``audit.k8s.io/v1`` Policy document: when given,
        kube-apiserver writes JSON audit events to ``audit_log`` (in the data dir, so it goes
        away with ``stop()``)."""
        for user, groups in (static_users or {}).items():
            _check_token_field(user)
            for group in groups:
                _check_token_field(group)
        self.bin_dir: Path = bin_dir if bin_dir is not None else find_bin_dir()
        self.run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_counter)}"
        self.log_dir: Path = log_dir if log_dir is not None else _default_log_dir(self.run_id)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.startup_timeout = startup_timeout
        self.startup_seconds: float | None = None
        _sweep_orphaned_work_dirs()
        self._work = Path(tempfile.mkdtemp(prefix=f"kai-testenv-{os.getpid()}-"))
        self._pki_dir = self._work / "pki"
        self.ca_file: Path = self._pki_dir / "ca.crt"
        self.admin_token: str = secrets.token_hex(24)
        self._kcm_token = secrets.token_hex(24)
        self._kwok_token = secrets.token_hex(24)
        self._static_users = {u: tuple(g) for u, g in (static_users or {}).items()}
        #: Token of each of ``static_users``.
        self.user_tokens: dict[str, str] = {u: secrets.token_hex(24) for u in self._static_users}
        self._audit_policy = dict(audit_policy) if audit_policy is not None else None
        #: kube-apiserver's audit log (JSON lines) when ``audit_policy`` was given, else None.
        self.audit_log: Path | None = self._work / "audit.log" if audit_policy is not None else None
        self._pick_ports()
        self.kubeconfig: Path = self._work / "admin.kubeconfig"
        self._components: list[process.Component] = []
        self._started = False
        self._stopped = False

    # ----------------------------------------------------------------- lifecycle

    def _pick_ports(self) -> None:
        (self._etcd_port, self._peer_port, self._api_port, self._kcm_port, self._kwok_port) = (
            _free_ports(5)
        )
        self.server: str = f"https://127.0.0.1:{self._api_port}"

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start every component and wait until the API is ready; raise ControlPlaneError
        (with each component's log tail) if that takes longer than ``startup_timeout``."""
        if self._started:
            return self
        if self._stopped:
            raise ControlPlaneError("this ControlPlane was stopped; create a new one")
        self._started = True
        process.register(self)
        began = time.monotonic()
        try:
            make_pki(self._pki_dir, service_ip=SERVICE_IP)
            for attempt in range(3):
                try:
                    self._launch(began)
                    break
                except _PortClash:
                    # Another process took a port between picking and binding: new ports.
                    self._stop_components()
                    if attempt == 2:
                        raise
                    self._pick_ports()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _launch(self, began: float) -> None:
        self._components = []
        self._write_files()
        deadline = began + self.startup_timeout
        self._spawn("etcd", self._etcd_argv())
        self._wait(deadline, "etcd /health", self._etcd_healthy)
        self._spawn("kube-apiserver", self._apiserver_argv())
        self._wait(deadline, "kube-apiserver /readyz", lambda: self._api_get("/readyz") == "ok")
        self._spawn("kube-controller-manager", self._kcm_argv())
        self._spawn("kwok", self._kwok_argv(), extra_env={"HOME": str(self._work / "kwok-home")})
        self._wait(deadline, "kube-controller-manager /healthz", self._kcm_healthy)
        self._wait(deadline, "kwok /healthz", self._kwok_healthy)
        # The service-account controller ran with its own SA credentials: RBAC and tokens work.
        self._wait(
            deadline,
            "ServiceAccount default/default",
            lambda: self._api_get("/api/v1/namespaces/default/serviceaccounts/default") is not None,
        )

    def stop(self, *, keep_work: bool = False) -> None:
        """Kill every component (whole process groups) and delete the data dirs. Idempotent;
        logs stay in ``log_dir``."""
        self._stopped = True
        self._stop_components()
        process.unregister(self)
        if not keep_work:
            shutil.rmtree(self._work, ignore_errors=True)

    def _stop_components(self) -> None:
        for comp in reversed(self._components):
            comp.stop()

    @property
    def pids(self) -> list[int]:
        """Process ids of the components started so far (running or not)."""
        return [c.pid for c in self._components if c.pid is not None]

    def running(self) -> bool:
        """True while every started component is alive."""
        return bool(self._components) and all(c.running() for c in self._components)

    def restart_apiserver(self, down_seconds: float = 0.0, timeout: float = 60.0) -> None:
        """Stop kube-apiserver, keep it down ``down_seconds``, start it again on the same port
        and wait for ``/readyz`` (for tests of client recovery). etcd keeps the data."""
        comp = next(c for c in self._components if c.name == "kube-apiserver")
        comp.stop()
        if down_seconds > 0:
            time.sleep(down_seconds)
        comp.start()
        self._wait(
            time.monotonic() + timeout,
            "kube-apiserver /readyz after restart",
            lambda: self._api_get("/readyz") == "ok",
        )

    # ----------------------------------------------------------------- plumbing

    def _write_files(self) -> None:
        (self._work / "kwok-home").mkdir(exist_ok=True)
        tokens = self._work / "tokens.csv"
        tokens.write_text(
            f'{self.admin_token},kai-admin,kai-admin-uid,"system:masters"\n'
            f"{self._kcm_token},system:kube-controller-manager,kcm-uid\n"
            f'{self._kwok_token},kwok-controller,kwok-uid,"system:masters"\n'
            + "".join(
                _token_line(self.user_tokens[user], user, f"static-{i}-uid", groups)
                for i, (user, groups) in enumerate(self._static_users.items())
            )
        )
        tokens.chmod(0o600)
        if self._audit_policy is not None:
            # JSON is valid YAML, which is what --audit-policy-file reads.
            (self._work / "audit-policy.json").write_text(json.dumps(self._audit_policy))
        self._write_kubeconfig(self.kubeconfig, self.admin_token, "kai-admin")
        self._write_kubeconfig(self._work / "kcm.kubeconfig", self._kcm_token, "kcm")
        self._write_kubeconfig(self._work / "kwok.kubeconfig", self._kwok_token, "kwok")

    def _write_kubeconfig(self, path: Path, token: str, user: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "kai-testenv",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": user, "context": {"cluster": "kai-testenv", "user": user}}],
            "current-context": user,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2))  # JSON is valid kubeconfig YAML
        path.chmod(0o600)

    def _spawn(self, name: str, argv: list[str], extra_env: dict[str, str] | None = None) -> None:
        env = {**os.environ, RUN_ENV: self.run_id, **(extra_env or {})}
        env.pop("KUBECONFIG", None)
        comp = process.Component(name, argv, self.log_dir / f"{name}.log", env)
        self._components.append(comp)
        comp.start()

    def _wait(self, deadline: float, what: str, ready: Callable[[], bool]) -> None:
        while True:
            for comp in self._components:
                code = comp.exit_code()
                if code is not None:
                    log = _tail(comp.log_path, 400)
                    if "address already in use" in log:
                        raise _PortClash(comp.name)
                    raise ControlPlaneError(
                        f"{comp.name} exited with code {code} while waiting for {what}; "
                        f"log {comp.log_path}:\n{_tail(comp.log_path, 40)}"
                    )
            with contextlib.suppress(OSError, ValueError):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"timed out after {self.startup_timeout:.0f}s waiting for {what}; "
                    f"logs in {self.log_dir}:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def _ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def _api_get(self, path: str) -> str | None:
        """GET path as admin; the body on 200, None on 404; raises OSError otherwise."""
        req = urllib.request.Request(
            self.server + path, headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        try:
            with urllib.request.urlopen(req, context=self._ssl_context(), timeout=5) as resp:
                body: bytes = resp.read()
                return body.decode()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def _etcd_healthy(self) -> bool:
        url = f"http://127.0.0.1:{self._etcd_port}/health"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")

    def _kcm_healthy(self) -> bool:
        # kcm serves a self-signed certificate: this probe checks liveness, not identity.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        url = f"https://127.0.0.1:{self._kcm_port}/healthz"
        with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
            return bool(resp.status == 200)

    def _kwok_healthy(self) -> bool:
        url = f"http://127.0.0.1:{self._kwok_port}/healthz"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)

    # ----------------------------------------------------------------- argv

    def _etcd_argv(self) -> list[str]:
        client = f"http://127.0.0.1:{self._etcd_port}"
        peer = f"http://127.0.0.1:{self._peer_port}"
        return [
            str(self.bin_dir / "etcd"),
            "--name=testenv",
            f"--data-dir={self._work / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=testenv={peer}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",  # throwaway data: durability only costs time
            "--log-level=warn",
        ]

    def _audit_argv(self) -> list[str]:
        if self.audit_log is None:
            return []
        return [
            f"--audit-policy-file={self._work / 'audit-policy.json'}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-maxsize=0",  # one file: readers keep byte offsets into it
            "--audit-log-mode=blocking",  # an event is on disk before its response is sent
        ]

    def _apiserver_argv(self) -> list[str]:
        pki = self._pki_dir
        return [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self._etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self._api_port}",
            f"--cert-dir={self._work / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={self.ca_file}",
            f"--token-auth-file={self._work / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # No endpoints for the `kubernetes` Service: nothing in the tests dials it.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
            *self._audit_argv(),
        ]

    def _kcm_argv(self) -> list[str]:
        pki = self._pki_dir
        return [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={self._work / 'kcm.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self._kcm_port}",
            f"--cert-dir={self._work / 'kcm-certs'}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={self.ca_file}",
            f"--cluster-signing-cert-file={self.ca_file}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--cluster-name=kai-testenv",
            "--profiling=false",
        ]

    def _kwok_argv(self) -> list[str]:
        # With no Stage config kwok uses its default node stages (initialize, heartbeat, with
        # leases) and pod stages (ready -> Running, complete, delete).
        return [
            str(self.bin_dir / "kwok"),
            f"--kubeconfig={self._work / 'kwok.kubeconfig'}",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}",
            f"--server-address=127.0.0.1:{self._kwok_port}",
            "--node-lease-duration-seconds=40",
            "--cidr=10.0.0.1/16",  # fake pod IPs; /24 would run out past ~250 pods
        ]

    # ----------------------------------------------------------------- public helpers

    def _run(
        self,
        tool: str,
        argv: Sequence[str],
        *,
        input: str | None,
        check: bool,
        timeout: float,
        env: dict[str, str],
    ) -> subprocess.CompletedProcess[str]:
        shown = " ".join(argv[1:])
        try:
            result = subprocess.run(
                list(argv),
                input=input,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ControlPlaneError(f"{tool} {shown} timed out after {timeout}s") from exc
        if check and result.returncode != 0:
            raise CommandError(
                f"{tool} {shown} failed (exit {result.returncode})\n"
                f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}",
                result,
            )
        return result

    def _tool_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        return env

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl (admin kubeconfig unless ``kubeconfig`` is given)."""
        argv = [str(self.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}"]
        return self._run(
            "kubectl", [*argv, *args], input=input, check=check, timeout=timeout,
            env=self._tool_env(),
        )  # fmt: skip

    def helm(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built helm against this control plane, with helm's own state kept in the
        control plane's temp dir."""
        env = self._tool_env()
        for var, sub in (
            ("HELM_CACHE_HOME", "cache"),
            ("HELM_CONFIG_HOME", "config"),
            ("HELM_DATA_HOME", "data"),
        ):
            env[var] = str(self._work / "helm" / sub)
        env["KUBECONFIG"] = str(kubeconfig or self.kubeconfig)
        argv = [str(self.bin_dir / "helm"), f"--kubeconfig={kubeconfig or self.kubeconfig}"]
        return self._run("helm", [*argv, *args], input=input, check=check, timeout=timeout, env=env)

    def service_account_token(self, namespace: str, name: str) -> str:
        """A fresh token for ServiceAccount namespace/name (TokenRequest API)."""
        out = self.kubectl("create", "token", name, "-n", namespace, "--duration=2h").stdout
        return out.strip()

    def kubeconfig_for_user(self, user: str) -> Path:
        """A kubeconfig authenticating as one of ``static_users``; returns its path."""
        if user not in self.user_tokens:
            raise KeyError(f"{user!r} is not a static user of this control plane")
        return self.kubeconfig_for_token(self.user_tokens[user], user)

    def kubeconfig_for_token(self, token: str, name: str) -> Path:
        """Write a kubeconfig that authenticates with `token`; returns its path."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "user"
        path = self._work / "kubeconfigs" / f"{safe}.kubeconfig"
        self._write_kubeconfig(path, token, safe)
        return path

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of each component's log, one section per component."""
        parts = [
            f"==> {c.name} ({c.log_path}) <==\n{_tail(c.log_path, lines)}" for c in self._components
        ]
        return "\n".join(parts) if parts else f"(no component started; logs in {self.log_dir})"


class _PortClash(ControlPlaneError):
    """A component could not bind its port."""
