"""Issue 3, done-when 2: kill -9 the job and start it again on the same checkpoint, here
while a broker is still paused (the moment the monitor exists for).

Real 3-broker Kafka 0.9, collector and job as ``isrwatch`` processes, isrwatch's own topics
on the watched cluster as docs/deploy.md creates them (6 partitions, one replica, placed by
Kafka): the paused broker leads some of the telemetry's partitions, so the restarted job
owes ranges it cannot read and plans against a leader that does not answer.

Broker 3 is paused; once the job has announced its followers (``Nearing``) the job is
SIGKILLed (process group, Spark JVM too) and started again on the same checkpoint while the
broker stays paused, the collector is SIGKILLed and started again with it, and an exporter is
started too. The restarted job must go on watching
during the fault: it completes batches and announces the paused follower out of sync before
the broker is resumed, and the new exporter serves the paused follower's gauges; after the
resume the job resolves every alert, repeats no transition of the first run, names no
follower but the paused one (the restarts are gaps in the telemetry), and loses no telemetry: once the collector is stopped and the job has committed the end of the topic, the
per-replica observation counts in its state store (read back with Spark's state reader) equal
the observations on the telemetry topic. The restarted job also removes what the killed one
left in its temp directory (Spark's scratch space; the job's ``TMPDIR`` is the test's own, so
what is there is the job's).

(Until 2026-11-26 this test resumed the broker before starting the job again; a restart after
a pause is also tests/e2e/test_late_job.py's.) The first try of this test found the restarted job exiting at start-up ("cannot reach Kafka:
Failed to get metadata: Local: Timed out"): librdkafka had asked the hung broker alone for
metadata (``exporter.kafka_metadata``).
"""

from __future__ import annotations

import json
import time
import urllib.request
import warnings
from collections import Counter

import pytest

from exporter.kafka_metadata import first_metadata
from isrwatch.alerts import AlertName
from tests.e2e.accounting import drain_and_count
from tests.e2e.kafka_io import ProduceLoad, read_observations
from tests.e2e.pipeline import LAG_MS, ZK_SESSION_MS, Pipeline, until
from tests.e2e.results import repeated_transitions, write_result

pytestmark = pytest.mark.validation

PAUSED = 3
# the restarted job's Spark start, checkpoint restore and first batch: a limit for a stuck
# run, inside the pause (which must end before the broker's ZooKeeper session expires)
RESTART_LIMIT_S = 150.0


def _serves_follower(port: int, topic: str, broker: int) -> bool:
    """The exporter's /metrics has a lag ratio for ``broker``'s replicas of ``topic``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return False
    return any(
        line.startswith("isrwatch_replica_lag_ratio{")
        and f'topic="{topic}"' in line
        and f'broker_id="{broker}"' in line
        for line in text.splitlines()
    )


def _answers(cluster, telemetry_topic: str, broker: int, since: float, until_s: float) -> list[float]:
    """Seconds after ``since`` of each observation of ``broker``'s replicas with an answer
    (a log end offset), up to ``until_s``, by the telemetry's clock."""
    return sorted(
        round(o.t_ms / 1000 - since, 2)
        for o in read_observations(cluster, telemetry_topic)
        if o.broker_id == broker and o.leo is not None and since <= o.t_ms / 1000 <= until_s
    )


