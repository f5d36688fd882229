"""What the CP-SAT stage calls placement quality: an integer cost per node state.

The model (:mod:`scheduler.solver.cpsat`) decides how many nodes of each class take each
pattern, so the state a pattern leaves a node in is known, and the cost of a whole answer is
the sum over nodes of cost(after) - cost(before): the measure of what the *whole batch*
leaves free, not of each pod at the moment it was placed. Two measures, one per scorer:

- :class:`PackingQuality`: binpack/spread (:func:`scheduler.plugins.packing.node_cost`),
  small integers, the model's measure since the start.
- :class:`FragmentationQuality`: the fragmentation scorer's own measure
  (:mod:`scheduler.plugins.fragmentation`): the expected GPU thousandths a task of the
  cluster's mix could not use on the node, plus the model scarcity of the thousandths used
  there. Per pod, the greedy ranks nodes by the change of exactly this sum; the model
  minimises the change over the batch, so it can put a 190-thousandths pod beside the
  810 one of the same batch, or keep a whole device for the multi-GPU pod that comes later
  in the batch.

A cost lies in ``[0, span(node)]``; :class:`scheduler.solver.cpsat.Scale` uses the span
so that one unit of admission outweighs any quality change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from scheduler.cluster.node import GPU_MILLI, Node
from scheduler.cluster.resources import CPU, MEMORY
from scheduler.framework.scoring import NodeScorer
from scheduler.plugins.fragmentation import MIB, FragmentationScorer
from scheduler.plugins.packing import MAX_NODE_COST, PackingScorer, Strategy, node_cost

__all__ = ["FragmentationQuality", "NodeQuality", "PackingQuality", "quality_for"]

#: A node state as the patterns see it: free resources, free thousandths per device.
NodeState = tuple[Mapping[str, int], Sequence[int]]


class NodeQuality(Protocol):
    """An integer cost of a node state; lower is better."""

    #: True when the cost of a node with GPUs reads its devices alone: who measures states
    #: of such nodes need not follow their CPU and memory.
    devices_only: bool

    def costs(self, node: Node, states: Sequence[NodeState]) -> list[int]:
        """The cost of each state of ``node`` (one call per node class: a measure may
        compute them together)."""
        ...

    def span(self, node: Node) -> int:
        """An upper bound of the cost of any state of ``node`` (costs are never negative)."""
        ...

    def node_costs(self, items: Sequence[tuple[Node, NodeState]]) -> list[int]:
        """The cost of each (node, state) pair, nodes of any kind."""
        ...


class PackingQuality:
    """Binpack/spread: :func:`scheduler.plugins.packing.node_cost`."""

    #: :func:`node_cost` of a node with GPUs reads its devices alone.
    devices_only = True

    def __init__(self, gpu: Strategy, cpu: Strategy) -> None:
        self.gpu: Strategy = gpu
        self.cpu: Strategy = cpu

    def costs(self, node: Node, states: Sequence[NodeState]) -> list[int]:
        return [node_cost(node, free, gpu, self.gpu, self.cpu) for free, gpu in states]

    def span(self, node: Node) -> int:
        return MAX_NODE_COST

    def node_costs(self, items: Sequence[tuple[Node, NodeState]]) -> list[int]:
        return [node_cost(node, free, gpu, self.gpu, self.cpu) for node, (free, gpu) in items]


class FragmentationQuality:
    """The fragmentation scorer's measure as a node cost, in GPU thousandths (rounded).

    ``fragmentation(state) + w * scarcity(model) * used thousandths`` (the measure includes
    the scorer's share-price term when it has one): its change when a pod
    lands is the scorer's score of that placement (without the sub-unit packing
    tie-break), so greedy and model judge a placement alike. Counting *used* rather than
    taken thousandths keeps the cost non-negative; the difference is a constant per node.
    """

    #: Fragmentation reads CPU and memory too.
    devices_only = False

    def __init__(self, scorer: FragmentationScorer) -> None:
        self.scorer = scorer

    def _per_used(self, node: Node) -> float:
        model = node.gpu_model
        if not model or not self.scorer.scarcity:
            return 0.0
        return self.scorer.scarcity_weight * self.scorer.scarcity.get(model, 0.0)

    def costs(self, node: Node, states: Sequence[NodeState]) -> list[int]:
        return [max(0, round(c)) for c in self.exact_costs(node, states)]

    def exact_costs(self, node: Node, states: Sequence[NodeState]) -> list[float]:
        """The costs before rounding (the batch pass compares answers by them)."""
        rows = [
            (free.get(CPU, 0), free.get(MEMORY, 0) // MIB, tuple(max(0, f) for f in gpu))
            for free, gpu in states
        ]
        frag = self.scorer.node_fragmentations(rows, node.gpu_model)
        per_used = self._per_used(node)  # after the measure: it builds the scarcity first
        return [
            f + per_used * (GPU_MILLI * len(gpu) - sum(gpu))
            for (_, _, gpu), f in zip(rows, frag, strict=True)
        ]

    def node_costs(self, items: Sequence[tuple[Node, NodeState]]) -> list[int]:
        # The cost reads a node's model and devices only: nodes alike in both are measured
        # together (a cycle measures every node class of the cluster once).
        groups: dict[tuple[str | None, int], list[int]] = {}
        for i, (node, (_, gpu)) in enumerate(items):
            groups.setdefault((node.gpu_model, len(gpu)), []).append(i)
        out = [0] * len(items)
        for members in groups.values():
            costs = self.costs(items[members[0]][0], [items[i][1] for i in members])
            for i, c in zip(members, costs, strict=True):
                out[i] = c
        return out

    def span(self, node: Node) -> int:
        # fragmentation <= free thousandths, the scarcity part <= w * used thousandths, the
        # price part <= price_weight * GPU_MILLI per device (no fill earns over one device)
        scale = 1 + max(1.0, self._per_used(node)) + self.scorer.price_weight
        return int(scale * GPU_MILLI * max(1, node.gpu_count)) + 1


def quality_for(scorer: NodeScorer, gpu: Strategy, cpu: Strategy) -> NodeQuality | None:
    """The model's measure for the greedy's ``scorer``; None for a scorer whose notion of
    quality the model does not share (then the model judges admission only)."""
    if isinstance(scorer, PackingScorer):
        return PackingQuality(gpu, cpu)
    if isinstance(scorer, FragmentationScorer):
        return FragmentationQuality(scorer)
    return None
