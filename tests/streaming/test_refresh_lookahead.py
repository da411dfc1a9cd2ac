"""``--ok-refresh-batches`` N > 1 with the lookahead (Kafka telemetry): the rows of ok
replicas reach the driver only every N-th observation, but the lookahead carries an ok
follower that is behind to Nearing on the wall clock from the status the driver holds.
So a follower the lookahead may carry must reach the driver at every observation:

* while it is behind within the lookahead's reach (else the driver never learns it is
  due to cross between batches);
* once it catches up (else the lookahead carries a stale "behind" status to a Nearing
  the telemetry already refutes: found by reading the code, a false alert).

Through the job's own path: its batch handler (``streaming.lifecycle.handler.BatchHandler``) on raw
telemetry, into the monitor, then the timer's ``carry_forward`` on a wall clock the test sets."""

from __future__ import annotations

import datetime as dt

import pytest

from isrwatch.alerts import AlertName
from isrwatch.rule import Rule, RuleConfig
from isrwatch.status import Thresholds
from isrwatch.telemetry import Observation, TelemetryRecord, encode_record
from streaming.driver.checkpoint import DriverCheckpoint
from streaming.driver.lookahead import Lookahead, last_caught_up_ms
from streaming.evaluation.statetable import StateTable
from streaming.lifecycle.handler import BatchHandler
from streaming.sinks.outputs import DeadLetterFile
from streaming.sources.source_spool import RAW_SCHEMA

from .test_monitor import Clock, Collect, _monitor

pytestmark = pytest.mark.spark

LAG_MS = 10_000  # nearing at 5 s behind; the default horizon a quarter: 2.5 s
T0 = 1_700_000_000_000
REFRESH = 1000  # an ok replica refreshed at its first observation, then every 1000th
FOLLOWERS = (2, 3, 4, 5, 6, 7, 8)
IN_SYNC = (5, 6, 7, 8)


def _obs(broker: int, t_ms: int, leo: int, leader_leo: int) -> Observation:
    return Observation(
        "orders", 0, broker, 1, t_ms, leo, leader_leo, hw=min(leo, leader_leo),
        isr=(1, *FOLLOWERS), replicas=(1, *FOLLOWERS), lag_time_max_ms=LAG_MS, min_isr=1,
    )  # fmt: skip


def _raw(spark, batch_id: int, observations: list[Observation]):
    """One raw batch (the spool source's columns): a record per observation time."""
    by_t: dict[int, list[Observation]] = {}
    for o in observations:
        by_t.setdefault(o.t_ms, []).append(o)
    rows = [
        (None, encode_record(TelemetryRecord("c", "test", t, tuple(obs))), "telemetry", 0, batch_id * 100 + i,
         dt.datetime.fromtimestamp(t / 1000, dt.UTC))
        for i, (t, obs) in enumerate(sorted(by_t.items()))
    ]  # fmt: skip
    return spark.createDataFrame(rows, RAW_SCHEMA)


def handler_on(spark, tmp_path, monitor, **extra) -> BatchHandler:
    """The job's batch handler for ``monitor`` (its rule), its state and checkpoint under ``tmp_path``."""
    return BatchHandler(
        cfg=monitor.cfg,
        th=monitor.thresholds,
        table=StateTable(spark, str(tmp_path / "state")),
        monitor=monitor,
        store=monitor.store,
        deadletters=DeadLetterFile(str(tmp_path / "deadletters.jsonl")),
        checkpoint=DriverCheckpoint(tmp_path / "ck"),
        future_tolerance_ms=None,
        max_gap_ms=None,
        forget_after_ms=15 * 60_000,
        side_counts={},
        **extra,
    )


def _run(spark, handler, batch_id: int, observations: list[Observation]) -> set[int]:
    """One batch through the job's own handler; returns the brokers whose status the batch
    moved on (their newest row reached the driver)."""
    monitor = handler.monitor
    before = {key[3]: s.eval_ms for key, s in monitor.statuses.items()}
    handler(_raw(spark, batch_id, observations), batch_id)
    return {key[3] for key, s in monitor.statuses.items() if before.get(key[3]) != s.eval_ms}


