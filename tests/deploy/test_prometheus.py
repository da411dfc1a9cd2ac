"""deploy/prometheus: config and rules checked by promtool, rule unit tests run,
the alerts held to the contract (names, labels, annotations), and the rules
loaded by a real Prometheus."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import requests
import yaml

from isrwatch.alerts import SEVERITY, AlertName
from isrwatch.outcomes import PREDICTIONS_MISSING
from localservices import binary, prometheus
from tests.deploy.panels import (
    DEPLOY,
    FLAPPING,
    RULE_RUNBOOK_URL,
    RULES_FILE,
    known_metric_names,
    metric_names,
    rules_with_interval,
)

PROM = DEPLOY / "prometheus"
PROMTOOL = binary("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package prometheus; `make system-packages`)"
)
REPLICA_LABELS = {"cluster", "topic", "partition", "broker_id", "leader_id"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def alert_rules() -> dict[str, dict]:
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


@needs_promtool
def test_promtool_check_config() -> None:
    result = promtool("check", "config", str(PROM / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    # The config's rule_files glob really picks up the rules.
    assert "1 rule files found" in result.stdout


@needs_promtool
def test_promtool_check_rules() -> None:
    files = sorted((PROM / "rules").glob("*.yml"))
    assert files
    result = promtool("check", "rules", *map(str, files))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_test_rules() -> None:
    files = sorted((PROM / "tests").glob("*.yml"))
    assert files
    result = promtool("test", "rules", *map(str, files))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_rule_tests_can_fail(tmp_path: Path) -> None:
    """The unit tests notice a wrong threshold (they would fire for the healthy replica)."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    broken = RULES_FILE.read_text().replace(
        "isrwatch_replica_last_update_timestamp_seconds > 60)) >= 0.5",
        "isrwatch_replica_last_update_timestamp_seconds > 60)) >= 0.25",
    )
    assert broken != RULES_FILE.read_text()
    (tmp_path / "rules" / RULES_FILE.name).write_text(broken)
    for f in (PROM / "tests").glob("*.yml"):
        (tmp_path / "tests" / f.name).write_text(f.read_text())
    result = promtool("test", "rules", *map(str, sorted((tmp_path / "tests").glob("*.yml"))))
    assert result.returncode != 0
    assert 'broker_id="1"' in result.stdout + result.stderr  # the healthy follower of orders-1


def test_alert_names_are_the_contract() -> None:
    """The job's alerts, the one that watches the job's predictions against the brokers' shrinks,
    and the one that reads the job's out-of-sync episodes."""
    assert set(alert_rules()) == {a.value for a in AlertName} | {PREDICTIONS_MISSING, FLAPPING}


def test_flapping_is_per_follower_from_the_episode_counter() -> None:
    """KafkaReplicaFlapping: a warning per follower (no leader_id: the counter has none, a leader
    change does not reset it), from the episode counter through the windowed recording rules."""
    rule = alert_rules()[FLAPPING]
    assert rule["labels"] == {"severity": "warning"}
    assert rule["annotations"]["runbook_url"] == RULE_RUNBOOK_URL + "#" + FLAPPING.lower()
    assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
    expr = " ".join(rule["expr"].split())
    assert "isrwatch:replica_out_of_sync_episodes:increase1h >= 2" in expr
    assert "isrwatch:replica_out_of_sync_episodes:increase10m >= 1" in expr
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    recorded = {r["record"]: " ".join(r["expr"].split()) for g in groups for r in g["rules"] if "record" in r}
    for window in ("10m", "1h"):
        record = recorded[f"isrwatch:replica_out_of_sync_episodes:increase{window}"]
        assert f"increase(isrwatch_replica_out_of_sync_episodes_total[{window}])" in record
        assert "max by (cluster, topic, partition, broker_id)" in record and "leader_id" not in record


# Each guard of the flapping rule, broken: its promtool test must notice.
FLAPPING_BREAKS = {
    "no alert": ("alert: KafkaReplicaFlapping", "alert: KafkaReplicaFlappingNot"),
    "fires while still out": ('state=~"out_of_sync|stalled"', 'state="none"'),
    "once an hour is repeated": (
        "isrwatch:replica_out_of_sync_episodes:increase1h >= 2",
        "isrwatch:replica_out_of_sync_episodes:increase1h >= 1",
    ),
    "a counter born is not counted": (
        "offset 10m)\n            and on (cluster)",
        "offset 10m) and on () vector(0) == 1\n            and on (cluster)",
    ),
    "a target back from a gap is a birth": ("(min_over_time(up[15m]) == 1)", "(min_over_time(up[15m]) >= 0)"),
    "a counter born before watching is a birth": (
        "(isrwatch_telemetry_last_timestamp_seconds offset 10m)",
        "(isrwatch_telemetry_last_timestamp_seconds)",
    ),
}


