"""The scenarios of ``python -m scheduler.bench takeback-diff``
(:mod:`scheduler.bench.takeback_diff`): kwok GPU nodes, queues with quotas, a first wave of
workloads that fill the cluster and run, a second wave that can only run if something is
taken back, and the outcome per gang that docs/taking-back.md says ours has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "PODGROUPER",
    "SCENARIOS",
    "Difference",
    "QueueSpec",
    "Scenario",
    "Step",
    "Workload",
    "scenario_named",
]

#: ``Workload.grouping`` of a gang of one whose PodGroup KAI's podgrouper makes.
PODGROUPER = "kai-podgrouper"


@dataclass(frozen=True)
class QueueSpec:
    """A queue of the scenario (its real name gets a per-run prefix). CPU and memory are
    unlimited (quota and limit -1); ``limit`` is always written out (KAI reads an omitted
    limit as 0, ours as -1: see docs/api.md)."""

    name: str
    gpu_quota: float
    parent: str | None = None
    gpu_limit: float = -1
    over_quota_weight: float = 1


@dataclass(frozen=True)
class Workload:
    """One gang: a ReplicaSet of ``replicas`` pods of ``gpus`` whole GPUs each."""

    name: str
    queue: str
    priority_class: str
    replicas: int
    gpus: int
    #: PodGroup ``minMember`` (default: ``replicas``); below ``replicas`` the gang is elastic.
    min_member: int | None = None
    #: PodGroup ``spec.preemptibility`` (``preemptible`` | ``non-preemptible``), else by priority.
    preemptibility: str | None = None
    #: Pin every pod to the scenario's node with this index (nodeSelector on the host name).
    node: int | None = None
    #: ``podgroup``: the bench creates the PodGroup; ``kai-podgrouper``: a gang of one whose
    #: PodGroup KAI's podgrouper makes (ours: an implicit gang of one).
    grouping: str = "podgroup"
    #: A PodDisruptionBudget over the gang's pods with this ``minAvailable``.
    budget_min_available: int | None = None

    @property
    def minimum(self) -> int:
        """The gang's ``minMember``."""
        return self.replicas if self.min_member is None else self.min_member


@dataclass(frozen=True)
class Step:
    """One step of the first wave: create workloads and wait until they all run, or remove
    workloads (helpers that shaped the layout) and wait until their pods are gone."""

    create: tuple[Workload, ...] = ()
    remove: tuple[str, ...] = ()


@dataclass(frozen=True)
class Difference:
    """A deliberate, documented difference: KAI's outcome per gang where it differs from
    ``Scenario.expect``, and why (docs/taking-back.md, "Differences from KAI-Scheduler")."""

    kai: Mapping[str, str]
    reason: str


@dataclass(frozen=True)
class Scenario:
    """A cluster, queues, a first wave that runs, a second wave, the expected outcome."""

    name: str
    summary: str
    nodes: int
    gpus_per_node: int
    queues: tuple[QueueSpec, ...]
    setup: tuple[Step, ...]
    wave2: tuple[Workload, ...]
    #: Gang -> outcome, as docs/taking-back.md says ours behaves (every reported gang).
    expect: Mapping[str, str]
    #: Gang -> eviction action (ours' vocabulary) for the gangs that lose pods.
    expect_actions: Mapping[str, str] = field(default_factory=dict)
    difference: Difference | None = None

    def workloads(self) -> list[Workload]:
        """Every workload, first wave then second."""
        return [w for s in self.setup for w in s.create] + list(self.wave2)

    def reported(self) -> list[Workload]:
        """The workloads whose outcome is reported (helpers removed in setup are not)."""
        removed = {n for s in self.setup for n in s.remove}
        return [w for w in self.workloads() if w.name not in removed]


def _two_teams(quota_a: float = 8, quota_b: float = 8) -> tuple[QueueSpec, ...]:
    return (
        QueueSpec("dept", quota_a + quota_b),
        QueueSpec("team-a", quota_a, parent="dept"),
        QueueSpec("team-b", quota_b, parent="dept"),
    )


