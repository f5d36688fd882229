"""What the solver returns: per-pod assignments and per-gang outcomes.

These types are the contract between the solver and everything after it (commit, status,
simulation). Every :class:`Placement` that leaves the solver package has passed the
independent validator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from scheduler.plugins.fragmentation import PRICE_WEIGHT

if TYPE_CHECKING:
    from scheduler.cluster.dra import ClaimAllocation

__all__ = [
    "ClaimGrant",
    "EvictAction",
    "Eviction",
    "GangOutcome",
    "Placement",
    "PlacementSettings",
    "PodAssignment",
    "Scoring",
    "SolveStatus",
    "Strategy",
]

Strategy = Literal["binpack", "spread"]

#: Why a running pod is evicted (see docs/taking-back.md):
#: ``reclaim`` - for a queue below its fair share, from a queue above its own;
#: ``preempt`` - for a higher-priority gang of the same queue;
#: ``consolidate`` - moved so a pending gang fits; it is placed again in the same cycle;
#: ``shrink`` - an elastic gang's pod beyond ``minMember`` (the gang keeps running).
EvictAction = Literal["reclaim", "preempt", "consolidate", "shrink"]
#: ``packing``: binpack/spread per ``gpu_strategy``/``cpu_strategy`` (KAI's behaviour);
#: ``fragmentation``: place each pod where it strands the least GPU capacity for the
#: workload seen in the cluster (FGD's idea, :mod:`scheduler.plugins.fragmentation`).
Scoring = Literal["packing", "fragmentation"]


@dataclass(frozen=True, slots=True)
class PlacementSettings:
    """How a cycle places work. GPU and CPU strategies are chosen separately, as KAI does."""

    #: binpack: fill partly used nodes/devices first; spread: prefer the emptiest.
    gpu_strategy: Strategy = "binpack"
    #: The same choice for nodes without GPU work (CPU-only pods).
    cpu_strategy: Strategy = "binpack"
    #: How the greedy ranks nodes and devices (see :data:`Scoring`). With ``fragmentation``
    #: CP-SAT's quality term follows the scorer (:mod:`scheduler.solver.quality`).
    scoring: Scoring = "packing"
    #: With ``fragmentation`` scoring: keep a pod taking part of one device pending rather
    #: than let it strand the rest of an idle device that almost nothing in the workload
    #: fits, while less of its GPU model's capacity is free than it would strand
    #: (:mod:`scheduler.plugins.strand_guard`). Opt-in: it leaves pods waiting beside idle
    #: devices, for more GPU allocated once capacity is scarce.
    hold_stranding_shares: bool = False
    #: The longest a pod is held by that rule, in seconds from its creation (0: no limit).
    #: Past it the pod is placed like any other: a held share is not starved because the
    #: cluster stays busy.
    hold_stranding_max_wait: float = 900.0
    #: With ``fragmentation`` scoring: weight of the share prices' term (what a device's
    #: free room can no longer earn at the prices of the workload mix's configuration LP,
    #: :mod:`scheduler.plugins.device_prices`) against fragmentation; 0 turns it off.
    share_price_weight: float = PRICE_WEIGHT
    #: Wall-clock budget for the optimising stages of a cycle: CP-SAT placement (the greedy
    #: answer is used if time runs out), then taking back with what is left of it (at least
    #: a fifth of it, see :data:`scheduler.solver.takeback.MIN_BUDGET_SHARE`).
    time_limit_seconds: float = 0.5
    #: CP-SAT worker threads (the machine has 2 cores; the event loop needs some room).
    workers: int = 2
    #: Skip CP-SAT entirely and return the greedy placement (benchmarks and tiny cycles).
    greedy_only: bool = False
    #: Run CP-SAT for placement quality even when greedy admitted every gang.
    quality_when_all_admitted: bool = True
    #: Run CP-SAT for placement quality when some gang was left out but the relaxation
    #: bound proves the admission optimal - the greedy's or the relaxation-guided pass's
    #: (CP-SAT could only improve quality). Off by
    #: default: on the 5,000-node benchmark that model cost ~0.2 s CPU per cycle and never
    #: improved the answer.
    quality_when_admission_proven: bool = False
    #: Cap on node patterns enumerated per node class in the CP-SAT model.
    patterns_per_class: int = 48
    #: Node classes in the CP-SAT model; beyond this, untouched classes are merged.
    max_model_classes: int = 400
    #: CP-SAT presolve. Off by default: on these aggregated models it spent most of a
    #: sub-second budget before search started from the hint (measured: 500-node cycles at
    #: 0.5 s reached 94-97% of the bound with it, 99.9-100% without).
    presolve: bool = False
    #: Take resources back (reclaim, preemption, consolidation, elastic shrink) for gangs
    #: that placement alone cannot admit.
    take_back: bool = True
    #: At most this many pods moved by consolidation per cycle (KAI's default is 16 too).
    consolidation_max_pods: int = 16
    #: Pending gangs the take-back stage considers per cycle, in admission order.
    take_back_gangs: int = 8
    #: Also optimise each priority below the frontier (else greedy backfill): the
    #: relaxation-guided pass, then a CP-SAT stage while the budget lasts. Off by default:
    #: on the 5,000-node benchmark (priorities 50,50,50,100) it raised the priority-50
    #: tier's within-fair-share work by 0.3-1.0% for ~0.55 s more CPU per cycle.
    lower_tier_stages: bool = False


class SolveStatus(StrEnum):
    """Which engine produced the placement and how sure it is."""

    OPTIMAL = "OPTIMAL"  # CP-SAT proved it optimal
    FEASIBLE = "FEASIBLE"  # CP-SAT improved on greedy but did not prove optimality
    GREEDY = "GREEDY"  # the greedy pass's answer (CP-SAT skipped, failed or was not better)
    EMPTY = "EMPTY"  # nothing to place


@dataclass(frozen=True, slots=True)
class ClaimGrant:
    """A ResourceClaim a placed pod uses. ``allocation``: the devices this cycle chose for
    it (the commit writes ``status.allocation``); None when the claim was allocated before
    (shared with a pod that runs, or with a gang member placed earlier in the cycle): the
    commit only adds the pod to ``status.reservedFor``."""

    claim: str  # ``namespace/name``
    allocation: ClaimAllocation | None = None
    #: Set for the claim the scheduler creates for the pod's extended resources backed by
    #: DRA (:mod:`scheduler.cluster.dra_extended`; ``claim`` is then a stand-in key): its
    #: requests as (request name, DeviceClass, count) ...
    requests: tuple[tuple[str, str, int], ...] = ()
    #: ... and the pod status' request mappings as (container, resource, request name).
    mappings: tuple[tuple[str, str, str], ...] = ()

    @property
    def extended(self) -> bool:
        """True for the claim the commit must create (extended resources backed by DRA)."""
        return bool(self.requests)


@dataclass(frozen=True, slots=True)
class PodAssignment:
    """One pod to bind: the node; for GPU pods, device index -> thousandths; for pods with
    ResourceClaims, the claims in ``spec.resourceClaims`` order (:class:`ClaimGrant`)."""

    pod_uid: str
    pod_key: str
    gang: str
    node: str
    gpu_grant: tuple[tuple[int, int], ...] = ()
    claims: tuple[ClaimGrant, ...] = ()


@dataclass(frozen=True, slots=True)
class Eviction:
    """One running pod to evict, and for whom.

    Every pod of a victim gang is listed (gangs go whole), except for ``shrink``, which lists
    only pods beyond ``minMember``. ``message`` is the sentence the victim's Event carries.
    """

    pod_uid: str
    pod_key: str
    gang: str
    queue: str
    node: str
    action: EvictAction
    #: Key of the pending gang this eviction makes room for.
    for_gang: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class GangOutcome:
    """The decision for one pending gang in this cycle.

    ``reason``/``reason_code`` are empty when the gang was placed; otherwise they say why it
    waits in words a user can act on (filled by :mod:`scheduler.explain`).
    """

    gang: str
    queue: str
    placed: bool
    #: Pods placed for this gang (min_member or more when placed; empty otherwise).
    pods: tuple[PodAssignment, ...] = ()
    reason_code: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Placement:
    """The whole result of one solve."""

    assignments: tuple[PodAssignment, ...] = ()
    outcomes: dict[str, GangOutcome] = field(default_factory=dict)
    status: SolveStatus = SolveStatus.EMPTY
    #: Value of the returned placement and of the plain greedy placement for the first
    #: stage (the highest priority where greedy left a gang out, or all gangs when it left
    #: none out), and an upper bound of that value over *every* valid placement - not only
    #: the ones the CP-SAT model can express. Same integer scale for all three
    #: (:class:`scheduler.solver.cpsat.Scale`); the bound comes from a relaxation of the
    #: real problem (:mod:`scheduler.solver.bound`); 0 when no bound is known.
    #: ``greedy_objective`` is 0 when the greedy did not place that stage (its tier was
    #: proven short and the guided answer reached the bound, see :mod:`.frontier`).
    objective: int = 0
    greedy_objective: int = 0
    best_bound: int = 0
    solve_seconds: float = 0.0
    build_seconds: float = 0.0
    #: Time spent explaining unplaced gangs (scheduler.explain), part of the cycle.
    explain_seconds: float = 0.0
    #: Wall-clock seconds of the whole solve() call.
    total_seconds: float = 0.0
    #: Pending gangs left for the next cycle by a gang budget (``solve(max_gangs=...)``):
    #: neither placed nor explained here, so they have no outcome.
    deferred: frozenset[str] = frozenset()
    #: Problems the validator found (empty = valid). A non-empty list never leaves the solver:
    #: it falls back to greedy, and to nothing if greedy is invalid too.
    violations: tuple[str, ...] = ()
    #: Running pods to evict so that gangs of ``assignments`` fit.
    evictions: tuple[Eviction, ...] = ()
    #: Gang key -> uids of the evicted pods it waits for. The assignments of these gangs are
    #: *nominations*: held on their nodes (nobody else may take the space) and bound only
    #: once every pod listed here is gone.
    waits_for: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: A lower bound of the GPU thousandths any plan must evict to admit the gangs that
    #: evicted, taken in the same order: per gang, what must leave the devices of the nodes
    #: it accepts, at its turn, before its pods fit on whole devices (0 when nothing was).
    min_evicted_gpu_milli: int = 0

    @property
    def freed(self) -> frozenset[str]:
        """Uids of the running pods whose room ``assignments`` use: this cycle's evictions and
        the pods already terminating that held gangs wait for."""
        return frozenset(
            {e.pod_uid for e in self.evictions}
            | {uid for uids in self.waits_for.values() for uid in uids}
        )
