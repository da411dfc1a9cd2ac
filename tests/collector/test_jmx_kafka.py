"""``--source jmx`` against the real local Kafka 0.9 cluster's MBeans (the session's cluster;
the one paused broker is resumed before its test ends)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from confluent_kafka import Consumer, TopicPartition

from collector.jmx import RMI_TIMEOUT_MS, JmxConnection, JmxError, start_jvm
from collector.jmxprobe import JmxProbe
from collector.probe import ClusterProbe, Snapshot
from isrwatch.clientconfig import kafka_python_config
from isrwatch.settings import Secret
from isrwatch.telemetry import decode_record, json_schema
from localkafka import COMPAT_CONFIG, LocalKafka, free_port
from tests.e2e.kafka_io import ProduceLoad, read_records

pytestmark = pytest.mark.kafka

PARTITIONS = 3
# Each broker's read gets this long in the fault tests: generous for a loaded 2-core machine,
# well under the RMI client's own timeout, which a round must never wait for.
ROUND_TIMEOUT_S = 2.0
SECRET = f"jmx-pw-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def topic(kafka_cluster: Any) -> str:
    """A watched topic on which each broker leads one partition and follows the two others
    (pinned: the tests read every broker's JMX as leader and as follower; no isrwatch topic is
    created here, the probes are read directly)."""
    name = f"jmx-watched-{uuid.uuid4().hex[:8]}"
    kafka_cluster.create_topic(name, assignment=[[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    return name


def _metadata(cluster: Any, round_timeout_s: float) -> ClusterProbe:
    return ClusterProbe(kafka_python_config(cluster.bootstrap_servers, COMPAT_CONFIG), round_timeout_s)


def _jmx_probe(cluster: Any, endpoints: list[str], round_timeout_s: float) -> JmxProbe:
    return JmxProbe(_metadata(cluster, round_timeout_s), [JmxConnection(e) for e in endpoints], round_timeout_s)


@pytest.fixture
def probes(kafka_cluster: Any) -> Iterator[tuple[ClusterProbe, JmxProbe]]:
    """The fetch probe and the JMX probe on the same cluster, connected."""
    k = kafka_cluster
    fetch = _metadata(k, 3.0)
    jmx = _jmx_probe(k, [k.jmx_address(b) for b in k.broker_ids], 3.0)
    fetch.connect(30)
    try:
        jmx.connect(30)
        yield fetch, jmx
    finally:
        jmx.close()
        fetch.close()


def _round_seen(i: int, snap: Snapshot, victim: int) -> str:
    """What round ``i`` saw, for a failure message: who answered, and where the metadata put ``victim``."""
    answered = sorted({key[0] for key in snap.leo})
    hosting = sorted({(p.topic, p.partition) for p in snap.partitions if victim in p.replicas})
    return (
        f"round {i}: answered {answered}, brokers {sorted(snap.brokers)}, metadata fresh {snap.metadata_fresh}, "
        f"{len(snap.partitions)} partitions, {len(hosting)} of them with broker {victim} among the replicas"
    )


def _leos(snap: Snapshot, topic: str) -> dict[tuple[int, str, int], int]:
    return {key: leo for key, leo in snap.leo.items() if key[1] == topic}


def test_jmx_and_fetch_agree_on_every_replicas_log_end_offset(kafka_cluster, topic, probes) -> None:
    fetch, jmx = probes
    replicas = {(b, topic, p) for b in kafka_cluster.broker_ids for p in range(PARTITIONS)}
    with ProduceLoad(kafka_cluster, topic, PARTITIONS, rate=300) as load:
        time.sleep(1.0)
        for _ in range(4):
            # Under load, one JMX round between two fetch rounds: offsets only grow, so every
            # replica's JMX offset lies between the two fetched ones.
            before, during, after = fetch.snapshot(), jmx.snapshot(), fetch.snapshot()
            assert not (before.unreachable | during.unreachable | after.unreachable)
            lo, mid, hi = _leos(before, topic), _leos(during, topic), _leos(after, topic)
            assert set(lo) == set(mid) == set(hi) == replicas
            outside = {r: (lo[r], mid[r], hi[r]) for r in replicas if not lo[r] <= mid[r] <= hi[r]}
            assert not outside, f"JMX offsets outside the fetched ones around them: {outside}"
        assert sum(hi[(p + 1, topic, p)] for p in range(PARTITIONS)) > 0, "the load reached no leader"
    # Load stopped (every message acknowledged): once the followers have caught up, both
    # sources say the same offset for every replica, the number of messages produced.
    deadline = time.monotonic() + 30
    while True:
        quiet = _leos(fetch.snapshot(), topic)
        if set(quiet) == replicas and all(
            len({quiet[(b, t, p)] for b, t, p in replicas if p == part}) == 1 for part in range(PARTITIONS)
        ):
            break
        assert time.monotonic() < deadline, f"followers did not catch up: {quiet}"
        time.sleep(0.3)
    assert _leos(jmx.snapshot(), topic) == quiet == _leos(fetch.snapshot(), topic)
    assert sum(quiet[(p + 1, topic, p)] for p in range(PARTITIONS)) == load.sent
    # What each broker said about its own replication came with the offsets.
    for broker in kafka_cluster.broker_ids:
        reading = jmx.readings[broker]
        assert reading.isr_shrinks is not None and reading.isr_expands is not None
        assert reading.under_replicated == 0 and reading.max_lag is not None


def test_a_closed_jmx_port_makes_its_broker_unreachable_and_the_others_carry_on(kafka_cluster, topic) -> None:
    k = kafka_cluster
    # broker 3's endpoint is a port nobody listens on
    probe = _jmx_probe(k, [k.jmx_address(1), k.jmx_address(2), f"127.0.0.1:{free_port()}"], ROUND_TIMEOUT_S)
    try:
        for snap in (probe.connect(30), probe.snapshot()):
            assert snap.unreachable == {3}
            assert {key for key in _leos(snap, topic)} == {(b, topic, p) for b in (1, 2) for p in range(PARTITIONS)}
    finally:
        probe.close()


def test_a_paused_broker_is_unreachable_within_the_round_and_answers_again_after(kafka_cluster, topic) -> None:
    k = kafka_cluster
    # Which broker is paused is chosen, not assumed: any but the controller, found now (earlier
    # tests on this shared cluster may have moved it). What this test proves is the JMX probe's
    # own round; a paused controller would also move leadership for the whole shared cluster
    # (ZooKeeper session expiry), which tests/e2e/test_broker_pauses.py covers.
    controller = k.controller_id()
    victim = max(b for b in k.broker_ids if b != controller)
    others = set(k.broker_ids) - {victim}
    probe = _jmx_probe(k, [k.jmx_address(b) for b in k.broker_ids], ROUND_TIMEOUT_S)
    probe.connect(30)
    try:
        assert probe.snapshot().unreachable == set()
        k.pause(victim)
        try:
            paused = [probe.snapshot() for _ in range(3)]
        finally:
            k.resume(victim)
        for i, snap in enumerate(paused):
            assert snap.unreachable == {victim}, _round_seen(i, snap, victim)
            assert {key for key in _leos(snap, topic)} == {(b, topic, p) for b in others for p in range(PARTITIONS)}
            # the round did not wait for the hung broker's read (nor for the RMI client's own timeout)
            assert snap.round_s < RMI_TIMEOUT_MS / 1000, snap.round_s
        deadline = time.monotonic() + RMI_TIMEOUT_MS / 1000 + 20
        while (snap := probe.snapshot()).unreachable:
            assert time.monotonic() < deadline, "the resumed broker's JMX never answered again"
            time.sleep(0.3)
        assert {key[0] for key in _leos(snap, topic)} == {1, 2, 3}
    finally:
        probe.close()


def test_a_broker_asking_for_jmx_credentials_is_read_with_them_and_refuses_others() -> None:
    start_jvm()
    with LocalKafka(brokers=1, jmx_credentials=("monitor", SECRET)) as k:
        good = JmxConnection(k.jmx_address(1), "monitor", Secret(SECRET))
        try:
            assert good.read().broker_id == 1
        finally:
            good.close()
        for user, password in (("monitor", Secret("not-the-password")), (None, None)):
            with pytest.raises(JmxError, match=r"SecurityException: Authentication failed") as caught:
                JmxConnection(k.jmx_address(1), user, password).read()
            assert SECRET not in str(caught.value) and "not-the-password" not in str(caught.value)


def _keystores(where: Path) -> tuple[Path, Path]:
    """A self-signed key for 127.0.0.1 (PKCS12, password "broker-pw") and a truststore holding
    its certificate (password "trust-pw"), made with the JDK's keytool."""
    keystore, cert, truststore = where / "broker.p12", where / "broker.crt", where / "trust.p12"
    for args in (
        ["-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048", "-validity", "2",
         "-dname", "CN=127.0.0.1", "-ext", "SAN=ip:127.0.0.1", "-keystore", str(keystore), "-storetype", "PKCS12",
         "-storepass", "broker-pw"],
        ["-exportcert", "-alias", "broker", "-keystore", str(keystore), "-storepass", "broker-pw", "-file", str(cert)],
        ["-importcert", "-noprompt", "-alias", "broker", "-file", str(cert), "-keystore", str(truststore),
         "-storetype", "PKCS12", "-storepass", "trust-pw"],
    ):  # fmt: skip
        subprocess.run(["keytool", *args], check=True, capture_output=True, timeout=120)
    return keystore, truststore