def _one_team(name: str, quota: float = 16) -> tuple[QueueSpec, ...]:
    return (QueueSpec("dept", quota), QueueSpec(name, quota, parent="dept"))


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="reclaim",
        summary="team-a borrowed team-b's quota (16 of 16 GPUs, quota 8 each); team-b submits 8 "
        "GPUs: team-a's lower-priority gang is reclaimed, both queues end at their fair share",
        nodes=2,
        gpus_per_node=8,
        queues=_two_teams(),
        setup=(
            Step(
                create=(
                    Workload("a-train", "team-a", "train", replicas=2, gpus=4),
                    Workload("a-build", "team-a", "build-preemptible", replicas=2, gpus=4),
                )
            ),
        ),
        wave2=(Workload("b-train", "team-b", "train", replicas=2, gpus=4),),
        expect={"a-train": "evicted", "a-build": "running", "b-train": "running"},
        expect_actions={"a-train": "reclaim"},
    ),
    Scenario(
        name="preempt",
        summary="one queue (quota 16) runs a train and a build-preemptible gang; an inference "
        "gang (non-preemptible, within quota) arrives: only the strictly lowest priority goes",
        nodes=2,
        gpus_per_node=8,
        queues=_one_team("team-p"),
        setup=(
            Step(
                create=(
                    Workload("p-train", "team-p", "train", replicas=2, gpus=4),
                    Workload("p-buildp", "team-p", "build-preemptible", replicas=2, gpus=4),
                )
            ),
        ),
        wave2=(Workload("p-infer", "team-p", "inference", replicas=2, gpus=4),),
        expect={"p-train": "evicted", "p-buildp": "running", "p-infer": "running"},
        expect_actions={"p-train": "preempt"},
    ),
    Scenario(
        name="consolidate",
        summary="2+2 GPUs free on two nodes, a 4-GPU pod arrives: a preemptible 2-GPU pod moves "
        "to the other node (its ReplicaSet recreates it there); pinned non-preemptible pods stay",
        nodes=2,
        gpus_per_node=8,
        queues=_one_team("team-c"),
        setup=(
            Step(
                create=(
                    Workload("c-fixed0", "team-c", "build", replicas=1, gpus=6, node=0),
                    Workload("c-fixed1", "team-c", "build", replicas=1, gpus=4, node=1),
                    # Fills node 0 so that c-mover can only land on node 1; removed below.
                    Workload("c-filler", "team-c", "build", replicas=1, gpus=2, node=0),
                )
            ),
            Step(
                create=(
                    Workload("c-mover", "team-c", "train", replicas=1, gpus=2, grouping=PODGROUPER),
                )
            ),
            Step(remove=("c-filler",)),
        ),
        wave2=(Workload("c-new", "team-c", "train", replicas=1, gpus=4, grouping=PODGROUPER),),
        expect={
            "c-fixed0": "running",
            "c-fixed1": "running",
            "c-mover": "moved",
            "c-new": "running",
        },
        expect_actions={"c-mover": "consolidate"},
    ),
    Scenario(
        name="elastic",
        summary="team-a runs a rigid gang (8 GPUs) and an elastic one (4x2 GPUs, minMember 2) on "
        "team-b's quota; team-b submits 4 GPUs: the elastic gang shrinks, the rigid one stays",
        nodes=2,
        gpus_per_node=8,
        queues=_two_teams(),
        setup=(
            Step(
                create=(
                    Workload("a-rigid", "team-a", "train", replicas=2, gpus=4),
                    Workload("a-elastic", "team-a", "train", replicas=4, gpus=2, min_member=2),
                )
            ),
        ),
        wave2=(Workload("b-train", "team-b", "train", replicas=2, gpus=2),),
        expect={"a-rigid": "running", "a-elastic": "shrunk", "b-train": "running"},
        expect_actions={"a-elastic": "shrink"},
    ),
    Scenario(
        name="budget",
        summary="as reclaim, but a PodDisruptionBudget (minAvailable 2) covers the "
        "lower-priority gang: ours reclaims the other gang; KAI ignores budgets",
        nodes=2,
        gpus_per_node=8,
        queues=_two_teams(),
        setup=(
            Step(
                create=(
                    Workload(
                        "a-train", "team-a", "train", replicas=2, gpus=4, budget_min_available=2
                    ),
                    Workload("a-build", "team-a", "build-preemptible", replicas=2, gpus=4),
                )
            ),
        ),
        wave2=(Workload("b-train", "team-b", "train", replicas=2, gpus=4),),
        expect={"a-train": "running", "a-build": "evicted", "b-train": "running"},
        expect_actions={"a-build": "reclaim", "a-train": "reclaim"},
        difference=Difference(
            kai={"a-train": "evicted", "a-build": "running"},
            reason="KAI-Scheduler deletes its victims (no Eviction API) and does not read "
            "PodDisruptionBudgets, so it takes the lowest-priority gang although its budget "
            "allows no disruption; ours evicts through the Eviction API and plans within each "
            "budget's disruptionsAllowed (docs/taking-back.md)",
        ),
    ),
    Scenario(
        name="protected",
        summary="a non-preemptible train gang (spec.preemptibility) and a preemptible one run; "
        "a higher-priority 16-GPU gang could only run by evicting both: nothing is evicted",
        nodes=2,
        gpus_per_node=8,
        queues=_one_team("team-n"),
        setup=(
            Step(
                create=(
                    Workload(
                        "n-protected",
                        "team-n",
                        "train",
                        replicas=2,
                        gpus=4,
                        preemptibility="non-preemptible",
                    ),
                    Workload("n-train", "team-n", "train", replicas=2, gpus=4),
                )
            ),
        ),
        wave2=(
            Workload(
                "n-urgent",
                "team-n",
                "inference",
                replicas=2,
                gpus=8,
                preemptibility="preemptible",
            ),
        ),
        expect={"n-protected": "running", "n-train": "running", "n-urgent": "pending"},
    ),
)


def scenario_named(name: str) -> Scenario:
    """The scenario called ``name``."""
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(f"no scenario {name!r}; known: {', '.join(s.name for s in SCENARIOS)}")
