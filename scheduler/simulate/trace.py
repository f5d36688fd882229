"""GPU cluster traces in the Alibaba ``openb`` CSV format, and how a replay reorders them.

The node list has ``sn,cpu_milli,memory_mib,gpu,model``; the pod list has
``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...`` (extra columns are ignored). See
``shared/traces/alibaba-gpu-v2023-openb/README.md``.

A replay takes the pods in file order after three optional, seeded steps:

- :func:`remix` re-samples the pod list to another type mix (more fractional, multi-GPU,
  model-constrained or CPU-only pods), to check a policy is not tuned to one file;
- :func:`shuffle_pods` shuffles the order;
- :func:`inflate` appends randomly re-sampled copies until the total GPU request reaches a
  multiple of the cluster's GPU capacity (the FGD paper's "tune" of 1.3).

Before them, ``--slice START:END`` may cut the pod list to a part of it, by arrival index or
by ``creation_time`` (:mod:`scheduler.simulate.trace_slice`).
"""

from __future__ import annotations

import argparse
import csv
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from scheduler.cluster.node import GPU_MILLI, GPU_MODEL_LABEL, Node
from scheduler.cluster.pod import GpuRequest, Pod
from scheduler.cluster.resources import CPU, GPU, MEMORY, Resources
from scheduler.cluster.selectors import NodeSelectorRequirement, NodeSelectorTerm

__all__ = [
    "DEFAULT_NODES",
    "DEFAULT_PODS",
    "MIX_KEYS",
    "TraceError",
    "TraceNode",
    "TracePod",
    "add_trace_arguments",
    "arrival_order",
    "default_trace_file",
    "gpu_capacity_milli",
    "inflate",
    "load_nodes",
    "load_pods",
    "load_trace_args",
    "openb_dir",
    "parse_mix",
    "remix",
    "shuffle_pods",
    "to_node",
    "to_pod",
]

#: Knobs accepted by :func:`remix` / ``--mix``: the share each kind of pod should have.
MIX_KEYS = ("gpushare", "multigpu", "gpuspec", "cpuonly")


