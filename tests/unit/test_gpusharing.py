"""GPU sharing's pure parts: reservation names and manifests, the collection plan, the device
ConfigMap, and the admission review (scheduler.cluster.gpusharing, scheduler.admission)."""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any

import pytest

from scheduler.admission import review
from scheduler.cluster.gpusharing import (
    CONFIG_MAP_LABEL,
    DEVICE_LABEL,
    RESERVATION_LABEL,
    VISIBLE_DEVICES_KEY,
    Reservation,
    config_map_name,
    device_config_map,
    devices_in_use,
    plan_reservations,
    pod_config_map,
    reservation_from_k8s,
    reservation_name,
    reservation_pod,
    scaling_from_k8s,
    scaling_groups,
    scaling_name,
    scaling_pod,
)
from scheduler.cluster.pod import Pod
from scheduler.cluster.podspec import pod_from_k8s
from scheduler.config import ConfigError, parse_config

__all__: list[str] = []

SCHEDULER = "kai-scheduler"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _k8s_pod(
    name: str = "p",
    *,
    annotations: dict[str, str] | None = None,
    gpus: str | None = None,
    scheduler: str = SCHEDULER,
    node: str | None = None,
    containers: int = 1,
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m"}}
    if gpus is not None:
        resources["limits"] = {"nvidia.com/gpu": gpus}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [
            {"name": f"c{i}", "image": "x", "resources": resources} for i in range(containers)
        ],
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": annotations or {},
        },
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def _pod(name: str, node: str | None, grant: tuple[tuple[int, int], ...], **kw: Any) -> Pod:
    obj = _k8s_pod(name, node=node, annotations={"gpu-fraction": "0.5"}, **kw)
    return pod_from_k8s(obj, scheduler_name=SCHEDULER, default_queue="q", gpu_grant=grant)


# --------------------------------------------------------------------------- names, manifests


@pytest.mark.parametrize(
    "node", ["n1", "GPU_Node.example.com", "x" * 250, "node-with-trailing-dash-" * 5]
)
def test_reservation_names_are_stable_and_dns_safe(node: str) -> None:
    name = reservation_name(node, 3)
    assert name == reservation_name(node, 3)
    assert len(name) <= 63 and DNS_LABEL.fullmatch(name), name
    assert name != reservation_name(node, 4)


def test_reservation_names_differ_for_nodes_that_look_alike() -> None:
    # Sanitising maps "a.b" and "a_b" to the same stem; the hash keeps them apart.
    assert reservation_name("a.b", 0) != reservation_name("a_b", 0)
    assert reservation_name("x" * 100 + "1", 0) != reservation_name("x" * 100 + "2", 0)