def _follower_record(cluster, telemetry_topic: str, broker: int, since: float) -> str:
    """What the telemetry said of ``broker``'s replicas from ``since`` on, in runs of the same
    (in the ISR, answered, caught up): when an alert fires again, was the follower out of the
    ISR (and by which leader's word) or behind? A failure's reading."""
    runs: dict[int, list[list]] = {}
    for o in sorted(read_observations(cluster, telemetry_topic), key=lambda o: o.t_ms):
        if o.broker_id != broker or o.t_ms / 1000 < since:
            continue
        caught_up = o.leo is not None and o.leader_leo is not None and o.leo >= o.leader_leo
        fact = (broker in o.isr, o.leo is not None, caught_up, o.leader_id)
        mine = runs.setdefault(o.partition, [])
        if mine and mine[-1][0] == fact:
            mine[-1][2], mine[-1][3] = o.t_ms / 1000 - since, mine[-1][3] + 1
        else:
            mine.append([fact, o.t_ms / 1000 - since, o.t_ms / 1000 - since, 1])
    return "\n".join(
        f"partition {p} {a:7.1f}s..{b:7.1f}s x{n}: in_isr={f[0]} answered={f[1]} caught_up={f[2]} leader={f[3]}"
        for p, mine in sorted(runs.items())
        for f, a, b, n in mine
    )


def _timeline(pipe: Pipeline, since: float) -> str:
    """Every alert event, one a line (seconds after ``since`` it arrived, the job's run,
    alert, partition, status): a failure's reading."""
    return "\n".join(
        f"{e.arrived - since:7.1f}s run {e.run} {e.name} partition {e.replica[1]} {e.status}" for e in pipe.alerts()
    )


