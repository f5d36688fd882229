"""A continuous, seeded stream of gangs for chaos runs, acting as their controller.

Each gang is a PodGroup (``scheduling.run.ai/v2alpha2``, ``minMember`` = its size, a short
``stalenessGracePeriod``) and its pods (``schedulerName: kai-scheduler``, annotation
``pod-group-name``), or a lone pod without a PodGroup. Pods ask for whole GPUs
(``nvidia.com/gpu`` limits) or a share of one (annotation ``gpu-fraction``), with CPU and
memory requests large enough that CPU, memory and the node's pod count all bind sometimes.
Every gang fits an empty cluster, so once faults stop every gang must eventually run.

The stream keeps a few gangs waiting at all times; a gang that has had all its pods bound for
its lifetime is deleted (and the checker told first, so that is not a lost pod). Like a Job
controller, the stream replaces a member that disappears without the test deleting it (an
eviction of a partial gang), under a new name, so the gang can run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.api import ApiError, KubeApi
from tests.chaos.invariants import InvariantChecker
from tests.chaos.podview import PodView

__all__ = ["GangSpec", "GangStream", "PodShape", "StreamSettings", "draw_gang"]

PODGROUP_API = "scheduling.run.ai/v2alpha2"


@dataclass(frozen=True)
class PodShape:
    """What one pod asks for: whole GPUs or a fraction of one, CPU and memory."""

    cpu: str
    memory: str
    gpus: int = 0
    fraction: str | None = None


@dataclass(frozen=True)
class GangSpec:
    """One gang of the stream."""

    name: str
    pods: tuple[PodShape, ...]
    #: A PodGroup with minMember = len(pods); False: one lone pod (an implicit gang).
    podgroup: bool
    #: Seconds the gang runs (all pods bound) before the stream deletes it.
    lifetime: float


@dataclass(frozen=True)
class StreamSettings:
    """Shape of the stream."""

    #: Gangs created but not yet fully bound, at most.
    max_waiting: int = 6
    #: Seconds between arrivals (uniform).
    arrival_gap: tuple[float, float] = (0.2, 0.8)
    #: Seconds a gang runs before it is deleted (uniform). With the arrival rate this asks
    #: for more than the CI cluster's 32 GPUs, so gangs wait for each other.
    lifetime: tuple[float, float] = (8.0, 20.0)
    #: A share of gangs runs longer than the faults last (a freeze outlasts 30 s), so
    #: a scheduler that forgets a bound pod during a fault still meets it afterwards.
    long_lifetime: tuple[float, float] = (30.0, 60.0)
    long_share: float = 0.25
    #: PodGroup spec.stalenessGracePeriod.
    grace: str = "3s"
    #: Seconds between control passes.
    period: float = 0.25


def draw_gang(rng: random.Random, index: int, settings: StreamSettings) -> GangSpec:
    """A random gang: whole-GPU, fractional, mixed or a lone pod (each fits one node of 8
    GPUs, 16 CPUs, 64Gi and 12 pods, so every gang fits an empty cluster)."""
    kind = rng.choices(["whole", "fraction", "mixed", "single"], weights=[4, 4, 1, 1])[0]

    def whole() -> PodShape:
        return PodShape(cpu=rng.choice(["2", "4"]), memory="8Gi", gpus=rng.choice([1, 1, 2]))

    def share() -> PodShape:
        fraction = rng.choice(["0.25", "0.3", "0.5", "0.5"])
        return PodShape(cpu=rng.choice(["500m", "1"]), memory="2Gi", fraction=fraction)

    if kind == "single":
        pods: tuple[PodShape, ...] = (rng.choice([whole, share])(),)
    else:
        size = rng.randint(2 if kind == "mixed" else 1, 4)
        make = {"whole": [whole], "fraction": [share], "mixed": [whole, share]}[kind]
        pods = tuple(make[i % len(make)]() for i in range(size))
    long = rng.random() < settings.long_share
    lifetime = settings.long_lifetime if long else settings.lifetime
    return GangSpec(
        name=f"g{index:04d}-{kind}",
        pods=pods,
        podgroup=kind != "single",
        lifetime=round(rng.uniform(*lifetime), 2),
    )


def pod_body(
    name: str, shape: PodShape, gang: str | None, node_selector: Mapping[str, str]
) -> dict[str, Any]:
    """The Pod manifest of one member."""
    resources: dict[str, Any] = {"requests": {"cpu": shape.cpu, "memory": shape.memory}}
    annotations: dict[str, str] = {}
    if shape.gpus:
        resources["limits"] = {"nvidia.com/gpu": str(shape.gpus)}
    if shape.fraction is not None:
        annotations["gpu-fraction"] = shape.fraction
    if gang is not None:
        annotations["pod-group-name"] = gang
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations, "labels": {"kai-chaos": "1"}},
        "spec": {
            "schedulerName": "kai-scheduler",
            "nodeSelector": dict(node_selector),
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "containers": [
                {"name": "main", "image": "registry.invalid/fake:1", "resources": resources}
            ],
        },
    }


@dataclass
class _Member:
    name: str
    shape: PodShape
    uid: str = ""
    seen: bool = False


@dataclass
class _Gang:
    spec: GangSpec
    members: list[_Member]
    podgroup_created: bool = False
    bound_at: float | None = None
    retiring: bool = False
    replacements: int = 0
    deleted: set[str] = field(default_factory=set)


@dataclass
class StreamStats:
    """What the stream did."""

    gangs_created: int = 0
    pods_created: int = 0
    gangs_retired: int = 0
    replacements: int = 0
    api_errors: int = 0
    last_error: str = ""


class GangStream:
    """Creates, watches (through the checker's view) and deletes gangs (module docstring)."""

    def __init__(
        self,
        api: KubeApi,
        checker: InvariantChecker,
        namespace: str,
        node_selector: Mapping[str, str],
        *,
        seed: int,
        settings: StreamSettings | None = None,
        log: Callable[..., None] = lambda event, **fields: None,
    ) -> None:
        self.api = api
        self.checker = checker
        self.namespace = namespace
        self.node_selector = dict(node_selector)
        self.settings = settings or StreamSettings()
        self._rng = random.Random(seed)
        self._log = log
        self._gangs: dict[str, _Gang] = {}
        self._index = 0
        self._next_arrival = 0.0
        self.arrivals = True
        self.draining = False
        self.stats = StreamStats()

    # ------------------------------------------------------------------ driving

    async def run(self, stop: asyncio.Event) -> None:
        """Control passes every ``period`` until ``stop`` is set."""
        while not stop.is_set():
            await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.settings.period)

    async def step(self) -> None:
        """One pass: create what is missing, replace vanished members, retire finished gangs,
        let a new gang arrive."""
        now = time.monotonic()
        calls = []
        for gang in list(self._gangs.values()):
            if gang.retiring:
                calls.append(self._delete_gang(gang))
                continue
            self._observe(gang, now)
            lifetime = 0.0 if self.draining else gang.spec.lifetime
            if gang.bound_at is not None and now - gang.bound_at >= lifetime:
                self._retire(gang)
                calls.append(self._delete_gang(gang))
            else:
                calls.append(self._create_missing(gang))
        waiting = sum(1 for g in self._gangs.values() if g.bound_at is None and not g.retiring)
        if self.arrivals and waiting < self.settings.max_waiting and now >= self._next_arrival:
            spec = draw_gang(self._rng, self._index, self.settings)
            self._index += 1
            self._next_arrival = now + self._rng.uniform(*self.settings.arrival_gap)
            gang = _Gang(spec, [_Member(f"{spec.name}-{i}", s) for i, s in enumerate(spec.pods)])
            self._gangs[spec.name] = gang
            self.stats.gangs_created += 1
            self._log("gang_created", gang=spec.name, pods=len(spec.pods), lifetime=spec.lifetime)
            calls.append(self._create_missing(gang))
        await asyncio.gather(*calls)

    async def drain(self, timeout: float) -> list[dict[str, Any]]:
        """No new gangs; delete each gang as soon as it is fully bound. Returns the gangs
        still there after ``timeout`` seconds (empty when the stream drained)."""
        self.arrivals = False
        self.draining = True
        deadline = time.monotonic() + timeout
        while self._gangs and time.monotonic() < deadline:
            await self.step()
            await asyncio.sleep(self.settings.period)
        return [self._describe(g) for g in self._gangs.values()]

    async def delete_all(self) -> None:
        """Delete every gang left (after the final checks)."""
        for gang in self._gangs.values():
            self._retire(gang)
        for _ in range(20):
            if not self._gangs:
                return
            await asyncio.gather(*(self._delete_gang(g) for g in list(self._gangs.values())))
            await asyncio.sleep(0.5)

    def lifetime_of(self, pod_name: str) -> float | None:
        """The lifetime of the gang pod ``pod_name`` belongs to (None: not a stream pod)."""
        for gang in self._gangs.values():
            if any(m.name == pod_name for m in gang.members):
                return gang.spec.lifetime
        return None

    # ------------------------------------------------------------------ one gang

    def _key(self, gang: _Gang) -> str:
        return f"{self.namespace}/{gang.spec.name}"

    def _observe(self, gang: _Gang, now: float) -> None:
        views: list[PodView | None] = []
        for i, member in enumerate(gang.members):
            view = self.checker.pod(self.namespace, member.name)
            if view is not None:
                member.seen = True
            elif member.seen and member.name not in gang.deleted:
                # Gone without us deleting it (an evicted member of a partial gang): replace
                # it under a new name, as a Job controller would.
                gang.replacements += 1
                self.stats.replacements += 1
                new = _Member(f"{gang.spec.name}-{i}r{gang.replacements}", member.shape)
                self._log("member_replaced", gang=gang.spec.name, old=member.name, new=new.name)
                gang.members[i] = new
            views.append(view)
        complete = all(v is not None and v.holds and not v.deleting for v in views)
        if complete and gang.bound_at is None:
            gang.bound_at = now
            self._log("gang_bound", gang=gang.spec.name)

    def _retire(self, gang: _Gang) -> None:
        """Tell the checker before deleting, so the deletion never looks like a lost pod."""
        if gang.retiring:
            return
        gang.retiring = True
        self.checker.retire_gang(self._key(gang))
        for member in gang.members:
            view = self.checker.pod(self.namespace, member.name)
            for uid in {member.uid, view.uid if view is not None else ""} - {""}:
                self.checker.mark_deleted_by_test(uid)
        self._log("gang_retired", gang=gang.spec.name)

    async def _create_missing(self, gang: _Gang) -> None:
        ns = self.namespace
        if gang.spec.podgroup and not gang.podgroup_created:
            body = {
                "apiVersion": PODGROUP_API,
                "kind": "PodGroup",
                "metadata": {"name": gang.spec.name},
                "spec": {
                    "minMember": len(gang.spec.pods),
                    "queue": "default-queue",
                    "stalenessGracePeriod": self.settings.grace,
                },
            }
            path = f"/apis/{PODGROUP_API}/namespaces/{ns}/podgroups"
            if not await self._create(path, body):
                return
            gang.podgroup_created = True
        group = gang.spec.name if gang.spec.podgroup else None

        async def one(member: _Member) -> None:
            body = pod_body(member.name, member.shape, group, self.node_selector)
            obj = await self._create(f"/api/v1/namespaces/{ns}/pods", body)
            if obj:
                member.uid = str((obj.get("metadata") or {}).get("uid") or "")
                self.stats.pods_created += 1

        await asyncio.gather(*(one(m) for m in gang.members if not m.uid))

    async def _create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST; on 409 (our earlier POST landed but its answer was lost) GET the object."""
        try:
            obj: dict[str, Any] = await self.api.request("POST", path, body=body)
            return obj
        except ApiError as e:
            if e.status == 409:
                try:
                    got: dict[str, Any] = await self.api.request(
                        "GET", f"{path}/{body['metadata']['name']}"
                    )
                    return got
                except ApiError as e2:
                    self._error(e2)
                    return None
            self._error(e)
            return None

    async def _delete_gang(self, gang: _Gang) -> None:
        ns = self.namespace
        targets = [(f"/api/v1/namespaces/{ns}/pods/{m.name}", m.name) for m in gang.members]
        if gang.spec.podgroup:
            path = f"/apis/{PODGROUP_API}/namespaces/{ns}/podgroups/{gang.spec.name}"
            targets.append((path, "podgroup"))

        async def one(path: str, what: str) -> None:
            if what in gang.deleted:
                return
            try:
                await self.api.request("DELETE", path)
            except ApiError as e:
                if e.status != 404:
                    self._error(e)
                    return
            gang.deleted.add(what)

        await asyncio.gather(*(one(p, w) for p, w in targets))
        if all(w in gang.deleted for _, w in targets) and all(
            self.checker.pod(ns, m.name) is None for m in gang.members
        ):
            del self._gangs[gang.spec.name]
            self.stats.gangs_retired += 1

    def _error(self, e: ApiError) -> None:
        self.stats.api_errors += 1
        self.stats.last_error = str(e)[:300]

    def _describe(self, gang: _Gang) -> dict[str, Any]:
        members = []
        for m in gang.members:
            view = self.checker.pod(self.namespace, m.name)
            members.append(
                {
                    "pod": m.name,
                    "created": bool(m.uid),
                    "node": view.node if view else None,
                    "phase": view.phase if view else None,
                    "reason": view.unschedulable_message if view else None,
                }
            )
        return {
            "gang": gang.spec.name,
            "retiring": gang.retiring,
            "bound": gang.bound_at is not None,
            "members": members,
        }
