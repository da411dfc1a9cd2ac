"""``isrwatch exporter`` against a real Kafka cluster (LocalKafka, loopback):
state topic in, /metrics out, tombstones and start-up errors."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from exporter.main import Exporter
from exporter.settings import ExporterSettings
from isrwatch.status import ReplicaStatus, State, status_key, status_to_json
from localkafka import free_port
from tests.exporter.samples import replica

pytestmark = pytest.mark.kafka

T0 = 1_700_000_000_000


def produce(cluster: Any, topic: str, records: list[tuple[str, ReplicaStatus | None]]) -> None:
    producer = Producer(cluster.client_config(**{"linger.ms": 0}))
    for key, status in records:
        value = None if status is None else json.dumps(status_to_json(status)).encode()
        producer.produce(topic, key=key.encode(), value=value)
    assert producer.flush(30) == 0


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = requests.get(url, timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def wait_scrape(
    url: str, ready: Callable[[dict[tuple[str, tuple[tuple[str, str], ...]], float]], bool], timeout_s: float = 60
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    deadline = time.monotonic() + timeout_s
    while True:
        got = samples(url)
        if ready(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def ratio_of(got: dict, s: ReplicaStatus) -> float | None:
    labels = {
        "cluster": s.cluster,
        "topic": s.topic,
        "partition": str(s.partition),
        "broker_id": str(s.broker_id),
        "leader_id": str(s.leader_id),
    }
    return got.get(("isrwatch_replica_lag_ratio", tuple(sorted(labels.items()))))


def changes(got: dict, topic: str, change: str) -> float | None:
    labels = {"cluster": "prod", "topic": topic, "partition": "0", "change": change}
    return got.get(("isrwatch_isr_changes_total", tuple(sorted(labels.items()))))


def test_exporter_serves_the_state_topic_from_the_beginning(kafka_cluster: Any, unique_name: Callable) -> None:
    topic = unique_name("state")
    kafka_cluster.create_topic(topic, partitions=2, replication_factor=1, config={"cleanup.policy": "compact"})
    watched = unique_name("orders")[:40]
    a = replica(2, State.CRITICAL, topic=watched, ratio=0.85, eval_ms=T0)
    b = replica(3, State.OK, topic=watched, eval_ms=T0)
    # Written before the exporter starts: it must read them back from the beginning.
    produce(kafka_cluster, topic, [(status_key(a), replica(2, topic=watched, eval_ms=T0 - 1000)), (status_key(a), a)])
    produce(kafka_cluster, topic, [(status_key(b), b)])

    settings = ExporterSettings(
        bootstrap_servers=kafka_cluster.bootstrap_servers,
        kafka_config=[f"{k}={v}" for k, v in kafka_cluster.client_config().items() if k != "bootstrap.servers"],
        state_topic=topic,
        host="127.0.0.1",
        port=0,
    )
    with Exporter(settings) as exporter:
        assert exporter.server is not None
        url = exporter.server.url
        got = wait_scrape(url, lambda g: ratio_of(g, a) is not None and ratio_of(g, b) is not None)
        assert ratio_of(got, a) == pytest.approx(0.85)
        assert ratio_of(got, b) == 0
        assert got[("isrwatch_up", ())] == 1
        headroom = ("isrwatch_partition_min_isr_headroom", (("cluster", "prod"), ("leader_id", "1"), ("partition", "0"), ("topic", watched)))  # fmt: skip
        assert got[headroom] == 0  # ISR 3, one follower critical, min ISR 2

        # The follower leaves the ISR, then its topic's replica is deleted (tombstone).
        out = replica(2, State.OUT_OF_SYNC, topic=watched, ratio=1.2, in_isr=False, isr_size=2, eval_ms=T0 + 5000)
        produce(kafka_cluster, topic, [(status_key(out), out)])
        got = wait_scrape(url, lambda g: changes(g, watched, "shrink") == 1)
        assert changes(got, watched, "shrink") == 1
        assert ratio_of(got, out) == pytest.approx(1.2)

        produce(kafka_cluster, topic, [(status_key(out), None)])
        got = wait_scrape(url, lambda g: ratio_of(g, out) is None)
        assert ratio_of(got, out) is None
        assert ratio_of(got, b) == 0  # the others stay


def up_value(url: str) -> float | None:
    return samples(url).get(("isrwatch_up", ()))


def test_isrwatch_up_follows_the_state_topic_through_a_broker_outage(
    kafka_cluster_factory: Callable, unique_name: Callable
) -> None:
    cluster = kafka_cluster_factory(brokers=1)
    topic = unique_name("state")
    cluster.create_topic(topic, partitions=1, replication_factor=1, config={"cleanup.policy": "compact"})
    first = replica(2, State.NEARING, ratio=0.6, eval_ms=T0)
    produce(cluster, topic, [(status_key(first), first)])
    settings = ExporterSettings(
        bootstrap_servers=cluster.bootstrap_servers,
        kafka_config=[f"{k}={v}" for k, v in cluster.client_config().items() if k != "bootstrap.servers"],
        state_topic=topic,
        host="127.0.0.1",
        port=0,
    )
    exporter = Exporter(settings)
    exporter.consumer.housekeeping_s = 1.0
    with exporter:
        assert exporter.server is not None
        url = exporter.server.url
        assert ratio_of(wait_scrape(url, lambda g: ratio_of(g, first) is not None), first) == pytest.approx(0.6)
        assert up_value(url) == 1

        cluster.stop(1, graceful_s=0)
        got = wait_scrape(url, lambda g: g.get(("isrwatch_up", ())) == 0)
        assert got[("isrwatch_up", ())] == 0
        assert ratio_of(got, first) == pytest.approx(0.6)  # the last known state stays served

        cluster.start_broker(1)
        later = replica(2, State.OK, ratio=0.1, eval_ms=T0 + 1000)
        produce(cluster, topic, [(status_key(later), later)])
        got = wait_scrape(url, lambda g: g.get(("isrwatch_up", ())) == 1 and ratio_of(g, later) == 0.1)
        assert got[("isrwatch_up", ())] == 1
        assert ratio_of(got, later) == pytest.approx(0.1)


def _exporter(cluster: Any, topic: str, port: int) -> subprocess.Popen[str]:
    """``isrwatch exporter`` as users run it, on the state topic."""
    cmd = [sys.executable, "-m", "isrwatch", "exporter", "--bootstrap-servers", cluster.bootstrap_servers,
           *cluster.kafka_config_flags(), "--state-topic", topic, "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _serving(proc: subprocess.Popen[str], url: str, ready: Callable[[dict], bool], timeout_s: float = 60) -> dict:
    """The exporter's samples once ``ready`` says so (or at the timeout, or when it exits)."""
    deadline = time.monotonic() + timeout_s
    got: dict = {}
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            got = samples(url)
        except requests.ConnectionError:
            got = {}
        if ready(got):
            break
        time.sleep(0.2)
    return got


