"""Issue 12: the job on a real Spark standalone cluster, and several Kafka clusters in one job.

Standalone: a master and two workers started from the pyspark package's jars
(``localspark``), the job submitted to it as a user would (``isrwatch run
--spark-master spark://...``), its executors in the workers' JVMs reading the
telemetry partitions and holding the state store. Real 3-broker Kafka 0.9, the
real collector, produce load, isrwatch's topics placed by Kafka as everywhere.

* Spark's REST API shows tasks run by executors of both workers, and the state records
  written by Python workers under the executors' JVMs;
* one worker killed (kill -9, with its executor) under load: the job goes on on the
  other; a follower broker paused afterwards: every real shrink alerted first, with the
  lead bound of local mode (tests/e2e/test_broker_pauses.py; at Kafka's default lag of
  30 s, see ``STANDALONE_LAG_MS``); in make campaign (``all-paused-twice``, ``not-ok``)
  another broker is paused before the kill too, alerted first just the same;
* nothing lost or counted twice: once the collector stops and the job has committed
  the end of the telemetry topic, the observations in its state store equal those on
  the topic; no alert transition repeated.

The two brokers paused are the two that do not hold the controller: a Kafka 0.9
controller paused can leave a leader with a stale ISR version (KAFKA-2729,
docs/kafka.md) for the rest of the run, which would end the second round; the
controller's pause is covered, in both deployments, by test_broker_pauses.py.

Several clusters: two watched clusters, each with its own collector
(``--cluster a``, ``--cluster b``), the same topic name on both, one telemetry
topic and one job. A broker of ``a`` paused is alerted for ``a``; nothing of ``b``
is alerted, and the job's /metrics keeps ``b``'s replicas apart and healthy.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import urllib.request
from collections import defaultdict
from typing import Any

import pytest

from isrwatch.alerts import AlertName
from localkafka import free_port
from localspark import LocalSpark
from tests.e2e.accounting import drain_and_count
from tests.e2e.kafka_io import ProduceLoad
from tests.e2e.pauses import layout, pause_round
from tests.e2e.pipeline import LAG_MS, ZK_SESSION_MS, AlertEvent, Pipeline, until
from tests.e2e.results import check_nearing_lead, repeated_transitions, write_result

DATA_PARTITIONS = 3
# replica.lag.time.max.ms of the standalone test: Kafka's default since 2.5 (30 s), not the
# 20 s of the local-mode tests. On a 2-core machine that also runs the three brokers,
# ZooKeeper, the collector and the load, a standalone master, two workers and their
# executors take 4-8 s per micro-batch (measured; 1-2 s in local mode), and the broker may
# drop a paused follower as early as lag after its last fetch: with 20 s the printed alert
# then came after the shrink once (CI, 2026-11-25: 19 s after the crossing). The bound
# asserted is the same formula as in local mode (results.lead_floor_s), at this lag.
STANDALONE_LAG_MS = 30_000


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def tasks_per_worker(ui_port: int, spark: LocalSpark) -> dict[int, int]:
    """Tasks each worker's executors have run, from the job's Spark REST API (every
    executor, dead ones too), by the worker whose UI serves the executor's logs."""
    base = f"http://127.0.0.1:{ui_port}/api/v1/applications"
    app = _get(base)[0]["id"]
    out: dict[int, int] = defaultdict(int)
    for ex in _get(f"{base}/{app}/allexecutors"):
        if ex["id"] == "driver":
            continue
        worker = spark.worker_of_executor_log(ex.get("executorLogs", {}).get("stdout", ""))
        if worker is not None:
            out[worker] += ex["totalTasks"]
    return dict(out)


def _check_round(r: dict[str, Any]) -> None:
    for row in r["rows"]:
        where = f"{row['topic']}-{row['partition']} on broker {r['broker']}"
        check_nearing_lead(row, where)  # the bound of local mode


def _ancestors(pid: int) -> list[str]:
    """The command lines of ``pid`` and its parents (Linux /proc)."""
    out = []
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    return out


