"""Issue 14, item 6: the soak. An hour (``ISRWATCH_SOAK_S``) of steady load with churn.

Real 3-broker Kafka 0.9, the README's deployment (collector and job as ``isrwatch``
processes, isrwatch's topics placed by Kafka on the watched cluster), produce load on a
steady topic. Every ``ISRWATCH_SOAK_CHURN_S`` (60 s) one churn step, in turn:

* a topic created (3 partitions, 2 replicas) and written to;
* the topic created two steps earlier deleted;
* one of its partitions reassigned to other brokers (a new replica copies and joins the ISR,
  one leaves);
* every third step, one broker restarted (a clean stop and start, each broker in turn).

Every 15 s the test samples the job's driver (the ``isrwatch run`` Python process) and its
Spark JVM (resident memory), the checkpoint directory's size and the replicas the job's
``/metrics`` shows. It asserts, and writes to the result file (``soak.json``) with the figures:

* the job and the collector ran throughout;
* memory flat: the peak resident memory of the driver and of the JVM over the last quarter of
  the run exceeds the second quarter's by less than ``MEMORY_GROWTH_SHARE`` of their median
  (plus a floor, ``MEMORY_FLOOR_MB``, three times it for the JVM, for the sawtooth of a
  garbage-collected heap); the fitted slope of the second half is recorded too;
* the checkpoint bounded: at the end no larger than 1.5 times its size at half time, plus 5 MB;
* the replicas of a deleted topic leave the job's ``/metrics`` within ``GONE_WITHIN_S``: the
  collector says them gone (telemetry version 4) and the job forgets them with that batch;
  of every topic deleted earlier than that before the end, no replica the cluster no longer
  lists has series left or a row in the job's state table (the checkpoint's newest version);
  before version 4 this took the job's ``FORGET_AFTER_MS`` (15 min on the cluster's clock). A
  producer that still knows a deleted topic creates it again (``auto.create.topics.enable``, on
  by default; the soak's own producer does, with the brokers' defaults: one partition, one
  replica): its followers listed again are the cluster's, not judged, and the result names
  those topics (its one replica, the leader, is no follower: judged);
* every replica the collector said gone was of a deleted topic, or moved off its broker by a
  reassignment: a broker restarting, or answering metadata before it knows every topic, makes
  none gone;
* no replica alert without a cause: each names a replica the leaders logged out of the
  ISR, a replica of a partition reassigned in the minute before, or comes within a broker
  restart's window (its stop to lag + 30 s after its start: every partition has a replica
  there, RF 3 or 2 on 3 brokers).

It runs in ``make soak`` only (an hour); ``ISRWATCH_SOAK_S=1200`` gives a shorter one.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from streaming.evaluation.statetable import StateTable
from tests.e2e.kafka_io import ProduceLoad, read_observations
from tests.e2e.pauses import layout
from tests.e2e.pipeline import LAG_MS, ZK_SESSION_MS, Pipeline
from tests.e2e.results import Shrinks, write_result

SOAK_S = float(os.environ.get("ISRWATCH_SOAK_S", "3600"))
CHURN_S = float(os.environ.get("ISRWATCH_SOAK_CHURN_S", "60"))
SAMPLE_S = 15.0
MEMORY_GROWTH_SHARE = 0.10  # of the median, per hour
MEMORY_FLOOR_MB = 30.0
# The collector says a replica gone ~5 s after its topic leaves metadata; the job's next batch
# forgets it. Two minutes leave room for a loaded machine's batches.
GONE_WITHIN_S = 120.0
_GONE = re.compile(r"\bevent=replicas_gone count=\d+ replicas=(\S+)")

pytestmark = [pytest.mark.campaign, pytest.mark.soak, pytest.mark.timeout(int(SOAK_S) + 900)]

_SERIES = re.compile(r"^isrwatch_replica_lag_ratio\{([^}]*)\}", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')

Replica = tuple[str, int, int]  # topic, partition, broker


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _jvm_rss_mb(pid: int) -> float:
    total = 0.0
    for c in _descendants(pid):
        try:
            if "java" in Path(f"/proc/{c}/comm").read_text():
                total += _rss_mb(c)
        except OSError:
            continue
    return total


def _dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6 if path.exists() else 0.0


def _replicas_on_metrics(port: int) -> set[Replica]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return set()
    labels = (dict(_LABEL.findall(m[1])) for m in _SERIES.finditer(text))
    return {(x["topic"], int(x["partition"]), int(x["broker_id"])) for x in labels}


def _slope_per_hour(samples: list[tuple[float, float]]) -> float:
    """Least-squares growth of (time s, value) samples, per hour."""
    n = len(samples)
    if n < 3:
        return 0.0
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    den = sum((t - mt) ** 2 for t, _ in samples)
    return 0.0 if den == 0 else 3600 * sum((t - mt) * (v - mv) for t, v in samples) / den


def _median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if s else 0.0


def test_an_hour_of_churn_leaves_memory_flat_and_raises_nothing_without_cause(kafka_cluster_factory, tmp_path):
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    steady = "orders"
    cluster.create_topic(steady, partitions=3, replication_factor=3)
    started = time.time()
    samples: list[dict[str, float]] = []
    created: list[tuple[str, float]] = []
    deleted: dict[str, float] = {}
    reassigned: list[tuple[str, int, list[int], float]] = []
    restarts: list[tuple[int, float, float]] = []
    producer = Producer(cluster.client_config())
    with ProduceLoad(cluster, steady, 3, rate=200), Pipeline(cluster, tmp_path) as pipe:
        pipe.wait_watching(6)
        assert pipe.job is not None and pipe.collector is not None
        job_pid = pipe.job.proc.pid
        t0 = time.monotonic()
        next_churn = t0 + CHURN_S
        step = 0
        while time.monotonic() - t0 < SOAK_S:
            pipe.check_alive("the soak")
            assert pipe.collector.running(), pipe.collector.tail()
            samples.append(
                {
                    "t": time.monotonic() - t0,
                    "driver_mb": _rss_mb(job_pid),
                    "jvm_mb": _jvm_rss_mb(job_pid),
                    "checkpoint_mb": _dir_mb(pipe.checkpoint_dir),
                    "topics_on_metrics": len({t for t, _, _ in _replicas_on_metrics(pipe.metrics_port)}),
                }
            )
            if time.monotonic() >= next_churn:
                step += 1
                name = f"churn-{step}"
                cluster.create_topic(name, partitions=3, replication_factor=2)
                for i in range(300):
                    producer.produce(name, value=b"x" * 100, partition=i % 3)
                producer.flush(30)
                created.append((name, time.time()))
                if len(created) >= 3:
                    old, _ = created[-3]
                    cluster.delete_topic(old)
                    deleted[old] = time.time()
                if len(created) >= 2:
                    moved, _ = created[-2]
                    now_on = list(layout(cluster, moved)[0][1])
                    target = [b for b in cluster.broker_ids if b not in now_on][:1] + now_on[:1]
                    reassigned.append((moved, 0, target, time.time()))
                    cluster.reassign(moved, 0, target)
                if step % 3 == 0:
                    broker = cluster.broker_ids[(step // 3) % len(cluster.broker_ids)]
                    stopped_at = time.time()
                    cluster.restart(broker)
                    restarts.append((broker, stopped_at, time.time()))
                next_churn = time.monotonic() + CHURN_S
                # progress for whoever runs the hour (make soak prints the test's output)
                last = samples[-1]
                print(
                    f"soak: {last['t']:.0f}/{SOAK_S:.0f} s, churn step {step}, driver {last['driver_mb']:.0f} MB,"
                    f" JVM {last['jvm_mb']:.0f} MB, checkpoint {last['checkpoint_mb']:.1f} MB,"
                    f" topics on /metrics {last['topics_on_metrics']:.0f}",
                    flush=True,
                )
            time.sleep(SAMPLE_S)
        soaked_s = time.monotonic() - t0  # the loop's length: SOAK_S or a little more
        end = time.time()
        final_replicas = _replicas_on_metrics(pipe.metrics_port)
        events = pipe.alerts()
        said_gone = [tuple(r.split("/")) for m in _GONE.finditer(pipe.collector.log()) for r in m[1].split(",")]

    half = [s for s in samples if s["t"] >= samples[-1]["t"] / 2]
    span = samples[-1]["t"]
    second_quarter = [s for s in samples if span / 4 <= s["t"] < span / 2]
    last_quarter = [s for s in samples if s["t"] >= 3 * span / 4]
    figures = {}
    for what, share_floor in (("driver_mb", MEMORY_FLOOR_MB), ("jvm_mb", 3 * MEMORY_FLOOR_MB)):
        series = [(s["t"], s[what]) for s in half]
        median = _median([v for _, v in series])
        figures[what] = {
            "median": round(median, 1),
            "first": round(samples[0][what], 1),
            "last": round(samples[-1][what], 1),
            # Judged: the peak of the last quarter against the second quarter's. A JVM's resident
            # memory saws with its collector and its heap fills towards its maximum long after
            # start (the first complete soak: 720 MB to ~1,520 MB in 11 minutes, then 1,430-1,600 MB
            # for 49 minutes); a line fitted to half an hour of that sawtooth read 440 MB/h.
            "growth_last_quarter_mb": round(
                max(x[what] for x in last_quarter) - max(x[what] for x in second_quarter), 1
            ),
            "allowed_mb": round(MEMORY_GROWTH_SHARE * median + share_floor, 1),
            "slope_per_hour_second_half": round(_slope_per_hour(series), 1),  # for the record
        }
    ckpt_half, ckpt_end = half[0]["checkpoint_mb"], samples[-1]["checkpoint_mb"]
    due = {t for t, at in deleted.items() if end - at > GONE_WITHIN_S}
    moved_off = {(t, p, b) for t, p, target, _ in reassigned for b in cluster.broker_ids if b not in target}
    gone_unexplained = sorted(
        (t, int(p), int(b)) for t, p, b in said_gone if t not in deleted and (t, int(p), int(b)) not in moved_off
    )
    # A deleted topic's follower the cluster lists again at the end is not judged: a producer that
    # still knew the topic created it again (auto.create.topics.enable, the brokers' default on
    # 0.9: the soak's own producer does), and the replica is the cluster's again. Created again
    # with the brokers' defaults, one replica: its leader, a follower before perhaps, is none now.
    listed_replicas, listed = _listed(cluster)
    recreated = sorted(due & {t for t, _, _ in listed_replicas})
    still_shown = sorted({r for r in final_replicas if r[0] in due and r not in listed})
    in_state = _replicas_in_state_table(pipe.checkpoint_dir)
    still_in_state = sorted({r for r in in_state if r[0] in due and r not in listed})
    unexplained, explained = _judge(cluster, events, started, reassigned, restarts)
    # the evidence behind each unexplained alert, read while the cluster still runs
    evidence = (
        _telemetry_of(
            cluster,
            pipe.telemetry_topic,
            {(u[3], u[4], u[5]) for u in unexplained},
            [started + (u[6] if u[6] is not None else u[0]) for u in unexplained],
        )
        if unexplained
        else []
    )
    growing = sorted(what for what, f in figures.items() if f["growth_last_quarter_mb"] > f["allowed_mb"])
    write_result(
        "soak",
        {
            "soak_s": round(soaked_s),  # the reliability table's figures (tools/reliability_table.py)
            "growing": growing,
            "checkpoint_grows": ckpt_end > 1.5 * ckpt_half + 5,
            "scenario": f"{SOAK_S:.0f} s of produce load with churn every {CHURN_S:.0f} s",
            "lag_time_max_ms": LAG_MS,
            "churn_steps": step,
            "topics_created": len(created),
            "topics_deleted": len(deleted),
            "deleted_due_to_be_forgotten": sorted(due),
            "deleted_still_on_metrics": still_shown,
            "deleted_still_in_state_table": still_in_state,
            "replicas_said_gone": len(said_gone),
            "gone_without_deletion_or_move": gone_unexplained,
            "topics_in_state_table": len({t for t, _, _ in in_state}),
            "deleted_listed_again_at_the_end": recreated,
            "reassignments": len(reassigned),
            "broker_restarts": [[b, round(a - started, 1), round(z - started, 1)] for b, a, z in restarts],
            "memory": figures,
            "checkpoint_mb_half_and_end": [round(ckpt_half, 2), round(ckpt_end, 2)],
            "replica_alerts_explained": explained,
            "replica_alerts_unexplained": unexplained,  # [arrived s, name, status, topic, partition, broker, starts s]
            "unexplained_telemetry": evidence,  # [t_ms, topic, partition, broker, leader, leo, leader_leo, prev_t_ms, prev_leo, isr]
            # how long an alert of a deleted topic's replica stayed firing after the deletion
            "resolved_after_topic_deleted_s": _resolved_after_deletion(events, deleted),
            "samples": samples,
        },
    )

    for what, f in figures.items():
        assert f["growth_last_quarter_mb"] <= f["allowed_mb"], f"{what} grows: {f}"
    assert ckpt_end <= 1.5 * ckpt_half + 5, f"the checkpoint grows: {ckpt_half:.1f} MB -> {ckpt_end:.1f} MB"
    assert not still_shown, f"deleted topics' replicas still on /metrics after {GONE_WITHIN_S:.0f} s: {still_shown}"
    assert not gone_unexplained, f"replicas said gone that were neither deleted nor moved: {gone_unexplained}"
    assert not still_in_state, f"deleted topics' replicas still in the job's state table: {still_in_state}"
    assert not unexplained, f"replica alerts without a cause: {unexplained[:10]}"


def _replicas_in_state_table(checkpoint_dir) -> set[Replica]:
    """The replicas in the job's newest full state version (its checkpoint's table; the deltas
    after it, at most ``statetable.FULL_EVERY`` batches' worth, are not read: no Spark here)."""
    table = StateTable(None, str(checkpoint_dir))  # listing and paths only: no Spark needed
    versions = table.versions()
    if not versions:
        return set()
    rows = pq.read_table(table.path(versions[-1]), columns=["topic", "partition", "broker_id"]).to_pylist()
    return {(r["topic"], r["partition"], r["broker_id"]) for r in rows}


