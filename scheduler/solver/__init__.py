"""Gang placement: greedy + CP-SAT over node equivalence classes, independently validated.

Public API:

- :func:`solve` (snapshot, settings, report) -> :class:`Placement` - one cycle; synchronous,
  run it in a worker thread. Every pending gang gets a :class:`GangOutcome`.
- :func:`solve_in_thread` - the same, awaited from asyncio (``asyncio.to_thread``).
- :func:`validate` (snapshot, assignments) -> list of violations (empty = valid); shares no
  code with the engines.
- :class:`ClusterState` - mutable free resources per node grouped in equivalence classes:
  ``ClusterState.from_snapshot(s)``, ``.apply(assignment, pod=None)``, ``.release(pod_uid)``.
- :func:`place_gangs` (state, [GangRequest], scorer=None, book=None) -> :class:`GreedyResult`
  - the greedy pass on a ClusterState, without building snapshots. This is what a simulator
  uses for per-pod trace replay: keep one ClusterState, call ``place_gangs`` with the new
  gangs each tiny cycle (assignments are applied to the state), ``release`` pods when they
  finish. A :class:`GangRequest` is (key, queue, priority, preemptible, required pods, extra
  pods); pass a :class:`~scheduler.solver.queues.QueueBook` to enforce queue limits/quota.
- Scorers: any :class:`scheduler.framework.NodeScorer` (``solve(..., scorer=...)`` or
  ``place_gangs(state, gangs, scorer)``); default
  :class:`scheduler.plugins.packing.PackingScorer` (binpack/spread). CP-SAT's quality term
  is the scorer's own measure (binpack/spread, or fragmentation: :mod:`.quality`); with any
  other scorer CP-SAT decides admission but no longer overrides placement quality.

Objective and bound: :attr:`Placement.objective` is the first stage's value (the highest
priority where greedy left a gang out) in the scale of :class:`~.cpsat.Scale`;
:attr:`Placement.best_bound` bounds that value over *every* valid placement, from a
relaxation of the real problem (:mod:`.bound`), not from the pattern-capped model.

Modules: ``state`` (ClusterState, classes), ``greedy`` (with ``why_not``: node checks and
refusal reasons, ``preferences``: choosing by a pod's preferences), ``held_shares`` (the
strand guard over a cycle's answer), ``patterns`` (node patterns and the
canonical packer), ``rows`` (queue and fair-share rows shared by the models), ``quality``
(the model's node cost), ``cpsat`` (the model), ``bound`` (the relaxation and its bound),
``guided`` (a relaxation-guided greedy answer), ``hybrid`` (stages by priority),
``validate`` (independent), ``problem``, ``queues``, ``solve`` (the pipeline and the
objective order).
"""

from scheduler.solver.greedy import GangRequest, GreedyResult, place_gangs
from scheduler.solver.placement import (
    GangOutcome,
    Placement,
    PlacementSettings,
    PodAssignment,
    SolveStatus,
    Strategy,
)
from scheduler.solver.queues import QueueBook
from scheduler.solver.solve import solve, solve_in_thread
from scheduler.solver.state import ClusterState
from scheduler.solver.validate import validate

__all__ = [
    "ClusterState",
    "GangOutcome",
    "GangRequest",
    "GreedyResult",
    "Placement",
    "PlacementSettings",
    "PodAssignment",
    "QueueBook",
    "SolveStatus",
    "Strategy",
    "place_gangs",
    "solve",
    "solve_in_thread",
    "validate",
]