class TraceError(ValueError):
    """A trace file or option is malformed; the message names the file, row and field."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One node of the trace: capacity and GPU model ('' for CPU-only nodes)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    """One task of the trace.

    ``gpu_milli`` is the share of each of ``num_gpu`` devices (1000 = whole); ``gpu_spec`` the
    allowed GPU models (empty = any model).
    """

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...] = ()
    #: ``creation_time`` in trace seconds (None when the file has none); only ``--slice``
    #: by time reads it, the replay itself takes pods in list order.
    created: float | None = None

    @property
    def gpu_request_milli(self) -> int:
        """Total GPU thousandths requested (what counts as arrived workload)."""
        return self.num_gpu * self.gpu_milli

    @property
    def fractional(self) -> bool:
        """True for a GPU-sharing task (part of one device)."""
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI


def _read_rows(path: Path, required: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(
                    f"{path}: missing column(s) {', '.join(missing)}; "
                    f"expected a header with {', '.join(required)}"
                )
            return [(i + 2, row) for i, row in enumerate(reader)]
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror}); pass an existing CSV file") from e


def _int(path: Path, line: int, row: dict[str, str], column: str, *, lo: int = 0) -> int:
    raw = (row.get(column) or "").strip()
    try:
        value = int(float(raw)) if raw else 0
    except ValueError as e:
        raise TraceError(
            f"{path}:{line}: column {column!r} is {raw!r}; it must be a whole number"
        ) from e
    if value < lo:
        raise TraceError(f"{path}:{line}: column {column!r} is {value}; it must be >= {lo}")
    return value


def load_nodes(path: str | Path) -> list[TraceNode]:
    """Read an openb node list. Raises :class:`TraceError` naming the row and column."""
    p = Path(path)
    out: list[TraceNode] = []
    seen: set[str] = set()
    for line, row in _read_rows(p, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        name = (row.get("sn") or "").strip()
        if not name or name in seen:
            raise TraceError(f"{p}:{line}: column 'sn' is {name!r}; node names must be unique")
        seen.add(name)
        gpus = _int(p, line, row, "gpu")
        model = (row.get("model") or "").strip()
        if gpus and not model:
            raise TraceError(f"{p}:{line}: node {name} has {gpus} GPUs but no 'model'")
        out.append(
            TraceNode(
                name,
                _int(p, line, row, "cpu_milli"),
                _int(p, line, row, "memory_mib"),
                gpus,
                model,
            )
        )
    if not out:
        raise TraceError(f"{p}: no nodes; the file needs at least one data row")
    return out


def load_pods(path: str | Path) -> list[TracePod]:
    """Read an openb pod list. Raises :class:`TraceError` naming the row and column."""
    p = Path(path)
    out: list[TracePod] = []
    cols = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
    for line, row in _read_rows(p, cols):
        name = (row.get("name") or "").strip()
        if not name:
            raise TraceError(f"{p}:{line}: column 'name' is empty; every pod needs a name")
        num_gpu = _int(p, line, row, "num_gpu")
        milli = _int(p, line, row, "gpu_milli")
        if num_gpu == 0:
            milli = 0
        elif not 0 < milli <= GPU_MILLI:
            raise TraceError(
                f"{p}:{line}: pod {name} asks for {num_gpu} GPU(s) with gpu_milli={milli}; "
                f"gpu_milli must be in 1..{GPU_MILLI}"
            )
        elif num_gpu > 1 and milli != GPU_MILLI:
            raise TraceError(
                f"{p}:{line}: pod {name} shares a GPU (gpu_milli={milli}) across {num_gpu} "
                "devices; only single-GPU pods may take part of a device"
            )
        spec = tuple(sorted({s.strip() for s in (row.get("gpu_spec") or "").split("|")} - {""}))
        created = _int(p, line, row, "creation_time") if row.get("creation_time") else None
        out.append(
            TracePod(
                name,
                _int(p, line, row, "cpu_milli"),
                _int(p, line, row, "memory_mib"),
                num_gpu,
                milli,
                spec,
                None if created is None else float(created),
            )
        )
    if not out:
        raise TraceError(f"{p}: no pods; the file needs at least one data row")
    return out


def gpu_capacity_milli(nodes: Iterable[TraceNode]) -> int:
    """Cluster GPU capacity in thousandths."""
    return sum(n.gpus for n in nodes) * GPU_MILLI


def shuffle_pods(pods: Sequence[TracePod], seed: int) -> list[TracePod]:
    """A seeded shuffle (the same seed always gives the same order)."""
    out = list(pods)
    random.Random(seed).shuffle(out)
    return out


def inflate(
    pods: Sequence[TracePod], factor: float, capacity_milli: int, seed: int
) -> list[TracePod]:
    """Append re-sampled copies until total GPU request >= ``factor`` x ``capacity_milli``.

    Copies are drawn uniformly (with replacement) from ``pods`` and renamed ``<name>-c<n>`` so
    every arriving pod has a unique name. A factor the list already meets adds nothing.
    """
    if factor <= 0:
        raise TraceError(f"--inflate is {factor}; it must be a positive multiple such as 1.3")
    out = list(pods)
    total = sum(p.gpu_request_milli for p in out)
    target = factor * capacity_milli
    if total >= target:
        return out
    if not any(p.gpu_request_milli for p in pods):
        raise TraceError("--inflate needs GPU pods in the pod list; this list has none")
    rng = random.Random(seed * 7919 + 1)
    n = 0
    while total < target:
        src = pods[rng.randrange(len(pods))]
        n += 1
        out.append(replace(src, name=f"{src.name}-c{n}"))
        total += src.gpu_request_milli
    return out


def parse_mix(text: str | None) -> dict[str, float]:
    """Parse ``--mix gpushare=0.6,multigpu=0.1`` into ``{knob: share}``."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or key not in MIX_KEYS:
            raise TraceError(
                f"--mix entry {part!r} is not KNOB=SHARE; knobs are {', '.join(MIX_KEYS)}"
            )
        try:
            share = float(raw)
        except ValueError as e:
            raise TraceError(f"--mix {key}={raw!r}: the share must be a number in [0, 1)") from e
        if not 0 <= share < 1:
            raise TraceError(f"--mix {key}={share}: the share must be in [0, 1)")
        out[key] = share
    return out


def _resample_share(
    pods: list[TracePod],
    rng: random.Random,
    population: Sequence[int],
    is_kind: Sequence[bool],
    share: float,
) -> None:
    """Replace pods (indices in ``population``) by copies of the kind until its share is met."""
    kind = [i for i, k in zip(population, is_kind, strict=True) if k]
    other = [i for i, k in zip(population, is_kind, strict=True) if not k]
    want = round(share * len(population))
    if len(kind) < want and kind and other:
        donors = [pods[i] for i in kind]
        for i in rng.sample(other, min(len(other), want - len(kind))):
            pods[i] = replace(rng.choice(donors), name=pods[i].name)
    elif len(kind) > want and other:
        donors = [pods[i] for i in other]
        for i in rng.sample(kind, len(kind) - want):
            pods[i] = replace(rng.choice(donors), name=pods[i].name)


