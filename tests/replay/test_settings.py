"""``isrwatch replay``'s flags: the settings they expand to, and one clear message when wrong
(checked before Spark starts: the console script, as a user runs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from isrwatch import cli
from isrwatch.rule import Rule
from replay.main import Setting, settings_to_run
from replay.settings import ReplaySettings, parse_time_ms

ISRWATCH = str(Path(sys.executable).with_name("isrwatch"))


def test_every_rule_with_every_value_and_the_message_values_for_the_message_rule_only() -> None:
    s = ReplaySettings(
        simulate="burst",
        rule=["kip16", "legacy-messages"],
        lag_time_max_ms=["10000,30000"],
        lag_max_messages=["4000", "500"],
    )
    assert settings_to_run(s) == [
        Setting(Rule.KIP16, 10_000, None),
        Setting(Rule.KIP16, 30_000, None),
        Setting(Rule.LEGACY_MESSAGES, 10_000, 4000),
        Setting(Rule.LEGACY_MESSAGES, 10_000, 500),
        Setting(Rule.LEGACY_MESSAGES, 30_000, 4000),
        Setting(Rule.LEGACY_MESSAGES, 30_000, 500),
    ]


def test_by_default_every_rule_at_the_recorded_setting() -> None:
    assert [s.rule for s in settings_to_run(ReplaySettings(simulate="burst"))] == list(Rule)
    assert {s.lag_time_max_ms for s in settings_to_run(ReplaySettings(simulate="burst"))} == {None}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "--input PATH, --bootstrap-servers HOSTS or --simulate SCENARIO"),
        (["--simulate", "burst", "--input", "x"], "--input PATH, --bootstrap-servers HOSTS or --simulate SCENARIO"),
        (["--simulate", "burst", "--since", "yesterday"], "--since 'yesterday' is not a time"),
        (["--simulate", "burst", "--since", "2026-11-24T13:00:00Z", "--until", "2026-11-24T12:00:00"], "is not before"),
        (["--simulate", "burst", "--lag-time-max-ms", "10000,abc"], "'abc' is not a whole number"),
        (["--simulate", "burst", "--lag-time-max-ms", "0"], "must be > 0"),
        (["--simulate", "burst", "--rule", "kip17"], "is not one of"),
        (["--input", "/nonexistent/recording"], "no such file or directory"),
    ],
)
def test_a_wrong_flag_is_one_line(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["replay", *args]) == 2  # checked before any record is read or Spark starts
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("isrwatch replay: error:") and says in err, err


def test_the_console_script_says_it_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([ISRWATCH, "replay"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "isrwatch replay: error: give one recording to replay: --input PATH, --bootstrap-servers HOSTS or "
        "--simulate SCENARIO"
    ], done.stderr


def test_an_empty_recording_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert cli.main(["replay", "--input", str(empty)]) == 2
    assert "no telemetry records in it" in capsys.readouterr().err


def test_times_are_epoch_ms_or_iso_8601_utc_unless_said() -> None:
    assert parse_time_ms("1795591964693") == 1795591964693
    assert parse_time_ms("2026-11-24T13:00:00Z") == parse_time_ms("2026-11-24T13:00:00") == 1795525200000
    assert parse_time_ms("2026-11-24T14:00:00+01:00") == 1795525200000
    assert parse_time_ms(None) is None
