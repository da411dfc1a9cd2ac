"""The dead letters written by the executors (``streaming.sinks.letterwriter``): a batch's dead
letters stay in Spark (one marker per Spark partition that has any comes to the driver), and
Spark's Python workers write to real Kafka, and count by reason, the same records the driver
would have written.

Real parts: Spark (local mode) and the shared 3-broker Kafka 0.9 cluster. The job's own path
(its handler, on real Kafka, with poison records) is tests/e2e/test_steady_load.py's and
tests/e2e/test_poison_records.py's; the million dead letters that made this module are
docs/benchmarks.md's ("A fleet's telemetry stamped an hour ahead")."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from isrwatch.rule import Rule, RuleConfig
from isrwatch.status import Thresholds
from isrwatch.telemetry import Observation, TelemetryRecord, encode_record
from localkafka.cluster import COMPAT_CONFIG
from streaming.evaluation.batch import BatchOutput, evaluate_records
from streaming.evaluation.statetable import StateTable
from streaming.sinks.letterwriter import LetterWriter
from streaming.sinks.outputs import MAX_DEADLETTER_BYTES, KafkaDeadLetters, encode_deadletter, make_producer
from streaming.sinks.outputs import producer_config as job_producer_config
from streaming.sinks.producer import OutputProducer
from streaming.sinks.statewriter import write_batch_state
from streaming.sources.source_spool import RAW_SCHEMA
from tests.e2e.kafka_io import read_records

pytestmark = pytest.mark.spark

NOW = int(time.time() * 1000)
AHEAD = NOW + 3_600_000  # a collector's clock an hour ahead: each observation a dead letter (future_t)


def _rows(bad: bool = True) -> list[tuple[bytes | None, bytes | None, str, int, int, None]]:
    """The Kafka source's rows: a record of 3 good observations, and with ``bad`` one of 40
    stamped an hour ahead and three records that are no telemetry at all."""
    good = [Observation("orders", p, 2, 1, NOW, 100, 100, prev_t_ms=NOW - 1000) for p in range(3)]
    values: list[bytes | None] = [encode_record(TelemetryRecord("c2", "test", NOW, tuple(good)))]
    if bad:
        ahead = [Observation("orders", p, 2, 1, AHEAD, 100, 100, prev_t_ms=AHEAD - 1000) for p in range(40)]
        values += [encode_record(TelemetryRecord("c1", "test", AHEAD, tuple(ahead))), b"\xff\xfe", None, b"[]"]
    return [(None, v, "telemetry", i % 2, i, None) for i, v in enumerate(values)]


def _evaluate(spark, tmp_path, rows, letters_apart: bool) -> tuple[BatchOutput, StateTable]:
    batch = spark.createDataFrame(rows, RAW_SCHEMA)
    table = StateTable(spark, str(tmp_path / ("apart" if letters_apart else "driver")))
    rule = RuleConfig(Rule.KIP16_REFINED, 10_000)
    out = evaluate_records(
        batch, 0, table, rule, Thresholds(), future_tolerance_ms=300_000, max_gap_ms=None, letters_apart=letters_apart
    )
    return out, table


def test_the_executors_write_the_dead_letters_the_driver_would_have(spark, kafka_cluster, unique_name, tmp_path):
    """The same batch both ways: with the letters apart none comes to the driver, the executors'
    count by reason is the driver's, and the topic gets, from Spark's Python workers, the
    records the driver writes (key the cluster, value ``encode_deadletter``); with
    ``--state-writer driver`` (``by_driver``), or when the executors' write fails, the driver
    writes the same."""
    rows = _rows()
    driver_out, table = _evaluate(spark, tmp_path, rows, letters_apart=False)
    write_batch_state(driver_out, table, 0)
    expected = driver_out.deadletters
    assert len(expected) == 40 + 3  # each observation stamped ahead, and each record of no telemetry
    flags = [f"{k}={v}" for k, v in COMPAT_CONFIG.items()]  # Kafka 0.9: no ApiVersions request
    conf = job_producer_config(kafka_cluster.bootstrap_servers, flags)
    driver = OutputProducer(make_producer(kafka_cluster.bootstrap_servers, flags))
    topics = {how: unique_name(f"letters-{how}") for how in ("executors", "driver", "fallback")}
    for topic in topics.values():
        kafka_cluster.create_topic(topic, partitions=2, replication_factor=3)

    out, table = _evaluate(spark, tmp_path, rows, letters_apart=True)
    try:
        assert out.deadletters == [] and out.letters is not None
        counts = dict(Counter(d["reason"] for d in expected))
        for how, topic in topics.items():
            # fallback: a task that fails (a setting librdkafka refuses, raised in the Python worker)
            bad = {"no.such.setting": "1"} if how == "fallback" else {}
            writer = LetterWriter({**conf, **bad}, KafkaDeadLetters(driver, topic), by_driver=how == "driver")
            who = "driver" if how == "fallback" else how
            assert writer.write(out.letters) == (who, len(expected), counts)
            assert writer.executors_failed is None  # not an import error: the executors are tried again
    finally:
        write_batch_state(out, table, 0)
    assert driver.flush(30) == 0
    want = sorted((str(d["cluster"] or "").encode(), encode_deadletter(d, MAX_DEADLETTER_BYTES)) for d in expected)
    for topic in topics.values():
        assert sorted((k, v) for _, _, k, v in read_records(kafka_cluster, topic)) == want


def test_a_batch_without_dead_letters_runs_no_spark_job_for_them(spark, tmp_path) -> None:
    """No dead letter: no marker among the driver's rows, so no Spark job to write them."""
    out, table = _evaluate(spark, tmp_path, _rows(bad=False), letters_apart=True)
    try:
        assert out.letters is None and out.deadletters == []
        assert out.table is not None and out.table.num_rows == 3  # the good observations' replicas
    finally:
        write_batch_state(out, table, 0)


