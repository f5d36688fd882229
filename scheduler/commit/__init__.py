"""Placement -> API calls: each gang bound as a transaction, stale gangs evicted, status told.

- :mod:`.transaction` - :func:`commit_gang`: grant annotations, assume, concurrent binds, forget
- :mod:`.staleness` - :class:`StalenessTracker`: partly bound gangs and their grace period
- :mod:`.status` - :class:`StatusPublisher`: pod conditions, Events, PodGroup and Queue status
- :mod:`.backend` - :class:`LiveBackend`: :class:`scheduler.cycle.Backend` on the live cluster
"""

from scheduler.commit.backend import LiveBackend, LiveCache
from scheduler.commit.staleness import StaleGang, StalenessTracker, gang_progress
from scheduler.commit.status import StatusPublisher, crd_quantity, queue_status_body
from scheduler.commit.transaction import Assumer, GangCommit, commit_gang

__all__ = [
    "Assumer",
    "GangCommit",
    "LiveBackend",
    "LiveCache",
    "StaleGang",
    "StalenessTracker",
    "StatusPublisher",
    "commit_gang",
    "crd_quantity",
    "gang_progress",
    "queue_status_body",
]
