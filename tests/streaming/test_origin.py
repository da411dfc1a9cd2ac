"""A checkpoint knows the telemetry it was made for (streaming.lifecycle.origin)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from isrwatch.exceptions import ConfigError
from streaming.lifecycle.origin import (
    Origin,
    check_offsets,
    check_origin,
    checkpoint_offsets,
    default_checkpoint_dir,
    kafka_origin,
)


def test_same_cluster_by_id_else_by_a_common_bootstrap_server():
    a = kafka_origin("k1:9092,k2:9092", "isr.telemetry", None)
    assert a.same_as(kafka_origin("K2:9092, k3:9092", "isr.telemetry", None))
    assert not a.same_as(kafka_origin("k9:9092", "isr.telemetry", None))
    assert not a.same_as(kafka_origin("k1:9092", "isr.other", None))
    with_id = kafka_origin("k1:9092", "isr.telemetry", "abc")
    assert with_id.same_as(kafka_origin("elsewhere:9092", "isr.telemetry", "abc"))
    assert not with_id.same_as(kafka_origin("k1:9092", "isr.telemetry", "xyz"))
    assert not a.same_as(Origin("simulator"))


def test_a_checkpoint_refuses_other_telemetry_with_one_message(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    check_origin(ckpt, kafka_origin("k1:9092", "isr.telemetry", None))
    check_origin(ckpt, kafka_origin("k1:9092", "isr.telemetry", None))  # the same: fine
    with pytest.raises(ConfigError, match=r"was made for topic isr.telemetry on k1:9092, not topic t2 on k1:9092"):
        check_origin(ckpt, kafka_origin("k1:9092", "t2", None))
    with pytest.raises(ConfigError, match=r"delete .*ckpt to start fresh"):
        check_origin(ckpt, Origin("simulator"))


def test_default_checkpoint_is_absolute_and_per_stream(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    a = default_checkpoint_dir("k1:9092,k0:9092", "isr.telemetry")
    assert a == str(tmp_path / "isrwatch" / "checkpoints" / "k0_9092_isr.telemetry")
    assert a != default_checkpoint_dir("k1:9092", "isr.telemetry")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_checkpoint_dir("k1:9092", "t").startswith("/")


def _offset_log(ckpt, batch, offsets):
    """An offset log entry as Spark writes it: v1, the batch metadata, one line per source."""
    d = ckpt / "aggregates" / "offsets"
    d.mkdir(parents=True, exist_ok=True)
    (d / str(batch)).write_text("v1\n" + json.dumps({"batchWatermarkMs": 0}) + "\n" + json.dumps(offsets))


def test_offsets_past_the_end_and_deleted_ones_are_logged(tmp_path, caplog):
    _offset_log(tmp_path, 0, {"t": {"0": 5, "1": 7}})
    _offset_log(tmp_path, 3, {"t": {"0": 50, "1": 70}})
    offsets = checkpoint_offsets(str(tmp_path), "aggregates")
    assert offsets == {"t": {"0": 50, "1": 70}}
    check_offsets(offsets, {"t": {"0": 0, "1": 0}}, {"t": {"0": 60, "1": 70}}, "ckpt")
    with caplog.at_level(logging.WARNING):
        # (the job starts, and its source reads the partition from its new end: test_source_kafka)
        check_offsets(offsets, {"t": {"0": 0, "1": 0}}, {"t": {"0": 60, "1": 3}}, "ckpt")
    assert "event=telemetry_checkpoint_past_end topic=t partition=1 checkpoint_offset=70 end=3" in caplog.text
    with caplog.at_level(logging.WARNING):
        check_offsets(offsets, {"t": {"0": 58, "1": 0}}, {"t": {"0": 60, "1": 70}}, "ckpt")
    assert "telemetry_deleted_unread" in caplog.text and "records=8" in caplog.text


@pytest.mark.kafka
def test_job_on_a_checkpoint_of_another_topic_exits_with_that_message(kafka_cluster, unique_name, tmp_path):
    """Real cluster: the checkpoint records its origin at the first start (done here through the
    job's own start-up check, which runs before Spark); the real command then refuses another topic."""
    from localkafka import COMPAT_CONFIG
    from streaming.lifecycle.origin import check_checkpoint
    from streaming.settings import JobSettings

    first, second = unique_name("telemetry"), unique_name("telemetry")
    kafka_cluster.create_topic(first, partitions=2, replication_factor=1)
    compat = [f"{k}={v}" for k, v in COMPAT_CONFIG.items()]
    ckpt = tmp_path / "ckpt"
    settings = JobSettings(
        bootstrap_servers=kafka_cluster.bootstrap_servers, kafka_config=compat, telemetry_topic=first
    )
    check_checkpoint(settings, str(ckpt), None, 15.0)
    assert json.loads((ckpt / "isrwatch" / "origin.json").read_text())["topic"] == first
    done = subprocess.run(
        [sys.executable, "-m", "isrwatch", "run", "--bootstrap-servers", kafka_cluster.bootstrap_servers,
         "--telemetry-topic", second, "--checkpoint-dir", str(ckpt),
         *[a for kv in compat for a in ("--kafka-config", kv)]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, done.stderr
    assert f"was made for topic {first} on" in errors[0] and f"not topic {second}" in errors[0]
    assert "Traceback" not in done.stderr
