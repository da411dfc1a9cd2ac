"""Issue 9: the monitor keeps seeing while any broker of the watched cluster stalls.

Real 3-broker Kafka 0.9 (ZooKeeper session longer than a pause, so the leaders'
own checks remove the paused follower), real collector and job, produce load.
isrwatch's topics are laid out as docs/deploy.md tells a user
(``pipeline.TOPIC_PARTITIONS`` partitions, one replica, Kafka's own
assignment), so every broker leads some of isrwatch's own partitions; the
watched topic has three partitions of three replicas placed by Kafka, so each
broker leads one and follows two. The controller is paused like the
others, last (see ``_pause_round`` on Kafka 0.9's KAFKA-2729).

Two deployments: the telemetry on the watched cluster, and on a separate
one-broker telemetry cluster; the first also with the fleet's ``--driver-replicas
not-ok``. Each broker is paused in turn until the leaders have dropped it from the
ISR, then resumed. For every pause:

* each real shrink of the paused follower is printed as
  ``KafkaReplicaNearingIsrShrink`` before the leader logs it, the job's crossing ahead by at
  least lag/2 - one collector interval - 1 s, and so is the printed alert (issue 9's bound,
  ``results.check_nearing_lead``);
* the job keeps completing micro-batches during the pause (no gap longer than
  ``MAX_BATCH_GAP_S``);
* while the broker is paused, no replica alert names a follower of a partition
  it leads (those followers cannot fetch: not their fault);
* every replica alert of the whole run is of the paused broker, or of a replica
  the brokers themselves logged out of the ISR (a paused leader, resumed,
  shrinks its ISR to itself: docs/kafka.md).

Issue 10: the separate-telemetry deployment's collector reads the log end offsets from the
brokers' JMX (``isrwatch collect --source jmx``), the watched-cluster one's by fetch requests;
the bounds above hold for both sources (a paused broker's JMX does not answer either).

Issue 15, on the separate-telemetry deployment: the recorded telemetry topic replayed with
``isrwatch replay`` under the setting the brokers ran (``kip16``, the lag) drops every paused
follower the leaders dropped, the leader's shrink inside the replay's predicted window, and
nothing the brokers did not drop; with a lag 5 s shorter it drops them 5 s earlier.

Issue 17, on the watched-cluster deployment (each broker leads partitions of
the state topic): ``isrwatch exporter`` reads the state topic and a real
Prometheus with the shipped rules scrapes it and the job's own /metrics. For
every pause the job's /metrics shows the paused follower at lag ratio >= 0.5,
and Prometheus fires ``KafkaReplicaNearingIsrShrink`` for it, before the
broker's real shrink; once the round's alerts have resolved, the exporter's
states agree with the job's within ``AGREE_S`` (with ``not-ok``, which serves only the
replicas the job holds: the exporter shows each of those in the job's state); no output
record is lost.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections import Counter
from typing import Any

import pytest
import requests

from localservices import prometheus
from tests.e2e.gauges import GaugeWatch, exporter_agrees, prometheus_config
from tests.e2e.kafka_io import ProduceLoad, read_records
from tests.e2e.pauses import layout, pause_round
from tests.e2e.pipeline import COLLECT_INTERVAL_S, LAG_MS, ZK_SESSION_MS, Pipeline, until
from tests.e2e.results import Shrinks, check_nearing_lead, replay_telemetry, write_result
from tests.e2e_observability.running_job import parse_metrics

pytestmark = pytest.mark.validation

DATA_PARTITIONS = 3
# Longest stretch without a completed micro-batch while a broker is paused: the trigger
# is 1 s, planning waits --partition-answer-ms (1 s) for a hung leader and a read task
# 1 s (3 s with a consumer new to the partition: streaming.sources.deferred); batches take 2-9 s
# on this 2-core machine under load (load average 10: 11.3 s measured once). Before the fix the job stood still for the whole pause.
MAX_BATCH_GAP_S = 15.0


def _state_after_compaction(cluster: Any, pipe: Pipeline, watch: GaugeWatch, every_replica: bool) -> dict[str, Any]:
    """Issue 17, after the rounds: the broker has compacted the state topic (records gone from
    its partitions), the last record of each replica is its newest (compaction keeps the last
    record of a key: nothing older resurrected by a late or retried delivery, nor after its
    tombstone), and an exporter started now, reading the compacted topic from its start, agrees
    with the job. A record the executors handed back to the driver while a leader hung may land
    after the driver's newer one when the leader wakes, until the driver repairs it
    (streaming.sinks.statewriter): such records, older than one before them, are counted, not refused."""
    found: dict[str, Any] = {}

    def compacted() -> bool:
        records = read_records(cluster, pipe.state_topic, compacted=True)
        removed = {}
        for p in {p for p, *_ in records}:
            offsets = [o for q, o, *_ in records if q == p]
            removed[p] = max(offsets) + 1 - len(offsets)
        found.update(records=records, removed=removed)
        return sum(removed.values()) > 0

    until("the broker to compact the state topic", compacted, 120, pipe)
    backwards = []
    newest: dict[str, int] = {}
    last: dict[str, tuple[int, int, int | None]] = {}  # key -> its last record: partition, offset, eval_ms
    for p, offset, raw_key, value in found["records"]:
        key = (raw_key or b"").decode(errors="replace")
        eval_ms = None if value is None else json.loads(value)["eval_ms"]
        last[key] = (p, offset, eval_ms)
        if eval_ms is None:
            continue
        if eval_ms < newest.get(key, -1):
            backwards.append([p, offset, key, eval_ms, newest[key]])
        newest[key] = max(eval_ms, newest.get(key, -1))
    not_newest = [[key, *at, newest[key]] for key, at in last.items() if at[2] is not None and at[2] < newest[key]]
    port = pipe.start_exporter()
    fresh = GaugeWatch(watch.topic, watch.urls["job"], f"http://127.0.0.1:{port}/metrics", watch.prom_url)
    until(
        "an exporter started on the compacted topic to agree with the job",
        lambda: exporter_agrees(fresh, every_replica),
        60,
        pipe,
    )
    return {
        "records_left": len(found["records"]),
        "removed_by_compaction": found["removed"],
        "went_backwards": backwards,
        "last_not_newest": not_newest,
    }


# Both deployments run in make campaign (~3 min and ~7.5 min: every broker paused in turn): make
# test keeps a paused broker alerted before its shrinks on the README's deployment, the faults
# reaching isrwatch's own topics, through tests/e2e/test_hung_telemetry_broker.py and
# test_restart.py, and the JMX source on real Kafka through tests/collector/test_jmx_kafka.py.
# The fleet's setting (README, docs/scaling.md), the job with --driver-replicas not-ok, on the
# watched-cluster deployment: the same bounds, Prometheus on the job and the exporter; the job's
# /metrics serve only the replicas it holds, so the exporter must agree with those (gauges.py).
@pytest.mark.campaign
@pytest.mark.parametrize(
    ("deployment", "source", "driver_replicas"),
    [
        pytest.param("watched-cluster", "fetch", "all", id="watched-cluster-fetch"),
        pytest.param("separate-telemetry-cluster", "jmx", "all", id="separate-telemetry-cluster-jmx"),
        pytest.param("watched-cluster", "fetch", "not-ok", id="watched-cluster-fetch-driver-not-ok"),
    ],
)
def test_every_broker_paused_in_turn_is_alerted_before_its_shrinks(
    deployment, source, driver_replicas, kafka_cluster_factory, tmp_path
):
    # The log cleaner on (the local clusters leave it off to save memory; a user's brokers
    # compact isr.replica-state), checking every 2 s instead of 15 s so compaction happens
    # within the test; the state topic rolls a segment every 10 s for the same reason
    # (Kafka's defaults: a week or 1 GiB). Placement is Kafka's own, as everywhere.
    compaction = {"log_cleaner_enable": "true", "log_cleaner_backoff_ms": 2000}
    cluster = kafka_cluster_factory(
        replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS, **compaction
    )
    telemetry = None
    if deployment == "separate-telemetry-cluster":
        telemetry = kafka_cluster_factory(brokers=1, zookeeper_session_timeout_ms=ZK_SESSION_MS, **compaction)
    topic = "orders"
    cluster.create_topic(topic, partitions=DATA_PARTITIONS, replication_factor=3)
    placed = layout(cluster, topic)
    assert sorted(leader for leader, _ in placed.values()) == [1, 2, 3], f"Kafka placed {placed}"
    started = time.time()
    rounds = []
    lost = None
    pending = None
    after_compaction = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(ProduceLoad(cluster, topic, DATA_PARTITIONS, rate=300))
        pipe = stack.enter_context(
            Pipeline(
                cluster,
                tmp_path,
                telemetry_cluster=telemetry,
                collector_source=source,
                state_topic_config={"segment.ms": 10_000, "min.cleanable.dirty.ratio": 0.01},
                job_args=["--driver-replicas", driver_replicas],
            )
        )
        watch = None
        if telemetry is None:
            own = layout(cluster, pipe.telemetry_topic)
            assert {leader for leader, _ in own.values()} == {1, 2, 3}, "every broker leads telemetry partitions"
            state = layout(cluster, pipe.state_topic)
            assert {leader for leader, _ in state.values()} == {1, 2, 3}, "every broker leads state partitions"
            pipe.start_exporter()
            job_url = f"http://127.0.0.1:{pipe.metrics_port}/metrics"
            exporter_url = f"http://127.0.0.1:{pipe.exporter_port}/metrics"
            prom_dir = tmp_path / "prometheus"
            prom_dir.mkdir()
            prom = stack.enter_context(
                prometheus(prometheus_config(prom_dir, [job_url[7:-8], exporter_url[7:-8]]), prom_dir)
            )
            watch = GaugeWatch(topic, job_url, exporter_url, prom.url)
            watch.start()
            stack.callback(watch.stop_event.set)
        pipe.wait_watching(2 * DATA_PARTITIONS)
        # Issue 17's runs paused a broker "once the job ran steadily": past Spark's warm-up
        # (its first batches take 10-30 s here), as a fault finds a job in service.
        steady = pipe.wait_steady()
        # (IsrwatchTelemetryStale may come and go while Spark warms up on a loaded machine: the
        # job's own slowness, which it reports; no replica may be alerted.)
        assert not [e for e in pipe.alerts() if e.replica[2] >= 0], "no replica alert before the first fault"
        controller = cluster.controller_id()
        for broker in sorted(cluster.broker_ids, key=lambda b: b == controller):  # the controller last
            rounds.append(pause_round(cluster, pipe, topic, broker, placed, watch, driver_replicas == "all"))
        if watch is not None:
            after_compaction = _state_after_compaction(cluster, pipe, watch, driver_replicas == "all")

            def counts(name: str) -> dict[str, float]:
                return {dict(lab)["topic"]: v for (n, lab), v in watch.scrape("job").items() if n == name}

            # everything written during the faults acknowledged: the job's pending gauge (read
            # at each scrape) is 0 between batches, whose few records are acknowledged in ms
            until(
                "no output record pending",
                lambda: (
                    bool(counts("isrwatch_output_records_pending"))
                    and not any(counts("isrwatch_output_records_pending").values())
                ),
                30,
                pipe,
            )
            pending = counts("isrwatch_output_records_pending")
            lost = counts("isrwatch_output_records_lost_total")
        # Issue 10, the broker's truth, live: the job's own count of the shrinks (checked below).
        job_url = f"http://127.0.0.1:{pipe.metrics_port}/metrics"
        read: dict[str, Any] = {}

        def counted() -> bool:
            """The job's shrink lines and /metrics read together (a line logged between the two
            reads: read again). With the leaders' own counts (jmx) every paused follower's real
            shrink is counted, also those metadata never showed, each settled 10 s of telemetry
            after the count rose: wait for that."""
            before = _counted_shrinks(pipe.job_log())
            read["metrics"] = parse_metrics(requests.get(job_url, timeout=10).text)
            read["lines"] = _counted_shrinks(pipe.job_log())
            if read["lines"] != before:
                return False
            paused = _paused_shrinks(Shrinks.read(cluster, topic, started), rounds, topic)
            return source != "jmx" or _warned_while_paused(read["lines"], rounds) == paused

        until("the job to count the paused followers' real shrinks", counted, 90, pipe)
        job_log = pipe.job_log()
    truth = Shrinks.read(cluster, topic, started)
    replayed = None
    if telemetry is not None:  # issue 15: the recording, replayed under the brokers' setting and a shorter one
        shorter = LAG_MS - 5_000
        replayed = replay_telemetry(
            telemetry, pipe.telemetry_topic, "--rule", "kip16", "--lag-time-max-ms", f"{LAG_MS},{shorter}"
        )
    write_result(
        f"broker_pauses_{deployment}" + ("" if driver_replicas == "all" else "_driver_not_ok"),
        {
            "scenario": f"each broker paused in turn under produce load, telemetry on the {deployment}",
            "lag_time_max_ms": LAG_MS,
            "collector_interval_s": COLLECT_INTERVAL_S,
            "collector_source": source,
            "job_steady_before_first_pause": steady,
            "rounds": [{k: v for k, v in r.items() if k != "rows"} for r in rounds],
            "rows": [
                {**row, "scenario": f"{row['scenario']} ({deployment}, {source})"} for r in rounds for row in r["rows"]
            ],
            "output_records_lost": lost,
            "output_records_pending_at_end": pending,
            "state_topic_after_compaction": after_compaction,
            "replayed": replayed,
            "alerts": [[e.arrived, e.name, e.status, *e.replica] for e in pipe.alerts()],
        },
    )

    for r in rounds:
        b = r["broker"]
        assert r["longest_batch_gap_s"] <= MAX_BATCH_GAP_S, f"broker {b} paused: the job stalled: {r}"
        # (An earlier stop saw this once for the controller's round on a machine at load 10, and
        # recorded it only; it did not recur in the 14 rounds of the next stop: asserted for all.)
        assert not r["misplaced_during_pause"], f"broker {b} paused: alerts for followers of its partitions: {r}"
        assert not r["resolved_before_rejoin"], f"broker {b}: a lag alert resolved before the leader took it back: {r}"
        for row in r["rows"]:
            where = f"{topic}-{row['partition']} on broker {b}"
            check_nearing_lead(row, where, printed_floor=True)
            assert row["stalled_arrived"] is not None, f"{where}: the paused broker was not reported stalled"
            if telemetry is None:  # issue 17: the gauges and the rule path, before the shrink too
                for kind in ("job", "prometheus"):
                    lead = row[f"{kind}_lead_s"]
                    assert lead is not None and lead > 0, f"{where}: {kind} showed no Nearing before the shrink: {row}"
    if lost is not None:
        assert not any(lost.values()), f"output records lost: {lost}"
    if after_compaction is not None:
        assert not after_compaction["last_not_newest"], f"a replica's last state is not its newest: {after_compaction}"
    for e in pipe.alerts(status="firing"):
        t, p, b = e.replica
        if b < 0:
            continue  # IsrwatchTelemetryStale and partition alerts name no follower
        paused_broker = any(r["broker"] == b and p in r["followed"] for r in rounds)
        logged_out = any(c.partition == p and b in c.isr_before and b not in c.isr_after for c in truth.lines)
        assert t == topic and (paused_broker or logged_out), f"{e.name} for {t}-{p} broker {b}: no cause"

    if replayed is not None:
        _check_replay(replayed, rounds, truth, topic)

    _check_outcomes(read["lines"], read["metrics"], truth, rounds, topic, source)
    # Issue 14, item 5, the control of tests/e2e/test_wrong_lag.py: isrwatch given the brokers'
    # own replica.lag.time.max.ms finds no evidence that it is wrong, whatever the pauses did
    evidence = {
        d: _total(read["metrics"], "isrwatch_lag_time_evidence_total", direction=d) for d in ("shorter", "longer")
    }
    mismatch = re.findall(r"event=lag_time_max_ms_mismatch .*", job_log)
    assert not any(evidence.values()) and not mismatch, f"the right lag time called wrong: {evidence} {mismatch}"


def _total(metrics: dict[Any, float], name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in metrics.items() if n == name and labels.items() <= dict(lab).items())


# A shrink the job counts is stamped with the collector round that showed it: the metadata
# (on 0.9 up to ~10 s after the leader's shrink) or the leader's count (within a round).
SHOWN_WITHIN_S = 20


def _paused_shrinks(truth: Shrinks, rounds: list[dict[str, Any]], topic: str) -> Counter[tuple[str, int, int]]:
    """The leaders' logged shrinks of each paused follower while it was paused (not those of a
    resumed paused leader shrinking the ISR to itself, which may remove a follower paused in
    another round)."""
    return Counter(
        (topic, c.partition, r["broker"])
        for r in rounds
        for c in truth.lines
        if r["paused_at"] <= c.time <= r["resumed_at"]
        and c.partition in r["followed"]
        and r["broker"] in set(c.isr_before) - set(c.isr_after)
    )


def _counted_shrinks(job_log: str) -> list[tuple[str, int, int, str, int]]:
    """(topic, partition, broker_id, outcome, t_ms) of each shrink the job logged counting:
    from metadata, or from a leader's own count (``seen=leader_count``, with the leader)."""
    metadata = r"isr_shrink cluster=\S+ topic=(\S+) partition=(\d+) broker_id=(\d+) outcome=(\w+) lead_s=\S+ t_ms=(\d+)"
    counted = (
        r"isr_shrink cluster=\S+ topic=(\S+) partition=(\d+) broker_id=(\d+) leader_id=\d+ outcome=(\w+) "
        r"lead_s=\S+ t_ms=(\d+) seen=leader_count"
    )
    return [
        (t, int(p), int(b), o, int(ms))
        for pattern in (metadata, counted)
        for t, p, b, o, ms in re.findall(pattern, job_log)
    ]


