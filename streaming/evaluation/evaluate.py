"""``isrwatch.status.evaluate`` as Spark expressions, and back to Python.

The aggregation's output rows are evaluated where they are, in the JVM: one
projection adds the ``ReplicaStatus`` columns, so the driver receives
statuses (``streaming.driver.rows`` makes them Python objects), not aggregates to evaluate one by one in Python (about 35 µs a
replica: the cost that capped the job, docs/benchmarks.md).

A replica is evaluated at the last time its leader answered
(``isrwatch.status.evaluate`` takes ``min(cluster clock, leader seen)``, and
the cluster clock is never behind a replica's own newest telemetry), so the
status is a function of the replica's own row: no clock needs to travel to
the executors.

``isrwatch.status.evaluate`` stays the reference: tests/streaming/test_evaluate.py
checks these expressions against it on generated aggregates.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
import pyspark.sql.functions as F
from pyspark.sql import Column, Window

from isrwatch.rule import Rule, RuleConfig
from isrwatch.status import STATUS_FIELDS, State, Thresholds
from streaming.evaluation import projection
from streaming.evaluation.state import variant_exprs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


__all__ = [
    "Reach",
    "STATUS_COLUMNS",
    "EXTRA_COLUMNS",
    "PREV_OBSERVED",
    "status_columns",
    "for_the_driver",
    "KEYS_INLINE",
    "with_key_flag",
    "held",
    "no_spare",
    "within_reach",
    "kept_up",
]

STATUS_COLUMNS = STATUS_FIELDS
# Carried beside each status for the driver: the replica's newest telemetry
# time (its cluster clock, and forgetting replicas whose telemetry stopped),
# how many observations it has had, ever (the batch's observation count), and
# the time of its observation before the newest (``PREV_OBSERVED``).
PREV_OBSERVED = "prev_observed_ms"
EXTRA_COLUMNS = ("last_t_ms", "observations", PREV_OBSERVED)
# A replica's observations in the batch (``observations``: all of them, the batch's included).
IN_BATCH = "_in_batch"
EPISODES = "out_of_sync_episodes"


class Reach(Protocol):
    """What the driver's lookahead (``streaming.driver.lookahead.Lookahead``) tells Spark of the
    followers it may carry to Nearing between batches (``within_reach``)."""

    @property
    def enabled(self) -> bool: ...

    @property
    def horizon_ms(self) -> int | None: ...  # None: ``horizon_share`` of each follower's lag time

    @property
    def horizon_share(self) -> float: ...

    @property
    def th(self) -> Thresholds: ...


def _state(ratio: Column, out_of_isr: Column, th: Thresholds) -> Column:
    return (
        F.when((ratio >= 1.0) | out_of_isr, F.lit(State.OUT_OF_SYNC.value))
        .when(ratio >= th.critical_ratio, F.lit(State.CRITICAL.value))
        .when(ratio >= th.nearing_ratio, F.lit(State.NEARING.value))
        .otherwise(F.lit(State.OK.value))
    )


def status_columns(
    aggs: DataFrame, cfg: RuleConfig, th: Thresholds, keep: Sequence[str] = (), only: Sequence[str] | None = None
) -> DataFrame:
    """``aggs`` (``streaming.evaluation.state.replica_aggregates``' columns) ->
    ``STATUS_COLUMNS`` + ``EXTRA_COLUMNS``, one row per replica, followed by the
    columns of ``aggs`` named in ``keep`` (other than those). ``only``: just these
    of the status columns, by the same expressions (the job's per-observation
    ``state`` and ``lag_state``: Spark computes no more than they need).
    ``PREV_OBSERVED`` is null unless ``aggs`` has it (only ``evaluate_batch``'s rows know
    a replica's observation before its newest; a state table's row does not)."""
    if PREV_OBSERVED not in aggs.columns:
        aggs = aggs.withColumn(PREV_OBSERVED, F.lit(None).cast("long"))
    first_parts, second_parts, final = _status_exprs(
        cfg, th, tuple(keep), EPISODES in aggs.columns, None if only is None else tuple(only)
    )
    first = projection.select(aggs, "*", *first_parts)
    return projection.select(projection.select(first, "*", *second_parts), *final)


@functools.lru_cache(maxsize=16)
def _status_exprs(
    cfg: RuleConfig, th: Thresholds, keep: tuple[str, ...], has_episodes: bool, only: tuple[str, ...] | None
) -> tuple[list[Column], list[Column], list[Column]]:
    """status_columns' three projections, built once per configuration (each Column
    costs calls into the JVM: rebuilt every batch, they took most of a second).
    ``has_episodes``: the rows carry an ``out_of_sync_episodes`` count (the job's
    state table does; an aggregate without it counts 0). ``only``: the status
    columns to compute (None: all)."""
    latest = F.col("latest")
    reported = latest["lag_time_max_ms"]
    # `agg.lag_time_max_ms or cfg.lag_time_max_ms`: missing or 0 -> the configured one.
    max_lag = F.when(reported.isNull() | (reported == 0), F.lit(cfg.lag_time_max_ms)).otherwise(reported)
    first = F.col("first_t_ms")
    now = F.coalesce(F.col("last_leader_answer_ms"), first)
    leo = F.coalesce(F.col("known_leo"), latest["leo"])
    leader_leo = F.coalesce(F.col("known_leader_leo"), latest["leader_leo"])
    # Two projections: the parts every status column uses, once, then the columns.
    # (One projection repeats the ratio's tree a dozen times: Spark took ~1 s a batch
    # just to analyse it; docs/benchmarks.md.)
    first_parts = [
        max_lag.alias("_max_lag"),
        now.alias("_now"),
        leo.alias("_leo"),
        leader_leo.alias("_leader_leo"),
        F.coalesce(latest["isr"], F.array().cast("array<int>")).alias("_isr"),
    ]
    max_lag, now, leo, leader_leo = F.col("_max_lag"), F.col("_now"), F.col("_leo"), F.col("_leader_leo")
    offset_lag = F.when(leader_leo.isNotNull(), F.greatest(F.lit(0), leader_leo - F.coalesce(leo, F.lit(0)))).otherwise(
        F.lit(0)
    )
    lcu = F.coalesce(F.col("last_caught_up_ms"), first)
    if cfg.rule is Rule.LEGACY_MESSAGES:
        fetched = F.coalesce(F.col("last_progress_ms"), first)
        age = F.greatest(F.lit(0), now - F.greatest(fetched, lcu))
        ratio = F.greatest(age / max_lag, offset_lag / F.lit(cfg.lag_max_messages))
        lcu = now - (ratio * max_lag).cast("long")
    else:
        if cfg.by_version:  # --rule auto: the variant of the Kafka version the replica's telemetry states
            refined, idle_caught_up = variant_exprs(cfg, latest["kafka_version"])
            idle = refined & idle_caught_up & leo.isNotNull() & leader_leo.isNotNull() & (leo >= leader_leo)
            lcu = F.when(idle, F.greatest(lcu, now)).otherwise(lcu)
        elif cfg.rule is Rule.KIP16_REFINED and cfg.idle_is_caught_up:
            idle = leo.isNotNull() & leader_leo.isNotNull() & (leo >= leader_leo)
            lcu = F.when(idle, F.greatest(lcu, now)).otherwise(lcu)
        ratio = F.greatest(F.lit(0), now - lcu) / max_lag
    second_parts = [offset_lag.alias("_offset_lag"), lcu.alias("_lcu"), ratio.alias("_ratio")]
    offset_lag, lcu, ratio = F.col("_offset_lag"), F.col("_lcu"), F.col("_ratio")
    # isrwatch.rule.check_period_ms: half of maxLag under the refined rule (per row under --rule auto).
    half = F.greatest(F.lit(1), F.floor(max_lag / 2).cast("long"))
    if cfg.by_version:
        period = F.when(variant_exprs(cfg, latest["kafka_version"])[0], half).otherwise(max_lag)
    else:
        period = half if cfg.rule is Rule.KIP16_REFINED else max_lag

    isr = F.col("_isr")
    in_isr = F.array_contains(isr, F.col("broker_id"))
    isr_size = F.size(isr)
    answered = F.coalesce(F.col("last_answer_ms"), first)
    # The follower silent in the newest round while its leader answered stall_after_ms after
    # it (``now`` is the leader's last answer). Not "the leader answered in the newest round":
    # one round its leader missed turned a stalled follower back and forth in one batch.
    stalled = latest["leo"].isNull() & (now - answered >= th.stall_after_ms) & (offset_lag > 0)
    lag_state = _state(ratio, (isr_size > 0) & ~in_isr, th)
    start = lcu + max_lag
    lag_ratio = F.when(ratio <= 0, F.lit(0.0)).otherwise(ratio).cast("double")
    episodes = F.coalesce(F.col(EPISODES), F.lit(0)) if has_episodes else F.lit(0)
    columns = {
        "cluster": F.col("cluster"),
        "topic": F.col("topic"),
        "partition": F.col("partition").cast("int"),
        "broker_id": F.col("broker_id").cast("int"),
        "leader_id": F.coalesce(latest["leader_id"], F.lit(-1)).cast("int"),
        "eval_ms": now.cast("long"),
        "state": F.when(stalled, F.lit(State.STALLED.value)).otherwise(lag_state),
        "time_since_caught_up_s": F.greatest(F.lit(0), now - lcu) / 1000.0,
        "lag_ratio": lag_ratio,
        "time_to_shrink_s": F.greatest(F.lit(0), start - now) / 1000.0,
        "offset_lag": offset_lag.cast("long"),
        "in_isr": in_isr,
        "isr_size": isr_size.cast("int"),
        "min_isr": latest["min_isr"].cast("int"),
        "lag_time_max_ms": max_lag.cast("long"),
        "shrink_window_start_ms": start.cast("long"),
        "shrink_window_end_ms": (start + period).cast("long"),
        "lag_state": lag_state,
        # One row's peak is its own ratio; streaming.evaluation.replicas takes the batch's.
        "peak_lag_ratio": lag_ratio,
        "out_of_sync_episodes": episodes.cast("long"),
        "last_t_ms": F.col("last_t_ms").cast("long"),
        "observations": F.col("observations").cast("long"),
        PREV_OBSERVED: F.col(PREV_OBSERVED).cast("long"),
    }
    assert tuple(columns) == STATUS_COLUMNS + EXTRA_COLUMNS, "keep status_columns in ReplicaStatus's order"
    names = tuple(columns) if only is None else only
    kept = [F.col(k) for k in keep if k not in names]
    return first_parts, second_parts, [*[columns[name].alias(name) for name in names], *kept]


def for_the_driver(
    statuses: DataFrame,
    watched_keys: Collection[str],
    refresh_batches: int,
    lookahead: Reach | None = None,
    clocks: bool = True,
) -> DataFrame:
    """The rows of ``status_columns``' output the driver needs when replicas that
    stay ok are refreshed only at every ``refresh_batches``-th observation
    (``--ok-refresh-batches``):

    * every replica not ok now (its alerts, its gauges);
    * every replica the driver watches (``watched_keys``, status keys,
      ``Monitor.watched_keys``): those it holds as not ok, whose return to ok
      resolves alerts, and those ``lookahead`` will carry to Nearing, whose
      catch-up cancels the crossing;
    * with ``lookahead``, every ok follower it may carry (``within_reach``): the
      driver must hold its newest status for the lookahead to say its crossing;
    * the replicas due for a refresh: a replica at its first observation ever,
      and then each time its count of observations (``observations``, of which
      ``IN_BATCH`` in this batch) passes a multiple of ``refresh_batches``, offset
      by a hash of the replica so that a fleet's refreshes spread over the batches.
      Counted in the replica's own observations, not in batches: a replica observed
      in only some batches (polled every 5 s at a 1 s trigger) is refreshed as
      surely as one observed in every batch;
    * the newest row of each cluster, which carries the cluster's telemetry clock (``clocks``:
      not for the state topic's records with ``--driver-replicas not-ok``, where Spark counts
      the clocks; a window over each cluster's rows, in one task, that a fleet's batch need
      not pay).

    ``refresh_batches`` 1 keeps every row.
    """
    if refresh_batches <= 1:
        return statuses
    n = F.lit(refresh_batches)
    offset = F.pmod(F.xxhash64(replica_key()), n)
    total = F.coalesce(F.col("observations"), F.col(IN_BATCH))
    before = total - F.col(IN_BATCH)
    due = (before <= 0) | (F.floor((total + offset) / n) > F.floor((before + offset) / n))
    keep = (F.col("state") != State.OK.value) | due | F.col(_WATCHED)
    if lookahead is not None and lookahead.enabled:
        keep = keep | within_reach(lookahead)
    flagged = with_key_flag(statuses, watched_keys, _WATCHED)
    if not clocks:
        return flagged.where(keep).drop(_WATCHED)
    rank = F.row_number().over(Window.partitionBy("cluster").orderBy(F.col("last_t_ms").desc()))
    return flagged.withColumn("_rank", rank).where(keep | (F.col("_rank") == 1)).drop("_rank", _WATCHED)


# Up to this many keys, ``with_key_flag`` tests a row's key against a literal set in the plan;
# beyond it, against a broadcast table of them. Spark analyses and optimises a literal set
# in time that grows faster than its size (a filter over 100,000 rows: 0.35 s with 1,000 keys,
# 5.3 s with 10,000, 25.5 s with 50,000; the broadcast table 0.20-0.42 s at each size, `bench.held_keys`:
# docs/benchmarks.md, "The driver's held replicas in an incident").
KEYS_INLINE = 256
_WATCHED = "_watched"


def replica_key() -> Column:
    """A row's replica as ``Monitor.watched_keys`` / ``Monitor.held_keys`` name it and the state
    topic keys its records (``isrwatch.status.status_key``):
    ``cluster/topic/partition/broker_id``."""
    return F.concat_ws(
        "/", F.col("cluster"), F.col("topic"), F.col("partition").cast("string"), F.col("broker_id").cast("string")
    )


def with_key_flag(rows: DataFrame, keys: Collection[str], name: str, inline: int | None = None) -> DataFrame:
    """``rows`` with a boolean column ``name``: whether the row's replica (``replica_key``) is one
    of ``keys``. At most ``inline`` (default ``KEYS_INLINE``) keys are a literal set in the plan;
    more are a table of their own, broadcast and joined (its keys are distinct, so no row is
    repeated): in an incident the driver holds thousands of replicas, and a literal set that
    size costs seconds a batch."""
    if len(keys) <= (KEYS_INLINE if inline is None else inline):
        flag = replica_key().isin(sorted(keys)) if keys else F.lit(False)
        return rows.withColumn(name, flag)
    keys_table = pa.table({"_flag_key": pa.array(sorted(keys), pa.string())})
    table = rows.sparkSession.createDataFrame(keys_table).withColumn(name, F.lit(True))
    joined = rows.join(F.broadcast(table), replica_key() == F.col("_flag_key"), "left")
    return joined.withColumn(name, F.coalesce(F.col(name), F.lit(False))).drop("_flag_key")


def held(default_min_isr: int, lookahead: Reach | None = None, watched: Column | None = None) -> Column:
    """Whether the driver holds a row of ``status_columns``' output with ``--driver-replicas
    not-ok`` (``Monitor`` with ``holds_ok`` off): a replica not ok (its alerts, its gauges); one
    the driver holds (``watched``, a flag of ``Monitor.held_keys`` made by ``with_key_flag``: a
    return to ok resolves its alerts, a catch-up cancels the lookahead's crossing, a spare back
    lets it go); an ok follower ``lookahead`` may carry (``within_reach``); and a follower of a
    partition without a spare in-sync replica (``no_spare``: its partition's alert and at-risk
    count need it). An ok replica that stays ok is none of these: it stays in Spark."""
    keep = (F.col("state") != State.OK.value) | no_spare(default_min_isr)
    if lookahead is not None and lookahead.enabled:
        keep = keep | within_reach(lookahead)
    if watched is not None:
        keep = keep | watched
    return keep


def no_spare(default_min_isr: int) -> Column:
    """A follower whose partition's ISR is no larger than its min ISR (``min_isr``, else
    ``default_min_isr``): ``isrwatch.alerts.partition_alert`` and the at-risk count
    (``exporter.families``) speak of its partition even while every follower is ok."""
    min_isr = F.col("min_isr")
    floor = F.when(min_isr.isNull() | (min_isr == 0), F.lit(default_min_isr)).otherwise(min_isr)
    return (F.col("isr_size") > 0) & (F.col("isr_size") <= floor)


def within_reach(lookahead: Reach) -> Column:
    """The rows of ok followers ``lookahead`` may carry to Nearing: in the ISR, behind,
    their crossing within its horizon of their own time (``Lookahead._crossing``'s test,
    a millisecond wider for its rounding up), and not caught up as of their previous
    observation (``kept_up``: ``Lookahead.observe`` plans none of those). A stalled
    follower is not ok: its row goes anyway."""
    lag = F.col("lag_time_max_ms")
    horizon = lag * lookahead.horizon_share if lookahead.horizon_ms is None else F.lit(lookahead.horizon_ms)
    behind_ms = F.col("time_since_caught_up_s") * 1000
    return (
        (F.col("lag_state") == State.OK.value)
        & F.col("in_isr")
        & (behind_ms > 0)
        & (behind_ms + horizon + 1 >= lag * lookahead.th.nearing_ratio)
        & ~kept_up()
    )


def kept_up() -> Column:
    """A row of ``status_columns``' output whose follower was caught up as of its observation
    before the newest (``PREV_OBSERVED``; false when that is not known): behind by no more
    than the interval between two observations, which is how often the collector polls it
    (``streaming.driver.lookahead.kept_up``, the same test)."""
    last_caught_up = F.col("shrink_window_start_ms") - F.col("lag_time_max_ms")
    return F.coalesce(last_caught_up >= F.col(PREV_OBSERVED), F.lit(False))
