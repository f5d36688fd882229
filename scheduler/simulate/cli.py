"""``kai-scheduler simulate``: run a scenario (or replay a trace) on an in-memory cluster.

Two modes share one subcommand::

    kai-scheduler simulate SCENARIO.yaml [--json] [--out DIR]
    kai-scheduler simulate MANIFESTS.yaml... --nodes NODES.yaml   # what users kubectl apply
    kai-scheduler simulate --trace openb --nodes NODES.csv --pods PODS.csv [trace flags]

The trace mode belongs to :mod:`scheduler.simulate.replay`; this module only hands over to it.
Exit codes: 0 the run completed, 2 bad input (the message names the field or flag), 1 the run
itself failed. Heavy imports (solver, matplotlib) happen only when a run starts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from scheduler.simulate.engine import SimulationResult

__all__ = ["add_parser", "configure_parser", "run"]

_DESCRIPTION = (
    "Run scheduling cycles in simulated time on an in-memory cluster described by a scenario "
    "file (nodes, queues, PodGroups, pods with arrival times and durations), then print per "
    "queue requested / allocated / fair share and per gang whether it was placed or why it "
    "waits. See examples/simulate/quickstart.yaml. With --trace, replay a GPU cluster trace "
    "instead (see the trace replay flags)."
)


def _replay_entry(name: str) -> Callable[..., Any] | None:
    """A function of the trace-replay module, looked up by name (it is optional here)."""
    try:
        module = importlib.import_module("scheduler.simulate.replay")
    except ImportError:
        return None
    entry = getattr(module, name, None)
    return entry if callable(entry) else None


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the simulate arguments (scenario mode, and trace mode if available)."""
    parser.add_argument(
        "scenario", nargs="?", metavar="SCENARIO.yaml", help="scenario file to simulate"
    )
    parser.add_argument(
        "more",
        nargs="*",
        metavar="MANIFESTS.yaml",
        help="more files: Kubernetes manifests (Queue, PodGroup, Pod, Job, Deployment, "
        "LeaderWorkerSet, ...) simulated as they are; see examples/simulate/README.md",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a machine-readable JSON summary instead"
    )
    parser.add_argument(
        "--out", metavar="DIR", default=None, help="write PNG plots of the run into DIR"
    )
    parser.add_argument("--no-progress", action="store_true", help="never show the progress bar")
    parser.add_argument(
        "--summary",
        action="store_true",
        help="print only the totals per queue and per outcome (no row per gang or eviction; "
        "with --json: no gangs, evictions, timeline lists)",
    )
    add_trace_arguments = _replay_entry("add_trace_arguments")
    if add_trace_arguments is not None:
        add_trace_arguments(parser)
    from scheduler.simulate.whatif import add_whatif_arguments

    add_whatif_arguments(parser)
    _nodes_flag(parser)
    parser.set_defaults(command="simulate")


def _nodes_flag(parser: argparse.ArgumentParser) -> None:
    """``--nodes`` is shared: openb CSV with --trace, a YAML file of nodes for manifests."""
    help_text = (
        "with --trace: the openb node CSV; with manifests: a YAML file of nodes "
        "(kind: SimulatedNodes, or Node objects)"
    )
    for action in parser._actions:
        if "--nodes" in action.option_strings:
            action.help = help_text
            return
    parser.add_argument("--nodes", metavar="NODES", default=None, help=help_text)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``simulate`` on the ``kai-scheduler`` subcommand parsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="simulate scheduling of a scenario or trace in simulated time",
        description=_DESCRIPTION,
        # The trace arguments come from another module; let a repeated flag (e.g. --out)
        # resolve instead of crashing the whole CLI.
        conflict_handler="resolve",
    )
    configure_parser(parser)
    parser.set_defaults(command="simulate")
    return parser


def _quiet_logs() -> None:
    """Cycle logs would bury the table: keep only warnings, on stderr."""
    import structlog

    def to_stderr(*_args: Any) -> structlog.PrintLogger:
        # Look stderr up on every call: it may be replaced (pytest capture, redirection).
        return structlog.PrintLogger(sys.stderr)

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=to_stderr,
        processors=[
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        cache_logger_on_first_use=False,
    )


def _simulated(now: float, horizon: float) -> str:
    from scheduler.simulate.report import format_time

    return f"{format_time(now)} / {format_time(horizon)} simulated"


def _pods(done: float, total: float) -> str:
    return f"{int(done)} / {int(total)} pods"