def state_writers(pipe: Pipeline) -> list[int]:
    """The processes the job says wrote its state records (``event=state_writers``) that are
    still running, each checked to be a Python worker under an executor's JVM (a worker's
    ``CoarseGrainedExecutorBackend``), not the job's driver."""
    pids = {int(hp.rsplit(":", 1)[1]) for line in re.findall(r"event=state_writers processes=(\S+)", pipe.job_log())
            for hp in line.split(",")}  # fmt: skip
    alive = [p for p in sorted(pids) if os.path.exists(f"/proc/{p}")]
    for p in alive:
        chain = _ancestors(p)
        assert any("CoarseGrainedExecutorBackend" in c for c in chain[1:]), f"state writer {p}: {chain}"
        assert not any("isrwatch run" in c or "isrwatch.cli run" in c for c in chain), f"{p} is the driver's"
    return alive


# make test pauses one broker, after the worker is killed: the job on the surviving worker alone
# alerts first. make campaign (~230 s each) pauses a broker before the kill too, with the job's
# defaults and with --driver-replicas not-ok (make test keeps not-ok on real Spark in one JVM,
# tests/streaming/test_driver_replicas.py; this one shows the batch's counts gathered by executors
# in other JVMs, Spark's observed metrics, and its alerts as sure).
@pytest.mark.parametrize(
    ("driver_replicas", "pause_before_kill"),
    [
        pytest.param("all", False, id="all"),
        pytest.param("all", True, id="all-paused-twice", marks=pytest.mark.campaign),
        pytest.param("not-ok", True, id="not-ok", marks=pytest.mark.campaign),
    ],
)
def test_the_job_on_a_standalone_cluster_alerts_first_and_goes_on_without_a_worker(
    kafka_cluster_factory, tmp_path, spark_reader, driver_replicas, pause_before_kill, request
):
    cluster = kafka_cluster_factory(
        replica_lag_time_max_ms=STANDALONE_LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS
    )
    topic = "orders"
    cluster.create_topic(topic, partitions=DATA_PARTITIONS, replication_factor=3)
    placed = layout(cluster, topic)
    ui_port = free_port()
    with contextlib.ExitStack() as stack:
        spark = stack.enter_context(LocalSpark(workers=2, data_dir=str(tmp_path / "spark")))
        assert len(spark.alive_workers()) == 2
        stack.enter_context(ProduceLoad(cluster, topic, DATA_PARTITIONS, rate=300))
        job_args = [
            "--spark-master", spark.master_url,
            "--spark-conf", f"spark.ui.port={ui_port}",
            "--stale-after-seconds", "600",  # the collector is stopped at the end
            "--driver-replicas", driver_replicas,
        ]  # fmt: skip
        pipe = stack.enter_context(Pipeline(cluster, tmp_path, job_args=job_args))
        pipe.wait_watching(2 * DATA_PARTITIONS)
        controller = cluster.controller_id()
        first, second = [b for b in cluster.broker_ids if b != controller][:2]

        rounds = [pause_round(cluster, pipe, topic, first, placed, None)] if pause_before_kill else []

        def both_worked() -> bool:
            tasks = tasks_per_worker(ui_port, spark)
            return len(tasks) == 2 and min(tasks.values()) > 0

        until("tasks run on both workers", both_worked, 120, pipe)
        before_kill = tasks_per_worker(ui_port, spark)
        writers = state_writers(pipe)

        spark.kill_worker(1)
        killed_at = time.time()
        batches_at_kill = len(pipe.batches())
        until("the job to go on without the worker", lambda: len(pipe.batches()) >= batches_at_kill + 5, 240, pipe)
        rounds.append(pause_round(cluster, pipe, topic, second, placed, None))
        after_kill = tasks_per_worker(ui_port, spark)

        high, expected, got = drain_and_count(cluster, pipe, spark_reader)
    write_result(
        # one file a case (make campaign runs all three): make test's [all] keeps the name docs/scaling.md gives
        "spark_standalone" + ("" if request.node.callspec.id == "all" else f"-{request.node.callspec.id}"),
        {
            "scenario": "job on a standalone cluster of 2 workers; "
            + (
                "a broker paused, a worker killed, another paused"
                if pause_before_kill
                else "a worker killed, a broker paused"
            ),
            "driver_replicas": driver_replicas,
            "lag_time_max_ms": STANDALONE_LAG_MS,
            "tasks_per_worker_before_kill": before_kill,
            "tasks_per_worker_after_kill": after_kill,
            "killed_at": killed_at,
            "rounds": [{k: v for k, v in r.items() if k != "rows"} for r in rounds],
            "rows": [row for r in rounds for row in r["rows"]],
            "telemetry_records": high,
            "observations_expected": sum(expected.values()),
            "observations_aggregated": sum(got.values()),
            "alerts": [[e.arrived, e.name, e.status, *e.replica] for e in pipe.alerts()],
        },
    )
    assert set(before_kill) == {0, 1} and min(before_kill.values()) > 0, f"tasks on both workers: {before_kill}"
    assert writers, "the state records were written by executors' Python workers (streaming.sinks.statewriter)"
    assert "state_writer=executors" in pipe.job_log()
    assert after_kill.get(0, 0) > before_kill[0], f"the surviving worker took the work on: {after_kill}"
    for r in rounds:
        _check_round(r)
    assert not repeated_transitions(pipe.alerts()), repeated_transitions(pipe.alerts())
    assert got == expected, "observations lost or counted twice with a worker lost"
    # The batch lines count every observation once (a batch run again after a restart: its last line).
    counted = {int(b): int(n) for b, n in re.findall(r"\bbatch batch_id=(\d+) observations=(\d+)", pipe.job_log())}
    assert sum(counted.values()) == sum(expected.values()), (sum(counted.values()), sum(expected.values()))


