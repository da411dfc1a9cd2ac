"""Issue 9, part 2: no evidence is not bad evidence.

Real cluster (Kafka 0.9.0.1, 3 brokers), real collector and job, produce load,
no broker fault. The collector is paused (SIGSTOP) for 40 s and resumed (``make test``);
in the campaign run (``make campaign``: 4 more minutes) it is later paused again for
3 minutes and resumed. Each pause is a gap in the telemetry:

* the job raises ``IsrwatchTelemetryStale`` exactly once per pause, and it
  resolves after the collector is resumed;
* four records that are not telemetry, written beside the collector's before the first
  gap, each on the dead-letter topic with its reason, and the job goes on (the poison
  records' make test case on real Kafka);
* no replica alert at all (no alert with a ``broker_id`` label), during or after
  either gap, from the job nor from a real Prometheus scraping the job and the exporter
  with the shipped rules (whose ``IsrwatchTelemetryStale`` must fire in each gap instead):
  the first observation after a gap carries the time and leader LEO
  of the one before it, and a follower a few messages behind under load must
  not read as "not caught up since before the gap" (docs/rule.md, "Gaps in
  telemetry: no evidence is not bad evidence").

The job runs with a 0.2 s trigger, and each pause starts once the job has caught
up with the telemetry, so its first batch after a gap holds only what the collector
publishes first on resume: the first round after the gap (where the issue saw six
replica alerts) and, as measured here, the round the collector runs at once after it
because the next one is overdue; that second round's previous-LEO evidence carries
the followers and hides the gap from the job without the fix. So the test also
replays the telemetry it read back round by round (``tests.simulator.replay.RuleReplay``:
what a batch ending at each observation reports): with the job's gap bound no
follower may reach the nearing ratio; with the broker's rule alone some should (else
this run did not exercise the inference: the machine's timing decides it, and the test
warns instead of failing).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import warnings

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from isrwatch.alerts import AlertName
from isrwatch.rule import Rule
from isrwatch.telemetry import Observation, decode_record
from tests.e2e.fuzz import BAD_RECORDS
from tests.e2e.gauges import prometheus_fired, prometheus_followers, prometheus_scraping
from tests.e2e.kafka_io import ProduceLoad, read_topic
from tests.e2e.pipeline import COLLECT_INTERVAL_S, LAG_MS, ZK_SESSION_MS, Pipeline, until
from tests.e2e.results import stale_episodes, stale_firing, write_result
from tests.simulator.replay import RuleReplay

pytestmark = [pytest.mark.slow, pytest.mark.validation]

# Every broker leads two partitions and follows four: twelve follower replicas.
ASSIGNMENT = [[1, 2, 3], [2, 3, 1], [3, 1, 2]] * 2
FOLLOWER_REPLICAS = 12
# 4 KB messages: with small ones a follower is at the leader LEO at almost every sample
# (measured here: 1% of observations behind at 200 B, 15-20% at 4 KB on a loaded machine,
# 0 of 24 after the gaps on a quiet one), and the gap's end would find no follower for the
# broker's rule to misread; hence also the fetch wait below.
RATE = 500
SIZE = 4000
FETCH_WAIT_MS = 400
# (pause, run after resume) in seconds: two lag times (20 s) without telemetry, and in the
# campaign a second, nine lag times long, after the first episode has resolved
SHORT_GAP = (40.0, 30.0)
LONG_GAP = (180.0, 40.0)
STALE = AlertName.TELEMETRY_STALE.value
TRIGGER_S = 0.2
# the job's default --observation-gap-ms: half of replica.lag.time.max.ms
GAP_BOUND_MS = LAG_MS // 2
NEARING = 0.5
# a job this far behind its telemetry at a pause would call it stale late, or twice
CAUGHT_UP_S = 8.0
_LAG = re.compile(r"\bbatch batch_id=\d+ .*\btelemetry_lag_s=([\d.]+)")


def telemetry(cluster, topic: str) -> list[Observation]:
    """Every observation on the telemetry topic (all partitions, to their end offsets now)."""
    c = Consumer(cluster.client_config(**{"group.id": f"gap-{topic}", "enable.auto.commit": False}))
    out: list[Observation] = []
    try:
        parts = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts if ends[p] > 0])
        left = sum(ends.values())
        deadline = time.monotonic() + 120
        while left > 0 and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is not None and m.error() is None:
                left -= 1
                try:
                    out.extend(decode_record(m.value() or b"").observations)
                except ValueError:  # one of BAD_RECORDS: the dead letters' part of the test
                    continue
        assert left == 0, f"{left} telemetry records not read back"
    finally:
        c.close()
    return out


def exposed_after_gaps(observations: list[Observation]) -> list[dict]:
    """First observations after a gap whose follower is behind the current leader
    LEO but past the pre-gap one: where the broker's rule alone reads the gap as lag."""
    return [
        {"replica": [o.topic, o.partition, o.broker_id], "t_ms": o.t_ms, "gap_ms": o.t_ms - o.prev_t_ms}
        for o in observations
        if o.prev_t_ms is not None
        and o.t_ms - o.prev_t_ms > GAP_BOUND_MS
        and o.leo is not None
        and o.leader_leo is not None
        and o.prev_leader_leo is not None
        and o.prev_leader_leo <= o.leo < o.leader_leo
    ]


