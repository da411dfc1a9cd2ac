"""Issue 14, item 5: the collector's clock 30 s ahead of the job's, and 30 s behind it.

The collector stamps every observation with its own clock; the job measures each
follower's time since caught up on that clock alone (differences of the collector's
timestamps), its stale check on the job's own clock (when a cluster's telemetry clock
last moved), and Alertmanager gets alert times no later than the job's clock
(``streaming.driver.notify``). So a skewed collector must change nothing a user relies on.

Real parts: a 3-broker Kafka 0.9 cluster, ``isrwatch collect`` with its wall clock
shifted (``tests/support/skewed_clock.py``: ``time.time`` off by a constant, the monotonic
clock untouched, as on a host whose NTP is broken; libfaketime was tried and also bends the
process's timeouts, which a skewed host does not) and ``isrwatch run`` on the real clock,
produce load, isrwatch's topics placed by Kafka.
One follower broker (not the controller, as in test_spark_cluster.py) paused:

* every real shrink alerted before the leader logged it (printed alert, job's clock) and
  the crossing the job computed, brought back to the job's clock by the known skew, leads
  the shrink by the bound of issue 9 (``results.check_nearing_lead``);
* no ``IsrwatchTelemetryStale``, no dead letter (30 s is inside the job's future
  tolerance), the job batching all along;
* the job logs ``telemetry_clock_ahead`` when the collector is ahead, and not when it is
  behind (behind looks like telemetry that arrives late, which ``telemetry_lag_s`` shows).

A campaign (``make campaign``): two rounds of a few minutes each.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

from isrwatch.alerts import AlertName
from tests.e2e.kafka_io import ProduceLoad, read_topic
from tests.e2e.pauses import layout, pause_round
from tests.e2e.pipeline import LAG_MS, ZK_SESSION_MS, Pipeline
from tests.e2e.results import check_nearing_lead, write_result

pytestmark = [pytest.mark.campaign, pytest.mark.reliability]

DATA_PARTITIONS = 3
SKEWED_CLOCK = Path(__file__).resolve().parents[1] / "support" / "skewed_clock.py"


@pytest.mark.parametrize("skew_s", [30, -30], ids=["collector-ahead", "collector-behind"])
def test_a_collector_clock_off_by_30_s_changes_no_alert(kafka_cluster_factory, tmp_path, skew_s):
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    topic = "orders"
    cluster.create_topic(topic, partitions=DATA_PARTITIONS, replication_factor=3)
    placed = layout(cluster, topic)
    wrapper = [sys.executable, str(SKEWED_CLOCK), str(skew_s)]
    with contextlib.ExitStack() as stack:
        stack.enter_context(ProduceLoad(cluster, topic, DATA_PARTITIONS, rate=300))
        pipe = stack.enter_context(Pipeline(cluster, tmp_path, collector_wrapper=wrapper))
        pipe.wait_watching(2 * DATA_PARTITIONS)
        broker = next(b for b in cluster.broker_ids if b != cluster.controller_id())
        r = pause_round(cluster, pipe, topic, broker, placed, None)
        letters = read_topic(cluster, pipe.deadletter_topic)
        job_log = pipe.job_log()
        stale = pipe.alerts(AlertName.TELEMETRY_STALE.value)
    write_result(
        f"clock_skew_{'ahead' if skew_s > 0 else 'behind'}",
        {
            "scenario": f"collector clock {skew_s:+d} s, broker {broker} paused",
            "lag_time_max_ms": LAG_MS,
            "round": {k: v for k, v in r.items() if k != "rows"},
            "rows": r["rows"],
            "shrinks": len(r["rows"]),
            # the printed alert (wall clock, the skew does not enter) after the leader's shrink
            "shrinks_not_alerted_first": sum(
                1 for row in r["rows"] if row["alert_arrived"] is None or row["arrival_lead_s"] <= 0
            ),
            "dead_letters": len(letters),
            "stale_alerts": len(stale),
        },
    )
    assert r["rows"], f"broker {broker} follows no partition of {topic}: {placed}"
    for row in r["rows"]:
        where = f"{row['topic']}-{row['partition']} on broker {broker}"
        # the crossing is stamped on the collector's clock: skew_s later than on the job's
        on_job_clock = {**row, "lead_s": row["lead_s"] + skew_s if row["lead_s"] is not None else None}
        check_nearing_lead(on_job_clock, where)
    assert not stale, f"a skewed clock raised IsrwatchTelemetryStale: {stale}"
    assert not letters, f"{len(letters)} dead letters from a collector {skew_s:+d} s off: {letters[:3]}"
    assert r["batches_during_pause"] > 0, r
    warned = "telemetry_clock_ahead" in job_log
    assert warned == (skew_s > 0), f"telemetry_clock_ahead logged: {warned}, collector {skew_s:+d} s"