def _sigterm(proc: subprocess.Popen[str]) -> str:
    """Stop the exporter as a service manager does; its stderr. Killed if it does not stop."""
    try:
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=30)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_the_exporter_command_serves_and_stops_on_sigterm(kafka_cluster: Any, unique_name: Callable) -> None:
    topic = unique_name("state")
    kafka_cluster.create_topic(topic, partitions=1, replication_factor=1, config={"cleanup.policy": "compact"})
    watched = unique_name("t")[:40]
    s = replica(3, State.STALLED, topic=watched, offset_lag=77, eval_ms=T0)
    produce(kafka_cluster, topic, [(status_key(s), s)])
    port = free_port()
    proc = _exporter(kafka_cluster, topic, port)
    try:
        got = _serving(proc, f"http://127.0.0.1:{port}/metrics", lambda g: ratio_of(g, s) is not None)
        offset_lag = {k: v for k, v in got.items() if k[0] == "isrwatch_replica_offset_lag"}
        assert list(offset_lag.values()) == [77]
        assert ("process_cpu_seconds_total", ()) in got
    finally:
        err = _sigterm(proc)
    assert proc.returncode == 0, err[-2000:]
    assert "event=exporter_started" in err and "event=exporter_stopping signal=SIGTERM" in err


# Values a user's cluster may put on the state topic (a stray producer, another tool's records,
# a corrupted write): none is a state record, each must be counted and skipped with its reason.
POISON = [
    b"",
    b"\xff\xfe\x00garbage",
    b"null",
    b"[1, 2, 3]",
    b'"a string"',
    b"[" * 50_000 + b"]" * 50_000,
    b'{"cluster": "prod"}',
]


def _poison(cluster: Any, topic: str, good: ReplicaStatus) -> None:
    """Every POISON value and the same record as ``good`` with a string where a number goes,
    under keys of their own, then ``good``. (A compacted topic refuses records without a key.)"""
    producer = Producer(cluster.client_config(**{"linger.ms": 0}))
    wrong = dict(status_to_json(good), lag_ratio="high", topic=good.topic + "-wrong")
    for i, value in enumerate([*POISON, json.dumps(wrong).encode()]):
        producer.produce(topic, key=f"poison-{i}".encode(), value=value)
    producer.produce(topic, key=status_key(good).encode(), value=json.dumps(status_to_json(good)).encode())
    assert producer.flush(30) == 0


