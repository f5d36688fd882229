"""What ``kai-scheduler simulate FILE... [--nodes NODES.yaml]`` reads: one scenario, or manifests.

- One file with one document without ``kind``: a scenario (:mod:`scheduler.simulate.scenario`).
- Otherwise every document with a ``kind`` is a Kubernetes manifest
  (:mod:`scheduler.simulate.manifests`); at most one document without ``kind`` may come along
  as the scenario part (``name``, ``settings``, ``nodes``, ``queues``, ... as in a scenario).
  ``--nodes`` names a file of nodes: ``kind: SimulatedNodes`` documents, Node objects (e.g.
  ``kubectl get nodes -o yaml``), or a plain list of node shapes.

Errors raise :class:`~scheduler.simulate.fields.ScenarioError`. An error found while checking
the assembled scenario names the manifest it came from (``queues.yaml document 2 (Queue
team-a)``), not the scenario list entry it was turned into.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from scheduler.simulate.fields import ScenarioError
from scheduler.simulate.loader import load_documents
from scheduler.simulate.manifests import Assembly, Document, assemble
from scheduler.simulate.scenario import Scenario, parse_scenario

__all__ = ["BIG_INPUT_BYTES", "load_inputs", "print_note"]

#: Inputs at least this big get a line on stderr before and after loading (it takes seconds).
BIG_INPUT_BYTES = 1_000_000
_ENTRY = re.compile(r"^(jobs|queues|podGroups|nodes)\[(\d+)\]\.?(.*)$")


def _documents(path: str) -> list[Document]:
    docs = load_documents(path)
    if len(docs) == 1:
        return [Document(docs[0], path)]
    return [Document(d, f"{path} document {i + 1}") for i, d in enumerate(docs)]


def _is_manifest(doc: Document) -> bool:
    return isinstance(doc.obj, dict) and "kind" in doc.obj


def _node_documents(path: str) -> list[Document]:
    """``--nodes``: manifests, a list of shapes, or a mapping with ``nodes``."""
    out = []
    for doc in _documents(path):
        obj = doc.obj
        if isinstance(obj, list):
            obj = {"kind": "SimulatedNodes", "nodes": obj}
        elif isinstance(obj, dict) and "kind" not in obj and "nodes" in obj:
            obj = {"kind": "SimulatedNodes", **obj}
        if not (isinstance(obj, dict) and obj.get("kind") in ("SimulatedNodes", "Node", "List")):
            raise ScenarioError(
                f"--nodes {doc.where}",
                "expected kind: SimulatedNodes (nodes: [shapes]), Node objects or a list of "
                "node shapes such as {name: dgx, count: 2, gpus: 8, cpu: 64, memory: 512Gi}",
            )
        out.append(Document(obj, doc.where))
    return out


def _remap(e: ScenarioError, asm: Assembly) -> ScenarioError:
    """Point an error on an assembled list entry back at the manifest it came from."""
    m = _ENTRY.match(e.field)
    if not m:
        return e
    origins = asm.origins.get(m.group(1)) or []
    index = int(m.group(2))
    origin = origins[index] if index < len(origins) else None
    if origin is None:
        return e
    rest = m.group(3)
    if m.group(1) == "jobs":
        if rest.startswith("pods.template."):
            rest = asm.template_paths.get(index, "") + rest.removeprefix("pods.template.")
        name = (asm.data["jobs"][index] or {}).get("name")
        origin = f"{origin}, pod {name}"
    return ScenarioError(f"{origin}{': ' + rest if rest else ''}", e.message)


def load_inputs(
    paths: Sequence[str],
    *,
    nodes: str | None = None,
    note: Callable[[str], None] | None = None,
) -> Scenario:
    """Read and validate the inputs into one :class:`Scenario`; ``note`` receives progress
    lines for big inputs and notes on manifests (pods left out, grouper warnings)."""
    say = note or (lambda _line: None)
    total = sum(Path(p).stat().st_size for p in paths if Path(p).is_file())
    started = time.perf_counter()
    if total >= BIG_INPUT_BYTES:
        say(f"loading {', '.join(paths)} ({total / 1e6:.1f} MB)")
    documents: list[Document] = []
    for path in paths:
        documents.extend(_documents(path))
    if not documents:
        raise ScenarioError(paths[0], "the file is empty; see examples/simulate/quickstart.yaml")
    plain = [d for d in documents if not _is_manifest(d)]
    if len(paths) == 1 and len(documents) == 1 and plain and nodes is None:
        scenario = parse_scenario(plain[0].obj, default_name=Path(paths[0]).stem)
    else:
        scenario = _from_manifests(paths, documents, plain, nodes, say)
    if total >= BIG_INPUT_BYTES:
        pods = sum(len(j.pods) for j in scenario.jobs)
        say(
            f"loaded {len(scenario.jobs)} jobs ({pods} pods), {len(scenario.nodes)} nodes, "
            f"{len(scenario.queues)} queues in {time.perf_counter() - started:.1f} s"
        )
    return scenario


def _from_manifests(
    paths: Sequence[str],
    documents: list[Document],
    plain: list[Document],
    nodes: str | None,
    say: Callable[[str], None],
) -> Scenario:
    if len(plain) > 1:
        raise ScenarioError(
            plain[1].where,
            f"a second document without kind (the first is {plain[0].where}); give one "
            "scenario document at most, and Kubernetes objects (with kind) for the rest",
        )
    if plain and not isinstance(plain[0].obj, dict):
        raise ScenarioError(plain[0].where, "must be a mapping (a scenario) or an object with kind")
    manifests = [d for d in documents if _is_manifest(d)]
    if nodes is not None:
        manifests.extend(_node_documents(nodes))
    asm = assemble(plain[0].obj if plain else None, manifests)
    if not asm.data.get("nodes"):
        raise ScenarioError(
            "nodes",
            "the input has no nodes; give --nodes NODES.yaml (kind: SimulatedNodes with "
            "nodes: [{name: dgx, count: 2, gpus: 8}], or Node objects)",
        )
    asm.data.setdefault("queues", [])
    try:
        name = "+".join(Path(p).stem for p in paths)
        scenario = parse_scenario(asm.data, default_name=name)
    except ScenarioError as e:
        raise _remap(e, asm) from e
    for line in asm.notes:
        say(f"note: {line}")
    return scenario


def print_note(line: str) -> None:
    """Write a note line on stderr (the CLI's ``note``)."""
    print(f"kai-scheduler simulate: {line}", file=sys.stderr)