# In make campaign (~190 s): make test keeps the standalone cluster's fault test above, and
# several clusters kept apart in one job (one spool, one Spark job) in tests/streaming/test_job.py.
@pytest.mark.campaign
def test_two_watched_clusters_in_one_job_stay_apart(kafka_cluster_factory, tmp_path):
    a = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    b = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    topic = "orders"  # the same name on both: only the cluster tells them apart
    for c in (a, b):
        c.create_topic(topic, partitions=DATA_PARTITIONS, replication_factor=3)
    placed = layout(a, topic)
    with contextlib.ExitStack() as stack:
        for c in (a, b):
            stack.enter_context(ProduceLoad(c, topic, DATA_PARTITIONS, rate=200))
        # cluster a's collector is the pipeline's own (--cluster e2e); b gets its own
        pipe = stack.enter_context(Pipeline(a, tmp_path))
        pipe.add_watched_cluster(b, "b")
        pipe.wait_watching(2 * 2 * DATA_PARTITIONS)
        controller = a.controller_id()
        broker = next(x for x in a.broker_ids if x != controller)
        r = pause_round(a, pipe, topic, broker, placed, None)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{pipe.metrics_port}/metrics", timeout=10).read().decode()

    def cluster_of(e: AlertEvent) -> str | None:
        return e.labels.get("cluster")

    ratios: dict[str, list[float]] = defaultdict(list)
    for line in metrics.splitlines():
        if line.startswith("isrwatch_replica_lag_ratio{"):
            labels, value = line.rsplit(" ", 1)
            ratios[labels.split('cluster="', 1)[1].split('"', 1)[0]].append(float(value))
    write_result(
        "two_clusters",
        {
            "scenario": "two watched clusters, one telemetry topic, one job; a broker of cluster e2e paused",
            "lag_time_max_ms": LAG_MS,
            "rounds": [{k: v for k, v in r.items() if k != "rows"}],
            "rows": r["rows"],
            "replica_series_per_cluster": {k: len(v) for k, v in ratios.items()},
            "alerts": [[e.arrived, e.name, e.status, cluster_of(e), *e.replica] for e in pipe.alerts()],
        },
    )
    _check_round(r)
    assert all(cluster_of(e) == "e2e" for e in pipe.alerts() if e.replica[2] >= 0), "a replica alert left cluster e2e"
    assert not [e for e in pipe.alerts() if cluster_of(e) == "b" and e.replica[2] >= 0], "cluster b had a replica alert"
    # IsrwatchTelemetryStale may come and go while Spark warms up or a batch runs long on a loaded
    # machine (seen once: both clusters stale for 2 s, before the pause): the job's own slowness,
    # which it reports for every cluster alike. One for b alone would be the fault crossing over.
    for e in pipe.alerts(AlertName.TELEMETRY_STALE.value):
        if cluster_of(e) == "b":
            twin = [x for x in pipe.alerts(AlertName.TELEMETRY_STALE.value, e.status) if cluster_of(x) == "e2e"]
            assert any(abs(x.arrived - e.arrived) <= 1.0 for x in twin), f"cluster b alone went stale: {e.body}"
    assert ratios["b"] and len(ratios["b"]) == len(ratios["e2e"]), f"each cluster's replicas apart: {ratios}"
    assert max(ratios["b"]) < 0.5, f"cluster b's replicas are healthy: {ratios['b']}"
