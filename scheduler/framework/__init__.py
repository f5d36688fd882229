"""The seams of the scheduler: small Protocols for what can be plugged in.

- :class:`NodeScorer` - how good is putting one pod on one node with a given device grant
  (lower is better); the greedy placement pass asks it for every candidate node class.
- :class:`DevicePicker` - optionally, which devices of a node a GPU pod should take.
- :class:`ScoreKey` - optionally, what a score depends on (lets the greedy cache scores).
- :class:`NodeView` / :class:`PodDemand` - the read-only data both see.

Implementations live in :mod:`scheduler.plugins` (``packing`` for binpack/spread,
``fragmentation`` for the FGD-style scorer). Nothing registers itself at import time: callers
pass a scorer explicitly (see :func:`scheduler.solver.place_gangs`).
"""

from scheduler.framework.scoring import DevicePicker, NodeScorer, NodeView, PodDemand, ScoreKey

__all__ = ["DevicePicker", "NodeScorer", "NodeView", "PodDemand", "ScoreKey"]
