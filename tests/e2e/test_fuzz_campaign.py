"""Issue 14, item 1: fuzzed telemetry at volume on the real telemetry topic.

Real parts: a 3-broker Kafka 0.9 cluster, ``isrwatch collect`` and ``isrwatch run`` as
processes (``tests.e2e.pipeline``), isrwatch's topics placed by Kafka, produce load on a
watched topic. While the job runs, at least 10,000 malformed records (``ISRWATCH_FUZZ_RECORDS``)
are produced in bursts next to the collector's telemetry, seeded (``ISRWATCH_FUZZ_SEED``,
printed; the same seed gives the same records, their timestamps relative to the start):
random bytes, text, truncated and byte-mutated telemetry (records shaped like the
collector's, claiming to come from cluster ``fuzz``), wrong types, unknown versions,
NaN/huge/negative numbers, timestamps years ahead and behind, offsets going backwards, empty
and null values, keys and headers of any shape, duplicated records, a few oversized ones.

The reference for what must be dead-lettered is the job's own parser (``streaming.evaluation.parse``)
run afterwards over the same records in a local Spark: every dead letter it gives is on the
dead-letter topic (same position, same reason, the payload's bytes back) and nothing else is.

Goals, asserted: the job never exits and keeps completing batches; every rejected record
dead-lettered with a reason; no replica alert for the watched cluster ``e2e`` (healthy all
along). A campaign (``make reliability``), a few minutes.
"""

from __future__ import annotations

import functools
import json
import os
import random
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer

from isrwatch.alerts import AlertName
from streaming.evaluation.parse import RECORD_REASONS
from streaming.lifecycle.origin import QUERY_DIR
from streaming.sources.source_spool import RAW_SCHEMA
from tests.e2e.fuzz import Fuzz, Record, telemetry_bases
from tests.e2e.kafka_io import ProduceLoad, produce_waiting, read_records
from tests.e2e.pipeline import CLUSTER, TOPIC_PARTITIONS, Pipeline, until
from tests.e2e.results import write_result
from tests.e2e.test_poison_records import check_letter

# A campaign: 10,000 fuzzed records on real Kafka, minutes (make reliability).
pytestmark = [pytest.mark.campaign, pytest.mark.reliability]

SEED_ENV, RECORDS_ENV = "ISRWATCH_FUZZ_SEED", "ISRWATCH_FUZZ_RECORDS"
BURST = 2_000
PAUSE_S = 8.0  # between bursts
MAX_BATCH_GAP_S = 120.0
RAW = RAW_SCHEMA  # the source's columns, as the job's own sources give them


def headers_supported(cluster: Any, topic: str) -> str | None:
    """None when a record with headers can be produced here, else the client's error (Kafka 0.9
    has no headers: they came with the 0.11 message format)."""
    errors: list[Any] = []
    producer = Producer(cluster.client_config(acks="all"))
    producer.produce(topic, value=b"header probe", headers=[("h", b"v")], on_delivery=lambda e, m: errors.append(e))
    producer.flush(30)
    return None if errors and errors[0] is None else str(errors[0] if errors else "no delivery report")


class Bursts:
    """Produces the fuzz records in bursts; (partition, offset) -> (kind, record, produced at)."""

    def __init__(self, cluster: Any, topic: str) -> None:
        self.producer = Producer(cluster.client_config(**{"acks": "1", "linger.ms": "20"}))
        self.topic = topic
        self.where: dict[tuple[int, int], tuple[str, Record, float]] = {}
        self.failed: Counter = Counter()

    def burst(self, records: list[tuple[str, Record]]) -> None:
        for i, (kind, (key, value, headers)) in enumerate(records):

            def delivered(err: Any, msg: Any, kind: str = kind, rec: Record = (key, value, headers)) -> None:
                if err is None:
                    self.where[(msg.partition(), msg.offset())] = (kind, rec, time.time())
                else:
                    self.failed[(kind, str(err))] += 1

            produce_waiting(self.producer, self.topic, value=value, key=key, headers=headers,
                            partition=i % TOPIC_PARTITIONS, on_delivery=delivered)  # fmt: skip
            self.producer.poll(0)
        assert self.producer.flush(120) == 0


def committed_ends(pipe: Pipeline) -> dict[int, int]:
    """partition -> the telemetry topic's end offset of the job's last committed batch."""
    query = pipe.checkpoint_dir / QUERY_DIR
    commits = [int(n) for n in os.listdir(query / "commits") if n.isdigit()] if (query / "commits").is_dir() else []
    if not commits:
        return {}
    ends = json.loads((query / "offsets" / str(max(commits))).read_text().splitlines()[-1])
    return {int(p): int(o) for p, o in ends.get(pipe.telemetry_topic, {}).items()}


