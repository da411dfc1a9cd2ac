"""What a denser telemetry layout would save: bytes per observation and Spark's parse.

Issue 11, item 3 asks for fewer, denser telemetry records, and for the choice to be
measured. This compares, on the same observations (``bench.load.Fleet``, version 1), the
version-1 layout against two candidate layouts a new version could take, each parsed by a
plain ``from_json`` and explode. The second, ``columnar``, became version 3, which the job
and the collector now use: ``bench.stages --versions 1,3`` times the job's own parse of it.

* ``v1``: today's record, one JSON object per observation, every field named in each;
* ``nested``: one object per partition (topic, partition, leader, high watermark, ISR,
  replicas, settings once) holding one object per follower (its broker, times, offsets);
* ``columnar``: one array per field: the partitions' fields as arrays (the topic as an
  index into a list of names), the followers' fields as arrays with the index of their
  partition: telemetry version 3 (``isrwatch.telemetry.observation_fields``).

For each layout: the bytes per observation, and Spark's ``from_json`` + explode to the
same flat observation columns (checked equal across layouts), from records held in
memory, written to the no-op sink: the median of ``--repeat`` runs after one warm-up.
With ``--kafka`` (a local Kafka cluster, started and stopped here), also the job's own
source reading each layout's records from a real topic, nothing else
(``bench.stages``' ``source_obs_per_s``): it moves the records' bytes from a Python
worker into the JVM.

``python -m bench.layouts --replicas 20000 --rounds 5``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from typing import Any

from bench import baselines
from bench.load import Fleet, as_version
from bench.machine import print_header
from bench.stages import noop_s, source_alone
from bench.throughput import START_MS
from isrwatch.telemetry import FOLLOWER_FIELDS, PARTITION_FIELDS

__all__ = ["LAYOUTS", "nested", "columnar", "measure", "main"]

LAYOUTS = ("v1", "nested", "columnar")
# An observation's fields: those of its partition (once per partition in the dense layouts)
# and those of the follower at one time.
COLUMNS = (
    "topic",
    "partition",
    "broker_id",
    "leader_id",
    "t_ms",
    "leo",
    "leader_leo",
    "hw",
    "prev_t_ms",
    "prev_leo",
    "prev_leader_leo",
    "isr",
    "replicas",
    "lag_time_max_ms",
    "min_isr",
)
_HEAD = "version int, cluster string, source string, sent_ms bigint"
_OBSERVATION = (
    "topic string, partition int, broker_id int, leader_id int, t_ms bigint, leo bigint, leader_leo bigint, "
    "hw bigint, prev_t_ms bigint, prev_leo bigint, prev_leader_leo bigint, isr array<int>, replicas array<int>, "
    "lag_time_max_ms bigint, min_isr int"
)
_PARTITION = (
    "topic string, partition int, leader_id int, hw bigint, isr array<int>, replicas array<int>, "
    "lag_time_max_ms bigint, min_isr int"
)
_FOLLOWER = "broker_id int, t_ms bigint, leo bigint, leader_leo bigint, prev_t_ms bigint, prev_leo bigint, prev_leader_leo bigint"
SCHEMAS = {
    "v1": f"{_HEAD}, observations array<struct<{_OBSERVATION}>>",
    "nested": f"{_HEAD}, partitions array<struct<{_PARTITION}, followers array<struct<{_FOLLOWER}>>>>",
    "columnar": (
        f"{_HEAD}, topics array<string>, "
        "partitions struct<topic array<int>, partition array<int>, leader_id array<int>, hw array<bigint>, "
        "isr array<array<int>>, replicas array<array<int>>, lag_time_max_ms array<bigint>, min_isr array<int>>, "
        "followers struct<p array<int>, broker_id array<int>, t_ms array<bigint>, leo array<bigint>, "
        "leader_leo array<bigint>, prev_t_ms array<bigint>, prev_leo array<bigint>, prev_leader_leo array<bigint>>"
    ),
}


def _dump(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def nested(record: bytes) -> bytes:
    """A version-1 record in the ``nested`` layout (same observations)."""
    doc = json.loads(record)
    parts: dict[tuple[str, int], dict[str, Any]] = {}
    for o in doc.pop("observations"):
        p = parts.setdefault((o["topic"], o["partition"]), {**{f: o[f] for f in PARTITION_FIELDS}, "followers": []})
        p["followers"].append({f: o[f] for f in FOLLOWER_FIELDS})
    return _dump({**doc, "partitions": list(parts.values())})


def columnar(record: bytes) -> bytes:
    """A version-1 record in the ``columnar`` layout, telemetry version 3 (same observations)."""
    return as_version(record, 3)


def flat(layout: str, raw: Any) -> Any:
    """``raw`` (a ``value`` column of records in ``layout``) -> one row per observation, ``COLUMNS``."""
    import pyspark.sql.functions as F

    rec = raw.select(F.from_json(F.col("value").cast("string"), SCHEMAS[layout]).alias("r"))
    if layout == "v1":
        o = F.col("o")
        return rec.select(F.explode("r.observations").alias("o")).select(*[o[c].alias(c) for c in COLUMNS])
    if layout == "nested":
        p, f = F.col("p"), F.col("f")
        rows = rec.select(F.explode("r.partitions").alias("p")).select("p", F.explode("p.followers").alias("f"))
        return rows.select(*[(f[c] if c in FOLLOWER_FIELDS else p[c]).alias(c) for c in COLUMNS])
    r = F.col("r")
    rows = rec.select("r", F.posexplode(r["followers"]["p"]).alias("i", "p"))

    def value(c: str) -> Any:
        if c in FOLLOWER_FIELDS:
            return F.element_at(r["followers"][c], F.col("i") + 1)
        v = F.element_at(r["partitions"][c], F.col("p") + 1)
        return F.element_at(r["topics"], v + 1) if c == "topic" else v

    return rows.select(*[value(c).alias(c) for c in COLUMNS])


def measure(
    spark: Any, replicas: int, rounds: int, repeat: int = 5, kafka: Any | None = None
) -> dict[str, dict[str, float]]:
    fleet = Fleet(replicas)
    v1: list[bytes] = []
    for r in range(rounds):
        v1 += fleet.round(r, START_MS + r * fleet.interval_ms)
    records = {"v1": v1, "nested": [nested(x) for x in v1], "columnar": [columnar(x) for x in v1]}
    n = replicas * rounds
    base = tempfile.mkdtemp(prefix="bench-layouts-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    held = []
    try:
        frames = {}
        for layout, recs in records.items():
            frames[layout] = baselines.raw_frame(spark, baselines.raw_parquet(recs, os.path.join(base, layout)))
            frames[layout] = frames[layout].select("value").repartition(2).cache()
            frames[layout].count()
            held.append(frames[layout])
        want = sorted(flat("v1", frames["v1"]).collect())
        if len(want) != n:
            raise AssertionError(f"v1 gave {len(want)} observations, not {n}")
        for layout in LAYOUTS[1:]:
            if sorted(flat(layout, frames[layout]).collect()) != want:
                raise AssertionError(f"the {layout} layout does not give the same observations as v1")
        out = {}
        for layout in LAYOUTS:
            df = flat(layout, frames[layout])
            df.write.format("noop").mode("overwrite").save()  # a warm-up, not timed
            secs = noop_s(df, repeat)
            size = sum(len(x) for x in records[layout])
            out[layout] = {"bytes_per_obs": size / n, "parse_s": secs, "obs_per_s": n / secs}
        if kafka is not None:
            for layout in LAYOUTS:
                read = source_alone(spark, kafka, records[layout], fleet.per_record)
                out[layout]["source_obs_per_s"] = read.get("source_obs_per_s", 0.0)
        return out
    finally:
        for df in held:
            df.unpersist()
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    ap = argparse.ArgumentParser(prog="python -m bench.layouts", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5, help="polling rounds (observations = replicas x rounds)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per layout, after a warm-up (median printed)")
    ap.add_argument("--kafka", action="store_true", help="also time the job's source on a local Kafka cluster")
    args = ap.parse_args(argv)
    print_header("isrwatch telemetry layouts: bytes and parse")
    from bench import kafka as bkafka
    from streaming.lifecycle.session import build_session

    spark = build_session("local[2]", 2, app_name="isrwatch-bench-layouts")
    kafka = bkafka.start_cluster() if args.kafka else None
    try:
        out = measure(spark, args.replicas, args.rounds, args.repeat, kafka)
    finally:
        if kafka is not None:
            kafka.close()
        spark.stop()
    print(f"observations={args.replicas * args.rounds:,} (the same in every layout; rows checked equal)")
    for layout, m in out.items():
        print(
            f"layout={layout} bytes_per_obs={m['bytes_per_obs']:.1f} parse_s={m['parse_s']:.3f} "
            f"obs_per_s={m['obs_per_s']:,.0f} bytes_ratio={out['v1']['bytes_per_obs'] / m['bytes_per_obs']:.2f} "
            f"parse_ratio={out['v1']['parse_s'] / m['parse_s']:.2f}"
            + (f" source_obs_per_s={m['source_obs_per_s']:,.0f}" if "source_obs_per_s" in m else "")
        )
    return out


if __name__ == "__main__":
    main()
