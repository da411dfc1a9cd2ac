"""Layered settings: defaults, file, environment, flags; one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from isrwatch.cli import build_parser, main
from isrwatch.exceptions import ConfigError
from isrwatch.settings import kafka_config_pairs, load
from streaming.settings import RunSettings


def parse(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["run", *argv])


def test_layers_later_wins(tmp_path: Path) -> None:
    cfg = tmp_path / "isrwatch.toml"
    cfg.write_text('lag_time_max_ms = 20000\ntrigger_seconds = 2.0\nrule = "kip16"\n')
    env = {"ISRWATCH_LAG_TIME_MAX_MS": "25000", "ISRWATCH_ALERTMANAGER_URL": "http://127.0.0.1:1,http://127.0.0.1:2"}
    s = load(RunSettings, parse("--config", str(cfg), "--trigger-seconds", "3"), env)
    assert s.lag_time_max_ms == 25000  # env over file
    assert s.trigger_seconds == 3.0  # flag over file
    assert s.rule == "kip16"  # file over default
    assert s.alertmanager_url == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert load(RunSettings, parse(), {}).lag_time_max_ms is None


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
    ],
)
def test_bad_values_give_one_clear_message(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(RunSettings, parse(*argv), env)


def test_cli_prints_one_line_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--lag-time-max-ms", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["isrwatch run: error: --lag-time-max-ms: -1 must be greater than 0"]


def test_secrets_never_show() -> None:
    s = load(RunSettings, parse("--alertmanager-password", "hunter2"), {})
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.alertmanager_password)
    assert s.alertmanager_password is not None and s.alertmanager_password.reveal() == "hunter2"


def test_kafka_config_pairs() -> None:
    assert kafka_config_pairs(["security.protocol=SASL_SSL", "sasl.password=a=b"]) == {
        "security.protocol": "SASL_SSL",
        "sasl.password": "a=b",
    }
    with pytest.raises(ConfigError, match="is not KEY=VALUE"):
        kafka_config_pairs(["security.protocol"])
