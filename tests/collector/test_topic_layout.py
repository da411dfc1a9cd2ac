"""What the collector says at start-up about the telemetry topic's layout, on the real
Kafka 0.9 cluster: a replicated telemetry topic on the watched cluster cannot be read while
a follower of it hangs (docs/deploy.md), and a user must hear that before the fault."""

from __future__ import annotations

import subprocess
import sys

import pytest

from localkafka import COMPAT_CONFIG

pytestmark = pytest.mark.kafka

COMPAT = [a for k, v in COMPAT_CONFIG.items() for a in ("--kafka-config", f"{k}={v}")]


def _collect(cluster, telemetry: str, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "isrwatch", "collect", "--bootstrap-servers", cluster.bootstrap_servers,
         "--telemetry-topic", telemetry, "--interval", "0.5", "--duration", "1", *COMPAT, *extra],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.parametrize(
    ("replication", "warned"),
    [(3, True), (1, False)],
    ids=["replicated", "one-replica"],
)
def test_a_replicated_telemetry_topic_on_the_watched_cluster_is_warned_of(
    kafka_cluster, unique_name, replication, warned
):
    telemetry = unique_name("telemetry")
    kafka_cluster.create_topic(telemetry, partitions=3, replication_factor=replication)
    stderr = _collect(kafka_cluster, telemetry)
    assert ("event=telemetry_topic_replicated" in stderr) is warned, stderr
    if warned:
        assert f"topic={telemetry} partitions=3" in stderr and "--telemetry-bootstrap-servers" in stderr


def test_a_replicated_telemetry_topic_on_a_cluster_of_its_own_is_fine(kafka_cluster, unique_name):
    # The same cluster named as the telemetry cluster stands in for a separate one: what the
    # collector checks is that the user chose where telemetry goes.
    telemetry = unique_name("telemetry")
    kafka_cluster.create_topic(telemetry, partitions=3, replication_factor=3)
    stderr = _collect(kafka_cluster, telemetry, "--telemetry-bootstrap-servers", kafka_cluster.bootstrap_servers)
    assert "telemetry_topic_replicated" not in stderr, stderr
    assert "collector_connected" in stderr
