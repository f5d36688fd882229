"""Placement -> API calls: each gang bound as a transaction, victims evicted, status told.

- :mod:`.transaction` - :func:`commit_gang`: grant annotations, assume, concurrent binds, forget
- :mod:`.volumebind` - volumes reserved and bound to WaitForFirstConsumer claims before the binds
- :mod:`.evict` - :func:`evict_gang`: a victim gang's evictions as a unit, Events, metrics
- :mod:`.nominations` - :class:`Nominations`: gangs held on their nodes until victims are gone
- :mod:`.staleness` - :class:`StalenessTracker`: partly bound gangs and their grace period
- :mod:`.status` - :class:`StatusPublisher`: pod conditions, Events, PodGroup and Queue status
- :mod:`.backend` - :class:`LiveBackend`: :class:`scheduler.cycle.Backend` on the live cluster
"""

from scheduler.commit.backend import LiveBackend, LiveCache
from scheduler.commit.evict import EVENT_REASONS, VictimGang, evict_gang
from scheduler.commit.nominations import DEFAULT_NOMINATION_TIMEOUT, NominatedGang, Nominations
from scheduler.commit.staleness import StaleGang, StalenessTracker, gang_progress
from scheduler.commit.status import StatusPublisher, crd_quantity, queue_status_body
from scheduler.commit.transaction import Assumer, GangCommit, commit_gang

__all__ = [
    "DEFAULT_NOMINATION_TIMEOUT",
    "EVENT_REASONS",
    "Assumer",
    "GangCommit",
    "LiveBackend",
    "LiveCache",
    "NominatedGang",
    "Nominations",
    "StaleGang",
    "StalenessTracker",
    "StatusPublisher",
    "VictimGang",
    "commit_gang",
    "crd_quantity",
    "evict_gang",
    "gang_progress",
    "queue_status_body",
]