def _listed(cluster) -> tuple[set[Replica], set[Replica]]:
    """Every replica of every partition the cluster's metadata lists, and of those every one
    but the partition's leader (all of them while it has no leader)."""
    from confluent_kafka.admin import AdminClient

    md = AdminClient(cluster.client_config()).list_topics(timeout=30)
    parts = [(t, p) for t, tm in md.topics.items() for p in tm.partitions.values()]
    replicas = {(t, p.id, b) for t, p in parts for b in p.replicas}
    return replicas, {(t, p.id, b) for t, p in parts for b in p.replicas if b != p.leader}


def _judge(cluster, events, started, reassigned, restarts) -> tuple[list[list], dict[str, int]]:
    """Each replica alert's cause, or the alert among the unexplained. A firing alert is judged
    by its ``startsAt`` (when its condition began, on the telemetry's clock: a report that comes
    late still has the cause it had), a resolution by the firing it ends."""
    shrinks: dict[str, Shrinks] = {}
    explained = {"logged_shrink": 0, "reassignment": 0, "broker_restart": 0, "resolution_of_explained": 0}
    unexplained = []
    causes: dict[tuple, bool] = {}
    for e in events:
        topic, partition, broker = e.replica
        if broker < 0:
            continue  # not a replica's alert (IsrwatchTelemetryStale and the like)
        if e.status != "firing":
            if causes.get(e.identity, False):
                explained["resolution_of_explained"] += 1
            else:
                unexplained.append([round(e.arrived - started, 1), e.name, e.status, *e.replica, None])
            continue
        if topic not in shrinks:
            shrinks[topic] = Shrinks.read(cluster, topic, started)
        at = e.starts_at
        cause = None
        if shrinks[topic].first(partition, broker) is not None:
            cause = "logged_shrink"
        elif any(
            t == topic and p == partition and -5 <= at - r_at < 60 + LAG_MS / 1000 for t, p, _, r_at in reassigned
        ):
            cause = "reassignment"
        elif any(a - 5 <= at <= z + LAG_MS / 1000 + 30 for _, a, z in restarts):
            cause = "broker_restart"
        causes[e.identity] = cause is not None
        if cause is None:
            unexplained.append([round(e.arrived - started, 1), e.name, e.status, *e.replica, round(at - started, 1)])
        else:
            explained[cause] += 1
    return unexplained, explained


