"""A killed job started again on the same checkpoint loses no telemetry and
repeats no alert transition (``isrwatch run`` as a real process, SIGKILLed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import asdict

import pytest

from isrwatch.spool import SpoolWriter
from isrwatch.telemetry import decode_record
from simulator.run import Simulation, now_ms

# In make campaign (~160 s): make test covers a killed job's restart on the user's deployment,
# real Kafka, in tests/e2e/test_restart.py; this one is the spool source's.
pytestmark = [pytest.mark.spark, pytest.mark.campaign]

SIM_SECONDS = 70


def write_spool(spool) -> Counter:
    """A stuck follower's telemetry, all in the past, into ``spool``; observations per replica."""
    sim = Simulation("stuck-follower", start_ms=now_ms() - (SIM_SECONDS + 5) * 1000, seed=3)
    writer = SpoolWriter(spool)
    expected: Counter = Counter()
    for _, records in sim.rounds(SIM_SECONDS):
        writer.append(records)
        for r in records:
            for o in map(asdict, decode_record(r).observations):
                expected[(o["topic"], o["partition"], o["broker_id"])] += 1
    return expected


def _start(spool, ckpt, duration, stderr=None, per_trigger=4):
    """``isrwatch run`` on ``spool``; its stderr to the file ``stderr`` (discarded without one)."""
    cmd = [sys.executable, "-m", "isrwatch", "run", "--spool-dir", str(spool), "--checkpoint-dir", str(ckpt)]
    cmd += [
        "--metrics-port",
        "0",
        "--max-records-per-trigger",
        str(per_trigger),
        "--trigger-seconds",
        "1",
        "--duration",
        str(duration),
    ]
    cmd += ["--stale-after-seconds", "600"]
    err = open(stderr, "wb") if stderr else subprocess.DEVNULL  # noqa: SIM115 (the child holds it)
    try:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
    finally:
        if stderr:
            err.close()


def test_restart_repeats_nothing_and_loses_nothing(spark, tmp_path) -> None:
    # The whole telemetry is in the spool before the job starts (in the past,
    # so nothing is "from the future"); 4 records per batch spread it over
    # many batches, so the kill lands mid-stream.
    expected = write_spool(tmp_path / "spool")
    ckpt = tmp_path / "ck"

    first = _start(tmp_path / "spool", ckpt, 300)
    lines = []
    try:
        for line in first.stdout:  # type: ignore[union-attr]
            lines.append(json.loads(line))
            if len(lines) >= 3:  # mid-alert: started, not yet resolved
                break
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    # What it printed before it died counts too.
    lines += [json.loads(x) for x in first.stdout.read().splitlines() if x.strip()]  # type: ignore[union-attr]
    assert len(lines) >= 3, "the first run announced the stuck follower"

    second = _start(tmp_path / "spool", ckpt, 90)
    out, _ = second.communicate(timeout=240)
    assert second.returncode == 0
    lines += [json.loads(x) for x in out.splitlines() if x.strip()]

    events = Counter((e["labels"]["alertname"], tuple(sorted(e["labels"].items())), e["status"]) for e in lines)
    assert max(events.values()) == 1, f"a transition was repeated: {events.most_common(3)}"
    firing = {k[:2] for k in events if k[2] == "firing"}
    resolved = {k[:2] for k in events if k[2] == "resolved"}
    assert firing and firing == resolved

    # Every observation in the spool was aggregated exactly once.
    from streaming.lifecycle.query import restore_aggregates

    rows = restore_aggregates(spark, str(ckpt))
    got = Counter({(r["topic"], r["partition"], r["broker_id"]): r["observations"] for r in rows})
    assert got == expected


def test_a_checkpoint_without_its_state_table_starts_empty_with_a_warning(spark, tmp_path, caplog) -> None:
    # Committed batches, and neither the state table nor an older job's state store (removed
    # by hand): the job says so and starts the replicas' state empty, instead of failing on
    # a Spark state store that never existed.
    from streaming.lifecycle.origin import QUERY_DIR
    from streaming.lifecycle.query import restore_state

    commits = tmp_path / QUERY_DIR / "commits"
    commits.mkdir(parents=True)
    (commits / "7").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    with caplog.at_level("WARNING", logger="streaming.query"):
        assert restore_state(spark, str(tmp_path)) is None
    assert "state_missing" in caplog.text and "batch_id=7" in caplog.text