def test_bad_records_on_the_state_topic_are_skipped_with_a_reason_and_survive_a_restart(
    kafka_cluster: Any, unique_name: Callable
) -> None:
    """Any bytes on the state topic: the exporter command counts each bad record (a metric),
    logs why, and goes on serving the good ones (before the fix a JSON array or null ended its
    consumer, and the gauges froze with /metrics still answering). Compacted, the topic keeps
    them: a restart reads them again, and must serve just the same."""
    topic = unique_name("state")
    kafka_cluster.create_topic(topic, partitions=1, replication_factor=1, config={"cleanup.policy": "compact"})
    watched = unique_name("t")[:40]
    first = replica(2, State.NEARING, topic=watched, ratio=0.6, eval_ms=T0)
    later = replica(2, State.OK, topic=watched, ratio=0.1, eval_ms=T0 + 1000)  # the same replica, newer
    _poison(kafka_cluster, topic, first)
    for run, newest in ((1, first), (2, later)):
        port = free_port()
        proc = _exporter(kafka_cluster, topic, port)
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            got = _serving(proc, url, lambda g, s=newest: ratio_of(g, s) == pytest.approx(s.lag_ratio))
            assert ratio_of(got, newest) == pytest.approx(newest.lag_ratio), f"run {run}: the good record is not served"
            if run == 1:
                # more poison, then a newer status of the same replica: read after the poison too
                _poison(kafka_cluster, topic, later)
                got = _serving(proc, url, lambda g: ratio_of(g, later) == pytest.approx(0.1))
                assert ratio_of(got, later) == pytest.approx(0.1), "a status after bad records is not served"
            series = [k for k in got if k[0] == "isrwatch_replica_lag_ratio"]
            assert len(series) == 1, series  # nothing of the bad records, the wrong-typed one included
            # Both rounds of poison, read before the newer status they precede. (The topic's one
            # active segment is never compacted, so the second start reads both rounds too.)
            skipped = got.get(("isrwatch_state_records_unreadable_total", ()))
            assert skipped == 2 * (len(POISON) + 1), f"run {run}: {skipped} counted"
        finally:
            err = _sigterm(proc)
        assert proc.returncode == 0, err[-2000:]
        assert "Traceback" not in err, err[-3000:]
        reasons = [line for line in err.splitlines() if "event=state_record_unreadable" in line]
        for expected in ("not JSON", "nested too deeply", "not a JSON object: null", "not a JSON object: array",
                         "missing fields", "field lag_ratio: number expected, not string"):  # fmt: skip
            assert any(expected in line for line in reasons), f"run {run}: no {expected!r} in {reasons}"


def test_the_exporter_killed_and_restarted_serves_every_state_again(kafka_cluster: Any, unique_name: Callable) -> None:
    """Issue 14, item 2, the exporter: ``kill -9`` (no goodbye, nothing flushed), statuses
    written while it is down, a restart: every replica's newest status is served again, read
    back from the compacted state topic (the exporter keeps nothing on disk). How long that
    took is printed, not asserted."""
    topic = unique_name("state")
    kafka_cluster.create_topic(topic, partitions=2, replication_factor=1, config={"cleanup.policy": "compact"})
    watched = unique_name("t")[:40]
    a = replica(2, State.CRITICAL, topic=watched, ratio=0.85, eval_ms=T0)
    b = replica(3, State.OK, topic=watched, partition=1, eval_ms=T0)
    produce(kafka_cluster, topic, [(status_key(a), a), (status_key(b), b)])
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = _exporter(kafka_cluster, topic, port)
    try:
        got = _serving(proc, url, lambda g: ratio_of(g, a) is not None and ratio_of(g, b) is not None)
        assert (ratio_of(got, a), ratio_of(got, b)) == (pytest.approx(0.85), 0)
        proc.kill()
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        # while it is down: a's follower leaves the ISR, a new replica is seen, b's is deleted
        a2 = replica(2, State.OUT_OF_SYNC, topic=watched, ratio=1.3, in_isr=False, isr_size=2, eval_ms=T0 + 5000)
        c = replica(1, State.STALLED, topic=watched, partition=1, leader_id=2, offset_lag=40, eval_ms=T0 + 5000)
        produce(kafka_cluster, topic, [(status_key(a2), a2), (status_key(c), c), (status_key(b), None)])
        started = time.monotonic()
        proc = _exporter(kafka_cluster, topic, port)

        def newest(g: dict) -> bool:
            return ratio_of(g, a2) == pytest.approx(1.3) and ratio_of(g, c) is not None and ratio_of(g, b) is None

        got = _serving(proc, url, newest)
        print(f"exporter restarted: every newest status served {time.monotonic() - started:.1f} s after its start")
        assert newest(got), f"after the restart: {got}"
        assert got[("isrwatch_up", ())] == 1
        ratios = {k: v for k, v in got.items() if k[0] == "isrwatch_replica_lag_ratio"}
        assert len(ratios) == 2, ratios  # a2 and c: nothing of the deleted replica, nothing twice
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