@needs_promtool
@pytest.mark.parametrize("change", list(FLAPPING_BREAKS), ids=list(FLAPPING_BREAKS))
def test_flapping_rule_tests_can_fail(tmp_path: Path, change: str) -> None:
    old, new = FLAPPING_BREAKS[change]
    text = RULES_FILE.read_text()
    assert old in text
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules" / RULES_FILE.name).write_text(text.replace(old, new))
    test = PROM / "tests" / "isrwatch-flapping.test.yml"
    (tmp_path / "tests" / test.name).write_text(test.read_text())
    result = promtool("test", "rules", str(tmp_path / "tests" / test.name))
    assert result.returncode != 0, result.stdout
    assert "FAILED" in result.stdout + result.stderr, result.stdout + result.stderr


def test_predictions_missing_reads_the_one_threshold() -> None:
    rule = alert_rules()[PREDICTIONS_MISSING]
    assert rule["labels"] == {"severity": "warning"}
    assert rule["annotations"]["runbook_url"] == RULE_RUNBOOK_URL + "#" + PREDICTIONS_MISSING.lower()
    assert "isrwatch:isr_shrinks_missed:threshold" in rule["expr"]
    assert "isrwatch:isr_shrinks_missed:ratio1h" in rule["expr"]


@pytest.mark.parametrize("name", [a for a in AlertName], ids=lambda a: a.value)
def test_alert_labels_and_annotations(name: AlertName) -> None:
    rule = alert_rules()[name.value]
    assert rule["labels"] == {"severity": SEVERITY[name]}
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    # From the one recording rule isrwatch:runbook_url (test_runbook checks it), with the alert's anchor.
    assert annotations["runbook_url"] == RULE_RUNBOOK_URL + "#" + name.value.lower()
    # Output labels are chosen explicitly (no job/instance leaking into the alert).
    expr = " ".join(rule["expr"].split())
    if name is AlertName.TELEMETRY_STALE:
        assert "max by (cluster)" in expr
    elif name is AlertName.MIN_ISR_AT_RISK:
        assert "min by (cluster, topic, partition, leader_id)" in expr
    else:
        assert f"by ({', '.join(['cluster', 'topic', 'partition', 'broker_id', 'leader_id'])})" in expr


def test_rules_read_only_known_metrics() -> None:
    known = known_metric_names()
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    for rule in (r for g in groups for r in g["rules"]):
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('alert') or rule.get('record')}: unknown metrics {unknown}"


@pytest.mark.services
@pytest.mark.skipif(binary("prometheus") is None, reason="prometheus not installed (`make system-packages`)")
def test_real_prometheus_loads_the_rules(tmp_path: Path) -> None:
    """The shipped prometheus.yml (service targets swapped for nothing) and rules
    load into a real Prometheus and every rule evaluates without error."""
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    config["scrape_configs"] = []
    config["alerting"] = {"alertmanagers": []}
    config["global"]["evaluation_interval"] = "1s"
    (tmp_path / "rules").mkdir()
    text = rules_with_interval("1s")
    (tmp_path / "rules" / RULES_FILE.name).write_text(text)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))

    with prometheus(tmp_path / "prometheus.yml", tmp_path) as prom:
        deadline = time.monotonic() + 60
        while True:
            groups = requests.get(f"{prom.url}/api/v1/rules", timeout=5).json()["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            if rules and all(r.get("health") == "ok" for r in rules):
                break
            bad = [r for r in rules if r.get("health") == "err"]
            assert not bad, [(r["name"], r.get("lastError")) for r in bad]
            assert time.monotonic() < deadline, f"rules not evaluated: {[(r['name'], r.get('health')) for r in rules]}"
            time.sleep(0.5)
        names = {r["name"] for r in rules}
        assert {a.value for a in AlertName} <= names
        assert {"isrwatch:replicas_by_state:count", "isrwatch:replica_lag_time_max_seconds:max"} <= names


def test_rule_thresholds_are_the_jobs_defaults() -> None:
    """The rules restate the job's --nearing-ratio, --critical-ratio and
    --stale-after-seconds defaults: a change to one must show here."""
    from isrwatch.status import Thresholds
    from streaming.settings import JobSettings

    defaults = JobSettings()
    assert (defaults.nearing_ratio, defaults.critical_ratio) == (
        Thresholds().nearing_ratio,
        Thresholds().critical_ratio,
    )
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    exprs = {r["alert"]: " ".join(r["expr"].split()) for g in groups for r in g["rules"] if "alert" in r}

    def threshold(name: str, op: str) -> float:
        found = re.findall(rf"\) {re.escape(op)} ([0-9.]+)", exprs[name])
        assert len(found) == 1, (name, exprs[name])
        return float(found[0])

    assert threshold(AlertName.NEARING.value, ">=") == defaults.nearing_ratio
    assert threshold(AlertName.IMMINENT.value, ">=") == defaults.critical_ratio
    assert threshold(AlertName.TELEMETRY_STALE.value, ">") == defaults.stale_after_seconds
