"""Issue 10, the broker's truth, live: the real job on real Spark, fed by the embedded simulator,
counts every real ISR shrink of its telemetry (the simulated leaders' and controller's, as the
collector reports them in ``isr_changes``) as warned or missed on its own /metrics.

* The stuck follower, default thresholds: each of its shrinks warned, none missed, the lead
  histogram holding one positive lead per shrink.
* A broker paused past its session (the controller drops it 6 s in, a 10 s lag) with the
  warning set too late (Nearing at 0.99, Imminent at 0.995, stalled only after 60 s): every
  shrink missed; and a real Prometheus scraping the job with the shipped rules fires
  ``IsrwatchPredictionsMissing``. The rule's 1 h window is kept as shipped: ``increase()`` over
  a window longer than the data uses the samples there are (the counters are served from 0
  from the job's first batch, before the pause), so the test needs no shorter copy.
"""

from __future__ import annotations

import contextlib
import io
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from isrwatch.outcomes import PREDICTIONS_MISSING
from isrwatch.spool import SpoolReader
from isrwatch.telemetry import decode_record
from localkafka import free_port
from localservices import binary, prometheus
from simulator.scenarios import FAULT_START_MS, fault_end_ms
from simulator.settings import EmbeddedSimulatorSettings
from streaming.lifecycle.job import JobHandles
from streaming.settings import JobSettings
from tests.e2e.gauges import prometheus_config
from tests.streaming.feed import RunningJob

pytestmark = pytest.mark.spark

LAG_MS = 10_000
CLUSTER = "sim"


def shrinks_in_spool(spool: str, until_ms: int) -> int:
    """Followers the telemetry reports leaving an ISR at or before ``until_ms``: the truth."""
    reader = SpoolReader(spool)
    n = 0
    for _, value in reader.read(0, reader.end_offset()):
        for c in decode_record(value).isr_changes:
            if c.t_ms <= until_ms:
                n += len(set(c.isr_before) - set(c.isr_after))
    return n


def outcome_samples(port: int) -> dict[tuple[str, str], float]:
    """(sample name, outcome or le or "") -> value, of cluster ``CLUSTER``, from the job's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("cluster") == CLUSTER and (
                s.name.startswith("isrwatch_isr_shrink") or s.name.startswith("isrwatch_warnings_without_shrink")
            ):
                out[(s.name, s.labels.get("outcome") or s.labels.get("le") or "")] = s.value
    return out


@contextlib.contextmanager
def embedded_job(spark, tmp_path: Path, scenario: str, speed: float, **settings) -> Iterator[RunningJob]:
    job = RunningJob(
        JobSettings(checkpoint_dir=str(tmp_path / "ck"), lag_time_max_ms=LAG_MS, **settings),
        spark,
        io.StringIO(),
        simulator=EmbeddedSimulatorSettings(simulate=scenario, speed=speed, cluster=CLUSTER),
    )
    try:
        yield job
    finally:
        job.stop.set()
        job.thread.join(120)
    assert "error" not in job.result, job.result.get("error")


def wait(what: str, job: RunningJob, predicate: Callable[[JobHandles], bool], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert "error" not in job.result and job.thread.is_alive(), job.result
        if job.handles.monitor is not None and job.handles.metrics_port and predicate(job.handles):
            return
        time.sleep(0.5)
    h = job.handles
    seen = dict(h.monitor.cluster_now) if h.monitor is not None else None
    raise AssertionError(
        f"timed out waiting for {what}: telemetry clocks {seen}, store {h.store and h.store.snapshot().batches}"
    )


def telemetry_clock(h: JobHandles) -> int:
    return h.monitor.cluster_now.get(CLUSTER, 0)


def test_the_stuck_followers_shrinks_are_warned_with_their_leads(spark, tmp_path) -> None:
    with embedded_job(spark, tmp_path, "stuck-follower", 10.0, metrics_port=free_port()) as job:
        spool = str(tmp_path / "ck" / "spool")
        start: list[int] = []

        def past_the_fault(h: JobHandles) -> bool:
            if not start:
                if not Path(spool).exists() or not SpoolReader(spool).end_offset():
                    return False
                first = next(iter(SpoolReader(spool).read(0, 1)))
                start.append(decode_record(first[1]).sent_ms)
            return telemetry_clock(h) - start[0] >= fault_end_ms(LAG_MS) + 15_000

        wait("the stuck follower's fault and catch-up", job, past_the_fault)
        clock = telemetry_clock(job.handles)
        got = outcome_samples(job.handles.metrics_port)
        truth = shrinks_in_spool(spool, clock)
    assert truth >= 2, f"the scenario's follower leaves the ISR of its two partitions: {truth}"
    assert got[("isrwatch_isr_shrinks_total", "warned")] == truth, got
    assert got[("isrwatch_isr_shrinks_total", "missed")] == 0, got
    assert got[("isrwatch_isr_shrink_lead_seconds_count", "")] == truth, got
    # Warned from Nearing (half the lag): at least a few seconds before each shrink.
    assert got[("isrwatch_isr_shrink_lead_seconds_sum", "")] >= truth * 1.0, got
    assert got[("isrwatch_isr_shrink_lead_seconds_bucket", "0.5")] == 0, got
    assert got[("isrwatch_warnings_without_shrink_total", "")] == 0, got


@pytest.mark.services
@pytest.mark.skipif(binary("prometheus") is None, reason="prometheus not installed (Debian package)")
def test_a_warning_set_too_late_misses_the_shrinks_and_prometheus_says_so(spark, tmp_path) -> None:
    port = free_port()
    (tmp_path / "prometheus").mkdir()
    config = prometheus_config(tmp_path / "prometheus", [f"127.0.0.1:{port}"])
    late = {"nearing_ratio": 0.99, "critical_ratio": 0.995, "stall_after_ms": 60_000}
    firing: list[dict] = []
    with (
        prometheus(config, tmp_path / "prometheus") as prom,
        embedded_job(spark, tmp_path, "broker-pause", 1.0, metrics_port=port, **late) as job,
    ):
        spool = str(tmp_path / "ck" / "spool")

        def all_missed(h: JobHandles) -> bool:
            truth = shrinks_in_spool(spool, telemetry_clock(h))
            got = outcome_samples(port)
            return truth > 0 and got.get(("isrwatch_isr_shrinks_total", "missed")) == truth

        wait("the paused broker's shrinks counted missed", job, all_missed)
        clock = telemetry_clock(job.handles)
        got = outcome_samples(port)
        truth = shrinks_in_spool(spool, clock)

        def alert_fires(_: JobHandles) -> bool:
            alerts = requests.get(f"{prom.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
            firing[:] = [
                a for a in alerts if a["labels"]["alertname"] == PREDICTIONS_MISSING and a["state"] == "firing"
            ]
            return bool(firing)

        wait(f"Prometheus to fire {PREDICTIONS_MISSING}", job, alert_fires, timeout_s=120)
    assert clock - FAULT_START_MS > 0
    assert got[("isrwatch_isr_shrinks_total", "warned")] == 0, got
    assert got[("isrwatch_isr_shrinks_total", "missed")] == truth, got
    assert got[("isrwatch_isr_shrink_lead_seconds_count", "")] == 0, got
    [alert] = firing
    assert alert["labels"] == {"alertname": PREDICTIONS_MISSING, "severity": "warning", "cluster": CLUSTER}
    assert alert["annotations"]["summary"].endswith("100% missed over the last hour"), alert