def remix(
    pods: Sequence[TracePod], mix: dict[str, float], nodes: Sequence[TraceNode], seed: int
) -> list[TracePod]:
    """Re-sample ``pods`` towards another type mix; names are kept, so each stays unique.

    - ``cpuonly``: share of all pods that ask for no GPU;
    - ``gpushare``: share of GPU pods that take part of one device;
    - ``multigpu``: share of GPU pods that take more than one device;
    - ``gpuspec``: share of GPU pods restricted to one GPU model, drawn in proportion to the
      models' GPU counts among nodes big enough for the pod.
    """
    rng = random.Random(seed * 104729 + 17)
    out = list(pods)
    if "cpuonly" in mix:
        idx = list(range(len(out)))
        _resample_share(out, rng, idx, [p.num_gpu == 0 for p in out], mix["cpuonly"])
    gpu_idx = [i for i, p in enumerate(out) if p.num_gpu]
    if "gpushare" in mix:
        _resample_share(out, rng, gpu_idx, [out[i].fractional for i in gpu_idx], mix["gpushare"])
    if "multigpu" in mix:
        _resample_share(out, rng, gpu_idx, [out[i].num_gpu > 1 for i in gpu_idx], mix["multigpu"])
    if mix.get("gpuspec"):
        for i in gpu_idx:
            if out[i].gpu_spec or rng.random() >= mix["gpuspec"]:
                continue
            fit = [n for n in nodes if n.gpus >= out[i].num_gpu and n.model]
            if fit:
                model = rng.choices([n.model for n in fit], [n.gpus for n in fit])[0]
                out[i] = replace(out[i], gpu_spec=(model,))
    return out


#: The shared trace folder, relative to the folder that holds this repository's checkout.
_OPENB_IN_SHARED = Path("shared/traces/alibaba-gpu-v2023-openb")
DEFAULT_NODES = "openb_node_list_gpu_node.csv"
DEFAULT_PODS = "openb_pod_list_default.csv"


def openb_dir() -> Path:
    """Where the openb CSVs live unless ``--nodes``/``--pods`` say otherwise.

    ``$KAI_OPENB_DIR`` first; else the ``shared/`` folder beside the checkout (where the team's
    machines and CI keep it), else ``/work/shared``.
    """
    if env := os.environ.get("KAI_OPENB_DIR"):
        return Path(env)
    beside_checkout = Path(__file__).resolve().parents[3] / _OPENB_IN_SHARED
    return beside_checkout if beside_checkout.is_dir() else Path("/work") / _OPENB_IN_SHARED


def default_trace_file(name: str) -> str | None:
    """The default openb file ``name`` if it exists (see :func:`openb_dir`)."""
    path = openb_dir() / name
    return str(path) if path.is_file() else None


def arrival_order(
    pods: Sequence[TracePod],
    nodes: Sequence[TraceNode],
    *,
    seed: int | None = None,
    inflate_to: float | None = None,
    mix: dict[str, float] | None = None,
) -> list[TracePod]:
    """The pods in the order a replay sees them: remixed, shuffled, then inflated.

    Each step uses ``seed`` (0 when no shuffle seed is given), so a run is reproducible.
    """
    s = 0 if seed is None else seed
    out = remix(pods, mix, nodes, s) if mix else list(pods)
    if seed is not None:
        out = shuffle_pods(out, seed)
    if inflate_to is not None:
        out = inflate(out, inflate_to, gpu_capacity_milli(nodes), s)
    return out


def to_node(node: TraceNode) -> Node:
    """The trace node as a domain :class:`Node` (GPU model in the GPU product label)."""
    labels = ((GPU_MODEL_LABEL, node.model),) if node.model else ()
    allocatable = {CPU: node.cpu_milli, MEMORY: node.memory_mib << 20, GPU: node.gpus}
    return Node(node.name, Resources(allocatable), labels=labels)


def to_pod(pod: TracePod, namespace: str = "trace", queue: str = "trace") -> Pod:
    """The trace task as a pending domain :class:`Pod`, its own implicit gang.

    ``gpu_spec`` becomes required node affinity on the GPU model label; whole-GPU pods ask
    ``nvidia.com/gpu``, fractional ones carry only the :class:`GpuRequest`.
    """
    requests = {CPU: pod.cpu_milli, MEMORY: pod.memory_mib << 20}
    if pod.num_gpu and not pod.fractional:
        requests[GPU] = pod.num_gpu
    affinity: tuple[NodeSelectorTerm, ...] = ()
    if pod.gpu_spec and pod.num_gpu:
        req = NodeSelectorRequirement(GPU_MODEL_LABEL, "In", pod.gpu_spec)
        affinity = (NodeSelectorTerm((req,)),)
    return Pod(
        uid=pod.name,
        namespace=namespace,
        name=pod.name,
        requests=Resources(requests),
        gpu=GpuRequest(pod.num_gpu, pod.gpu_milli) if pod.num_gpu else None,
        affinity=affinity,
        gang=f"{namespace}/{pod.name}",
        queue=queue,
    )


