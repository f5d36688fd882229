"""The kai-scheduler command line: default subcommand, upstream flags, errors exit 2."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from scheduler.cli import _normalise, build_parser, main, parse_bool, settings_from_args
from scheduler.config import ConfigError

DEPLOYMENT_ARGS = [
    "--kube-api-server=https://kubernetes.default.svc",
    "--kube-api-secure=true",
    "--kube-config=/etc/kubernetes/admin.conf",
]


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser(with_simulate=False).parse_args(_normalise(argv))


def test_run_is_the_default_subcommand() -> None:
    assert _normalise([]) == ["run"]
    assert _normalise(["--log-level=debug"]) == ["run", "--log-level=debug"]
    assert _normalise(["run", "--leader-elect"]) == ["run", "--leader-elect"]
    assert _normalise(["simulate", "x.yaml"]) == ["simulate", "x.yaml"]
    assert _normalise(["--help"]) == ["--help"]


def test_deployment_snippet_parses_as_is() -> None:
    args = _parse(DEPLOYMENT_ARGS)
    config, client, service = settings_from_args(args)
    assert args.command == "run"
    assert client.kube_config == "/etc/kubernetes/admin.conf"
    assert client.api_server == "https://kubernetes.default.svc"
    assert client.api_secure is True
    assert config.scheduler_name == "kai-scheduler"
    assert service.leader_elect is False
    assert service.metrics_address == ":8080"


def test_shipped_deployment_args_parse() -> None:
    args = _parse(
        [
            "run",
            "--scheduler-name=kai-scheduler",
            "--metrics-address=:8080",
            "--leader-elect=false",
            "--log-format=json",
            "--log-level=info",
        ]
    )
    _, _, service = settings_from_args(args)
    assert service.leader_elect is False


def test_flags_are_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "sched-ns")
    monkeypatch.setenv("POD_NAME", "sched-0")
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("placement: {gpu: spread}\ncyclePeriod: 300ms\n")
    args = _parse(
        [
            "--leader-elect",
            "--kube-api-secure=false",
            "--scheduler-name",
            "mine",
            f"--config={cfg_file}",
            "--metrics-address=127.0.0.1:0",
            "--log-format=console",
        ]
    )
    config, client, service = settings_from_args(args)
    assert service.leader_elect is True
    assert service.identity.startswith("sched-0_")
    assert client.api_secure is False
    assert client.kube_config is None
    assert _parse([]).kube_api_secure is None  # unset: the kubeconfig decides
    assert config.scheduler_name == "mine"
    assert config.placement.gpu_strategy == "spread"
    assert config.cycle_period == 0.3
    assert config.leader_election.lease_namespace == "sched-ns"
    assert args.log_format == "console"


@pytest.mark.parametrize(
    ("text", "value"), [("true", True), ("False", False), ("1", True), ("no", False)]
)
def test_parse_bool(text: str, value: bool) -> None:
    assert parse_bool(text) is value


def test_parse_bool_rejects_garbage() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="true or false"):
        parse_bool("maybe")


def test_bad_flag_value_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--kube-api-secure=maybe"])
    assert info.value.code == 2
    assert "true or false" in capsys.readouterr().err


def test_bad_config_key_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("cyclePeriod: 1s\nsolverTimelimit: 1s\n")
    assert main([f"--config={cfg_file}", "--metrics-address=127.0.0.1:0"]) == 2
    assert "solverTimelimit" in capsys.readouterr().err


def test_bad_server_url_and_metrics_address() -> None:
    with pytest.raises(ConfigError, match="--kube-api-server"):
        settings_from_args(_parse(["--kube-api-server=kubernetes.default.svc"]))
    with pytest.raises(ConfigError, match="--metrics-address"):
        settings_from_args(_parse(["--metrics-address=:http"]))


def test_missing_kubeconfig_outside_a_cluster_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code = main([f"--kube-config={tmp_path / 'nope'}", "--metrics-address=127.0.0.1:0"])
    assert code == 2
    assert "kube-config" in capsys.readouterr().err


def test_simulate_subcommand_is_wired() -> None:
    pytest.importorskip("scheduler.simulate.cli")
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"run", "simulate"} <= set(sub.choices)


def test_metrics_port_in_use_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import socket

    # A usable kubeconfig (the kubeconfig is checked before the port is bound).
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main([f"--kube-config={kubeconfig}", f"--metrics-address=127.0.0.1:{port}"]) == 2
    assert "--metrics-address" in capsys.readouterr().err
