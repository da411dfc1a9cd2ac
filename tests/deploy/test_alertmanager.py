"""deploy/alertmanager: amtool accepts the config, alerts route where they
should, and a real Alertmanager running it inhibits what it should (and only that)
for alerts made by isrwatch.alerts."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from isrwatch.alerts import AlertName, replica_alerts, stale_alert
from isrwatch.status import ReplicaStatus, State
from localservices import alertmanager, binary
from tests.deploy.panels import DEPLOY
from tests.exporter.samples import replica

CONFIG = DEPLOY / "alertmanager" / "alertmanager.yml"
AMTOOL = binary("amtool")
needs_amtool = pytest.mark.skipif(
    AMTOOL is None, reason="amtool not installed (Debian package prometheus-alertmanager; `make system-packages`)"
)


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert AMTOOL is not None
    return subprocess.run([AMTOOL, *args], capture_output=True, text=True, timeout=60)


@needs_amtool
def test_amtool_check_config() -> None:
    result = amtool("check-config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_amtool
@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        ({"alertname": "KafkaReplicaOutOfSync", "severity": "critical"}, "kafka-oncall"),
        ({"alertname": "KafkaReplicaStalled", "severity": "critical"}, "kafka-oncall"),
        ({"alertname": "KafkaPartitionMinIsrAtRisk", "severity": "critical"}, "kafka-oncall"),
        ({"alertname": "KafkaReplicaNearingIsrShrink", "severity": "warning"}, "kafka-chat"),
        ({"alertname": "IsrwatchTelemetryStale", "severity": "warning"}, "monitoring"),
    ],
)
def test_routes(labels: dict[str, str], receiver: str) -> None:
    pairs = [f"{k}={v}" for k, v in {**labels, "cluster": "c1", "topic": "orders"}.items()]
    result = amtool("config", "routes", "test", f"--config.file={CONFIG}", *pairs)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == [receiver]


def test_grouping_by_cluster_and_topic() -> None:
    route = yaml.safe_load(CONFIG.read_text())["route"]
    assert set(route["group_by"]) == {"cluster", "topic"}


def test_required_inhibitions_are_declared() -> None:
    rules = yaml.safe_load(CONFIG.read_text())["inhibit_rules"]
    by_source = {r["source_matchers"][0]: r for r in rules}
    out_of_sync = by_source[f'alertname="{AlertName.OUT_OF_SYNC.value}"']
    assert set(out_of_sync["equal"]) == {"cluster", "topic", "partition", "broker_id"}
    stale = by_source[f'alertname="{AlertName.TELEMETRY_STALE.value}"']
    assert stale["equal"] == ["cluster"]


def _status(cluster: str, partition: int, broker_id: int, state: State, ratio: float, now_ms: int) -> ReplicaStatus:
    return replica(
        broker_id,
        state,
        cluster=cluster,
        partition=partition,
        eval_ms=now_ms,
        ratio=ratio,
        offset_lag=500,
        lag_time_max_ms=10_000,
    )


def _key(alert: dict[str, Any]) -> tuple[str, str, str, str]:
    labels = alert["labels"]
    return (labels["alertname"], labels["cluster"], labels.get("partition", ""), labels.get("broker_id", ""))


def _wait_for(url: str, expected: dict[tuple[str, str, str, str], str]) -> dict[tuple[str, str, str, str], str]:
    """Poll the API until every alert has its expected state (active/suppressed);
    return what was last seen."""
    deadline = time.monotonic() + 30
    seen: dict[tuple[str, str, str, str], str] = {}
    while time.monotonic() < deadline:
        alerts = requests.get(f"{url}/api/v2/alerts", timeout=5).json()
        seen = {_key(a): a["status"]["state"] for a in alerts}
        if seen == expected:
            break
        time.sleep(0.3)
    return seen


@pytest.mark.services
@pytest.mark.skipif(
    binary("alertmanager", "prometheus-alertmanager") is None,
    reason="alertmanager not installed (Debian package prometheus-alertmanager; `make system-packages`)",
)
def test_real_alertmanager_inhibits(tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    out_of_sync = replica_alerts(_status("c1", 0, 2, State.OUT_OF_SYNC, 1.2, now_ms))
    assert [a.name for a in out_of_sync] == [AlertName.NEARING, AlertName.IMMINENT, AlertName.OUT_OF_SYNC]
    nearing = replica_alerts(_status("c1", 1, 3, State.NEARING, 0.6, now_ms))
    other_cluster = replica_alerts(_status("c2", 0, 2, State.CRITICAL, 0.9, now_ms))

    with alertmanager(CONFIG, tmp_path) as am:
        posted = requests.post(
            f"{am.url}/api/v2/alerts",
            json=[a.to_alertmanager() for a in out_of_sync + nearing + other_cluster],
            timeout=5,
        )
        assert posted.status_code == 200, posted.text
        expected = {
            # orders-0 broker 2 is out of sync: its Nearing and Imminent are silenced.
            ("KafkaReplicaNearingIsrShrink", "c1", "0", "2"): "suppressed",
            ("KafkaReplicaIsrShrinkImminent", "c1", "0", "2"): "suppressed",
            ("KafkaReplicaOutOfSync", "c1", "0", "2"): "active",
            # Another replica of the same partition's topic keeps its own warning.
            ("KafkaReplicaNearingIsrShrink", "c1", "1", "3"): "active",
            # c2's replica is critical: Imminent silences its Nearing.
            ("KafkaReplicaNearingIsrShrink", "c2", "0", "2"): "suppressed",
            ("KafkaReplicaIsrShrinkImminent", "c2", "0", "2"): "active",
        }
        assert _wait_for(am.url, expected) == expected

        # c1 goes dark: every replica alert of c1 is silenced, c2's are not.
        stale = stale_alert("c1", now_ms - 30_000, now_ms)
        posted = requests.post(f"{am.url}/api/v2/alerts", json=[stale.to_alertmanager()], timeout=5)
        assert posted.status_code == 200, posted.text
        expected = {
            ("KafkaReplicaNearingIsrShrink", "c1", "0", "2"): "suppressed",
            ("KafkaReplicaIsrShrinkImminent", "c1", "0", "2"): "suppressed",
            ("KafkaReplicaOutOfSync", "c1", "0", "2"): "suppressed",
            ("KafkaReplicaNearingIsrShrink", "c1", "1", "3"): "suppressed",
            ("KafkaReplicaNearingIsrShrink", "c2", "0", "2"): "suppressed",
            ("KafkaReplicaIsrShrinkImminent", "c2", "0", "2"): "active",
            ("IsrwatchTelemetryStale", "c1", "", ""): "active",
        }
        assert _wait_for(am.url, expected) == expected