def test_reservation_pod_holds_one_gpu_on_its_node() -> None:
    body = reservation_pod("node-1", 2, namespace="res")
    assert body["spec"]["nodeName"] == "node-1"
    (container,) = body["spec"]["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert body["metadata"]["namespace"] == "res"
    assert reservation_from_k8s(body) == Reservation(
        "res", body["metadata"]["name"], "", "node-1", 2
    )


def test_config_map_name_fits_a_label_and_the_webhook_label_wins() -> None:
    assert len(config_map_name("p" * 253)) <= 63
    # Long names that start alike still get their own ConfigMap.
    assert config_map_name("p" * 60 + "-0") != config_map_name("p" * 60 + "-1")
    assert all(len(config_map_name("p" * n)) <= 63 for n in range(1, 254))
    assert config_map_name("train-0") == "train-0-gpu-share"
    pod = _pod("train-0", None, ())
    assert pod_config_map(pod) == "train-0-gpu-share"
    labelled = pod_from_k8s(
        {
            **_k8s_pod("train-0", annotations={"gpu-fraction": "0.5"}),
            "metadata": {
                "name": "train-0",
                "namespace": "ns",
                "annotations": {"gpu-fraction": "0.5"},
                "labels": {CONFIG_MAP_LABEL: "train-abc123-gpu-share"},
            },
        },
        scheduler_name=SCHEDULER,
        default_queue="q",
    )
    assert pod_config_map(labelled) == "train-abc123-gpu-share"


def test_device_config_map_is_owned_by_the_pod() -> None:
    body = device_config_map("p-gpu-share", "ns", "p", "uid-p", ["0", "3"], "0.5")
    assert body["data"][VISIBLE_DEVICES_KEY] == "0,3"
    (owner,) = body["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "p", "uid-p")


# --------------------------------------------------------------------------- reading pods


@pytest.mark.parametrize(
    "mutate",
    [
        lambda o: o["metadata"]["labels"].pop(RESERVATION_LABEL),
        lambda o: o["metadata"]["labels"].__setitem__(RESERVATION_LABEL, "yes"),
        lambda o: o["metadata"]["labels"].__setitem__(DEVICE_LABEL, "first"),
        lambda o: o["metadata"]["labels"].pop(DEVICE_LABEL),
        lambda o: (o["spec"].pop("nodeName"), o["metadata"]["annotations"].clear()),
    ],
)
def test_reservation_from_k8s_ignores_what_it_cannot_read(mutate: Any) -> None:
    body = reservation_pod("n1", 0)
    mutate(body)
    assert reservation_from_k8s(body) is None


@pytest.mark.parametrize(
    "obj", [{}, {"metadata": None}, {"metadata": {"labels": None}}, {"spec": None}]
)
def test_reservation_from_k8s_survives_malformed_objects(obj: dict[str, Any]) -> None:
    assert reservation_from_k8s(obj) is None


def test_finished_or_terminating_reservations_are_gone() -> None:
    body = reservation_pod("n1", 0)
    assert not reservation_from_k8s(body).gone  # type: ignore[union-attr]
    body["status"] = {"phase": "Failed"}
    assert reservation_from_k8s(body).gone  # type: ignore[union-attr]
    body["status"] = {"phase": "Running"}
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert reservation_from_k8s(body).gone  # type: ignore[union-attr]


# --------------------------------------------------------------------------- the plan


def test_devices_in_use_counts_bound_active_sharers_only() -> None:
    whole = pod_from_k8s(
        _k8s_pod("whole", gpus="1", node="n1"),
        scheduler_name=SCHEDULER,
        default_queue="q",
        gpu_grant=((5, 1000),),
    )
    done = _k8s_pod("done", node="n1", annotations={"gpu-fraction": "0.5"})
    done["status"]["phase"] = "Succeeded"
    pods = [
        _pod("a", "n1", ((0, 500),)),
        _pod("b", "n1", ((0, 500),)),
        _pod("c", "n2", ((1, 250),)),
        _pod("pending", None, ()),
        whole,
        pod_from_k8s(done, scheduler_name=SCHEDULER, default_queue="q", gpu_grant=((2, 500),)),
        # Another scheduler's sharer: held (or not) by that scheduler.
        pod_from_k8s(
            _k8s_pod("theirs", node="n3", annotations={"gpu-fraction": "0.5"}),
            scheduler_name="another-scheduler",
            default_queue="q",
            gpu_grant=((0, 500),),
        ),
    ]
    assert devices_in_use(pods) == {("n1", 0), ("n2", 1)}


def _res(node: str, device: int, *, gone: bool = False) -> Reservation:
    return Reservation("res", reservation_name(node, device), "u", node, device, gone=gone)


def test_plan_deletes_unused_and_recreates_missing() -> None:
    used = {("n1", 0), ("n1", 1), ("n2", 0)}
    reservations = [
        _res("n1", 0),  # used, live: kept
        _res("n1", 1, gone=True),  # used, terminating: hold it again
        _res("n3", 0),  # nobody uses it: delete
        _res("n4", 0, gone=True),  # unused and already going: nothing to do
    ]
    plan = plan_reservations(reservations, used)
    assert [(r.node, r.device) for r in plan.delete] == [("n3", 0)]
    assert plan.recreate == (("n1", 1), ("n2", 0))


def test_plan_with_nothing_used_deletes_every_live_reservation() -> None:
    plan = plan_reservations([_res("n1", 0), _res("n1", 1)], set())
    assert len(plan.delete) == 2 and plan.recreate == ()


# --------------------------------------------------------------------------- admission


def _request(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {"uid": "r1", "kind": {"kind": "Pod"}, "operation": operation, "object": obj}


def _patched(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    out = copy.deepcopy(obj)
    for op in json.loads(base64.b64decode(response["patch"])):
        # The webhook only adds (RFC 6902 "add"), which is all this applies.
        assert op["op"] == "add", op
        *parents, last = [
            s.replace("~1", "/").replace("~0", "~") for s in op["path"].split("/")[1:]
        ]
        target: Any = out
        for segment in parents:
            target = target[int(segment)] if isinstance(target, list) else target[segment]
        if isinstance(target, list):
            assert last == "-", op  # appends only: indexes would shift under later ops
            target.append(op["value"])
        else:
            assert last not in target, op  # "add" on a map must not clobber a user's key
            target[last] = op["value"]
    return out


@pytest.mark.parametrize(
    ("annotations", "gpus", "words"),
    [
        ({"gpu-fraction": "0.5"}, "1", "not both"),
        ({"gpu-fraction": "0"}, None, "greater than 0"),
        ({"gpu-fraction": "1"}, None, "below 1"),
        ({"gpu-fraction": "1.5"}, None, "below 1"),
        ({"gpu-fraction": "half"}, None, "below 1"),
        ({"gpu-memory": "-5"}, None, "positive amount"),
        ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "two"}, None, "whole number"),
    ],
)
def test_review_rejects_bad_share_requests_naming_the_annotation(
    annotations: dict[str, str], gpus: str | None, words: str
) -> None:
    response = review(_request(_k8s_pod(annotations=annotations, gpus=gpus)), [SCHEDULER])
    assert response["allowed"] is False and response["uid"] == "r1"
    message = response["status"]["message"]
    assert "metadata.annotations[gpu-" in message and words in message, message


def test_review_points_every_container_at_the_config_map() -> None:
    obj = _k8s_pod("train-0", annotations={"gpu-fraction": "0.5"}, containers=2)
    obj["spec"]["initContainers"] = [{"name": "init", "image": "x"}]
    # A user's own value is kept; the other variable is still added.
    obj["spec"]["containers"][1]["env"] = [{"name": VISIBLE_DEVICES_KEY, "value": "all"}]
    out = _patched(obj, review(_request(obj), [SCHEDULER]))
    assert out["metadata"]["labels"][CONFIG_MAP_LABEL] == "train-0-gpu-share"
    containers = out["spec"]["initContainers"] + out["spec"]["containers"]
    assert len(containers) == 3
    for c in containers:
        names = [e["name"] for e in c["env"]]
        assert sorted(names) == ["GPU_PORTION", VISIBLE_DEVICES_KEY], c
    for c in (containers[0], containers[1]):
        (env,) = [e for e in c["env"] if e["name"] == VISIBLE_DEVICES_KEY]
        ref = env["valueFrom"]["configMapKeyRef"]
        assert ref == {"name": "train-0-gpu-share", "key": VISIBLE_DEVICES_KEY}
    assert {"name": VISIBLE_DEVICES_KEY, "value": "all"} in containers[2]["env"]


def test_review_labels_a_generate_name_pod_with_its_config_map() -> None:
    obj = _k8s_pod(annotations={"gpu-fraction": "0.25"})
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = "job-7-"
    obj["metadata"]["labels"] = {"app": "x"}
    out = _patched(obj, review(_request(obj), [SCHEDULER]))
    name = out["metadata"]["labels"][CONFIG_MAP_LABEL]
    assert name.startswith("job-7-") and name.endswith("-gpu-share") and len(name) <= 63
    assert out["metadata"]["labels"]["app"] == "x"
    ref = out["spec"]["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"]
    assert ref["name"] == name


@pytest.mark.parametrize(
    "request_",
    [
        _request(_k8s_pod(annotations={"gpu-fraction": "0.5"}, scheduler="default-scheduler")),
        _request(_k8s_pod(annotations={"gpu-fraction": "2"}, scheduler="default-scheduler")),
        _request(_k8s_pod(gpus="1")),
        _request(_k8s_pod()),
        _request(_k8s_pod(annotations={"gpu-fraction": "0.5"}), operation="UPDATE"),
        {"uid": "r1", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": None},
        {"uid": "r1"},
    ],
)
def test_review_leaves_other_pods_alone(request_: dict[str, Any]) -> None:
    assert review(request_, [SCHEDULER]) == {"uid": "r1", "allowed": True}


# --------------------------------------------------------------------------- settings


def test_config_parses_gpu_sharing_and_requires_the_webhook_files() -> None:
    cfg = parse_config({"gpuSharing": {"enabled": True, "collectInterval": "500ms"}})
    assert cfg.gpu_sharing.enabled and cfg.gpu_sharing.collect_interval == 0.5
    assert cfg.gpu_sharing.reservation_namespace == "kai-resource-reservation"
    with pytest.raises(ConfigError, match="webhookCertFile"):
        parse_config({"gpuSharing": {"webhookAddress": "0.0.0.0:8443"}})
    with pytest.raises(ConfigError, match=r"gpuSharing\.enable"):
        parse_config({"gpuSharing": {"enable": True}})


# --------------------------------------------------------------------------- scaling pods


def _pending(name: str, annotations: dict[str, str], selector: dict[str, str] | None = None) -> Pod:
    obj = _k8s_pod(name, annotations=annotations)
    if selector:
        obj["spec"]["nodeSelector"] = selector
    return pod_from_k8s(obj, scheduler_name=SCHEDULER, default_queue="q")


def test_scaling_groups_pack_shares_into_whole_devices_per_node_group() -> None:
    pods = [
        _pending("a", {"gpu-fraction": "0.5"}),
        _pending("b", {"gpu-fraction": "0.5"}),
        _pending("c", {"gpu-fraction": "0.3"}),
        _pending("d", {"gpu-fraction": "0.7"}),
        _pending("e", {"gpu-fraction": "0.6"}),
        # Two devices at a quarter each, and a share by memory (a whole device: the new
        # node's GPU memory is not known).
        _pending("f", {"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"}),
        _pending("g", {"gpu-memory": "1000"}),
        _pending("h", {"gpu-fraction": "0.5"}, selector={"pool": "a100"}),
    ]
    groups = scaling_groups(pods)
    assert len(groups) == 2
    by_size = sorted(devices for _, devices in groups.values())
    # 4.1 devices' worth: g alone, 0.7+0.3, 0.6+0.25, 0.5+0.5, f's second quarter.
    assert by_size == [1, 5]
    # A pod's shares of several devices never land on one device.
    assert [n for _, n in scaling_groups([pods[5]]).values()] == [2]
    assert [m.name for m, n in groups.values() if n == 1] == ["h"]
    # Stable: the same groups and sizes whatever the order (names are reconciled by it).
    again = scaling_groups(list(reversed(pods)))
    assert {g: n for g, (_, n) in again.items()} == {g: n for g, (_, n) in groups.items()}
    names = {scaling_name(g, i) for g, (_, n) in groups.items() for i in range(n)}
    assert len(names) == 6 and all(len(n) <= 63 and DNS_LABEL.fullmatch(n) for n in names)


def test_scaling_pod_copies_where_the_member_may_run() -> None:
    member = _k8s_pod("a", annotations={"gpu-fraction": "0.5"})
    member["spec"]["nodeSelector"] = {"pool": "a100"}
    member["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    member["spec"]["priorityClassName"] = "train"
    member["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}},
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []},
    }
    body = scaling_pod("gpu-scaling-x-0", "res", member, SCHEDULER)
    spec = body["spec"]
    assert spec["schedulerName"] == f"{SCHEDULER}-scaling"  # nothing places it, nor groups it
    assert spec["nodeSelector"] == {"pool": "a100"} and spec["priorityClassName"] == "train"
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert set(spec["affinity"]) == {"nodeAffinity"}  # other pods' placement does not carry over
    (container,) = spec["containers"]
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "1"}
    assert scaling_from_k8s(body) is not None and reservation_from_k8s(body) is None
    assert scaling_from_k8s(member) is None and scaling_from_k8s({}) is None
