"""What the benches comparing ours with NVIDIA KAI-Scheduler share (``takeback-diff``,
:mod:`scheduler.bench.takeback_diff`; ``podgrouper-diff``, :mod:`scheduler.bench.podgrouper_diff`):
both run ours, then KAI, on one control plane, so each needs its own CRDs applied in turn
(:func:`apply_our_crds`, :func:`apply_kai_crds`); KAI built on demand (:func:`kai_dir`); the
default queues and PriorityClasses (:func:`apply_our_defaults`); the pinned versions for the
JSON output (:func:`pinned_versions`); and progress lines on stderr (:func:`log`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from scheduler.bench import e2e_peers as peers
from testenv import ControlPlane

__all__ = [
    "REPO",
    "apply_kai_crds",
    "apply_our_crds",
    "apply_our_defaults",
    "kai_dir",
    "log",
    "pinned_versions",
]

REPO = peers.REPO


def log(bench: str, message: str) -> None:
    """A progress line of ``bench`` on stderr (stdout carries only the JSON result)."""
    print(f"[{bench} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def apply_our_crds(cp: ControlPlane) -> None:
    """Apply our CRDs and wait until the Queue and PodGroup CRDs are Established."""
    # Server-side with force: KAI's CRDs (applied the same way) may own the fields now.
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"), timeout=120)
    cp.kubectl(
        "wait", "--for", "condition=Established", "--timeout=60s",
        "crd/queues.scheduling.run.ai", "crd/podgroups.scheduling.run.ai",
    )  # fmt: skip


def apply_kai_crds(cp: ControlPlane, path: Path, timeout: float = 60.0) -> None:
    """Apply KAI's CRDs and wait until each is Established. ``kubectl wait`` fails outright
    on a CRD created a moment ago (no ``status.conditions`` yet), which is the case for KAI's
    BindRequest on a plane that had only ours, so poll instead."""
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path / "crds"), timeout=120)
    deadline = time.monotonic() + timeout
    while True:
        crds = json.loads(cp.kubectl("get", "-f", str(path / "crds"), "-o", "json").stdout)
        pending = [
            c["metadata"]["name"]
            for c in crds.get("items", [])
            if not any(
                cond.get("type") == "Established" and cond.get("status") == "True"
                for cond in (c.get("status") or {}).get("conditions") or []
            )
        ]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"KAI CRDs not Established after {timeout}s: {pending}")
        time.sleep(0.3)


def apply_our_defaults(cp: ControlPlane) -> None:
    """Our CRDs, the default queues and the PriorityClasses both schedulers use."""
    apply_our_crds(cp)
    cp.kubectl("apply", "-f", str(REPO / "manifests" / "defaults"))
    cp.kubectl("apply", "-f", str(REPO / "manifests" / "60-priorityclasses.yaml"))


def kai_dir() -> Path:
    """KAI's binaries, CRDs and RBAC, built (or found in the cache) by build_peers.sh."""
    script = REPO / "testenv" / "build_peers.sh"
    # Logged as takeback-diff by both benches (this was takeback-diff's, which podgrouper-diff
    # used as it was).
    log("takeback-diff", f"building/checking KAI-Scheduler with {script} ...")
    subprocess.run([str(script), "kai"], check=True, stdout=sys.stderr, cwd=REPO)
    return (REPO / ".cache" / "peer-bin" / "kai").resolve()


def pinned_versions() -> dict[str, str]:
    """The versions testenv pins (testenv/versions.env: ``NAME=value`` lines)."""
    return dict(
        line.split("=", 1)
        for line in (REPO / "testenv" / "versions.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
