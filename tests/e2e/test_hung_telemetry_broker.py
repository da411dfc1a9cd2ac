"""The broker that holds isrwatch's telemetry hangs: its followers are still alerted before the shrink.

Real 3-broker Kafka 0.9, collector and job as ``isrwatch`` processes on the watched cluster,
and isrwatch's own topics left to the brokers' defaults, as a user who skips docs/deploy.md
has them: created when first used, ``num.partitions=1``, one replica, on a broker Kafka
picks. That broker is paused until the leaders drop it from the ISR of the watched topic
(three partitions of three replicas placed by Kafka), then resumed.

While it is paused no telemetry gets through: the collector cannot publish to the topic's
only partition and the job cannot read it. The job's own watch of the brokers
(``streaming.driver.brokerwatch``) sees that broker silent while the others answer; for every
real shrink of the paused follower, ``KafkaReplicaNearingIsrShrink`` is printed before the
leader logs it, with the lead of issue 9 (lag/2 - one collector interval - 1 s; the job's
crossing is the broker's last answer to it + lag/2), and no replica alert names a follower
of a partition the paused broker leads or a replica nobody dropped.
"""

from __future__ import annotations

import contextlib
import re
import time

import pytest

from tests.e2e.kafka_io import ProduceLoad
from tests.e2e.pauses import layout, pause_round
from tests.e2e.pipeline import COLLECT_INTERVAL_S, LAG_MS, ZK_SESSION_MS, Pipeline
from tests.e2e.results import Shrinks, check_nearing_lead, write_result

pytestmark = pytest.mark.validation

DATA_PARTITIONS = 3


# The job as it starts by default (``all``: every observed replica held on the driver), and
# with a fleet's ``--driver-replicas not-ok``, where the driver holds no ok follower and reads the
# silent broker's back from the state table (``streaming.lifecycle.query.follower_statuses``):
# that one in ``make campaign`` (the same 1.5 minutes again; make test keeps the default's).
@pytest.mark.parametrize("driver_replicas", ["all", pytest.param("not-ok", marks=pytest.mark.campaign)])
def test_the_broker_holding_the_telemetry_paused_is_alerted_before_its_shrinks(
    kafka_cluster_factory, tmp_path, driver_replicas
):
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    topic = "orders"
    cluster.create_topic(topic, partitions=DATA_PARTITIONS, replication_factor=3)
    placed = layout(cluster, topic)
    started = time.time()
    with contextlib.ExitStack() as stack:
        stack.enter_context(ProduceLoad(cluster, topic, DATA_PARTITIONS, rate=300))
        job_args = ["--driver-replicas", driver_replicas]
        pipe = stack.enter_context(Pipeline(cluster, tmp_path, own_topics="broker-defaults", job_args=job_args))
        pipe.wait_watching(2 * DATA_PARTITIONS)
        steady = pipe.wait_steady()
        own = layout(cluster, pipe.telemetry_topic)
        assert len(own) == 1, f"the brokers' default gives the telemetry topic one partition: {own}"
        [(holder, _)] = own.values()
        assert not [e for e in pipe.alerts() if e.replica[2] >= 0], "no replica alert before the fault"
        r = pause_round(cluster, pipe, topic, holder, placed, None)
    truth = Shrinks.read(cluster, topic, started)
    not_ok = driver_replicas == "not-ok"
    write_result(
        "hung_telemetry_broker" + ("_not_ok" if not_ok else ""),
        {
            "scenario": "the broker holding isrwatch's one-partition telemetry topic paused under produce load"
            + (", the job with --driver-replicas not-ok" if not_ok else ""),
            "lag_time_max_ms": LAG_MS,
            "collector_interval_s": COLLECT_INTERVAL_S,
            "job_steady_before_first_pause": steady,
            "telemetry_holder": holder,
            "round": {k: v for k, v in r.items() if k != "rows"},
            "rows": [{**row, "scenario": f"{row['scenario']} (it holds the telemetry)"} for row in r["rows"]],
            "alerts": [[e.arrived, e.name, e.status, *e.replica] for e in pipe.alerts()],
        },
    )

    assert r["rows"], f"broker {holder} follows no partition of {topic}: {placed}"
    assert not r["misplaced_during_pause"], f"alerts for followers of the paused broker's partitions: {r}"
    assert not r["resolved_before_rejoin"], f"a lag alert resolved before the leader took the follower back: {r}"
    for row in r["rows"]:
        check_nearing_lead(row, f"{topic}-{row['partition']} on broker {holder}", printed_floor=True)
    for e in pipe.alerts(status="firing"):
        t, p, b = e.replica
        if b < 0:
            continue  # IsrwatchTelemetryStale: the telemetry did stop
        logged_out = any(c.partition == p and b in c.isr_before and b not in c.isr_after for c in truth.lines)
        assert t == topic and (b == holder or logged_out), f"{e.name} for {t}-{p} broker {b}: no cause"

    # The Kafka source's warnings of the hung leader, logged in the Python process Spark starts
    # to plan the source's batches, in the job's own format (isrwatch.logs.worker_logging):
    # they came out as the bare message until 2026-12-06.
    log = pipe.job_log()
    assert "WARNING streaming.watermarks event=telemetry_partitions_late" in log, log[-3000:]
    if not_ok:  # the paused broker's ok followers came from the state table, not the driver's memory
        held = re.findall(rf"silent_followers_held brokers=\S*/{holder} replicas=(\d+)", log)
        assert held and int(held[0]) > 0, log[-3000:]
    bare = [line for line in log.splitlines() if line.startswith(("event=", "%"))]  # (%: librdkafka's own)
    assert not bare, bare[:5]
