"""Child processes of the control plane: one process group each, logs to a file, and a
registry that stops every live control plane at exit and on SIGINT/SIGTERM."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Protocol

__all__ = ["Component", "Stoppable", "register", "unregister"]

_SETPRIV = shutil.which("setpriv")


class Component:
    """One long-running binary (etcd, kube-apiserver, ...) in its own process group."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str]
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The process id, once started."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Launch the binary with stdout and stderr appended to its log file."""
        argv = self.argv
        # If this interpreter is killed outright (SIGKILL), the kernel kills the child too.
        # Only from the main thread: the death signal fires when the *spawning thread* exits.
        if _SETPRIV and threading.current_thread() is threading.main_thread():
            argv = [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"# {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # own process group: stop() kills it whole
            )

    def exit_code(self) -> int | None:
        """None while running, else the exit status."""
        return self._proc.poll() if self._proc is not None else None

    def running(self) -> bool:
        """Started and not exited."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds, and reap the leader."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # The leader is gone; sweep any straggler left in its group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


class Stoppable(Protocol):
    """Anything the registry can stop (a ControlPlane)."""

    def stop(self) -> None: ...


_live: dict[int, Stoppable] = {}
_installed = False
_previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}


def _stop_all() -> None:
    for obj in list(_live.values()):
        with contextlib.suppress(Exception):
            obj.stop()
    _live.clear()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _stop_all()
    previous = _previous.get(signum)
    if callable(previous):
        previous(signum, frame)  # e.g. Python's default SIGINT handler: KeyboardInterrupt
    elif previous == signal.SIG_IGN:
        return
    else:  # SIG_DFL or unknown: die of the same signal, as the default would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(_stop_all)
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; atexit still applies
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        if previous == signal.SIG_IGN:
            continue  # e.g. SIGINT in a background job: the signal is not meant to stop us
        _previous[sig] = previous
        signal.signal(sig, _on_signal)


def register(obj: Stoppable) -> None:
    """Stop `obj` at interpreter exit and on SIGINT/SIGTERM unless unregistered first."""
    _install()
    _live[id(obj)] = obj


def unregister(obj: Stoppable) -> None:
    """Forget `obj` (after it was stopped)."""
    _live.pop(id(obj), None)