def reference_letters(spark: Any, topic: str, where: dict, now_ms: int) -> Counter:
    """(partition, offset, reason) of every dead letter the job's parser gives these records."""
    from streaming.evaluation.parse import parse_records, side_items
    from streaming.lifecycle.job import FUTURE_TOLERANCE_MS

    rows = [(rec[0], rec[1], topic, p, o, None) for (p, o), (_, rec, _) in where.items()]
    side = side_items(parse_records(spark.createDataFrame(rows, RAW)), FUTURE_TOLERANCE_MS, now_ms)
    got = side.where("kind = 'deadletter'").select("source_partition", "source_offset", "reason").collect()
    return Counter((r[0], r[1], r[2]) for r in got)


def test_fuzzed_telemetry_at_volume_never_stops_the_job(kafka_cluster_factory, spark_reader, tmp_path) -> None:
    seed = int(os.environ.get(SEED_ENV) or 14)
    count = int(os.environ.get(RECORDS_ENV) or 10_000)
    print(f"\nfuzz campaign: {SEED_ENV}={seed} {RECORDS_ENV}={count}")
    cluster = kafka_cluster_factory()
    watched = "fuzz-watched"
    cluster.create_topic(watched, partitions=2, replication_factor=3)
    stale = ["--stale-after-seconds", "60"]  # the job's own slowness on 2 cores is not what is measured here
    started = time.time()
    with ProduceLoad(cluster, watched, 2, rate=100) as load, Pipeline(cluster, tmp_path, job_args=stale) as pipe:
        pipe.wait_watching(4)
        headers_error = headers_supported(cluster, watched)
        now_ms = int(time.time() * 1000)
        rng = random.Random(seed)
        fuzz = Fuzz(rng, telemetry_bases(rng, watched, now_ms), now_ms)
        records = fuzz.records(count, headers_error is None)
        bursts = Bursts(cluster, pipe.telemetry_topic)
        samples: list[tuple[float, int]] = [(time.monotonic(), len(pipe.batches()))]

        def sample() -> int:
            """The job's batches so far, noting when the count last moved."""
            n = len(pipe.batches())
            if n != samples[-1][1]:
                samples.append((time.monotonic(), n))
            return n

        def waited(end: float) -> bool:
            sample()
            return time.monotonic() > end

        fuzz_from = time.time()
        for at in range(0, len(records), BURST):
            bursts.burst(records[at : at + BURST])
            until("the pause between bursts", functools.partial(waited, time.monotonic() + PAUSE_S), 60, pipe)
        fuzz_s = time.time() - fuzz_from
        ends: dict[int, int] = {}
        for p, o in bursts.where:
            ends[p] = max(ends.get(p, 0), o + 1)

        def caught_up() -> bool:
            sample()
            done = committed_ends(pipe)
            return all(done.get(p, 0) >= o for p, o in ends.items())

        until("the job to commit every fuzzed record", caught_up, 600, pipe)
        seen = len(pipe.batches())
        until("three more batches", lambda: sample() > seen + 3, 120, pipe)
        sample()
        last_gap = time.monotonic() - samples[-1][0]  # since the last batch seen
        letters = [json.loads(v) for *_, v in read_records(cluster, pipe.deadletter_topic) if v is not None]
        job_alive = pipe.job is not None and pipe.job.running()
        alerts = pipe.alerts()
        job_log = pipe.job_log()
        batches = pipe.batches()
        sent = load.sent
    shrinks = [c for c in cluster.isr_shrinks(started) if c.topic == watched]

    want = reference_letters(spark_reader(), pipe.telemetry_topic, bursts.where, int(fuzz_from * 1000))
    got: Counter = Counter()
    stray = 0  # dead letters of records the test did not produce (the collector's)
    for d in letters:
        pos = (d["source_partition"], d["source_offset"])
        if pos not in bursts.where:
            stray += 1
            continue
        got[(*pos, d["reason"])] += 1
        if d["reason"] in RECORD_REASONS:
            check_letter(d, bursts.where[pos][1][1])
    missing = want - got  # rejected by the parser, not on the dead-letter topic
    extra = got - want  # on the dead-letter topic more often than the parser rejects them
    produced = Counter(kind for kind, _, _ in bursts.where.values())
    whole = {(p, o) for p, o, r in want if r in RECORD_REASONS}
    partly = {(p, o) for p, o, r in want if r not in RECORD_REASONS} - whole
    outcome: dict[str, Counter] = {}
    for pos, (kind, _, _) in bursts.where.items():
        c = outcome.setdefault(kind, Counter())
        c["rejected" if pos in whole else "part rejected" if pos in partly else "accepted"] += 1
    by_reason = Counter(r for (_, _, r), n in got.items() for _ in range(n))
    empty_reason = sum(1 for d in letters if not d.get("reason"))
    replica_alerts = [e for e in alerts if e.name != AlertName.TELEMETRY_STALE.value]
    watched_alerts = [e for e in replica_alerts if e.labels.get("cluster") == CLUSTER]
    gaps = [b[0] - a[0] for a, b in zip(samples, samples[1:], strict=False)] + [last_gap]
    figures: dict[str, Any] = {
        "seed": seed,
        "records_requested": count,
        "records_produced": sum(produced.values()),
        "produced_by_kind": dict(sorted(produced.items())),
        "outcome_by_kind": {k: dict(v) for k, v in sorted(outcome.items())},
        "produce_failures": {f"{k}: {e}": n for (k, e), n in bursts.failed.items()},
        # Kafka 0.9's message format has no headers: the client delivers the records without them
        "headers": f"refused: {headers_error}" if headers_error else "delivered (Kafka 0.9's format drops them)",
        "fuzz_seconds": round(fuzz_s, 1),
        "job_starts": pipe.job_runs,
        "job_alive_at_end": job_alive,
        "job_crashes_or_restarts": pipe.job_runs - 1 + (not job_alive),
        "batches": len(batches),
        "longest_batch_gap_s": round(max(gaps, default=0.0), 1),
        "tracebacks_in_job_log": job_log.count("Traceback"),
        "deadletters_expected": sum(want.values()),
        "deadletters_on_topic": sum(got.values()),
        "deadletters_by_reason": dict(sorted(by_reason.items())),
        "deadletters_missing": sum(missing.values()),
        "deadletters_unexpected": sum(extra.values()),
        "deadletters_empty_reason": empty_reason,
        "collector_records_deadlettered": stray,
        "replica_alerts_watched_cluster": len(watched_alerts),
        "alerts_by_name_and_cluster": dict(Counter(f"{e.name} {e.labels.get('cluster')} {e.status}" for e in alerts)),
        "shrinks": len(shrinks),
        "load_messages": sent,
    }
    write_result("fuzz_campaign", figures)
    print_table(figures)

    assert figures["records_produced"] >= count, figures["produce_failures"]
    assert figures["job_crashes_or_restarts"] == 0, "the job exited"
    # measured: 5.3 s at most on 2 cores; a job stuck on a record would stop batching
    assert figures["longest_batch_gap_s"] < MAX_BATCH_GAP_S, figures["longest_batch_gap_s"]
    assert batches and batches[-1][1] > 0, "the collector's telemetry is still read"
    assert not missing, f"rejected, not dead-lettered: {sorted(missing.items())[:20]}"
    assert not extra, f"dead-lettered beyond the parser's reasons: {sorted(extra.items())[:20]}"
    assert empty_reason == 0 and stray == 0
    assert not watched_alerts, f"replica alerts for the healthy cluster: {[e.body for e in watched_alerts]}"
    assert not shrinks, shrinks