# --- command line flags (``kai-scheduler simulate --trace openb``) --------------------------


def _has_option(parser: argparse.ArgumentParser, flag: str) -> bool:
    return any(flag in a.option_strings for a in parser._actions)


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the trace-replay flags to ``parser`` (skipping any it already has, e.g. --json)."""
    g = parser.add_argument_group("trace replay (--trace openb)")
    g.add_argument("--trace", choices=["openb"], default=None, help="replay a trace")
    g.add_argument("--nodes", metavar="NODES.csv", help="openb node list")
    g.add_argument("--pods", metavar="PODS.csv", help="openb pod list")
    g.add_argument("--shuffle-seed", type=int, default=None, metavar="S", help="shuffle pods")
    g.add_argument(
        "--inflate",
        type=float,
        default=None,
        metavar="X",
        help="append re-sampled pods until GPU demand is X times capacity (e.g. 1.3)",
    )
    g.add_argument("--batch", type=int, default=1, metavar="B", help="pods per cycle")
    g.add_argument(
        "--drop-unplaced",
        action="store_true",
        help="drop a pod not placed in the first cycle that sees it (FGD paper rule)",
    )
    g.add_argument("--placements", metavar="OUT.jsonl", help="write one line per placed pod")
    g.add_argument(
        "--mix",
        default=None,
        metavar="KNOB=SHARE,...",
        help=f"re-sample the pod list first; knobs: {', '.join(MIX_KEYS)}",
    )
    g.add_argument(
        "--policy",
        choices=["frag", "fgd", "bestfit", "paper-bestfit"],
        default="frag",
        help="placement policy (frag: ours; fgd, bestfit, paper-bestfit: baselines)",
    )
    g.add_argument(
        "--hold-stranding",
        action="store_true",
        help="policy frag, engines greedy and cycle: placement.holdStrandingShares (a share "
        "waits rather than strand an idle device once GPU capacity is scarce)",
    )
    g.add_argument(
        "--engine",
        choices=["auto", "cycle", "greedy", "arrays"],
        default="auto",
        help="cycle: every cycle is the live scheduler's (snapshot, fair share, greedy + "
        "CP-SAT, commit) on an in-memory cluster; greedy: only its placement pass "
        "(scheduler.solver.place_gangs), state kept across cycles; arrays: a vectorised "
        "re-implementation of the frag policy (fast cross-check, and the fgd baseline); "
        "auto: cycle for --batch > 1 (arrays for fgd); for --batch 1 greedy (frag) or "
        "arrays (baselines)",
    )
    g.add_argument(
        "--slice",
        default=None,
        metavar="START:END",
        help="replay only part of the pod list (before --mix/--shuffle-seed/--inflate): "
        "arrival indices (0:1000, -500:) or creation times with a unit (0:7d, 12h:36h)",
    )
    if not _has_option(parser, "--json"):
        g.add_argument("--json", action="store_true", help="print the summary as JSON")
    if not _has_option(parser, "--out"):
        g.add_argument("--out", metavar="DIR", default=None, help="write PNG plots into DIR")


def load_trace_args(args: argparse.Namespace) -> tuple[list[TraceNode], list[TracePod]]:
    """Nodes and the arrival-ordered pods the flags describe. Raises TraceError."""
    nodes_path = args.nodes or default_trace_file(DEFAULT_NODES)
    pods_path = args.pods or default_trace_file(DEFAULT_PODS)
    if not nodes_path or not pods_path:
        raise TraceError("--nodes and --pods are required (openb CSV files)")
    if args.batch < 1:
        raise TraceError(f"--batch is {args.batch}; it must be at least 1")
    nodes = load_nodes(nodes_path)
    listed = load_pods(pods_path)
    if getattr(args, "slice", None):
        from scheduler.simulate.trace_slice import parse_slice, slice_pods

        listed = slice_pods(listed, parse_slice(args.slice))
    pods = arrival_order(
        listed,
        nodes,
        seed=args.shuffle_seed,
        inflate_to=args.inflate,
        mix=parse_mix(args.mix),
    )
    return nodes, pods
