"""Layered settings: defaults, file, environment, flags; one clear error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from isrwatch.cli import build_parser, main
from isrwatch.commands import RunSettings
from isrwatch.exceptions import ConfigError
from isrwatch.settings import build, group, load, option


def parse(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["run", *argv])


def test_layers_later_wins(tmp_path: Path) -> None:
    cfg = tmp_path / "isrwatch.toml"
    cfg.write_text('lag_time_max_ms = 20000\ntrigger_seconds = 2.0\nrule = "kip16"\n')
    env = {"ISRWATCH_LAG_TIME_MAX_MS": "25000", "ISRWATCH_ALERTMANAGER_URL": "http://127.0.0.1:1,http://127.0.0.1:2"}
    s = load(RunSettings, parse("--config", str(cfg), "--trigger-seconds", "3"), env)
    assert s.job.lag_time_max_ms == 25000  # env over file
    assert s.job.trigger_seconds == 3.0  # flag over file
    assert s.job.rule == "kip16"  # file over default
    assert s.alerting.alertmanager_url == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert load(RunSettings, parse(), {}).job.lag_time_max_ms is None


def test_unknown_key_in_a_file_is_an_error(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("lag_time_max = 1\n")
    with pytest.raises(ConfigError, match="unknown key 'lag_time_max'"):
        load(RunSettings, parse("--config", str(cfg)), {})


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--lag-time-max-ms", "ten"], {}, "--lag-time-max-ms: 'ten' is not a whole number"),
        (["--lag-time-max-ms", "0"], {}, "--lag-time-max-ms: 0 must be greater than 0"),
        (["--rule", "kip17"], {}, "--rule: 'kip17' is not one of"),
        ([], {"ISRWATCH_TRIGGER_SECONDS": "soon"}, "ISRWATCH_TRIGGER_SECONDS: 'soon' is not a number"),
        (["--nearing-ratio", "1.5"], {}, "--nearing-ratio: 1.5 must be between 0 and 1"),
        (["--simulate", "steady", "--bootstrap-servers", "127.0.0.1:9092"], {}, "exclude each other"),
        (["--simulate", "steady", "--spool-dir", "/tmp"], {}, "exclude each other"),
        (["--replica-series-top", "-1"], {}, "--replica-series-top: -1 must be 0 or more"),  # the exporter's group
        (["--lookahead-ms", "-1"], {}, "--lookahead-ms: -1 must be 0 or more"),  # the job's: the same check
        (["--driver-replicas", "some"], {}, "--driver-replicas: 'some' is not one of: all, not-ok"),
        (["--speed", "0"], {}, "--speed: 0.0 must be greater than 0"),  # the simulator's group
        (["--cluster", "c" * 256], {}, "--cluster: 256 characters, at most 255"),  # the job would refuse it
        (["--cluster", ""], {}, "--cluster: must not be empty"),
        # topics Kafka would refuse at the first produce or read, not at start
        (["--telemetry-topic", "isr telemetry"], {}, "--telemetry-topic: 'isr telemetry' is not a Kafka topic name"),
        # a check names where the value came from: here the environment
        ([], {"ISRWATCH_STATE_TOPIC": "isr/state"}, "^ISRWATCH_STATE_TOPIC: 'isr/state' is not a Kafka topic name"),
        (["--deadletter-topic", ".."], {}, "--deadletter-topic: '..' is not a Kafka topic name"),
        (["--alerts-topic", "a" * 250], {}, "--alerts-topic: 250 characters, Kafka allows at most 249"),
        (["--checkpoint-dir", "s3a://bucket/ck"], {}, "--checkpoint-dir: s3a://bucket/ck is a URI"),
        (["--spark-conf", "executor.memory=2g"], {}, "--spark-conf: 'executor.memory=2g' is not spark.KEY=VALUE"),
        (["--bootstrap-servers", "127.0.0.1:9092", "--kafka-config", "acks"], {}, "'acks' is not KEY=VALUE"),
        (["--kafka-config", "acks"], {}, "'acks' is not KEY=VALUE"),  # unused without Kafka, still a mistake
        (["--metrics-port", "70000"], {}, "--metrics-port: 70000 is not a port"),  # was a traceback at bind
        (["--bootstrap-servers", "127.0.0.1:abc"], {}, "--bootstrap-servers: '127.0.0.1:abc' is not HOST:PORT"),
        (["--bootstrap-servers", "a:9092, b:99999"], {}, "'b:99999' is not HOST:PORT"),
        # given but empty (a deployment's unset variable): not the embedded simulator's made-up alerts
        ([], {"ISRWATCH_BOOTSTRAP_SERVERS": ""}, "^ISRWATCH_BOOTSTRAP_SERVERS: empty: give HOST:PORT"),
        (["--bootstrap-servers", " , "], {}, "^--bootstrap-servers: empty: give HOST:PORT"),
        ([], {"ISRWATCH_SPOOL_DIR": ""}, "^ISRWATCH_SPOOL_DIR: empty: give a value, or leave the option out"),
        # URLs the job posts to or links to: refused at start, not at every post (only in the log)
        (["--alertmanager-url", "alertmanager:9093"], {}, "--alertmanager-url: 'alertmanager:9093' is not an http"),
        (["--alertmanager-url", "http://a:9093", "--alertmanager-url", "ftp://b"], {}, "'ftp://b' is not an http"),
        (["--alertmanager-url", "http://am:99999"], {}, "'http://am:99999': its port is not a number"),
        (["--grafana-url", "grafana.example"], {}, "--grafana-url: 'grafana.example' is not an http"),
        (["--runbook-url", "https://"], {}, "--runbook-url: 'https://' is not an http"),
        (
            ["--bootstrap-servers", "127.0.0.1:9092", "--kafka-config", "ssl.keystore.location=/k.p12"],
            {},
            "--kafka-config ssl.keystore.location: isrwatch's protocol-level client .* cannot use a PKCS#12 keystore",
        ),
        (
            ["--bootstrap-servers", "127.0.0.1:9092", "--kafka-config", "sasl.mechanism=OAUTHBEARER"],
            {},
            "--kafka-config sasl.mechanism=OAUTHBEARER: .* supports GSSAPI, PLAIN, SCRAM-SHA-256, SCRAM-SHA-512",
        ),
    ],
)
def test_bad_values_give_one_clear_message(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(RunSettings, parse(*argv), env)


def test_a_failed_check_names_the_config_file_key_or_the_flag_that_set_the_value(tmp_path: Path) -> None:
    cfg = tmp_path / "isrwatch.toml"
    cfg.write_text("nearing_ratio = 1.5\n")
    with pytest.raises(ConfigError, match=rf"^--config {cfg}: nearing_ratio: 1.5 must be between 0 and 1"):
        load(RunSettings, parse("--config", str(cfg)), {})
    with pytest.raises(ConfigError, match=r"^--nearing-ratio: 1.2 must be between 0 and 1"):  # the flag wins
        load(RunSettings, parse("--config", str(cfg), "--nearing-ratio", "1.2"), {"ISRWATCH_NEARING_RATIO": "0.5"})


def test_cli_prints_one_line_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--lag-time-max-ms", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["isrwatch run: error: --lag-time-max-ms: -1 must be greater than 0"]


def test_the_collectors_cluster_name_is_checked_at_start(capsys: pytest.CaptureFixture[str]) -> None:
    """A name the job would refuse (``name_too_long``) stops ``isrwatch collect`` before it
    publishes a record; the longest allowed passes the check (and stops later, at no broker)."""
    assert main(["collect", "--bootstrap-servers", "127.0.0.1:9", "--cluster", "k" * 256]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "isrwatch collect: error: --cluster: 256 characters, at most 255 (a longer one is rejected: name_too_long)"
    ]


def test_settings_kafka_python_cannot_use_are_refused_at_start_naming_keys_not_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The collector's probe and the job's planner speak Kafka's protocol through kafka-python:
    # refused at start-up, not left to fail every round. Values may be secrets: never shown.
    argv = ["--bootstrap-servers", "127.0.0.1:9", "--kafka-config", "ssl.keystore.password=hunter2"]
    for command in ("collect", "run"):
        assert main([command, *argv, "--kafka-config", "sasl.oauthbearer.client.secret=s3cret"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"isrwatch {command}: error: --kafka-config ")
        assert "sasl.oauthbearer.client.secret, ssl.keystore.password" in err[0]
        assert "hunter2" not in err[0] and "s3cret" not in err[0]
        assert 'docs/kafka.md, "Pointing at a production cluster"' in err[0]  # where the list is
        # An item that is not KEY=VALUE: its own one-line error, for either command.
        assert main([command, "--bootstrap-servers", "127.0.0.1:9", "--kafka-config", "linger.ms"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "'linger.ms' is not KEY=VALUE" in err[0]
    # What kafka-python takes passes, as do librdkafka-only settings without a credential.
    usable = ["security.protocol=SASL_SSL", "sasl.mechanism=SCRAM-SHA-512", "ssl.ca.location=/ca.pem", "linger.ms=5"]
    s = load(RunSettings, parse("--bootstrap-servers", "127.0.0.1:9", *[f"--kafka-config={u}" for u in usable]), {})
    assert s.job.validate() is None
    # The embedded default has no Kafka client to refuse it for.
    assert load(RunSettings, parse("--kafka-config", "ssl.keystore.location=/k.p12"), {}).job.validate() is None


def test_secrets_never_show() -> None:
    s = load(RunSettings, parse("--alertmanager-password", "hunter2"), {})
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.alerting.alertmanager_password)
    assert s.alerting.alertmanager_password is not None and s.alerting.alertmanager_password.reveal() == "hunter2"


def test_run_composes_each_components_settings_with_flat_names() -> None:
    """``isrwatch run``'s options come from four components; each gets its own part."""
    s = load(RunSettings, parse("--replica-series", "not-ok", "--seed", "7", "--trigger-seconds", "2"), {})
    assert s.series.replica_series == "not-ok" and s.simulator.seed == 7 and s.job.trigger_seconds == 2.0
    assert build(RunSettings, grafana_url="http://g").alerting.grafana_url == "http://g"
    with pytest.raises(TypeError, match="no option 'trigger'"):
        build(RunSettings, trigger=1)
    # a fleet's pair: not-ok, and the state topic's ok records at every N-th observation
    fleet = load(RunSettings, parse("--driver-replicas", "not-ok", "--ok-refresh-batches", "5"), {})
    assert (fleet.job.driver_replicas, fleet.job.ok_refresh_batches) == ("not-ok", 5)