def test_collect_reads_brokers_whose_jmx_uses_tls_with_the_truststore_given(tmp_path: Path) -> None:
    keystore, truststore = _keystores(tmp_path)
    with LocalKafka(brokers=2, jmx_keystore=(keystore, "broker-pw")) as k:
        watched = f"jmx-tls-{uuid.uuid4().hex[:8]}"
        # The watched topic pinned so that each broker leads one partition and follows the other
        # (both brokers' JMX must report leader and follower offsets; no fault here); the
        # telemetry topic is placed by Kafka.
        k.create_topic(watched, assignment=[[1, 2], [2, 1]])
        k.create_topic(f"{watched}-telemetry", partitions=2, replication_factor=1)
        command = [
            sys.executable, "-m", "isrwatch", "collect", "--bootstrap-servers", k.bootstrap_servers,
            *k.kafka_config_flags(), "--source", "jmx", *k.jmx_flags(), "--jmx-registry-ssl",
            "--telemetry-topic", f"{watched}-telemetry", "--interval", "0.5", "--duration", "3", "--startup-timeout", "5",
        ]  # fmt: skip
        trusting = subprocess.run(
            [*command, "--jmx-truststore", str(truststore), "--jmx-truststore-password", "trust-pw"],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert trusting.returncode == 0, trusting.stderr[-3000:]
        assert "jmx_unreachable" not in trusting.stderr and "brokers=1,2" in trusting.stderr
        observed = {
            (o.partition, o.broker_id, o.leo)
            for _, _, _, value in read_records(k, f"{watched}-telemetry")
            for o in decode_record(value or b"").observations
            if o.topic == watched
        }
        assert {(0, 2, 0), (1, 1, 0)} <= observed
        # Without the truststore the brokers' certificate is not trusted: nothing answers.
        untrusting = subprocess.run(command, capture_output=True, text=True, timeout=180)
        assert untrusting.returncode == 2
        assert "no broker's JMX answered" in untrusting.stderr and "trust-pw" not in untrusting.stderr


def test_collect_source_jmx_publishes_telemetry_the_job_accepts(kafka_cluster, topic) -> None:
    k = kafka_cluster
    telemetry = f"jmx-telemetry-{uuid.uuid4().hex[:8]}"
    k.create_topic(telemetry, partitions=3, replication_factor=1)
    closed = f"127.0.0.1:{free_port()}"  # one endpoint that fails: its error is logged
    done = subprocess.run(
        [sys.executable, "-m", "isrwatch", "--log-level", "DEBUG", "collect", "--bootstrap-servers", k.bootstrap_servers,
         *k.kafka_config_flags(), "--source", "jmx", *k.jmx_flags(), "--jmx", closed,
         "--jmx-user", "monitor", "--jmx-password", SECRET,
         "--telemetry-topic", telemetry, "--cluster", "local", "--interval", "0.5", "--duration", "4"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "source=jmx" in done.stderr and f"event=jmx_unreachable endpoint={closed}" in done.stderr
    assert SECRET not in done.stdout + done.stderr

    values = [value or b"" for _, _, _, value in read_records(k, telemetry)]
    assert len(values) >= 4  # about one a round
    assert all(SECRET.encode() not in value for value in values)
    schema = json_schema()
    latest = {}
    for value in values:
        record = decode_record(value)  # isrwatch.telemetry's own check, then the JSON Schema
        assert record.source == "jmx" and record.cluster == "local"
        body = json.loads(value)
        jsonschema.validate(body, schema)
        for o in map(asdict, record.observations):  # version 3: columns
            if o["topic"] == topic:
                latest[(o["partition"], o["broker_id"])] = o
    assert sorted(latest) == [(0, 2), (0, 3), (1, 1), (1, 3), (2, 1), (2, 2)]
    # each broker's own ISR shrink count (IsrShrinksPerSec), for the job's shrink accounting
    counts = [b for value in values for b in json.loads(value).get("brokers", [])]
    assert {b["broker_id"] for b in counts} == {1, 2, 3}
    assert all(b["isr_shrinks_total"] >= 0 and b["isr_expands_total"] >= 0 for b in counts), counts
    c = Consumer(k.client_config(**{"group.id": f"wm-{telemetry}"}))
    try:
        for (part, _), o in latest.items():
            _, high = c.get_watermark_offsets(TopicPartition(topic, part), timeout=10)
            assert o["leo"] == o["leader_leo"] == high
            assert o["leader_id"] == part + 1 and o["prev_t_ms"] is not None and o["prev_t_ms"] < o["t_ms"]
            assert o["hw"] is None  # JMX has no high watermark MBean on 0.9
    finally:
        c.close()