def test_killed_job_restarted_during_a_broker_pause_keeps_watching_loses_nothing_repeats_nothing(
    kafka_cluster_factory, tmp_path, spark_reader
):
    # the pause lasts through a whole job restart: the paused broker's ZooKeeper session outlives it
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS * 2)
    topic = "ledger"
    # the watched topic, pinned so the paused broker follows both partitions; isrwatch's own
    # topics are placed by Kafka (Pipeline.create_topics)
    cluster.create_topic(topic, assignment=[[1, 2, 3], [2, 1, 3]])
    pipeline = Pipeline(cluster, tmp_path, job_args=["--stale-after-seconds", "600"])
    with ProduceLoad(cluster, topic, 2, rate=200), pipeline as pipe:
        pipe.wait_watching(4)
        pipe.wait_steady()
        cluster.pause(PAUSED)
        paused_at = time.time()
        try:
            until(
                "the job to announce the paused follower",
                lambda: len({e.replica for e in pipe.alerts(AlertName.NEARING.value, "firing")}) == 2,
                4 * LAG_MS / 1000,
                pipe,
            )
            assert pipe.job is not None
            pipe.job.kill()
            killed_at = time.time()
            # what the killed job left in its temp directory (Spark's scratch space): the
            # restarted job removes it (streaming.lifecycle.leftovers)
            left_by_kill = sorted(p.name for p in pipe.job_tmp.iterdir())
            # the collector too (item 2: the same for the collector), started again at once
            assert pipe.collector is not None
            pipe.collector.kill()
            pipe.start_collector()
            first_run = list(pipe.alerts())
            # metadata with the hung broker named first (a client that asks it alone waits out its timeout)
            hung_first = ",".join(cluster.address(b) for b in (PAUSED, 1, 2))
            md = first_metadata({**cluster.client_config(), "bootstrap.servers": hung_first}, 10.0, topic)
            assert sorted(md.topics[topic].partitions) == [0, 1]
            pipe.start_job()  # same checkpoint, the broker still paused (batches(): this run's)
            until(
                "the restarted job's first batch while the broker is paused",
                lambda: len(pipe.batches()) > 0,
                RESTART_LIMIT_S,
                pipe,
            )
            first_batch_s = time.time() - killed_at
            still_there = [n for n in left_by_kill if (pipe.job_tmp / n).exists()]
            exporter = pipe.start_exporter()
            until(
                "the restarted job to announce the paused follower out of sync",
                lambda: len({e.replica for e in pipe.alerts(AlertName.OUT_OF_SYNC.value, "firing")}) == 2,
                RESTART_LIMIT_S,
                pipe,
            )
            out_of_sync_s = time.time() - paused_at
            until(
                "the exporter started during the pause to serve the paused follower's gauges",
                lambda: _serves_follower(exporter, topic, PAUSED),
                RESTART_LIMIT_S,
                pipe,
            )
        finally:
            cluster.resume(PAUSED)
            resumed_at = time.time()
            # every alert line so far, for a failure's reading
            (tmp_path / "alerts.jsonl").write_text(
                "".join(f"{json.dumps([e.arrived, e.run, e.body])}\n" for e in pipe.alerts())
            )

        def resolved_all() -> bool:
            # each alert's newest event: an alert resolved once and fired again is not
            # resolved (a CI run on 2026-12-01 drained on that: docs/validation.md)
            return bool(pipe.alerts()) and not pipe.firing()

        try:
            until("the restarted job to resolve the alerts", resolved_all, 240, pipe)
        except BaseException:
            print(_timeline(pipe, paused_at))
            print(_follower_record(cluster, pipe.telemetry_topic, PAUSED, paused_at))
            raise
        high, expected, got = drain_and_count(cluster, pipe, spark_reader)

    events = Counter((e.identity, e.status) for e in pipe.alerts())
    # For the open finding (docs/validation.md): what the telemetry says the paused broker
    # answered after the pause began (seconds after it), by the collector's clock.
    answered_in_pause = _answers(cluster, pipe.telemetry_topic, PAUSED, paused_at, resumed_at)
    write_result(
        "restart",
        {
            "scenario": "job SIGKILLed while a broker is paused and started again before it resumes",
            "lag_time_max_ms": LAG_MS,
            "paused_at": paused_at,
            "killed_at": killed_at,
            "resumed_at": resumed_at,
            "first_batch_after_kill_s": round(first_batch_s, 1),
            "out_of_sync_after_pause_s": round(out_of_sync_s, 1),
            "telemetry_records": high,
            "flapped": sorted(str(i) for (i, status), n in events.items() if n > 1),
            "paused_broker_answers_after_pause_s": answered_in_pause,
            "observations_expected": sum(expected.values()),
            "observations_aggregated": sum(got.values()),
            "rows": [],
            "alerts": [[e.arrived, e.run, e.body] for e in pipe.alerts()],
        },
    )
    print(f"first batch {first_batch_s:.1f} s after the kill; out of sync {out_of_sync_s:.1f} s after the pause")
    assert pipe.alerts()[len(first_run) :], "the restarted job announced something"
    assert any(n.startswith("isrwatch-spark-") for n in left_by_kill), left_by_kill
    assert still_there == [], f"the killed job's temporary directories outlived the restart: {still_there}"
    # the restarts are gaps in the telemetry, and no evidence is not bad evidence
    healthy = sorted({e.replica for e in pipe.alerts() if e.replica[2] >= 0 and e.replica[2] != PAUSED})
    assert not healthy, f"replica alerts for followers nothing slowed: {healthy}"
    repeats = repeated_transitions(pipe.alerts())
    assert not repeats, f"a transition was sent twice: {repeats}"
    last = {e.identity: e.status for e in pipe.alerts()}
    assert set(last.values()) == {"resolved"}, (
        f"an alert was left firing:\n{_timeline(pipe, paused_at)}\n"
        f"the paused follower by the telemetry:\n{_follower_record(cluster, pipe.telemetry_topic, PAUSED, paused_at)}"
    )
    if max(events.values()) > 1:
        # Open finding (docs/validation.md): the restarted job resolves the paused follower's
        # Nearing, which the first run's lookahead fired at its predicted crossing, in its first
        # batch and fires it again in the next, at the crossing the telemetry shows. Not a repeat
        # of what the first run sent, so not asserted; recorded.
        warnings.warn(
            f"restart: an alert flapped: {events.most_common(3)}; the paused broker answered, by the"
            f" telemetry, {answered_in_pause[-5:]} s after the pause began",
            stacklevel=1,
        )
    assert got == expected, "observations lost or counted twice across the restart"