@dataclass(frozen=True)
class _PortA:
    port: int = option(1, "a port")


@dataclass(frozen=True)
class _PortB:
    port: int = option(2, "another port")


@dataclass(frozen=True)
class _Both:
    a: _PortA = group(_PortA)
    b: _PortB = group(_PortB)


def test_a_name_in_two_groups_is_refused() -> None:
    with pytest.raises(TypeError, match="'port' is declared by two of its groups"):
        build(_Both)


def test_the_rule_is_chosen_per_cluster_unless_given() -> None:
    """Issue 55: the default, auto, picks each cluster's variant from its Kafka version; a
    variant given by flag, environment or file applies to every cluster."""
    from isrwatch.rule import Rule
    from streaming.lifecycle.assembly import rule_config

    auto, _ = rule_config(load(RunSettings, parse(), {}).job)
    assert (auto.rule, auto.idle_is_caught_up, auto.by_version) == (Rule.KIP16_REFINED, True, True)
    for given in (
        load(RunSettings, parse("--rule", "kip16-refined"), {}),
        load(RunSettings, parse(), {"ISRWATCH_RULE": "kip16-refined"}),
    ):
        cfg, _ = rule_config(given.job)
        assert (cfg.rule, cfg.by_version) == (Rule.KIP16_REFINED, False)