def job_caught_up(pipe: Pipeline) -> bool:
    """The job's newest batch is within ``CAUGHT_UP_S`` of the telemetry and no stale alert fires."""
    assert pipe.job is not None
    lags = _LAG.findall(pipe.job.log())
    return bool(lags) and float(lags[-1]) < CAUGHT_UP_S and stale_firing(pipe) is None


def collector_gap(pipe: Pipeline, pause_s: float, run_s: float) -> tuple[float, float]:
    """Once the job has caught up (or after 2 minutes), pause the collector for ``pause_s`` (the job must call the
    telemetry stale meanwhile), resume it, wait for the stale alert to resolve and ``run_s``
    more. -> (paused at, resumed at)."""
    assert pipe.collector is not None
    # Best effort: on a machine too loaded for the job to catch up, pause anyway.
    deadline = time.monotonic() + 120
    while not job_caught_up(pipe) and time.monotonic() < deadline:
        pipe.check_alive("the job to catch up with the telemetry")
        time.sleep(0.5)
    pid = pipe.collector.proc.pid
    stale_before = len(pipe.alerts(STALE, "resolved"))
    paused_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        until(
            "IsrwatchTelemetryStale while the collector is paused",
            lambda: len(pipe.alerts(STALE, "firing")) > stale_before,
            pause_s,
            pipe,
        )
        until("the end of the pause", lambda: time.time() >= paused_at + pause_s, pause_s, pipe)
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed_at = time.time()
    until(
        "IsrwatchTelemetryStale to resolve after resume",
        lambda: len(pipe.alerts(STALE, "resolved")) > stale_before,
        120,
        pipe,
    )
    until(f"{run_s:.0f}s after resume", lambda: time.time() >= resumed_at + run_s, run_s + 120, pipe)
    return paused_at, resumed_at