def _resolved_after_deletion(events, deleted: dict[str, float]) -> list[float]:
    """Seconds from a topic's deletion to the resolution of each of its replicas' alerts that
    was still firing then (the job resolves it when it forgets the replica: when the collector
    says it gone, or ``FORGET_AFTER_MS`` after its last telemetry, on the cluster's clock)."""
    out = []
    for e in events:
        topic = e.replica[0]
        if e.status == "resolved" and topic in deleted and e.arrived > deleted[topic]:
            out.append(round(e.arrived - deleted[topic], 1))
    return sorted(out)


def _telemetry_of(cluster, telemetry_topic: str, replicas: set[tuple[str, int, int]], around: list[float]) -> list:
    """The observations of ``replicas`` within a minute before and 30 s after any of the times
    ``around`` (epoch s): the evidence an unexplained alert was raised on."""
    return sorted(
        [
            o.t_ms,
            o.topic,
            o.partition,
            o.broker_id,
            o.leader_id,
            o.leo,
            o.leader_leo,
            o.prev_t_ms,
            o.prev_leo,
            list(o.isr),
        ]
        for o in read_observations(cluster, telemetry_topic)
        if (o.topic, o.partition, o.broker_id) in replicas and any(t - 60 <= o.t_ms / 1000 <= t + 30 for t in around)
    )