def _warned_while_paused(
    lines: list[tuple[str, int, int, str, int]], rounds: list[dict[str, Any]]
) -> Counter[tuple[str, int, int]]:
    """The shrinks of each paused follower the job counted warned, seen while it was paused
    or up to SHOWN_WITHIN_S after."""
    return Counter(
        (t, p, b)
        for t, p, b, outcome, t_ms in lines
        for r in rounds
        if outcome == "warned"
        and r["broker"] == b
        and p in r["followed"]
        and r["paused_at"] <= t_ms / 1000 <= r["resumed_at"] + SHOWN_WITHIN_S
    )


def _check_outcomes(
    lines: list[tuple[str, int, int, str, int]],
    job_metrics: dict[Any, float],
    truth: Shrinks,
    rounds: list[dict[str, Any]],
    topic: str,
    source: str,
) -> None:
    """Issue 10, the broker's truth, live. Every shrink the job counted is one a leader logged,
    and each of a paused follower's counted warned, with a lead in the histogram. From metadata
    alone (fetch) the job sees only some, or none: Kafka 0.9's metadata misses a shrink undone
    within seconds (measured: 3 of 6 in one JMX run before the leaders' counts were used; 0 of 6
    in the fetch deployment of a fresh-clone run and in a JMX run, 2026-11-26). With the
    leaders' own IsrShrinksPerSec counts (jmx) it counts them all: warned = the paused
    followers' real shrinks, exactly, replica by replica."""
    for t, p, b, outcome, t_ms in lines:
        logged_out = [c for c in truth.lines if c.partition == p and b in c.isr_before and b not in c.isr_after]
        assert t == topic and logged_out, f"the job counted a shrink of {t}-{p} broker {b} no leader logged"
        paused_then = [r for r in rounds if r["broker"] == b and p in r["followed"]]
        if any(r["paused_at"] <= t_ms / 1000 <= r["resumed_at"] + SHOWN_WITHIN_S for r in paused_then):
            assert outcome == "warned", f"a paused follower's shrink counted {outcome}: {t}-{p} broker {b}"
    warned = _warned_while_paused(lines, rounds)
    if source == "jmx":
        paused = _paused_shrinks(truth, rounds, topic)
        assert paused, "no leader logged a shrink of a paused follower"
        assert warned == paused, f"warned shrinks {dict(warned)} != the paused followers' real shrinks {dict(paused)}"
    all_warned = sum(1 for line in lines if line[3] == "warned")
    assert _total(job_metrics, "isrwatch_isr_shrinks_total", outcome="warned") == all_warned, (job_metrics, lines)
    assert _total(job_metrics, "isrwatch_isr_shrink_lead_seconds_count") == all_warned, job_metrics