@pytest.mark.parametrize(
    "gaps",
    [
        pytest.param([SHORT_GAP], id="40s"),
        pytest.param([SHORT_GAP, LONG_GAP], id="40s-then-3min", marks=pytest.mark.campaign),
    ],
)
def test_collector_gaps_raise_one_stale_alert_each_and_no_replica_alert(
    kafka_cluster_factory, tmp_path, gaps: list[tuple[float, float]]
):
    cluster = kafka_cluster_factory(
        replica_lag_time_max_ms=LAG_MS,
        zookeeper_session_timeout_ms=ZK_SESSION_MS,
        # Not a user's tuning, and said why: every follower fetch waits FETCH_WAIT_MS at the
        # leader (min bytes never reached), so a follower is a fraction of a second behind at
        # almost every sample. On a quiet machine with default fetch settings the followers were
        # at the leader LEO at all 24 samples after the gaps (measured), and the run could not
        # show what the broker's rule alone makes of a gap.
        replica_fetch_min_bytes=100 * 1024 * 1024,
        replica_fetch_wait_max_ms=FETCH_WAIT_MS,
    )
    topic = "gaps"
    cluster.create_topic(topic, assignment=ASSIGNMENT)
    pauses: list[tuple[float, float]] = []
    with (
        ProduceLoad(cluster, topic, len(ASSIGNMENT), rate=RATE, size=SIZE) as load,
        Pipeline(cluster, tmp_path, job_args=["--trigger-seconds", str(TRIGGER_S)]) as pipe,
        contextlib.ExitStack() as stack,
    ):
        pipe.wait_watching(FOLLOWER_REPLICAS)
        prom = stack.enter_context(prometheus_scraping(pipe, tmp_path))
        watched_from = time.time()
        exporter_target = f"127.0.0.1:{pipe.exporter_port}"
        until(
            f"Prometheus to show the {FOLLOWER_REPLICAS} followers from the exporter",
            lambda: len(prometheus_followers(prom.url, topic, exporter_target)["series"]) == FOLLOWER_REPLICAS,
            120,
            pipe,
        )
        # A job slow to start on a loaded machine may call its telemetry stale before it
        # catches up: that episode must be over before the first gap.
        until("no IsrwatchTelemetryStale firing before the first gap", lambda: stale_firing(pipe) is None, 120, pipe)
        assert not [e for e in pipe.alerts() if "broker_id" in e.labels], "no replica alert before the first gap"
        # Records that are not telemetry, beside the collector's: each goes to the dead-letter
        # topic with its reason and the job goes on (make test's poison records on real Kafka;
        # tests/e2e/test_steady_load.py does it under steady load in make campaign).
        bad = Producer(cluster.client_config())
        for value in BAD_RECORDS:
            bad.produce(pipe.telemetry_topic, value=value, key=b"e2e")
        assert bad.flush(30) == 0
        until(
            "the dead letters",
            lambda: len(read_topic(cluster, pipe.deadletter_topic)) >= len(BAD_RECORDS),
            120,
            pipe,
        )
        started_at = time.time()
        for pause_s, run_s in gaps:
            pauses.append(collector_gap(pipe, pause_s, run_s))
        ended_at = time.time()
        produced = load.sent
        batches = pipe.batches()
        fired = prometheus_fired(prom.url, time.time() - watched_from)

    # in time order: the telemetry topic's partitions are read one after another
    observations = sorted(
        (o for o in telemetry(cluster, pipe.telemetry_topic) if o.topic == topic), key=lambda o: o.t_ms
    )
    exposed = exposed_after_gaps(observations)
    # Round by round: the broker's rule alone, and the job's inference across gaps.
    broker_rule = RuleReplay(Rule.KIP16_REFINED).feed(observations).max_age_after_ms
    job_rule = RuleReplay(Rule.KIP16_REFINED, max_gap_ms=GAP_BOUND_MS).feed(observations).max_age_after_ms
    worst_broker_rule = max(broker_rule.values(), default=0) / LAG_MS
    worst_job_rule = max(job_rule.values(), default=0) / LAG_MS

    letters = [json.loads(v or b"null") for v in read_topic(cluster, pipe.deadletter_topic)]
    events = pipe.alerts()
    episodes = stale_episodes(events)
    replica_alerts = [e for e in events if "broker_id" in e.labels]
    rules_replica_alerts = sorted(
        {(a["alertname"], a["topic"], a["partition"], a["broker_id"]) for a, _ in fired if "broker_id" in a}
    )
    rules_stale = sorted(t for a, at in fired if a["alertname"] == STALE for t in at)
    # the rules' evaluations with it firing, pause by pause (the rule's threshold: 15 s into one)
    rules_stale_in = [[t for t in rules_stale if a < t <= b] for a, b in pauses]
    write_result(
        f"telemetry_gap_{len(gaps)}",
        {
            "scenario": "collector paused (SIGSTOP) under produce load, no broker fault",
            "lag_time_max_ms": LAG_MS,
            "collector_interval_s": COLLECT_INTERVAL_S,
            "produce_rate": RATE,
            "message_bytes": SIZE,
            "produced": produced,
            "pauses": [[a, b, b - a] for a, b in pauses],
            "started_at": started_at,
            "ended_at": ended_at,
            "stale_episodes": episodes,
            # a job more than --stale-after-seconds behind its telemetry (a loaded machine) flaps
            # the stale alert between the pauses too: recorded, not a gap of the collector
            "stale_outside_pauses": [
                (f, r) for f, r in episodes if f > started_at and not any(a < f <= b for a, b in pauses)
            ],
            "replica_alerts": len(replica_alerts),
            "prometheus_rules_replica_alerts": rules_replica_alerts,
            "prometheus_rules_stale_fired_in_pauses": [[min(ts), max(ts)] if ts else None for ts in rules_stale_in],
            "observations_after_gaps": sum(
                1 for o in observations if o.prev_t_ms is not None and o.t_ms - o.prev_t_ms > GAP_BOUND_MS
            ),
            "exposed_after_gaps": exposed,
            "gap_inference_exercised": worst_broker_rule >= NEARING,
            "replay_worst_lag_ratio": {"broker_rule_alone": worst_broker_rule, "job": worst_job_rule},
            "batches": len(batches),
            "deadletters": [d.get("reason") for d in letters],
            "alerts": [[e.arrived, e.name, e.status, *e.replica, e.offset_lag, e.starts_at, e.window] for e in events],
        },
    )

    if worst_broker_rule < NEARING:
        # Whether a follower is caught between the two leader LEOs at the first sample after a
        # gap is the machine's timing (22 of 24 samples in one run, none in another); the
        # alerts below hold either way, and tests/isrwatch/test_rule.py holds the inference
        # itself to telemetry that always has such followers (property tests over any gaps).
        warnings.warn(
            f"no follower behind the leader LEO at the end of a gap (broker's rule alone: worst lag ratio "
            f"{worst_broker_rule:.2f}): this run did not exercise the gap inference",
            stacklevel=1,
        )
    assert sorted(d.get("reason") for d in letters) == sorted(BAD_RECORDS.values()), letters
    assert worst_job_rule < NEARING, f"replayed round by round, a follower reached lag ratio {worst_job_rule:.2f}"
    for paused_at, resumed_at in pauses:
        mine = [(f, r) for f, r in episodes if paused_at < f <= resumed_at]
        assert len(mine) == 1, f"IsrwatchTelemetryStale episodes {mine} in the pause {paused_at}..{resumed_at}"
        resolved = mine[0][1]
        assert resolved is not None and resolved > resumed_at, f"stale resolved at {resolved}, resumed {resumed_at}"
    for (paused_at, resumed_at), mine_rules in zip(pauses, rules_stale_in, strict=True):
        assert mine_rules, (
            f"the shipped rules' {STALE} did not fire in Prometheus in the pause {paused_at}..{resumed_at}"
        )
    assert not rules_replica_alerts, f"the shipped rules fired replica alerts in Prometheus: {rules_replica_alerts}"
    assert not replica_alerts, "replica alerts across a telemetry gap: " + "; ".join(
        f"{e.name} {e.status} {e.replica} offset_lag={e.offset_lag} at +{e.arrived - pauses[0][0]:.1f}s"
        for e in replica_alerts
    )
