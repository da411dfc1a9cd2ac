"""Telemetry records to observations, in the JVM: parse, validate, explode.

``parse_records`` turns raw source rows (the Kafka source's columns) into one
row per record with the parsed body and, when the whole record is bad, its
dead-letter reason. ``observations`` explodes the good records into one row
per observation, each with its own reason (null when good);
``side_items`` picks out the rare rows (dead letters, ISR changes). All of it is Spark SQL: no
Python runs per record or per observation.

Dead letters share one shape (``DeadLetter``, its keys ``DEADLETTER_COLUMNS``): the reason (a short
code, the ``reason`` label of the dead-letter counter), a detail text, the
cluster when known, the source position and the rejected payload (the whole
record, or the one observation as JSON) with its encoding: the text when the
bytes are valid UTF-8 (``utf8``), else their base64 (``base64``); null payload
and encoding for a record with no value. Every byte sequence is a record: bytes
that are not UTF-8 never reach the JSON parser nor the driver as text.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict, cast

import pyspark.sql.functions as F
from pyspark.sql import Column, DataFrame

from isrwatch.telemetry import (
    COLUMNS_FROM,
    FOLLOWER_FIELDS,
    MAX_CLUSTER_CHARS,
    MAX_TOPIC_CHARS,
    OPTIONAL_PARTITION_FIELDS,
    PARTITION_FIELDS,
    SPARK_SCHEMA_DDL,
    SUPPORTED_VERSIONS,
    Observation,
)
from streaming.evaluation import projection

if TYPE_CHECKING:
    from collections.abc import Collection

__all__ = [
    "REASONS",
    "RECORD_REASONS",
    "DEADLETTER_COLUMNS",
    "DeadLetter",
    "UTF8",
    "BASE64",
    "CHANGE_TYPE",
    "parse_records",
    "observations",
    "good_observations",
    "side_items",
    "SIDE_COLUMNS",
    "bad_records_kept",
    "PAYLOAD_KEPT_BYTES",
    "DEADLETTER_BATCH_BYTES",
    "deadletter_of",
    "payload_kept_bytes",
]

# reason code -> what it means (docs/streaming.md lists the same).
REASONS = {
    "empty_value": "the record has no value (null or zero bytes)",
    "not_utf8": "the record is not valid UTF-8 text",
    "not_json": "the record is not JSON (or nests deeper than the JSON parser allows)",
    "not_object": "the record is JSON but not an object",
    "unknown_version": "version is missing or not one this job reads",
    "missing_cluster": "cluster is missing or empty",
    "name_too_long": f"cluster is longer than {MAX_CLUSTER_CHARS} characters, or an observation's topic longer "
    f"than Kafka allows ({MAX_TOPIC_CHARS})",
    "bad_observations": "observations is missing or not an array",
    "bad_columns": "a version-3 or -4 record's topics, partitions or followers are missing, their arrays differ in "
    "length, or an index (followers.p, partitions.topic) is out of range",
    "bad_type": "a field has the wrong type or is out of range (text, a fraction, NaN or more than 64 bits "
    "where a whole number belongs; a list that is not a list)",
    "missing_ids": "an observation lacks topic, partition, broker_id, leader_id or t_ms",
    "negative_value": "an observation has a negative offset, id or time",
    "prev_after_t": "prev_t_ms is after t_ms",
    "leader_leo_backwards": "prev_leader_leo is above leader_leo",
    "future_t": "t_ms is too far in the future of the job's clock",
    "bad_isr_change": "an isr_changes entry lacks t_ms, topic, partition, isr_before or isr_after, or its "
    f"topic is longer than {MAX_TOPIC_CHARS} characters",
    "bad_broker_counters": "a brokers entry lacks broker_id or t_ms, or has a negative id, time or count",
    "bad_gone": "a gone entry lacks t_ms, topic, partition or broker_id, or has a negative id or time, or its "
    f"topic is longer than {MAX_TOPIC_CHARS} characters",
}

# The reasons that reject a whole record (the others reject one observation or ISR change).
RECORD_REASONS = frozenset(
    (
        "empty_value",
        "not_utf8",
        "not_json",
        "not_object",
        "unknown_version",
        "missing_cluster",
        "name_too_long",
        "bad_observations",
        "bad_type",
        "bad_columns",
    )
)

# parse_records' column of a version-3 record's column checks (``_columns_bad``), dropped after the reason.
_COLUMNS_BAD = "_columns_bad"

# The parsed body's column that holds the record's text when a field did not convert (Spark's
# JSON reader keeps the rest as nulls otherwise: a wrong type would read as a missing value).
CORRUPT = "_corrupt_record"


class DeadLetter(TypedDict):
    """One dead letter as the driver hands it to the outputs (``streaming.sinks.outputs``)."""

    reason: str  # a key of REASONS
    detail: str | None
    cluster: str | None
    source_topic: str | None
    source_partition: int | None
    source_offset: int | None
    payload: str | None  # the rejected bytes, as payload_encoding says
    payload_encoding: str | None  # UTF8 or BASE64 (None without a payload)
    # Set when ``payload`` holds only the first bytes of a bigger record (``payload_kept_bytes``): its whole
    # size and the SHA-256 of the whole (hex); None otherwise.
    payload_bytes: int | None
    payload_sha256: str | None


DEADLETTER_COLUMNS = list(DeadLetter.__annotations__)


def deadletter_of(side: Mapping[str, Any]) -> DeadLetter:
    """A dead letter's fields out of its rare row (``side_items``' columns, as JSON decoded)."""
    return cast("DeadLetter", {k: side.get(k) for k in DEADLETTER_COLUMNS})


# A rejected record's bytes kept for its dead letter: at most the first 64 KiB, and fewer when a
# batch can read many records (``payload_kept_bytes``). A batch of big bad records (up to
# --max-records-per-trigger of ~1 MB each) would otherwise be held in Spark's memory and carried
# to the driver whole, and run it out of memory on every restart (docs/streaming.md).
PAYLOAD_KEPT_BYTES = 65_536
# The bad records' bytes one batch keeps at most (its cap's worth of them, each cut to
# ``payload_kept_bytes``), and the least kept of one. At 64 KiB each, the default cap's 2,000
# records of 70 KB (~170 MB of dead letters in the driver's one Arrow job) lost a task's result
# and then ran the 1 GiB JVM out of heap, at every restart (docs/benchmarks.md, "A flood of big
# records"); at 16 KiB each the same flood was dead-lettered in batches of ~4.5 s.
DEADLETTER_BATCH_BYTES = 32 << 20
PAYLOAD_MIN_KEPT_BYTES = 1_024


def payload_kept_bytes(max_records: int) -> int:
    """The bytes kept of each bad record when a batch reads at most ``max_records`` records
    (``--max-records-per-trigger``): its share of ``DEADLETTER_BATCH_BYTES``, between
    ``PAYLOAD_MIN_KEPT_BYTES`` and ``PAYLOAD_KEPT_BYTES`` (16,777 at the default 2,000)."""
    share = DEADLETTER_BATCH_BYTES // max(1, max_records)
    return max(PAYLOAD_MIN_KEPT_BYTES, min(PAYLOAD_KEPT_BYTES, share))


# payload_encoding values: the payload is the text itself, or the base64 of the bytes.
UTF8, BASE64 = "utf8", "base64"

CHANGE_TYPE = (
    "array<struct<t_ms:bigint,topic:string,partition:int,isr_before:array<int>,isr_after:array<int>,leader_id:int>>"
)
COUNTERS_TYPE = "array<struct<broker_id:int,t_ms:bigint,isr_shrinks_total:bigint,isr_expands_total:bigint>>"
GONE_TYPE = "array<struct<t_ms:bigint,topic:string,partition:int,broker_id:int>>"

# side_items' columns, in order; the record's own position and cluster, the rest each item's
SIDE_COLUMNS = (
    "kind",
    "reason",
    "detail",
    "cluster",
    "source_topic",
    "source_partition",
    "source_offset",
    "payload",
    "payload_encoding",
    "payload_bytes",
    "payload_sha256",
    "topic",
    "partition",
    "shrink",
    "expand",
    "t_ms",
    "left",
    "joined",
    "leader_id",
    "broker_id",
    "shrinks_total",
)
_RECORD_SIDE_COLUMNS = frozenset({"cluster", "source_topic", "source_partition", "source_offset"})
_OFFSETS = ("leo", "leader_leo", "hw", "prev_leo", "prev_leader_leo")
# An observation's fields, in the order of its struct (isrwatch.telemetry.Observation).
_OBSERVATION_FIELDS = tuple(f.name for f in dataclasses.fields(Observation))


def parse_records(raw: DataFrame) -> DataFrame:
    """One row per record: source_topic, source_partition, source_offset,
    raw (the value's bytes), value_bytes (their number), value (the text; null
    unless valid UTF-8), rec (the parsed body) and reason/detail (null for a
    good record)."""
    first, rec, columns_bad, reason, detail = _record_columns()
    # One projection per step, each reading the one before by name: with the reason written
    # into each of detail's branches (and version 3's column checks into the reason's), the
    # generated method grew past the size the JVM's JIT compiles, and ran interpreted: 0.4 s
    # more per 100,000 observations (docs/benchmarks.md, "Telemetry version 3").
    parsed = projection.select(raw, *first).withColumn("rec", rec).withColumn(_COLUMNS_BAD, columns_bad)
    return parsed.withColumn("reason", reason).withColumn("detail", detail).drop(_COLUMNS_BAD)


@functools.cache
def _record_columns() -> tuple[list[Column], Column, Column, Column, Column]:
    """parse_records' columns, built once: each Column costs calls into the JVM,
    ~0.3 ms apiece, which added up to a second a batch when rebuilt every batch."""
    # Text only when the bytes are UTF-8: invalid bytes would otherwise reach
    # the JSON parser (which replaces them) and the driver (which cannot decode them).
    versions = F.array(*[F.lit(v) for v in sorted(SUPPORTED_VERSIONS)])
    first = [
        F.col("topic").alias("source_topic"),
        F.col("partition").alias("source_partition"),
        F.col("offset").alias("source_offset"),
        F.col("value").alias("raw"),
        # Its own column, so the aggregation's plan does not carry the raw bytes for it.
        F.coalesce(F.octet_length(F.col("value")), F.lit(0)).alias("value_bytes"),
        F.try_validate_utf8(F.col("value").cast("string")).alias("value"),
    ]
    # validated once, parsed once
    rec = F.from_json(F.col("value"), f"{SPARK_SCHEMA_DDL}, {CORRUPT} STRING", {"columnNameOfCorruptRecord": CORRUPT})
    r = F.col("rec")
    size = F.col("value_bytes")
    columnar = r["version"] >= COLUMNS_FROM
    no_observations = ~columnar & r["observations"].isNull()
    columns_bad = columnar & _columns_bad(r)
    bad_columns = F.col(_COLUMNS_BAD)
    looks_like_object = F.ltrim(F.col("value")).startswith("{")
    cluster_too_long = F.length(r["cluster"]) > MAX_CLUSTER_CHARS
    # CASE evaluates lazily: the second JSON parse only runs for records
    # already found wanting.
    reason = (
        F.when(size == 0, F.lit("empty_value"))
        .when(F.col("value").isNull(), F.lit("not_utf8"))
        .when(F.try_parse_json(F.col("value")).isNull(), F.lit("not_json"))
        .when(~looks_like_object, F.lit("not_object"))
        .when(
            r.isNull() | ~F.coalesce(F.array_contains(versions, r["version"]), F.lit(False)), F.lit("unknown_version")
        )
        .when(F.coalesce(F.length(r["cluster"]), F.lit(0)) == 0, F.lit("missing_cluster"))
        .when(cluster_too_long, F.lit("name_too_long"))
        .when(no_observations, F.lit("bad_observations"))
        .when(r[CORRUPT].isNotNull(), F.lit("bad_type"))
        .when(bad_columns, F.lit("bad_columns"))
    )
    # Only records with a version problem get this far at all (text that is
    # not UTF-8 has no parse); the common case never evaluates the parses above.
    reason = F.when(
        r.isNull()
        | r["version"].isNull()
        | ~F.array_contains(versions, r["version"])
        | r["cluster"].isNull()
        | (r["cluster"] == "")
        | cluster_too_long
        | no_observations
        | r[CORRUPT].isNotNull()
        | bad_columns,
        reason,
    )
    given = F.col("reason")  # detail reads the reason by name (parse_records)
    detail = (
        F.when(
            given == "unknown_version",
            F.concat(F.lit("version="), F.coalesce(r["version"].cast("string"), F.lit("null"))),
        )
        .when(given == "not_json", F.lit("cannot parse as JSON"))
        .when(
            given == "name_too_long",
            F.concat(F.lit("cluster of "), F.length(r["cluster"]).cast("string"), F.lit(" characters")),
        )
        .when(given == "bad_type", F.lit("a field of the wrong type or out of range"))
        .when(given == "bad_columns", F.lit("the columns do not fit together"))
        .when(given == "not_utf8", F.concat(F.lit("bytes="), size.cast("string")))
        .when(given == "empty_value", F.when(F.col("raw").isNull(), F.lit("null value")).otherwise(F.lit("0 bytes")))
        .otherwise(F.lit(None).cast("string"))
    )
    return first, rec, columns_bad, reason, detail


def _columns_bad(r: Column) -> Column:
    """A version-3 body whose columns do not fit: a missing array, arrays of one group
    (``partitions``, ``followers``) of unequal length, an index that points outside its
    array. True when any holds (a null anywhere reads as bad)."""
    topics, parts, fol = r["topics"], r["partitions"], r["followers"]
    n_parts, n = F.size(parts["partition"]), F.size(fol["p"])
    bad = topics.isNull() | parts.isNull() | fol.isNull()
    for f in PARTITION_FIELDS[:1] + PARTITION_FIELDS[2:]:  # each against partitions.partition
        bad = bad | (F.size(parts[f]) != n_parts)
    for f in OPTIONAL_PARTITION_FIELDS:  # absent: every entry null
        bad = bad | (parts[f].isNotNull() & (F.size(parts[f]) != n_parts))
    for f in FOLLOWER_FIELDS:
        bad = bad | (F.size(fol[f]) != n)

    def index_bad(index: Column, bound: Column) -> Column:
        # A null index is left to the observation it belongs to: its fields read as null,
        # a missing_ids dead letter. (Finding nulls here would take a lambda per element.)
        return (F.coalesce(F.array_min(index), F.lit(0)) < 0) | (F.coalesce(F.array_max(index), F.lit(-1)) >= bound)

    bad = bad | index_bad(fol["p"], n_parts) | index_bad(parts["topic"], F.size(topics))
    return F.coalesce(bad, F.lit(True))


def _column_fields(r: Column, i: Column, p: Column | None = None) -> dict[str, Column]:
    """Observation ``i`` (0-based) of a version-3 body ``r`` whose columns fit
    (``_columns_bad`` false), field by field; ``p``: its ``followers.p`` when known. A field
    whose index is null reads as null."""

    def at(values: Column, index: Column) -> Column:
        return F.try_element_at(values, index + 1)

    p = at(r["followers"]["p"], i) if p is None else p
    fields = {f: at(r["partitions"][f], p) for f in (*PARTITION_FIELDS, *OPTIONAL_PARTITION_FIELDS)}
    fields["topic"] = at(r["topics"], fields["topic"])
    fields.update((f, at(r["followers"][f], i)) for f in FOLLOWER_FIELDS)
    return fields


def _column_observation(r: Column, i: Column, p: Column | None = None) -> Column:
    """``_column_fields`` as the struct a version-1 record holds."""
    fields = _column_fields(r, i, p)
    return F.struct(*[fields[f].alias(f) for f in _OBSERVATION_FIELDS])


def _record_payload() -> tuple[Column, Column, Column, Column]:
    """(payload, payload_encoding, payload_bytes, payload_sha256) of a whole record of
    ``bad_records_kept``: the text when it is UTF-8 and whole, else the base64 of its
    (first kept) bytes; null without a value. The last two only for a record
    cut short: its whole size and hash."""
    text = F.col("value").isNotNull()
    # One line of standard base64 whatever spark.sql.chunkBase64String.enabled says (MIME lines by default).
    payload = F.when(text, F.col("value")).otherwise(F.translate(F.base64(F.col("raw")), "\r\n", ""))
    encoding = F.when(text, F.lit(UTF8)).when(F.col("raw").isNotNull(), F.lit(BASE64))
    cut = F.col("raw_sha256").isNotNull()
    return payload, encoding, F.when(cut, F.col("value_bytes")), F.col("raw_sha256")


def bad_records_kept(records: DataFrame, kept_bytes: int = PAYLOAD_KEPT_BYTES) -> DataFrame:
    """``parse_records``' rows as a batch holds them for its two uses: the raw bytes and text
    only for a bad record (only its dead letter needs them), and of a record over
    ``kept_bytes`` (``payload_kept_bytes``) only the first bytes, with the SHA-256 of the
    whole (``raw_sha256``)."""
    return projection.select(records, *_kept_columns(kept_bytes))


@functools.cache
def _kept_columns(kept_bytes: int) -> tuple[Column | str, ...]:
    bad = F.col("reason").isNotNull()
    cut = bad & (F.col("value_bytes") > kept_bytes)
    return (
        "source_topic",
        "source_partition",
        "source_offset",
        F.when(cut, F.substring(F.col("raw"), 1, kept_bytes)).when(bad, F.col("raw")).alias("raw"),
        "value_bytes",
        F.when(bad & ~cut, F.col("value")).alias("value"),
        F.when(cut, F.sha2(F.col("raw"), 256)).alias("raw_sha256"),
        "rec",
        "reason",
        "detail",
    )


def _observation_reason(o: Column | Mapping[str, Column], now_ms: Column, future_tolerance_ms: int | None) -> Column:
    """Why observation ``o`` is a dead letter, else null. ``o``: the observation's struct, or its
    fields by name (``_column_fields``: each check then holds only the fields it reads, not the
    whole struct once per field read, which Spark would analyse again at every batch)."""
    missing = (
        o["topic"].isNull()
        | (o["topic"] == "")
        | o["partition"].isNull()
        | o["broker_id"].isNull()
        | o["leader_id"].isNull()
        | o["t_ms"].isNull()
    )
    negative = (
        (o["partition"] < 0)
        | (o["broker_id"] < 0)
        | (o["leader_id"] < 0)
        | (o["t_ms"] < 0)
        | (F.coalesce(o["prev_t_ms"], F.lit(0)) < 0)
    )
    for name in _OFFSETS:
        negative = negative | (F.coalesce(o[name], F.lit(0)) < 0)
    reason = (
        F.when(missing, F.lit("missing_ids"))
        .when(F.length(o["topic"]) > MAX_TOPIC_CHARS, F.lit("name_too_long"))
        .when(negative, F.lit("negative_value"))
        .when(o["prev_t_ms"] > o["t_ms"], F.lit("prev_after_t"))
        .when(o["prev_leader_leo"] > o["leader_leo"], F.lit("leader_leo_backwards"))
    )
    if future_tolerance_ms is not None:
        reason = reason.when(o["t_ms"] > now_ms + F.lit(future_tolerance_ms), F.lit("future_t"))
    return reason


def _columns_clean(r: Column, now_ms: Column, future_tolerance_ms: int | None) -> Column:
    """True when no observation of a version-3 body ``r`` whose columns fit can have a
    dead-letter reason (``_observation_reason``), by bounds over whole columns that Spark
    compiles (``array_min``, ``array_max``, ``arrays_overlap``): no null where an id is
    required, nothing negative, no empty or over-long topic, the newest ``t_ms`` not in
    the future, and every ``prev_t_ms`` before every ``t_ms``. Only the comparison of each
    follower's ``prev_leader_leo`` with its own ``leader_leo`` (and its ``prev_t_ms`` with
    its ``t_ms``, when the bound does not settle it) goes element by element. False or null
    when unsure: the record's observations are then checked one by one. A screen, not a
    second rule: it only clears records the full check would clear (each reason's case in
    tests/streaming/test_columns.py)."""
    parts, fol = r["partitions"], r["followers"]

    def ids(values: Column) -> Column:  # no null (its overlap with [-1] is null then), none below 0
        return ~F.arrays_overlap(values, F.array(F.lit(-1))) & (F.array_min(values) >= 0)

    def offsets(values: Column) -> Column:  # a null reads as 0 (``_observation_reason``)
        return F.coalesce(F.array_min(values), F.lit(0)) >= 0

    def never_after(before: Column, after: Column) -> Column:  # no element of ``before`` > its own of ``after``
        return ~F.array_contains(F.zip_with(before, after, lambda b, a: F.coalesce(b > a, F.lit(False))), True)

    topics = r["topics"]
    clean = ~F.arrays_overlap(topics, F.array(F.lit(""))) & (
        (F.length(F.array_join(topics, "")) <= MAX_TOPIC_CHARS)
        | F.forall(topics, lambda t: F.length(t) <= MAX_TOPIC_CHARS)
    )
    for values in (fol["p"], parts["topic"], parts["partition"], parts["leader_id"], fol["broker_id"], fol["t_ms"]):
        clean = clean & ids(values)
    for values in (parts["hw"], *(fol[f] for f in _OFFSETS if f != "hw"), fol["prev_t_ms"]):
        clean = clean & offsets(values)
    if future_tolerance_ms is not None:
        clean = clean & (F.array_max(fol["t_ms"]) <= now_ms + F.lit(future_tolerance_ms))
    t_ordered = (F.coalesce(F.array_max(fol["prev_t_ms"]), F.lit(-1)) <= F.array_min(fol["t_ms"])) | never_after(
        fol["prev_t_ms"], fol["t_ms"]
    )
    return F.coalesce(clean & t_ordered & never_after(fol["prev_leader_leo"], fol["leader_leo"]), F.lit(False))


def _minute(now_ms: int | None) -> int | None:
    """``now_ms`` rounded up to the minute: a literal is compiled into Spark's generated
    code, and one that changed every batch cost a recompilation (~0.6 s) every batch."""
    return None if now_ms is None else -(-now_ms // 60_000) * 60_000


def _now(now_ms: int | None) -> Column:
    """The job's clock as a column: Spark's batch time, or ``now_ms``."""
    return F.unix_millis(F.current_timestamp()) if now_ms is None else F.lit(now_ms).cast("long")


def observations(
    records: DataFrame,
    future_tolerance_ms: int | None,
    now_ms: int | None = None,
    versions: Collection[int] = SUPPORTED_VERSIONS,
) -> DataFrame:
    """One row per observation of the good records: source position, cluster,
    the record's ``kafka_version``, the observation struct ``o`` and reason (null when good). The job's clock
    is Spark's batch time (``current_timestamp``); ``future_tolerance_ms``
    None turns the future check off (a simulator running faster than real
    time has its own clock). ``now_ms``: the job's clock fixed by the caller
    (the same for every action of one batch; ``_now``). ``versions``: the
    telemetry versions the records can hold; the default, all, suits the job,
    whose records are held; a caller whose records are a stream read once (a
    benchmark's baseline) names the one its records hold, so that only its
    layout's branch reads them (each branch would read the source again)."""
    listed, columnar, o, reason = _observation_columns(future_tolerance_ms, _minute(now_ms))
    head = _observation_head()
    # No record-level filter before the explodes: Spark would push it below the
    # projection holding from_json and copy the parse into it (11 parses per
    # record in the plan; bench.stages). Exploding nothing for a bad record
    # keeps one from_json.
    # One branch per layout, each exploding only its own records. (One explode for both, with
    # each field chosen by version, let the optimizer copy every field's choice into each
    # check that reads it: three times slower, and past what Java compiles in one method.)
    # The job passes held records (streaming.evaluation.batch), so each branch reads them, not the JSON.
    branches = []
    if any(v < COLUMNS_FROM for v in versions):
        branches.append(projection.select(records, *head, listed))
    if any(v >= COLUMNS_FROM for v in versions):
        by_position = projection.select(records, *head, "rec", columnar)
        branches.append(projection.select(by_position, "source_topic", "source_offset", "cluster", "kafka_version", o))
    rows = functools.reduce(DataFrame.unionByName, branches)
    return projection.select(rows, "source_topic", "source_offset", "cluster", "kafka_version", "o", reason)


@functools.cache
def _observation_head() -> tuple[Column | str, ...]:
    """The record's position, its cluster and its Kafka version (version 4, optional: the rule
    variant's, per row), before its observations."""
    return (
        "source_topic",
        "source_offset",
        F.col("rec.cluster").alias("cluster"),
        F.col("rec.kafka_version").alias("kafka_version"),
    )


@functools.lru_cache(maxsize=8)
def _observation_columns(future_tolerance_ms: int | None, now_ms: int | None) -> tuple[Column, Column, Column, Column]:
    r = F.col("rec")
    good = F.col("reason").isNull()
    columnar = r["version"] >= COLUMNS_FROM
    # Versions 1 and 2: the observations as they are. Version 3: one row per follower, its
    # position and its partition entry's, the observation read from the columns by position
    # (not a higher-order function: Spark runs those interpreted, and one reading the record
    # in its lambda let the optimizer copy from_json into it; docs/benchmarks.md).
    listed = F.explode(F.when(good & ~columnar, r["observations"])).alias("o")
    by_position = F.posexplode(F.when(good & columnar, r["followers"]["p"])).alias("_i", "_p")
    o = _column_observation(r, F.col("_i"), F.col("_p")).alias("o")
    reason = _observation_reason(F.col("o"), _now(now_ms), future_tolerance_ms).alias("reason")
    return listed, by_position, o, reason


def good_observations(obs: DataFrame) -> DataFrame:
    """The valid observations, flattened: cluster, every observation field, and the record's
    Kafka version (null where it states none)."""
    return projection.select(obs.where(_good()), "cluster", "o.*", "kafka_version")


@functools.cache
def _good() -> Column:
    return F.col("reason").isNull()


def _isr_change_bad(c: Column) -> Column:
    return (
        c["t_ms"].isNull()
        | c["topic"].isNull()
        | (c["topic"] == "")
        | (F.length(c["topic"]) > MAX_TOPIC_CHARS)
        | c["partition"].isNull()
        | c["isr_before"].isNull()
        | c["isr_after"].isNull()
    )


def _counters_bad(b: Column) -> Column:
    return (
        b["broker_id"].isNull()
        | b["t_ms"].isNull()
        | (b["broker_id"] < 0)
        | (b["t_ms"] < 0)
        | (F.coalesce(b["isr_shrinks_total"], F.lit(0)) < 0)
        | (F.coalesce(b["isr_expands_total"], F.lit(0)) < 0)
    )


def _gone_bad(g: Column) -> Column:
    return (
        g["t_ms"].isNull()
        | g["topic"].isNull()
        | (g["topic"] == "")
        | (F.length(g["topic"]) > MAX_TOPIC_CHARS)
        | g["partition"].isNull()
        | g["broker_id"].isNull()
        | (g["t_ms"] < 0)
        | (g["partition"] < 0)
        | (g["broker_id"] < 0)
    )


def _item(
    kind: str,
    reason: Column,
    payload: Column,
    encoding: Column | None = None,
    detail: Column | None = None,
    topic: Column | None = None,
    partition: Column | None = None,
    shrink: Column | None = None,
    expand: Column | None = None,
    change: Column | None = None,
    counters: Column | None = None,
    gone: Column | None = None,
    whole: tuple[Column, Column] | None = None,
) -> Column:
    def null(t: str) -> Column:
        return F.lit(None).cast(t)

    return F.struct(
        F.lit(kind).alias("kind"),
        reason.alias("reason"),
        (detail if detail is not None else null("string")).alias("detail"),
        payload.alias("payload"),
        (encoding if encoding is not None else F.when(payload.isNotNull(), F.lit(UTF8))).alias("payload_encoding"),
        (whole[0] if whole is not None else null("bigint")).alias("payload_bytes"),
        (whole[1] if whole is not None else null("string")).alias("payload_sha256"),
        (topic if topic is not None else null("string")).alias("topic"),
        (partition if partition is not None else null("int")).alias("partition"),
        (shrink if shrink is not None else null("int")).alias("shrink"),
        (expand if expand is not None else null("int")).alias("expand"),
        # an ISR change's time and the followers that left and joined (streaming.lifecycle.handler: isrwatch.outcomes)
        next((c["t_ms"] for c in (change, counters, gone) if c is not None), null("bigint")).alias("t_ms"),
        (F.array_except(change["isr_before"], change["isr_after"]) if change is not None else null("array<int>")).alias(
            "left"
        ),
        (F.array_except(change["isr_after"], change["isr_before"]) if change is not None else null("array<int>")).alias(
            "joined"
        ),
        (change["leader_id"] if change is not None else null("int")).alias("leader_id"),
        # a broker's own ISR shrink count (kind "counters"; streaming.lifecycle.handler: isrwatch.outcomes), or
        # the broker of a replica gone (kind "gone": the monitor forgets it)
        next((c["broker_id"] for c in (counters, gone) if c is not None), null("int")).alias("broker_id"),
        (counters["isr_shrinks_total"] if counters is not None else null("bigint")).alias("shrinks_total"),
    )


def side_items(records: DataFrame, future_tolerance_ms: int | None, now_ms: int | None = None) -> DataFrame:
    """The rare rows of a batch, in one pass with no shuffle: every dead
    letter (a bad record; a bad observation or ISR change inside a good one)
    and every ISR change, broker count, replica gone and identity stated (a record's
    ``cluster_id`` and ``endpoints``, as JSON in payload). Columns: kind (``deadletter`` |
    ``isr`` | ``counters`` | ``gone`` | ``identity``), reason,
    detail, cluster, source_topic, source_partition, source_offset, payload
    (the rejected record or JSON) and payload_encoding (``utf8`` | ``base64``),
    topic, partition, shrink (followers removed), expand (followers added), the
    change's t_ms, left and joined (those followers' ids) and leader_id, a broker's
    broker_id, t_ms and shrinks_total (its own ISR shrink count), and a gone replica's
    topic, partition, broker_id and t_ms.
    """
    cluster, items, columns = _side_columns(future_tolerance_ms, _minute(now_ms))
    exploded = projection.select(records, "source_topic", "source_partition", "source_offset", cluster, items)
    return projection.select(exploded, *columns)


@functools.lru_cache(maxsize=8)
def _side_columns(future_tolerance_ms: int | None, now_ms: int | None) -> tuple[Column, Column, list[str]]:
    now = _now(now_ms)
    r = F.col("rec")
    listed_bad = F.filter(r["observations"], lambda o: _observation_reason(o, now, future_tolerance_ms).isNotNull())
    # A version-3 record: the positions of its bad observations, each checked field by field
    # from the columns (no observation is built for a good one), then the bad ones built. The
    # lambdas read the record: cheap on the held records the job passes (streaming.evaluation.batch); on
    # a frame straight from from_json the optimizer may copy the parse into them. A record the
    # compiled screen clears (``_columns_clean``) has no position to check.
    n = F.size(r["followers"]["p"])
    checked = (n > 0) & ~_columns_clean(r, now, future_tolerance_ms)
    positions = F.when(checked, F.sequence(F.lit(0), n - 1)).otherwise(F.array().cast("array<int>"))
    bad_positions = F.filter(
        positions, lambda i: _observation_reason(_column_fields(r, i), now, future_tolerance_ms).isNotNull()
    )
    columnar_bad = F.transform(bad_positions, lambda i: _column_observation(r, i))
    bad_obs = F.when(r["version"] >= COLUMNS_FROM, columnar_bad).otherwise(listed_bad)
    obs_items = F.transform(
        bad_obs,
        lambda o: _item("deadletter", _observation_reason(o, now, future_tolerance_ms), F.to_json(o)),
    )
    change_items = F.transform(
        F.coalesce(r["isr_changes"], F.array().cast(CHANGE_TYPE)),
        lambda c: F.when(_isr_change_bad(c), _item("deadletter", F.lit("bad_isr_change"), F.to_json(c))).otherwise(
            _item(
                "isr",
                F.lit(None).cast("string"),
                F.lit(None).cast("string"),
                topic=c["topic"],
                partition=c["partition"],
                shrink=F.size(F.array_except(c["isr_before"], c["isr_after"])),
                expand=F.size(F.array_except(c["isr_after"], c["isr_before"])),
                change=c,
            )
        ),
    )
    counter_items = F.transform(
        F.filter(
            F.coalesce(r["brokers"], F.array().cast(COUNTERS_TYPE)),
            lambda b: _counters_bad(b) | b["isr_shrinks_total"].isNotNull(),  # no count: nothing to say
        ),
        lambda b: F.when(_counters_bad(b), _item("deadletter", F.lit("bad_broker_counters"), F.to_json(b))).otherwise(
            _item("counters", F.lit(None).cast("string"), F.lit(None).cast("string"), counters=b)
        ),
    )
    gone_items = F.transform(
        F.coalesce(r["gone"], F.array().cast(GONE_TYPE)),
        lambda g: F.when(_gone_bad(g), _item("deadletter", F.lit("bad_gone"), F.to_json(g))).otherwise(
            _item(
                "gone",
                F.lit(None).cast("string"),
                F.lit(None).cast("string"),
                topic=g["topic"],
                partition=g["partition"],
                gone=g,
            )
        ),
    )
    # what the collector says of the cluster it polls, when it says it (streaming.driver.identity), with
    # its Kafka version (streaming.driver.variants: the rule variant the cluster gets, logged)
    stated = r["cluster_id"].isNotNull() | r["endpoints"].isNotNull()
    identity_item = _item(
        "identity",
        F.lit(None).cast("string"),
        F.to_json(
            F.struct(
                r["cluster_id"].alias("cluster_id"),
                r["endpoints"].alias("endpoints"),
                r["kafka_version"].alias("kafka_version"),
            )
        ),
    )
    identity = F.slice(F.array(identity_item), 1, F.when(stated, 1).otherwise(0))  # (empty unless stated)
    payload, encoding, whole_bytes, whole_sha256 = _record_payload()
    letter = _item(
        "deadletter", F.col("reason"), payload, encoding, detail=F.col("detail"), whole=(whole_bytes, whole_sha256)
    )
    items = F.when(F.col("reason").isNotNull(), F.array(letter)).otherwise(
        F.concat(obs_items, change_items, counter_items, gone_items, identity)
    )
    # (a cluster name past the bound is not repeated into the dead letter's own field; the payload has it)
    no_cluster = F.col("reason").isin("not_json", "not_object", "name_too_long")
    cluster = F.when(no_cluster, F.lit(None).cast("string")).otherwise(r["cluster"])
    return (
        cluster.alias("cluster"),
        F.explode(items).alias("i"),
        [f"i.{c}" if c not in _RECORD_SIDE_COLUMNS else c for c in SIDE_COLUMNS],
    )
