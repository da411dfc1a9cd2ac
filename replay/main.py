"""``isrwatch replay``: the recording evaluated under every setting asked for, in Spark batch mode.

The recording is parsed once with the job's parser (``streaming.evaluation.parse``: what the job would
reject is counted as rejected here); then, per setting, the job's own expressions
(``streaming.evaluation.replicas.evaluate_batch``, an empty carried state, the whole recording as one
batch) give each follower's verdict at every observation, and the changes of its out-of-sync
verdict go to ``replay.tally``. The observed ISR in the telemetry is left out of the verdict
(it is what the recorded brokers did, not what the setting would do), and so is the
``replica.lag.time.max.ms`` the telemetry reports when a value is given with
``--lag-time-max-ms``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from isrwatch.exceptions import ConfigError
from isrwatch.logs import kv
from isrwatch.rule import Rule, RuleConfig
from isrwatch.settings import kafka_config_pairs
from isrwatch.status import State, Thresholds
from replay.report import write_report
from replay.settings import DEFAULT_LAG_MAX_MESSAGES, ReplaySettings, parse_time_ms, split_list
from replay.sources import read_recording, read_topic, simulated
from replay.stage import stage
from replay.tally import Transition, tally

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Setting", "settings_to_run", "replay", "render_table", "main"]

log = logging.getLogger(__name__)

# When neither the flags nor the telemetry say: Kafka's default up to 2.4.
FALLBACK_LAG_TIME_MAX_MS = 10_000


@dataclass(frozen=True)
class Setting:
    rule: Rule
    lag_time_max_ms: int | None  # None: the value each replica's telemetry reports
    lag_max_messages: int | None  # legacy-messages only

    def label(self) -> dict[str, Any]:
        return {
            "rule": self.rule.value,
            "lag_time_max_ms": self.lag_time_max_ms,
            "lag_max_messages": self.lag_max_messages,
        }


def settings_to_run(s: ReplaySettings) -> list[Setting]:
    """Every rule with every ``replica.lag.time.max.ms`` (and, for the message rule, every
    ``replica.lag.max.messages``), in the order given."""
    rules = [Rule.parse(r) for r in split_list(s.rule)] or list(Rule)
    lags: list[int | None] = [int(v) for v in split_list(s.lag_time_max_ms)] or [None]
    messages = [int(v) for v in split_list(s.lag_max_messages)] or [DEFAULT_LAG_MAX_MESSAGES]
    out: list[Setting] = []
    for rule in dict.fromkeys(rules):
        for lag in dict.fromkeys(lags):
            if rule is Rule.LEGACY_MESSAGES:
                out.extend(Setting(rule, lag, m) for m in dict.fromkeys(messages))
            else:
                out.append(Setting(rule, lag, None))
    return out


def _transitions(evaluated: DataFrame) -> list[Transition]:
    import pyspark.sql.functions as F

    from streaming.evaluation import replicas

    out_of_sync = F.col("lag_state") == State.OUT_OF_SYNC.value
    warning = F.col("lag_state").isin(State.NEARING.value, State.CRITICAL.value)
    reps = F.col("latest.replicas")
    rows = (
        evaluated.where(F.col(replicas.CHANGE))
        .select(
            "cluster",
            "topic",
            "partition",
            "broker_id",
            "eval_ms",
            out_of_sync.alias("out"),
            F.when(reps.isNotNull(), F.size(reps)).alias("n_replicas"),
            F.col("latest.min_isr").cast("int").alias("min_isr"),
            warning.alias("warning"),
        )
        .collect()
    )
    return [
        Transition(
            (r.cluster, r.topic, int(r.partition), int(r.broker_id)),
            int(r.eval_ms),
            bool(r.out),
            r.n_replicas,
            r.min_isr,
            bool(r.warning),
        )  # fmt: skip
        for r in rows
    ]


def _longest_recovered(evaluated: DataFrame) -> dict[str, Any] | None:
    """The longest a follower went without being caught up and then caught up again (its
    last-caught-up time moved on), as seen at the telemetry's rounds; None when none did."""
    import pyspark.sql.functions as F
    from pyspark.sql import Window

    from streaming.evaluation import replicas
    from streaming.evaluation.state import KEY_COLUMNS

    episodes = (
        evaluated.where(F.col(replicas.SEED) == 0)
        .groupBy(*KEY_COLUMNS, "last_caught_up_ms")
        .agg(F.max("time_since_caught_up_s").alias("seconds"), F.max("eval_ms").alias("at_ms"))
    )
    newest = F.max("last_caught_up_ms").over(Window.partitionBy(*KEY_COLUMNS))
    recovered = episodes.withColumn("_newest", newest).where(F.col("last_caught_up_ms") < F.col("_newest"))
    # ties broken by the replica, so the same recording always names the same one
    top = recovered.orderBy(F.col("seconds").desc(), *KEY_COLUMNS).limit(1).collect()
    if not top:
        return None
    r = top[0]
    return {"seconds": float(r.seconds), "cluster": r.cluster, "topic": r.topic, "partition": int(r.partition),
            "broker_id": int(r.broker_id), "at_ms": int(r.at_ms)}  # fmt: skip