class _Progress:
    """A rich progress bar (over simulated time, or over a trace's pods), shown only once a
    run has taken a while."""

    #: Short runs finish before a bar would be readable; show it only after this long.
    DELAY_SECONDS = 0.5

    def __init__(
        self,
        console: Console,
        *,
        enabled: bool,
        describe: Callable[[float, float], str] = _simulated,
    ) -> None:
        self._console = console
        self._enabled = enabled
        self._describe = describe
        self._started = time.perf_counter()
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> _Progress:
        self._started = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, now: float, horizon: float) -> None:
        """Called by the engine after every step (of simulated time, or of a replay)."""
        if not self._enabled:
            return
        if self._bar is None:
            if time.perf_counter() - self._started < self.DELAY_SECONDS:
                return
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("simulating"),
                BarColumn(),
                TextColumn("{task.fields[sim]}"),
                TimeElapsedColumn(),
                console=self._console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("simulate", total=max(horizon, 1.0), sim="")
        assert self._task is not None
        self._bar.update(
            self._task,
            completed=now,
            total=max(horizon, now, 1.0),
            sim=self._describe(now, horizon),
        )

    def close(self) -> None:
        """Take the bar down for good (before the caller prints its report)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        self._enabled = False

    def update_until_done(self, done: float, total: float) -> None:
        """:meth:`update` for a run whose total is known: closes the bar at the end."""
        self.update(done, total)
        if done >= total:
            self.close()


def _lines(
    err: Console, args: argparse.Namespace, describe: Callable[[float, float], str] = _simulated
) -> Callable[[float, float], None] | None:
    """Plain progress lines on stderr when it is not a terminal (the bar needs one)."""
    if err.is_terminal or args.no_progress:
        return None
    from scheduler.simulate.progresslines import LineProgress

    return LineProgress(sys.stderr, describe).update


def _error(message: str) -> int:
    print(f"kai-scheduler simulate: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run the simulate subcommand; returns the process exit code."""
    if getattr(args, "snapshot", None):
        from scheduler.simulate.whatif import run_whatif

        return run_whatif(args)
    trace = getattr(args, "trace", None)
    if trace:
        if args.scenario:
            return _error("give a scenario file or --trace, not both")
        run_trace = _replay_entry("run_trace")
        if run_trace is None:
            return _error("trace replay (scheduler.simulate.replay) is not available")
        from rich.console import Console

        from scheduler.simulate.fields import ScenarioError
        from scheduler.simulate.loader import check_text_file
        from scheduler.simulate.progresslines import fan_out

        try:
            for flag in ("nodes", "pods"):
                # A missing file is the trace loader's to report (with its own hint).
                if getattr(args, flag, None) and os.path.isfile(getattr(args, flag)):
                    check_text_file(getattr(args, flag), f"--{flag}")
        except ScenarioError as e:
            return _error(str(e))
        err = Console(stderr=True)
        show = err.is_terminal and not args.no_progress and not args.json
        lines = _lines(err, args, _pods)
        with _Progress(err, enabled=show, describe=_pods) as progress:
            return int(run_trace(args, progress=fan_out(progress.update_until_done, lines)))
    if not args.scenario:
        return _error(
            "missing SCENARIO.yaml (or manifests with --nodes, or --trace openb); "
            "try: kai-scheduler simulate examples/simulate/quickstart.yaml"
        )
    _quiet_logs()
    from scheduler.simulate.inputs import load_inputs, print_note
    from scheduler.simulate.scenario import ScenarioError

    try:
        scenario = load_inputs(
            [args.scenario, *(getattr(args, "more", None) or [])],
            nodes=getattr(args, "nodes", None),
            note=print_note,
        )
    except ScenarioError as e:
        return _error(str(e))
    from rich.console import Console

    from scheduler.simulate.engine import simulate
    from scheduler.simulate.progresslines import fan_out

    err = Console(stderr=True)
    show = err.is_terminal and not args.no_progress and not args.json
    with _Progress(err, enabled=show) as progress:
        result = simulate(scenario, progress=fan_out(progress.update, _lines(err, args)))
    plots: list[str] = []
    if args.out:
        from scheduler.simulate.plots import write_plots

        try:
            plots = [str(p) for p in write_plots(result, args.out)]
        except OSError as e:
            return _error(f"--out {args.out}: cannot write plots ({e.strerror or e})")
    try:
        _print_result(result, plots, as_json=args.json, summary_only=args.summary)
    except BrokenPipeError:
        # The reader (e.g. ``| head``) went away; that is not a failure of the run.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _print_result(
    result: SimulationResult, plots: list[str], *, as_json: bool, summary_only: bool = False
) -> None:
    from rich.console import Console

    from scheduler.simulate.report import print_report, summary

    if as_json:
        data = summary(result, summary_only=summary_only)
        data["plots"] = plots
        print(json.dumps(data, indent=2))
    else:
        # Piped output would default to 80 columns and fold the reasons into slivers.
        console = Console() if sys.stdout.isatty() else Console(width=140)
        print_report(result, console, summary_only=summary_only)
        for p in plots:
            print(f"wrote {p}")