def print_table(f: dict[str, Any]) -> None:
    print(f"\nfuzz campaign, seed {f['seed']}: {f['records_produced']} records in {f['fuzz_seconds']} s")
    print(f"{'kind':<20}{'produced':>10}{'rejected':>10}{'part rej.':>10}{'accepted':>10}")
    for kind, n in f["produced_by_kind"].items():
        o = f["outcome_by_kind"][kind]
        print(f"{kind:<20}{n:>10}{o.get('rejected', 0):>10}{o.get('part rejected', 0):>10}{o.get('accepted', 0):>10}")
    rows = [
        ("job crashes or restarts (goal 0)", f["job_crashes_or_restarts"]),
        ("batches completed", f["batches"]),
        ("longest wait for a batch (s)", f["longest_batch_gap_s"]),
        ("dead letters expected (the job's parser)", f["deadletters_expected"]),
        ("dead letters on the topic", f["deadletters_on_topic"]),
        ("rejected, not dead-lettered (goal 0)", f["deadletters_missing"]),
        ("dead-lettered beyond the parser (goal 0)", f["deadletters_unexpected"]),
        ("dead letters without a reason (goal 0)", f["deadletters_empty_reason"]),
        ("collector records dead-lettered (goal 0)", f["collector_records_deadlettered"]),
        ("replica alerts, watched cluster (goal 0)", f["replica_alerts_watched_cluster"]),
        ("leaders' ISR shrinks", f["shrinks"]),
        ("headers", f["headers"]),
    ]
    for name, value in rows:
        print(f"{name:<44}{value}")
    for reason, n in f["deadletters_by_reason"].items():
        print(f"  dead letters {reason:<30}{n}")
    for what, n in f["alerts_by_name_and_cluster"].items():
        print(f"  alert {what:<37}{n}")
    for what, n in f["produce_failures"].items():
        print(f"  not produced {what}: {n}")