def test_a_follower_the_lookahead_may_carry_reaches_the_driver_at_every_observation(spark, tmp_path) -> None:
    cfg, th = RuleConfig(Rule.KIP16_REFINED, LAG_MS), Thresholds()
    clock, sink = Clock(), Collect()
    monitor = _monitor(tmp_path / "ck", clock, sink, lookahead=Lookahead(cfg, th, live_ms=15_000))
    monitor.cfg = cfg
    handler = handler_on(spark, tmp_path, monitor, refresh_batches=REFRESH)
    # Batch 0, every replica's first observations (each goes to the driver): all caught up at
    # T0; then 2 and 3 behind 3 s, at two observations (a ratio of 0.3, ok, crossing at T0 + 5 s:
    # within the 2.5 s horizon of T0 + 3 s; not caught up as of the observation before, which
    # the lookahead would read as a poll interval), 4 behind 1 s (not within it), 5 to 8 in
    # sync. The leader's row is the cluster's newest (that row always goes: it carries the
    # cluster's clock).
    first = [_obs(b, T0, 100, 100) for b in FOLLOWERS]
    first += [_obs(b, t, 100, leo) for b in (2, 3) for t, leo in ((T0 + 1_000, 200), (T0 + 3_000, 400))]
    first += [_obs(4, T0 + 1_000, 100, 200)]
    first += [_obs(b, T0 + 3_000, 400, 400) for b in IN_SYNC] + [_obs(1, T0 + 3_001, 400, 400)]
    clock.t = (T0 + 3_500) / 1000
    assert _run(spark, handler, 0, first) == {1, *FOLLOWERS}
    # Batch 1: 2 has caught up; 3 is still behind; 4 is behind 4 s now (within the horizon).
    # No refresh is due and nothing changed state (all ok): 2's return must reach the driver
    # (else the lookahead carries its stale status to a Nearing the telemetry refutes), 3's
    # and 4's rows too (the lookahead needs each one's newest). The followers in sync do not.
    second = [_obs(2, T0 + 4_000, 500, 500), _obs(3, T0 + 4_000, 100, 500), _obs(4, T0 + 4_000, 100, 500)]
    second += [_obs(b, T0 + 4_000, 500, 500) for b in IN_SYNC] + [_obs(1, T0 + 4_001, 500, 500)]
    clock.t = (T0 + 4_500) / 1000
    reached = _run(spark, handler, 1, second)
    assert {2, 3, 4} <= reached, reached
    assert not set(IN_SYNC) <= reached, reached  # the refresh still holds the others back
    # Past the crossing on the wall clock (T0 + 5 s for 3 and 4), no batch since.
    clock.t = (T0 + 5_200) / 1000
    carried = monitor.carry_forward()
    assert sorted(s.broker_id for s in carried) == [3, 4], [(s.broker_id, s.lag_ratio) for s in carried]
    started = {(a.name, dict(a.labels)["broker_id"]) for t in sink.transitions for a in t.started}
    assert {(AlertName.NEARING, "3"), (AlertName.NEARING, "4")} <= started, started
    assert (AlertName.NEARING, "2") not in started, started


@pytest.mark.parametrize("horizon_ms", [None, 1_500])
def test_within_reach_keeps_every_follower_the_lookahead_would_carry(spark, horizon_ms) -> None:
    """``evaluate.within_reach`` (Spark) against ``Lookahead._crossing`` and ``kept_up`` (the
    driver's tests) on random statuses: every follower the lookahead may carry is kept, and only
    those, but for a crossing a millisecond outside the horizon (the Spark side's margin for
    rounding)."""
    import random
    from dataclasses import asdict, replace

    from isrwatch.status import ReplicaStatus, State
    from streaming.driver.lookahead import kept_up
    from streaming.evaluation.evaluate import PREV_OBSERVED, within_reach

    th = Thresholds()
    lookahead = Lookahead(RuleConfig(Rule.KIP16_REFINED, LAG_MS), th, live_ms=15_000, horizon_ms=horizon_ms)
    rng = random.Random(7)
    statuses = []
    for i in range(2_000):
        lag = rng.choice([2_000, LAG_MS, 30_000])
        behind = rng.choice([0, rng.randrange(0, lag), rng.randrange(0, lag // 2 + 1)])
        now = T0 + rng.randrange(0, 100_000)
        ratio = behind / lag
        state = State.OK if ratio < th.nearing_ratio else State.NEARING
        start = now - behind + lag  # the shrink window's start: the last catch-up plus the lag
        in_isr = rng.random() < 0.8
        statuses.append(
            ReplicaStatus(
                cluster="c",
                topic="t",
                partition=i,
                broker_id=2,
                leader_id=1,
                eval_ms=now,
                state=state,
                time_since_caught_up_s=behind / 1000.0,
                lag_ratio=ratio,
                time_to_shrink_s=0.0,
                offset_lag=0,
                in_isr=in_isr,
                isr_size=3,
                min_isr=2,
                lag_time_max_ms=lag,
                shrink_window_start_ms=start,
                shrink_window_end_ms=start + lag // 2,
            )
        )
    # Exactly at the edge of the horizon, and a millisecond either side of it.
    for s in statuses[:30]:
        reach = horizon_ms if horizon_ms is not None else s.lag_time_max_ms // 4
        edge = int(th.nearing_ratio * s.lag_time_max_ms) - reach
        for behind in (edge - 1, edge, edge + 1):
            statuses.append(
                replace(
                    s,
                    partition=len(statuses),
                    state=State.OK,
                    in_isr=True,
                    time_since_caught_up_s=behind / 1000.0,
                    lag_ratio=behind / s.lag_time_max_ms,
                    shrink_window_start_ms=s.eval_ms - behind + s.lag_time_max_ms,
                )
            )
    # Each row's observation before its newest: unknown, or a millisecond either side of its
    # last catch-up or at it (caught up as of it: kept up, ``kept_up``), or well before it.
    rows, prev = [], {}
    for s in statuses:
        lcu = last_caught_up_ms(s)
        prev[s.partition] = rng.choice([None, lcu - 1, lcu, lcu + 1, lcu - 5_000])
        d = asdict(s)
        d["state"], d["lag_state"] = s.state.value, s.lag_state.value
        rows.append({**d, PREV_OBSERVED: prev[s.partition]})
    kept = {r["partition"] for r in spark.createDataFrame(rows).where(within_reach(lookahead)).collect()}
    carried = {
        s.partition for s in statuses if lookahead._crossing(s) is not None and not kept_up(s, prev[s.partition])
    }
    assert carried, "the sample must hold followers within reach"
    assert any(kept_up(s, prev[s.partition]) and lookahead._crossing(s) is not None for s in statuses)
    assert carried <= kept, sorted(carried - kept)[:10]
    for s in statuses:
        if s.partition in kept - carried:  # only the margin: ok, in the ISR, behind, a millisecond out
            crossing = last_caught_up_ms(s) + th.nearing_ratio * s.lag_time_max_ms
            assert s.lag_state is State.OK and s.in_isr and s.time_since_caught_up_s > 0, s
            assert lookahead.horizon(s) < crossing - s.eval_ms <= lookahead.horizon(s) + 1, s
