"""Running the simulator: the generator API, real-time spool feeding and ``isrwatch simulate``."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from isrwatch.cli import main as cli_main
from isrwatch.exceptions import UnreachableError
from isrwatch.spool import SpoolReader
from isrwatch.telemetry import VERSION, decode_record
from simulator import feed_spool, iter_records, read_truth
from simulator.sinks import KafkaSink
from tests.simulator.replay import START_MS, observations


def test_iter_records_yields_rounds_and_fills_the_truth_as_it_goes():
    truth = []
    seen_changes = 0
    rounds = 0
    for t, batch in iter_records("stuck-follower", seed=3, start_ms=START_MS, duration_s=60, truth=truth):
        assert t == START_MS + rounds * 1000
        rounds += 1
        # the truth list grows in step with the isr_changes the records carry
        seen_changes += sum(len(decode_record(r).isr_changes) for r in batch)
        assert seen_changes == len(truth)
    assert rounds == 61
    assert {c.change for c in truth} == {"shrink", "expand"}


def test_iter_records_takes_bench_sizes_and_fetch_mode():
    gen = iter_records("steady", start_ms=START_MS, duration_s=2, brokers=6, topics=4, partitions=25, mode="fetch")
    obs = [o for _, batch in gen for o in observations(batch)]
    assert {o.leader_id for o in obs} == set(range(1, 7))
    assert len({(o.topic, o.partition, o.broker_id) for o in obs}) == 4 * 25 * 2


def test_feed_spool_paces_in_real_time_until_stopped(tmp_path):
    stop = threading.Event()
    result = {}
    truth_path = tmp_path / "truth.jsonl"

    def feed():
        with open(truth_path, "w") as fh:
            result["sim"] = feed_spool(tmp_path / "spool", "steady", speed=2.0, stop_event=stop, truth_file=fh)

    thread = threading.Thread(target=feed)
    thread.start()
    reader = SpoolReader(tmp_path / "spool")
    try:
        # Open-ended run: it keeps appending rounds as simulated time becomes due.
        while reader.end_offset() < 3 and thread.is_alive():
            stop.wait(0.05)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    end = reader.end_offset()
    assert end >= 3
    times = [decode_record(r).sent_ms for _, r in reader.read(0, end)]
    assert times == sorted(times) and times[1] - times[0] == 1000
    assert truth_path.exists()


def test_feed_spool_stops_at_the_duration(tmp_path):
    sim = feed_spool(tmp_path, "broker-pause", speed=500.0, duration_s=30, start_ms=START_MS, seed=4)
    records = [r for _, r in SpoolReader(tmp_path).read(0, SpoolReader(tmp_path).end_offset())]
    assert len(records) == 31 == sim.records
    assert sum(len(decode_record(r).isr_changes) for r in records) == len(sim.truth) > 0


def test_simulate_command_writes_spool_and_truth(tmp_path):
    spool, truth = tmp_path / "spool", tmp_path / "truth.jsonl"
    argv = ["simulate", "--scenario", "stuck-follower", "--duration", "60", "--speed", "5000", "--seed", "2"]
    argv += ["--spool-dir", str(spool), "--truth-file", str(truth), "--cluster", "lab"]
    assert cli_main(argv) == 0
    reader = SpoolReader(spool)
    records = [decode_record(r) for _, r in reader.read(0, reader.end_offset())]
    assert len(records) == 61 and {r.cluster for r in records} == {"lab"}
    with open(truth) as fh:
        changes = read_truth(fh)
    assert [c.change for c in changes] == ["shrink", "shrink", "expand", "expand"]
    assert [(c.t_ms, c.isr_after) for c in changes] == [(c.t_ms, c.isr_after) for r in records for c in r.isr_changes]


def test_simulate_command_writes_json_lines_to_stdout(capsysbinary):
    argv = ["simulate", "--duration", "3", "--speed", "1000", "--mode", "fetch", "--partitions", "1"]
    assert cli_main(argv) == 0
    lines = capsysbinary.readouterr().out.splitlines()
    assert lines
    decoded = [decode_record(line) for line in lines]
    assert {r.source for r in decoded} == {"simulator-fetch"}
    assert {o.topic for r in decoded for o in r.observations} == {"orders", "payments"}


def test_simulate_command_refuses_two_destinations(tmp_path, capsys):
    argv = ["simulate", "--spool-dir", str(tmp_path), "--bootstrap-servers", "127.0.0.1:1"]
    assert cli_main(argv) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_kafka_sink_names_the_unreachable_cluster():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(UnreachableError, match=f"cannot reach Kafka at 127.0.0.1:{port}"):
            KafkaSink(f"127.0.0.1:{port}", "isr.telemetry", "sim", {}, timeout_s=1.0)


def test_simulate_command_publishes_to_a_real_kafka_topic(kafka_cluster, unique_name):
    from confluent_kafka import Consumer, TopicPartition

    topic = unique_name("telemetry")
    kafka_cluster.create_topic(topic, 1, 1)
    argv = ["simulate", "--scenario", "broker-pause", "--duration", "20", "--speed", "1000", "--cluster", "kafka-sim"]
    argv += ["--bootstrap-servers", kafka_cluster.bootstrap_servers, "--telemetry-topic", topic]
    argv += kafka_cluster.kafka_config_flags()
    assert cli_main(argv) == 0

    consumer = Consumer(kafka_cluster.client_config(**{"group.id": unique_name("read"), "enable.auto.commit": False}))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = []
        for _ in range(60):
            got += [m for m in consumer.consume(100, timeout=1.0) if m.error() is None]
            if len(got) >= 21:
                break
    finally:
        consumer.close()
    assert len(got) == 21
    assert {m.key() for m in got} == {b"kafka-sim"}
    records = [decode_record(m.value()) for m in got]
    assert [r.sent_ms for r in records] == sorted(r.sent_ms for r in records)
    assert any(o.leo is None for r in records for o in r.observations)  # the paused broker
    assert json.loads(got[0].value())["version"] == VERSION


def test_simulate_command_rejects_a_scenario_the_cluster_cannot_run(capsys):
    assert cli_main(["simulate", "--scenario", "stuck-follower", "--brokers", "1"]) == 2
    assert "needs replication_factor >= 2" in capsys.readouterr().err