def test_a_sink_that_raises_keeps_neither_write_from_being_made(caplog) -> None:
    """``RareRows.write`` (a unit of its logic, fakes for the store and sinks): the driver's dead
    letters' sink raising does not keep the executors' from writing theirs, nor the reverse;
    each failure is logged as ``deadletters_lost`` and the batch's counts keep what was written."""
    from types import SimpleNamespace

    from streaming.driver.rare import RareRows

    outcomes = SimpleNamespace(settle=lambda now: [], take_evidence=lambda: [])
    store = SimpleNamespace(outcomes=outcomes)
    letter = {"reason": "not_json", "cluster": None}

    class Sink:
        def __init__(self, fails: bool) -> None:
            self.fails, self.failed, self.written = fails, 0, 0

        def write(self, letters):
            if self.fails:
                raise OSError("disk full")
            self.written += len(list(letters))
            return self.written

    class Writer:
        def __init__(self, fails: bool) -> None:
            self.fails, self.asked = fails, 0

        def write(self, letters):
            self.asked += 1
            if self.fails:
                raise RuntimeError("the job to write them failed")
            return "executors", 5, {"future_t": 5}

    for driver_fails, executors_fail in ((True, False), (False, True)):
        sink, writer = Sink(driver_fails), Writer(executors_fail)
        checkpoint = SimpleNamespace(save_side=lambda batch_id: None)
        rare = RareRows(store, sink, checkpoint, {}, writer)  # type: ignore[arg-type]
        out = SimpleNamespace(deadletters=[letter], letters=object(), isr_changes=[], counters=[])
        caplog.clear()
        by_reason = rare.write(out, 7, {})  # type: ignore[arg-type]
        assert writer.asked == 1 and "deadletters_lost batch_id=7" in caplog.text
        if driver_fails:
            assert sink.failed == 1 and by_reason == {"not_json": 1, "future_t": 5}
        else:
            assert sink.written == 1 and by_reason == {"not_json": 1} and "where=executors" in caplog.text


def test_while_the_driver_holds_dead_letters_it_writes_the_batch_s_too(spark, kafka_cluster, unique_name, tmp_path):
    """A leader of the dead-letter topic that does not answer leaves the driver's producer
    holding what it sent; the executors' tasks would each wait ``FLUSH_S`` on it and hand their
    letters back, at every batch of the fault. So while the driver holds any, it writes the
    batch's (``LetterWriter._driver_holds``). The hung leader's stand-in: the driver's producer
    bootstraps on a loopback port nothing listens on, so what it is given stays pending, while
    the executors' configuration is the real cluster's (they would deliver: a write of theirs
    would show as "executors")."""
    import socket

    from confluent_kafka import Producer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # closed once the block ends: nothing listens there
    flags = [f"{k}={v}" for k, v in COMPAT_CONFIG.items()]
    conf = job_producer_config(kafka_cluster.bootstrap_servers, flags)
    topic = unique_name("letters-held")
    kafka_cluster.create_topic(topic, partitions=2, replication_factor=3)
    driver = OutputProducer(Producer({**job_producer_config(dead, flags), "message.timeout.ms": 300_000}))
    out, table = _evaluate(spark, tmp_path, _rows(), letters_apart=True)
    try:
        assert out.letters is not None
        # flush_s 30: a topic this new may answer its first acks=all produce after the default
        # 1 s on a loaded machine, and the letters handed back would go to the driver's
        # producer here, which holds them (test_statewriter's executors test says more).
        writer = LetterWriter(conf, KafkaDeadLetters(driver, topic), flush_s=30.0)
        # nothing held yet: the executors write (to the real cluster)
        assert writer.write(out.letters)[0] == "executors"
        driver.produce(topic, key=b"c1", value=b"{}")  # a dead letter the driver cannot deliver
        assert driver.stats()[topic].pending == 1
        who, written, counts = writer.write(out.letters)
        assert (who, written) == ("driver", 43) and sum(counts.values()) == 43
        assert driver.stats()[topic].pending == 1 + 43, "the batch's letters held by the driver, none lost"
    finally:
        write_batch_state(out, table, 0)
        driver.producer.purge()
        driver.producer.flush(0)