def test_usable_urls_pass_and_the_doctor_checks_its_exporter_urls_too() -> None:
    from doctor.settings import DoctorSettings

    good = ["http://127.0.0.1:9093", "https://am.example/prefix/", "http://[::1]:9093", "HTTP://am"]
    argv = [a for u in good for a in ("--alertmanager-url", u)]
    s = load(
        RunSettings, parse(*argv, "--grafana-url", "https://grafana.example", "--runbook-url", "http://wiki/r"), {}
    )
    assert s.alerting.alertmanager_url == good
    with pytest.raises(ConfigError, match="^--exporter-url: 'localhost:9743' is not an http"):
        build(DoctorSettings, exporter_url=["localhost:9743"])


def test_every_command_checks_its_bootstrap_servers_and_ports() -> None:
    """Each command's Kafka addresses and listening port, at start-up; the forms librdkafka
    takes pass (a protocol prefix, a bracketed IPv6 address, no port, spaces after commas)."""
    from collector.settings import CollectSettings
    from exporter.settings import ExporterSettings
    from replay.settings import ReplaySettings
    from simulator.settings import SimulateSettings

    for cls, name in [
        (CollectSettings, "bootstrap_servers"),
        (CollectSettings, "telemetry_bootstrap_servers"),
        (ExporterSettings, "bootstrap_servers"),
        (ReplaySettings, "bootstrap_servers"),
        (SimulateSettings, "bootstrap_servers"),
    ]:
        flag = "--" + name.replace("_", "-")
        with pytest.raises(ConfigError, match=f"^{flag}: 'k:port' is not HOST:PORT"):
            build(cls, **{name: "k:port"})
    with pytest.raises(ConfigError, match="^--port: 65536 is not a port"):
        build(ExporterSettings, bootstrap_servers="k:9092", port=65536)
    usable = "SSL://k1:9093, [::1]:9092,k3"
    assert build(ExporterSettings, bootstrap_servers=usable, port=0).bootstrap_servers == usable


def test_a_config_file_that_is_not_utf_8_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    cfg = tmp_path / "isrwatch.toml"
    cfg.write_bytes(b'cluster = "caf\xe9"\n')  # Latin-1, as an editor may save it
    with pytest.raises(ConfigError, match=rf"^--config: {cfg} is not valid TOML: not UTF-8 \(byte 14\)$"):
        load(RunSettings, parse("--config", str(cfg)), {})