def _check_replay(replayed: list[dict[str, Any]], rounds: list[dict[str, Any]], truth: Shrinks, topic: str) -> None:
    """Issue 15: the replay at the brokers' setting drops each paused follower where its leader
    did (0.9's leader checks every lag: its shrink falls in (lcu + lag, lcu + 2 lag]), allowing a
    collector round and a second for the telemetry's view of the follower's last catch-up; with
    5 s less lag it drops it 5 s earlier; and it drops nothing the brokers did not (it also drops,
    as the brokers do, the followers of a paused leader once it answers again: docs/kafka.md)."""
    at, shorter = ([((f["topic"], f["partition"], f["broker_id"]), f["t_ms"]) for f in s["shrink_events"]]
                   for s in replayed)  # fmt: skip
    slack_ms = (COLLECT_INTERVAL_S + 1.0) * 1000
    for r in rounds:
        for row in r["rows"]:
            replica, shrink_ms = (topic, row["partition"], r["broker"]), row["shrink_at"] * 1000
            mine = [t for k, t in at if k == replica and t - slack_ms <= shrink_ms <= t + LAG_MS + slack_ms]
            assert mine, f"no replayed shrink of {replica} before the leader's at {shrink_ms}: {at}"
            earlier = [t for k, t in shorter if k == replica and abs(mine[0] - t - 5_000) <= slack_ms]
            assert earlier, f"with 5 s less lag, {replica} not dropped 5 s before {mine[0]}: {shorter}"
    for (t, p, b), _ in at:
        assert any(c.partition == p and b in c.isr_before and b not in c.isr_after for c in truth.lines), (
            f"the replay dropped {t}-{p} broker {b}, which no leader dropped"
        )