def replay(
    spark: SparkSession,
    raw: DataFrame,
    settings: list[Setting],
    flap_window_ms: int,
    top: int,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> dict[str, Any]:
    """Each setting's tally over the records of ``raw`` (the Kafka source's columns:
    ``replay.stage``), with what the recording held;
    only observations with ``since_ms <= t_ms <= until_ms`` count (None: no bound)."""
    import pyspark.sql.functions as F
    from pyspark import StorageLevel

    from streaming.evaluation import parse, replicas

    parsed = parse.parse_records(raw).persist(StorageLevel.MEMORY_AND_DISK)
    obs = parse.observations(parsed, None).persist(StorageLevel.MEMORY_AND_DISK)
    valid = parse.good_observations(obs)
    if since_ms is not None:
        valid = valid.where(F.col("t_ms") >= since_ms)
    if until_ms is not None:
        valid = valid.where(F.col("t_ms") <= until_ms)
    good = valid.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        counts = parsed.agg(F.count(F.lit(1)), F.count(F.col("reason"))).first()  # count(col): its non-nulls
        assert counts is not None  # an aggregate without grouping has one row
        n_records, rejected_records = int(counts[0]), int(counts[1])
        rejected_obs = obs.where(F.col("reason").isNotNull()).count()
        span = good.agg(F.min("t_ms"), F.max("t_ms"), F.count(F.lit(1)), F.collect_set("lag_time_max_ms")).first()
        assert span is not None  # an aggregate without grouping has one row
        start_ms, end_ms, n_obs, reported = span[0], span[1], int(span[2]), sorted(v for v in span[3] if v)
        if not n_obs:
            raise ConfigError(
                f"nothing to replay: none of the {n_records} records holds a valid observation"
                + (" in the --since/--until window" if since_ms is not None or until_ms is not None else "")
                + f" ({rejected_records} rejected records, {rejected_obs} rejected observations)"
            )
        results = []
        series = []  # per setting, followers out of the ISR over time (the report's chart)
        for i, setting in enumerate(settings, 1):
            t0 = time.monotonic()
            lag = setting.lag_time_max_ms or (reported[0] if len(reported) == 1 else FALLBACK_LAG_TIME_MAX_MS)
            cfg = RuleConfig(setting.rule, lag, setting.lag_max_messages or DEFAULT_LAG_MAX_MESSAGES)
            o = good.withColumn("isr", F.lit(None).cast("array<int>"))
            if setting.lag_time_max_ms is not None:
                o = o.withColumn("lag_time_max_ms", F.lit(None).cast(good.schema["lag_time_max_ms"].dataType))
            rows = replicas.observation_rows(o, cfg, lag // 2)
            carried = rows.select(*replicas.STATE_COLUMNS).limit(0)
            # held: the transitions and the advice both read it (one window over the recording, not two)
            evaluated = replicas.evaluate_batch(rows, carried, cfg, Thresholds(), lag // 2).persist(
                StorageLevel.MEMORY_AND_DISK
            )
            try:
                counted = tally(_transitions(evaluated), int(end_ms), flap_window_ms)
                longest = None if setting.rule is Rule.LEGACY_MESSAGES else _longest_recovered(evaluated)
            finally:
                evaluated.unpersist()
            label = setting.label()
            if setting.lag_time_max_ms is None:
                label["lag_time_max_ms"] = reported[0] if len(reported) == 1 else None
                label["lag_time_max_ms_from"] = "telemetry"
            results.append({**label, **counted.as_dict(top), "longest_recovered": longest})
            series.append(counted.out_over_time)
            log.info(
                kv(
                    event="replay_setting",
                    done=f"{i}/{len(settings)}",
                    **label,
                    seconds=round(time.monotonic() - t0, 1),
                )
            )
        return {
            "records": n_records,
            "observations": n_obs,
            "rejected_records": rejected_records,
            "rejected_observations": rejected_obs,
            "start_ms": int(start_ms),
            "end_ms": int(end_ms),
            "settings": results,
            "series": series,
        }
    finally:
        good.unpersist()
        obs.unpersist()
        parsed.unpersist()


_CAVEATS = (
    "caveats: seen at the telemetry's rounds (up to one round short); a follower someone fixed counts as "
    "caught up on its own; a leader checks every replica.lag.time.max.ms (<= 0.10.1) or half of it, so the "
    "broker may keep a follower up to one check longer; only what this recording held"
)


def render_table(result: dict[str, Any]) -> str:
    """The settings side by side, for the terminal."""
    head = ["rule", "lag.time.max.ms", "lag.max.messages", "shrinks", "expands", "flaps", "replica-s out",
            "partitions < min.isr", "worst partition"]  # fmt: skip
    lines = []
    for s in result["settings"]:
        worst = s["worst_partitions"][0] if s["worst_partitions"] else None
        lines.append([
            s["rule"],
            "recorded" if s["lag_time_max_ms"] is None else str(s["lag_time_max_ms"]),
            "-" if s["lag_max_messages"] is None else str(s["lag_max_messages"]),
            str(s["shrinks"]), str(s["expands"]), str(s["flaps"]),
            f"{s['replica_seconds_out_of_isr']:.1f}",
            f"{s['partitions_under_min_isr']} ({s['seconds_under_min_isr']:.1f} s)",
            f"{worst['topic']}-{worst['partition']} ({worst['shrinks']})" if worst else "-",
        ])  # fmt: skip
    widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]
    advice: list[tuple[str, str]] = []
    for s in result["settings"]:
        longest = s.get("longest_recovered")
        if longest is None or s["rule"] in {a[0] for a in advice}:
            continue
        where = f"{longest['topic']}-{longest['partition']} on broker {longest['broker_id']}"
        advice.append((s["rule"], f"{s['rule']}: the longest a follower went without catching up, and then caught up, "
                       f"was {longest['seconds']:.1f} s ({where}): a replica.lag.time.max.ms above "
                       f"{1000 * longest['seconds']:.0f} ms would have kept every such follower in the ISR"))  # fmt: skip
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    span_s = (result["end_ms"] - result["start_ms"]) / 1000.0
    out = [
        f"replayed {result['records']} records, {result['observations']} observations over {span_s:.0f} s "
        f"({result['rejected_records']} records and {result['rejected_observations']} observations rejected)",
        fmt.format(*head),
        *[fmt.format(*r) for r in lines],
    ]
    if advice:
        out += ["", *[a[1] for a in advice], _CAVEATS]
    return "\n".join(out)


def _recording(settings: ReplaySettings) -> tuple[Iterator[bytes], str]:
    """The records to replay, and how to name them in a message."""
    if settings.input:
        return read_recording(settings.input), f"--input {settings.input}"
    if settings.bootstrap_servers:
        config = kafka_config_pairs(settings.kafka_config)
        records = read_topic(settings.bootstrap_servers, settings.telemetry_topic, config)
        return records, f"topic {settings.telemetry_topic} on {settings.bootstrap_servers}"
    assert settings.simulate is not None  # validate() says one of the three
    records = simulated(settings.simulate, settings.duration, settings.seed, settings.interval_ms, settings.mode)
    return records, f"scenario {settings.simulate}"


def main(settings: ReplaySettings) -> int:
    from streaming.lifecycle.session import build_session
    from streaming.sources.source_spool import RAW_SCHEMA

    to_run = settings_to_run(settings)
    records, what = _recording(settings)
    with tempfile.TemporaryDirectory(prefix="isrwatch-replay-") as scratch:
        staged = os.path.join(scratch, "records")
        count = stage(records, staged, what)
        log.info(kv(event="replay_started", records=count, settings=len(to_run), master=settings.spark_master))
        spark = build_session(settings.spark_master, 2, app_name="isrwatch-replay", scratch_dir=scratch)
        try:
            raw = spark.read.schema(RAW_SCHEMA).parquet(staged)
            result = replay(
                spark,
                raw,
                to_run,
                settings.flap_window_ms,
                settings.top,
                parse_time_ms(settings.since),
                parse_time_ms(settings.until),
            )
        finally:
            spark.stop()
    if settings.report:
        path = write_report(result, settings.report)
        log.info(kv(event="replay_report", path=path))
    if settings.format == "json":
        json.dump(result["settings"], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_table(result))
    return 0
