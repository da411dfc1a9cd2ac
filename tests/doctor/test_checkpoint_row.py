"""The doctor's ``checkpoint`` row when the checkpoint is past a telemetry partition's end (the
topic created again, or its log cut back): a warning naming the partition and what the job does,
not a failure (the job starts, and its source reads the partition from its new end)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from collector.probe import Snapshot
from doctor.checks import OK, WARN, _checkpoint, _Cluster
from streaming.lifecycle.origin import QUERY_DIR, check_origin, kafka_origin

TOPIC = "isr.telemetry"
BOOTSTRAP = "127.0.0.1:9092"


def _checkpoint_at(tmp_path: Path, offsets: dict[str, dict[str, int]]) -> Path:
    """A job's checkpoint for TOPIC (its origin as the job records it) whose last batch ends at ``offsets``."""
    ckpt = tmp_path / "ckpt"
    check_origin(str(ckpt), kafka_origin(BOOTSTRAP, TOPIC, None))
    log = ckpt / QUERY_DIR / "offsets"
    log.mkdir(parents=True)
    (log / "4").write_text("v1\n" + json.dumps({"batchWatermarkMs": 0}) + "\n" + json.dumps(offsets))
    return ckpt


def _row(ckpt: Path, ends: dict[int, int]):
    settings = SimpleNamespace(checkpoint_dir=str(ckpt), bootstrap_servers=BOOTSTRAP, telemetry_topic=TOPIC)
    snap = Snapshot(t_ms=0, brokers={}, partitions=[], hw={(TOPIC, p): hw for p, hw in ends.items()})
    return _checkpoint(settings, _Cluster("telemetry cluster", BOOTSTRAP, None, snap))


def test_a_checkpoint_past_a_partition_s_end_is_a_warning_naming_it(tmp_path):
    ckpt = _checkpoint_at(tmp_path, {TOPIC: {"0": 50, "1": 70}})
    row = _row(ckpt, {0: 60, 1: 3})
    assert row.status == WARN, row
    assert f"at offset 70 of {TOPIC}[1], which ends at 3" in row.found
    assert "reads it from its new end" in row.fix


def test_a_checkpoint_inside_the_topic_is_ok(tmp_path):
    ckpt = _checkpoint_at(tmp_path, {TOPIC: {"0": 50, "1": 70}})
    assert _row(ckpt, {0: 60, 1: 70}).status == OK
