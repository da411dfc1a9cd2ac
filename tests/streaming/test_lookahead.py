"""The lookahead between batches (streaming.driver.lookahead) through the driver's monitor, without
Spark: a follower behind is said nearing at its crossing on the wall clock, and only within
the bounds that keep a gap in telemetry from reading as a follower out of sync."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from isrwatch.alerts import AlertName
from isrwatch.rule import Rule, RuleConfig
from isrwatch.status import State, Thresholds, evaluate
from streaming.driver.identity import ClusterIdentity, Identities
from streaming.driver.lookahead import Lookahead, carry, last_caught_up_ms
from streaming.evaluation.state import row_to_aggregate
from tests.streaming.test_monitor import Clock, Collect, _monitor, _row

LAG_MS = 10_000  # _row's replica.lag.time.max.ms
HORIZON_MS = LAG_MS // 4  # the default
T0 = 1_000_000  # telemetry time of the first batch (ms); the wall clock is set to match


def _setup(tmp_path, rule: Rule = Rule.KIP16_REFINED, horizon_ms: int | None = None):
    clock, sink = Clock(), Collect()
    cfg = RuleConfig(rule, LAG_MS)
    m = _monitor(tmp_path, clock, sink, lookahead=Lookahead(cfg, Thresholds(), live_ms=15_000, horizon_ms=horizon_ms))
    m.cfg = cfg
    return m, clock, sink


def _batch(
    m,
    batch_id: int,
    t_ms: int,
    caught_up_ms: int,
    *,
    in_isr: bool = True,
    leo: int = 10,
    silent_ms: int = 0,
    prev_ms: int | None = None,
):
    """One batch of one replica evaluated at ``t_ms``; ``silent_ms`` > 0: its broker has not
    answered for that long (no LEO in the newest observation) while its leader does.
    ``prev_ms``: the time of its observation before, as Spark's row gives it (None: not known)."""
    row = _row(t_ms, caught_up_ms, batch_id + 1)
    row["latest"]["leo"] = row["known_leo"] = leo
    if silent_ms:
        row["latest"]["leo"] = None
        row["last_answer_ms"] = t_ms - silent_ms
    if not in_isr:
        row["latest"]["isr"] = [1]
    agg = row_to_aggregate(row)
    s = evaluate(agg, t_ms, m.cfg, m.thresholds)
    return m.apply_statuses(batch_id, [(s, t_ms, batch_id + 1, prev_ms)])


def _started(sink) -> list[tuple[str, int]]:
    return [(a.name.value, a.starts_ms) for t in sink.transitions for a in t.started]


def _resolved(sink) -> list[str]:
    return [a.name.value for t in sink.transitions for a in t.resolved]


def test_a_follower_behind_is_nearing_at_its_crossing_on_the_wall_clock(tmp_path) -> None:
    m, clock, sink = _setup(tmp_path)
    # Behind for 3 s of 10 at T0: it crosses 0.5 at lcu + 5 s = T0 + 2 s, within the horizon.
    _batch(m, 0, T0, T0 - 3_000)
    clock.t = (T0 + 1_900) / 1000
    assert m.carry_forward() == [] and not _started(sink)
    clock.t = (T0 + 2_000) / 1000
    [carried] = m.carry_forward()
    assert carried.lag_state is State.NEARING and carried.lag_ratio == 0.5 and carried.eval_ms == T0 + 2_000
    assert _started(sink) == [(AlertName.NEARING.value, T0 + 2_000)]
    assert next(iter(m.store.snapshot().statuses())).lag_ratio == 0.5  # the job's own gauges say so too
    assert m.carry_forward() == []  # said once


def test_a_follower_caught_up_as_of_its_previous_observation_is_not_carried(tmp_path) -> None:
    """A collector polling every 2.6 s at a 10 s lag time: a follower that keeps up with its
    previous observation is 2.6 s behind at each one, past the quarter of the lag the horizon
    starts from, and its crossing (lcu + 5 s) would come before the next observation. Its age
    says how often it is polled, not that it stopped: not carried (found on real Kafka,
    tests/e2e/test_two_clusters.py's fleet shape: false Nearings for a cluster polled every 6 s
    at a 20 s lag). An observation that still shows it behind is evidence: carried then."""
    m, clock, sink = _setup(tmp_path)
    _batch(m, 0, T0, T0)  # caught up
    _batch(m, 1, T0 + 2_600, T0, prev_ms=T0)  # behind since the observation before
    clock.t = (T0 + 5_000) / 1000
    assert m.carry_forward() == [] and not _started(sink)
    _batch(m, 2, T0 + 5_200, T0 + 2_600, prev_ms=T0 + 2_600)  # polled again: kept up with the one before
    # the next round (sooner) still shows it behind since T0 + 2.6 s: it did not fetch since
    _batch(m, 3, T0 + 6_000, T0 + 2_600, prev_ms=T0 + 5_200)
    clock.t = (T0 + 7_600) / 1000
    [carried] = m.carry_forward()
    assert carried.eval_ms == T0 + 7_600 and _started(sink) == [(AlertName.NEARING.value, T0 + 7_600)]


def test_a_follower_whose_previous_observation_is_not_known_is_planned_from_its_age(tmp_path) -> None:
    """The same status without the time of the observation before (a replica's first, a status
    restored from the state table): its age is all there is, and it is carried at its crossing."""
    m, clock, sink = _setup(tmp_path)
    _batch(m, 0, T0, T0)
    _batch(m, 1, T0 + 2_600, T0)
    clock.t = (T0 + 5_000) / 1000
    [carried] = m.carry_forward()
    assert carried.eval_ms == T0 + 5_000 and _started(sink) == [(AlertName.NEARING.value, T0 + 5_000)]


def test_a_stalled_follower_caught_up_as_of_its_previous_observation_is_still_carried(tmp_path) -> None:
    """Polled every 3 s, but the newest observation says the follower's broker is silent (no
    LEO) for the stall time while its leader answers: evidence that it fetches nothing, carried
    at its crossing."""
    m, clock, sink = _setup(tmp_path)
    _batch(m, 0, T0, T0)
    _batch(m, 1, T0 + 3_000, T0, silent_ms=3_000, prev_ms=T0)
    assert m.statuses[("c", "t", 0, 2)].state is State.STALLED
    clock.t = (T0 + 5_000) / 1000
    [carried] = m.carry_forward()
    assert carried.state is State.STALLED and (AlertName.NEARING.value, T0 + 5_000) in _started(sink)


def test_evidence_that_agrees_keeps_the_alert_and_evidence_that_refutes_it_resolves_it(tmp_path) -> None:
    m, clock, sink = _setup(tmp_path)
    _batch(m, 0, T0, T0 - 3_000)
    clock.t = (T0 + 2_100) / 1000
    m.carry_forward()
    # The next batch's telemetry ends before the crossing, with the same last catch-up:
    # it agrees; no transition. (The state topic has Spark's evaluated rows, never the carried
    # status: streaming.sinks.statewriter, tests/streaming/test_statewriter.py.)
    _batch(m, 1, T0 + 1_500, T0 - 3_000)
    assert _started(sink) == [(AlertName.NEARING.value, T0 + 2_000)] and not _resolved(sink)
    assert next(iter(m.store.snapshot().statuses())).eval_ms == T0 + 2_000
    # Then telemetry past the crossing, still behind: evidence of the same alert, held.
    _batch(m, 2, T0 + 2_500, T0 - 3_000)
    assert len(_started(sink)) == 1 and not _resolved(sink)
    # Then the follower caught up: resolved.
    _batch(m, 3, T0 + 3_000, T0 + 2_900, leo=20)
    assert _resolved(sink) == [AlertName.NEARING.value]


def test_a_catch_up_before_the_crossing_resolves_the_carried_alert(tmp_path) -> None:
    m, clock, sink = _setup(tmp_path)
    _batch(m, 0, T0, T0 - 3_000)
    clock.t = (T0 + 2_000) / 1000
    m.carry_forward()
    _batch(m, 1, T0 + 1_500, T0 + 1_000, leo=20)  # it had caught up at T0 + 1 s
    assert _resolved(sink) == [AlertName.NEARING.value]
    clock.t += 60
    assert m.carry_forward() == []


def test_nothing_is_inferred_further_than_the_horizon_past_the_newest_telemetry(tmp_path) -> None:
    m, clock, sink = _setup(tmp_path)
    # Behind for 2 s: its crossing is 3 s after the evidence, past the 2.5 s horizon.
    _batch(m, 0, T0, T0 - 2_000)
    for wall in (T0 + 3_000, T0 + 10_000):
        clock.t = wall / 1000
        assert m.carry_forward() == []
    assert not _started(sink)


def test_a_stalled_follower_is_carried_from_further_back(tmp_path) -> None:
    """Its broker silent for the stall time while its leader answers: evidence that it fetches
    nothing, so its crossing is said on the wall clock even when the newest telemetry is
    more than the quarter horizon before it; the same follower answering is not."""
    m, clock, sink = _setup(tmp_path)
    # Behind for 1 s, silent for 3 s (the stall time): it crosses 0.5 at T0 + 4 s, 4 s
    # after its newest status: past the quarter horizon (2.5 s), within the stalled one.
    _batch(m, 0, T0, T0 - 1_000, silent_ms=3_000)
    assert m.statuses[("c", "t", 0, 2)].state is State.STALLED
    clock.t = (T0 + 4_000) / 1000
    [carried] = m.carry_forward()
    assert carried.state is State.STALLED and carried.lag_state is State.NEARING and carried.eval_ms == T0 + 4_000
    assert (AlertName.NEARING.value, T0 + 4_000) in _started(sink)
    # The same evidence from a follower that answers: beyond the horizon, nothing inferred.
    m2, clock2, sink2 = _setup(tmp_path / "2")
    _batch(m2, 0, T0, T0 - 1_000)
    clock2.t = (T0 + 4_000) / 1000
    assert m2.carry_forward() == [] and not _started(sink2)


def test_a_follower_caught_up_or_out_of_the_isr_is_not_carried(tmp_path) -> None:
    m, clock, sink = _setup(tmp_path)
    _batch(m, 0, T0, T0, leo=20)  # caught up at its newest telemetry
    clock.t = (T0 + HORIZON_MS) / 1000
    assert m.carry_forward() == []
    m2, clock2, sink2 = _setup(tmp_path / "2")
    _batch(m2, 0, T0, T0 - 3_000, in_isr=False)  # already out of sync from evidence
    clock2.t = (T0 + 2_000) / 1000
    assert m2.carry_forward() == []
    assert [n for n, _ in _started(sink2)] == [
        AlertName.NEARING.value, AlertName.IMMINENT.value, AlertName.OUT_OF_SYNC.value
    ]  # fmt: skip


def test_telemetry_behind_the_wall_clock_carries_nothing(tmp_path) -> None:
    """A backlog, a replay or a collector's clock well behind: the cluster's newest telemetry
    is older than the stale limit on the wall clock, so the crossing waits for evidence."""
    m, clock, sink = _setup(tmp_path)
    _batch(m, 0, T0, T0 - 3_000)
    clock.t = (T0 + 16_000) / 1000
    assert m.carry_forward() == []


def test_off_for_the_legacy_rule_and_at_zero(tmp_path) -> None:
    for rule, horizon in ((Rule.LEGACY_MESSAGES, None), (Rule.KIP16_REFINED, 0)):
        m, clock, sink = _setup(tmp_path / f"{rule.value}{horizon}", rule, horizon)
        _batch(m, 0, T0, T0 - 3_000)
        clock.t = (T0 + 2_000) / 1000
        assert m.carry_forward() == []


@given(
    age=st.integers(0, 9_999),
    ahead=st.integers(0, 20_000),
    stalled=st.booleans(),
)
def test_carry_grows_only_the_age(age: int, ahead: int, stalled: bool) -> None:
    """``carry`` is the reference evaluated later with no new evidence: the same last
    catch-up, the ratio of the longer age, the state of that ratio (stalled kept)."""
    cfg, th = RuleConfig(Rule.KIP16, LAG_MS), Thresholds()
    row = _row(T0, T0 - age, 1)
    if stalled:
        row["latest"]["leo"] = None
        row["last_answer_ms"] = T0 - 5_000
    s = evaluate(row_to_aggregate(row), T0, cfg, th)
    later = carry(s, T0 + ahead, th)
    again = evaluate(
        row_to_aggregate({**row, "last_t_ms": T0 + ahead, "last_leader_answer_ms": T0 + ahead}), T0 + ahead, cfg, th
    )
    assert last_caught_up_ms(later) == last_caught_up_ms(s)
    assert abs(later.lag_ratio - again.lag_ratio) < 1e-9
    assert later.lag_state is again.lag_state
    assert (later.state is State.STALLED) == (s.state is State.STALLED)
    assert later.time_to_shrink_s == again.time_to_shrink_s


def test_a_restart_keeps_a_carried_alert_that_its_evidence_still_agrees_with(tmp_path) -> None:
    """The job stopped after saying Nearing between batches: restored from the same evidence
    (its state store), the first batch older than the crossing must not resolve it."""
    m, clock, sink = _setup(tmp_path)
    _batch(m, 0, T0, T0 - 3_000)
    clock.t = (T0 + 2_000) / 1000
    m.carry_forward()
    restored = m.statuses[("c", "t", 0, 2)]
    evidence = evaluate(row_to_aggregate(_row(T0, T0 - 3_000, 1)), T0, m.cfg, m.thresholds)
    again, clock2, sink2 = _setup(tmp_path)  # the same checkpoint: the alert book
    assert restored.eval_ms == T0 + 2_000 and again.book.active
    again.restore([(evidence, T0, 1, None)])
    _batch(again, 1, T0 + 1_500, T0 - 3_000)
    assert not _resolved(sink2) and not _started(sink2)
    _batch(again, 2, T0 + 3_000, T0 + 2_900, leo=20)
    assert _resolved(sink2) == [AlertName.NEARING.value]


def test_a_last_catch_up_moved_a_round_later_by_late_telemetry_keeps_the_alert(tmp_path) -> None:
    """Observations that arrive late (a late partition) can raise the last catch-up by a
    collector round: the follower is still behind and crosses 0.5 s later; the alert holds
    (no resolve and start again), its status carried to the later crossing."""
    m, clock, sink = _setup(tmp_path)
    _batch(m, 0, T0, T0 - 3_000)
    clock.t = (T0 + 2_000) / 1000
    m.carry_forward()
    _batch(m, 1, T0 + 1_500, T0 - 2_500)
    assert _started(sink) == [(AlertName.NEARING.value, T0 + 2_000)] and not _resolved(sink)
    held = m.statuses[("c", "t", 0, 2)]
    assert held.eval_ms == T0 + 2_500 and held.lag_ratio == 0.5
    _batch(m, 2, T0 + 3_000, T0 - 2_500)  # evidence past the crossing: Nearing from telemetry
    assert len(_started(sink)) == 1 and not _resolved(sink)


class Brokers:
    """What ``streaming.driver.brokerwatch.BrokerWatch`` tells the monitor, set by the test: the
    telemetry cluster's brokers 1 and 2 at 127.0.0.1:9091+id, no cluster id (Kafka 0.9)."""

    def __init__(self, silent: dict[int, float], cluster_id: str | None = None) -> None:
        self._silent = silent
        self._resumed: dict[int, float] = {}
        self.cluster_id = cluster_id
        self.asked: list[tuple[float, float]] = []

    def silent(self, now: float, after_s: float) -> dict[int, float]:
        self.asked.append((now, after_s))
        return {b: t for b, t in self._silent.items() if now - t >= after_s}

    def resumed(self, after_s: float) -> dict[int, float]:
        return dict(self._resumed)

    def identity(self) -> ClusterIdentity:
        return ClusterIdentity(self.cluster_id, {1: ("127.0.0.1", 9092), 2: ("127.0.0.1", 9093)})


# What the collector of cluster "c" (``_row``'s) states of it: the same brokers at the same addresses.
SAME_BROKERS = {"endpoints": [{"broker_id": b, "host": "127.0.0.1", "port": 9091 + b} for b in (1, 2)]}


def _setup_watched(tmp_path, silent: dict[int, float], stated: dict | None = SAME_BROKERS, named: str | None = None):
    """The monitor with the job's own look at its telemetry cluster's brokers; ``stated``:
    what cluster "c"'s collector says of it (None: nothing, an older collector)."""
    m, clock, sink = _setup(tmp_path)
    m.broker_watch = Brokers(silent)
    m.identities = Identities(named)
    if stated is not None:
        m.identify([("c", stated)])
    return m, clock, sink


def test_a_follower_on_a_broker_silent_to_the_job_is_nearing_while_the_telemetry_stands_still(tmp_path) -> None:
    """isrwatch's topics on the watched cluster, held up by the hung broker: no telemetry after
    T0, the follower's broker silent to the job since T0 + 1 s while its other broker answers.
    Its crossing: the broker's last answer (T0 + 1 s; the telemetry saw it caught up at T0, and
    it went on fetching until it stopped) + lag/2, said stalled and nearing."""
    m, clock, sink = _setup_watched(tmp_path, {2: (T0 + 1_000) / 1000})
    _batch(m, 0, T0, T0, leo=20)  # caught up at T0, the newest telemetry
    clock.t = (T0 + 5_999) / 1000
    assert m.carry_forward() == []
    clock.t = (T0 + 6_000) / 1000
    [carried] = m.carry_forward()
    assert carried.state is State.STALLED and carried.lag_state is State.NEARING and carried.eval_ms == T0 + 6_000
    assert last_caught_up_ms(carried) == T0 + 1_000
    assert (AlertName.NEARING.value, T0 + 6_000) in _started(sink)
    clock.t = (T0 + 7_000) / 1000
    assert m.carry_forward() == [], "said once"


def _read_back(m, t_ms: int, caught_up_ms: int, leo: int):
    """The follower as the state table last held it (what ``Monitor.followers_of`` reads back
    in the job: ``streaming.lifecycle.query.follower_statuses``, tested on a real state table in
    tests/streaming/test_driver_replicas.py): its status, newest telemetry time, observations,
    and no time of an observation before (the state table keeps only the newest)."""
    row = _row(t_ms, caught_up_ms, 1)
    row["latest"]["leo"] = row["known_leo"] = leo
    return (evaluate(row_to_aggregate(row), t_ms, m.cfg, m.thresholds), t_ms, 1, None)


def _not_ok_watched(tmp_path, read_back: bool):
    """A monitor holding only replicas not ok (``holds_ok`` off), broker 2 silent to the job
    since T0 + 1 s; ``read_back``: with ``followers_of`` (which records what it is asked)."""
    asked: list[set[tuple[str, int]]] = []
    clock, sink = Clock(), Collect()
    cfg = RuleConfig(Rule.KIP16_REFINED, LAG_MS)
    lookahead = Lookahead(cfg, Thresholds(), live_ms=15_000)
    monitor = _monitor(tmp_path, clock, sink, lookahead=lookahead, holds_ok=False)
    monitor.cfg = cfg

    def followers_of(brokers):
        asked.append(set(brokers))
        return [_read_back(monitor, T0, T0, 20)]

    monitor.followers_of = followers_of if read_back else None
    monitor.broker_watch = Brokers({2: (T0 + 1_000) / 1000})
    monitor.identify([("c", SAME_BROKERS)])
    return monitor, clock, sink, asked


def test_with_only_replicas_not_ok_held_a_silent_broker_s_ok_followers_are_read_back_and_carried(tmp_path) -> None:
    """``--driver-replicas not-ok``: the driver lets the ok follower go after its batch, so on
    its broker's silence (the telemetry frozen with it) it had nobody to carry and the Nearing
    came only with the shrink. Now the broker's ok in-sync followers are read back from the
    state (once, until a batch) and carried as with every replica held."""
    for read_back in (False, True):
        monitor, clock, sink, asked = _not_ok_watched(tmp_path / str(read_back), read_back)
        _batch(monitor, 0, T0, T0, leo=20)  # caught up at T0, the newest telemetry
        assert monitor.statuses == {}, "ok: let go after its batch"
        clock.t = (T0 + 5_999) / 1000
        assert monitor.carry_forward() == []
        clock.t = (T0 + 6_000) / 1000
        carried = monitor.carry_forward()  # (with the read back: asked on its thread, carried once in)
        assert monitor.wait_read_back(30)
        carried += monitor.carry_forward()
        if not read_back:
            assert carried == [] and not _started(sink), "nothing held, nothing carried"
            continue
        assert asked == [{("c", 2)}], "read back once, when the broker fell silent"
        [one] = carried
        assert one.state is State.STALLED and one.lag_state is State.NEARING and one.eval_ms == T0 + 6_000
        assert (AlertName.NEARING.value, T0 + 6_000) in _started(sink)
        clock.t = (T0 + 7_000) / 1000
        assert monitor.carry_forward() == [] and len(asked) == 1
        # the broker answers again and the telemetry shows the follower caught up: resolved, let go
        monitor.broker_watch._silent = {}
        clock.t = (T0 + 8_000) / 1000
        _batch(monitor, 1, T0 + 8_000, T0 + 8_000, leo=20)
        assert AlertName.NEARING.value in _resolved(sink)
        assert monitor.statuses == {}


def test_a_silent_broker_s_followers_read_back_stay_held_through_batches_until_it_answers(tmp_path) -> None:
    """Read back before their crossing, the followers stay held through the batches that come
    while their broker is silent (each would have let them go, and the next tick read the
    table again: a Spark job per batch for the whole fault), are carried at the crossing, and
    are let go once the broker answers again and a batch shows them caught up."""
    monitor, clock, sink, asked = _not_ok_watched(tmp_path, True)
    _batch(monitor, 0, T0, T0, leo=20)
    clock.t = (T0 + 4_500) / 1000  # silent 3.5 s (over the stall time), the crossing at T0 + 6 s
    assert monitor.carry_forward() == []
    assert monitor.wait_read_back(30) and asked == [{("c", 2)}]
    assert len(monitor.statuses) == 1, "held, ok, before its crossing"
    _batch(monitor, 1, T0, T0, leo=20)  # a batch while the telemetry stands still
    assert len(monitor.statuses) == 1, "kept through the batch"
    clock.t = (T0 + 5_000) / 1000
    assert monitor.carry_forward() == []
    assert monitor.wait_read_back(30) and asked == [{("c", 2)}], "not read again"
    clock.t = (T0 + 6_000) / 1000
    [one] = monitor.carry_forward()
    assert one.lag_state is State.NEARING and one.eval_ms == T0 + 6_000
    monitor.broker_watch._silent = {}
    clock.t = (T0 + 8_000) / 1000
    _batch(monitor, 2, T0 + 8_000, T0 + 8_000, leo=20)
    assert AlertName.NEARING.value in _resolved(sink)
    assert monitor.statuses == {} and monitor._held_silent == set()


def test_the_silence_bounds_the_last_catch_up(tmp_path) -> None:
    """Telemetry that saw the follower caught up later than the broker's last answer to the
    job (the collector's clock ahead, or its round later) cannot put the crossing after
    the last answer + lag/2: a broker that answers nobody fetches nothing. (And telemetry
    that ends seconds before the silence, a slow batch under load, cannot put it before:
    see the test above.)"""
    m, clock, sink = _setup_watched(tmp_path, {2: (T0 - 2_000) / 1000})
    _batch(m, 0, T0, T0, leo=20)
    # the telemetry must have stood still for nearly a crossing (lag/2 - 1 s) first
    clock.t = (T0 + 3_999) / 1000
    assert m.carry_forward() == []
    clock.t = (T0 + 4_000) / 1000
    [carried] = m.carry_forward()
    assert carried.eval_ms == T0 + 3_000 and last_caught_up_ms(carried) == T0 - 2_000


def test_telemetry_from_the_silence_does_not_refute_the_carried_nearing(tmp_path) -> None:
    """Once the broker answers, the backlog brings telemetry from before and during the
    silence: a status that shows no catch-up after the one assumed keeps the alert (it
    used to resolve it and the next batches fire it again); a real catch-up resolves it."""
    m, clock, sink = _setup_watched(tmp_path, {2: (T0 + 1_000) / 1000})
    _batch(m, 0, T0, T0, leo=20)
    clock.t = (T0 + 6_000) / 1000
    assert len(m.carry_forward()) == 1
    _batch(m, 1, T0 + 1_500, T0 + 1_000, leo=10)  # backlog: caught up at T0 + 1 s, behind since
    assert not [a for t in sink.transitions for a in t.resolved], "the carried Nearing holds"
    assert m.statuses[("c", "t", 0, 2)].lag_state is State.NEARING
    _batch(m, 2, T0 + 7_000, T0 + 7_000, leo=20)  # it caught up: resolved
    assert AlertName.NEARING.value in [a.name.value for t in sink.transitions for a in t.resolved]


def test_no_carry_while_the_telemetry_goes_on_or_for_another_cluster_or_an_answering_broker(tmp_path) -> None:
    # the telemetry current (within the stall time of the wall clock): it shows the stall itself
    m, clock, sink = _setup_watched(tmp_path, {2: (T0 - 20_000) / 1000})
    _batch(m, 0, T0, T0 - 4_000)
    clock.t = (T0 + 2_999) / 1000
    carried = m.carry_forward()  # (behind 4 s at T0: the telemetry's own lookahead carries it)
    assert carried and all(c.state is not State.STALLED for c in carried)
    # a separate telemetry cluster: the watched cluster's broker 2 is at another address
    other = {"endpoints": [{"broker_id": 2, "host": "kafka2.prod", "port": 9092}]}
    m2, clock2, sink2 = _setup_watched(tmp_path / "2", {2: (T0 + 1_000) / 1000}, stated=other)
    _batch(m2, 0, T0, T0, leo=20)
    clock2.t = (T0 + 20_000) / 1000
    assert m2.carry_forward() == [] and not _started(sink2)
    # every broker answering (a collector stopped): nothing, the gap is the stale alert's
    m3, clock3, sink3 = _setup_watched(tmp_path / "3", {})
    _batch(m3, 0, T0, T0, leo=20)
    clock3.t = (T0 + 20_000) / 1000
    assert m3.carry_forward() == [] and not _started(sink3)
    # a follower out of the ISR already: evidence has it
    m4, clock4, sink4 = _setup_watched(tmp_path / "4", {2: (T0 + 1_000) / 1000})
    _batch(m4, 0, T0, T0, leo=20, in_isr=False)
    clock4.t = (T0 + 20_000) / 1000
    assert m4.carry_forward() == []


def test_telemetry_after_the_broker_answers_again_replaces_the_carried_status(tmp_path) -> None:
    m, clock, sink = _setup_watched(tmp_path, {2: (T0 + 1_000) / 1000})
    _batch(m, 0, T0, T0, leo=20)
    clock.t = (T0 + 6_000) / 1000
    assert len(m.carry_forward()) == 1
    m.broker_watch._silent = {}  # it answers again, and the telemetry shows it caught up
    clock.t = (T0 + 8_000) / 1000
    _batch(m, 1, T0 + 8_000, T0 + 8_000, leo=20)
    assert m.statuses[("c", "t", 0, 2)].lag_state is State.OK
    resolved = [a.name.value for t in sink.transitions for a in t.resolved]
    assert AlertName.NEARING.value in resolved


def test_a_slow_batch_before_the_silence_neither_brings_the_alert_forward_nor_flaps_it(tmp_path) -> None:
    """The fresh-clone run of 2026-11-26: the job's newest telemetry ended 5 s before the
    broker stopped answering (a 7.5 s batch under load). Its crossing is the last answer +
    lag/2, not the telemetry's last catch-up + lag/2 (5 s early), and the batch that then
    brings the telemetry up to the silence (caught up until just before it) keeps the alert."""
    m, clock, sink = _setup_watched(tmp_path, {2: (T0 + 5_000) / 1000})
    _batch(m, 0, T0, T0, leo=20)
    clock.t = (T0 + 9_999) / 1000
    assert m.carry_forward() == [], "not from the telemetry's older catch-up"
    clock.t = (T0 + 10_000) / 1000
    [carried] = m.carry_forward()
    assert carried.eval_ms == T0 + 10_000
    _batch(m, 1, T0 + 4_500, T0 + 4_500, leo=20)  # the slow batch's telemetry: caught up at T0 + 4.5 s
    assert not [a for t in sink.transitions for a in t.resolved], "the carried Nearing holds"


def test_a_restarted_job_does_not_end_what_its_first_run_fired_with_older_telemetry(tmp_path) -> None:
    """The first run fired Nearing from telemetry; the restarted job's state and first batch
    are from before the alert began (it re-reads telemetry the first run had not aggregated
    yet: deferred ranges, a batch in flight). That evidence cannot end the alert (seen on real
    Kafka: resolved, then fired again a batch later); later telemetry still can. With the
    lookahead off (``--lookahead-ms 0``), which otherwise may carry the restored status on."""
    m, clock, sink = _setup(tmp_path, horizon_ms=0)
    _batch(m, 0, T0, T0 - 6_000)  # 0.6 of the lag: Nearing since its crossing, T0 - 1 s
    start = T0 - 1_000
    assert _started(sink) == [(AlertName.NEARING.value, start)]
    m2, clock2, sink2 = _setup(tmp_path, horizon_ms=0)  # the same checkpoint: the book has it firing
    clock2.t = start / 1000
    old = _row(start - 500, start - 5_400, 1)
    m2.restore([(evaluate(row_to_aggregate(old), start - 500, m2.cfg, m2.thresholds), start - 500, 1, None)])
    _batch(m2, 1, start - 300, start - 4_500)  # a later catch-up than the first run knew: 0.42
    assert not _resolved(sink2) and not _started(sink2)
    _batch(m2, 2, start + 1_000, start + 900, leo=20)  # caught up after the alert began: it ends
    assert _resolved(sink2) == [AlertName.NEARING.value] and not _started(sink2)


def test_telemetry_that_flows_from_a_collector_clock_behind_the_jobs_is_not_still(tmp_path) -> None:
    """The collector's clock 30 s behind the job's (tests/e2e/test_clock_skew.py): its telemetry
    times trail the job's clock by 30 s while it flows, every second. A broker silent to the job
    alone (the telemetry shows its follower caught up) is not carried: the telemetry does not
    stand still. (It did when standing still was the job's clock minus the telemetry's time.)
    Once the telemetry stops, the broker's silence speaks as on one clock."""
    skew_ms = 30_000
    m, clock, sink = _setup_watched(tmp_path, {2: (T0 + skew_ms + 1_000) / 1000})
    for i in range(12):
        clock.t = (T0 + skew_ms + i * 1_000) / 1000
        _batch(m, i, T0 + i * 1_000, T0 + i * 1_000, leo=20)
        assert m.carry_forward() == [], i
    assert not _started(sink)
    # The telemetry stops: its newest time (T0 + 11 s) reached the job at T0 + 41 s on the job's
    # clock, 30 s behind, of which the stall time (3 s) counts as the pipeline's delay. Still
    # for 4 s (lag/2 - 1 s) one second later, and the follower's crossing (the broker's last
    # answer + lag/2) has come: carried, from that crossing.
    clock.t = (T0 + skew_ms + 11_000 + 999) / 1000
    assert m.carry_forward() == []
    clock.t = (T0 + skew_ms + 11_000 + 1_000) / 1000
    [carried] = m.carry_forward()
    assert carried.state is State.STALLED and last_caught_up_ms(carried) == T0 + skew_ms + 1_000
    assert carried.eval_ms == T0 + skew_ms + 1_000 + LAG_MS // 2


def _silent_follower_carried(tmp_path, stated: dict | None, named: str | None = None, cluster_id=None) -> bool:
    """Whether cluster "c"'s follower on broker 2, silent to the job, is carried to Nearing."""
    m, clock, sink = _setup_watched(tmp_path, {2: (T0 + 1_000) / 1000}, stated=stated, named=named)
    m.broker_watch.cluster_id = cluster_id
    _batch(m, 0, T0, T0, leo=20)
    clock.t = (T0 + 20_000) / 1000
    return bool(m.carry_forward())


def test_the_jobs_own_evidence_reaches_a_watched_cluster_only_when_it_is_the_telemetry_cluster(tmp_path) -> None:
    """Issue 52: known by the cluster id where both sides have one, else by the same broker id at
    the same address, or by the operator's --telemetry-cluster; unknown is not the same."""
    ep = SAME_BROKERS["endpoints"]
    assert _silent_follower_carried(tmp_path / "a", SAME_BROKERS)  # Kafka 0.9: the addresses
    assert not _silent_follower_carried(tmp_path / "b", None)  # nothing stated: unknown
    assert _silent_follower_carried(tmp_path / "c", None, named="c")  # the operator says so
    assert not _silent_follower_carried(tmp_path / "d", None, named="other")
    # the same broker id at another address (another cluster numbering its brokers alike)
    moved = {"endpoints": [{**e, "port": 19093} if e["broker_id"] == 2 else e for e in ep]}
    assert not _silent_follower_carried(tmp_path / "e", moved)
    # cluster ids decide where both sides have one, whatever the addresses
    assert _silent_follower_carried(tmp_path / "f", {"cluster_id": "K1", "endpoints": []}, cluster_id="K1")
    assert not _silent_follower_carried(tmp_path / "g", {"cluster_id": "K2", "endpoints": ep}, cluster_id="K1")
    # a collector that states a cluster id the job's brokers do not give (or the reverse): the addresses
    assert _silent_follower_carried(tmp_path / "h", {"cluster_id": "K2", "endpoints": ep})
    # a broker hung past its session leaves the collector's newest metadata: its address is kept
    m, clock, sink = _setup_watched(tmp_path / "i", {2: (T0 + 1_000) / 1000})
    m.identify([("c", {"endpoints": [ep[0]]})])
    _batch(m, 0, T0, T0, leo=20)
    clock.t = (T0 + 20_000) / 1000
    assert m.carry_forward()


def test_two_clusters_numbering_their_brokers_alike_with_one_topic_layout_stay_apart(tmp_path) -> None:
    """The case of issue 52: clusters alpha and beta, the same topic, partition and broker ids;
    the job reads beta. Beta's broker 2 silent to the job: beta's follower is stalled and
    nearing, alpha's (healthy, its telemetry standing still like beta's) has nothing."""
    m, clock, sink = _setup_watched(tmp_path, {2: (T0 + 1_000) / 1000}, stated=None)
    m.identify(
        [("beta", SAME_BROKERS), ("alpha", {"endpoints": [{"broker_id": 2, "host": "127.0.0.1", "port": 29093}]})]
    )
    for cluster in ("alpha", "beta"):
        row = _row(T0, T0, 1)
        row["cluster"] = cluster
        row["latest"]["leo"] = row["known_leo"] = 20
        s = evaluate(row_to_aggregate(row), T0, m.cfg, m.thresholds)
        m.apply_statuses(0 if cluster == "alpha" else 1, [(s, T0, 1, None)])
    clock.t = (T0 + 20_000) / 1000
    carried = m.carry_forward()
    assert [(c.cluster, c.broker_id, c.state) for c in carried] == [("beta", 2, State.STALLED)]
    assert {dict(a.labels)["cluster"] for t in sink.transitions for a in t.started} == {"beta"}


def test_a_broker_answering_again_refutes_a_crossing_its_older_status_called_for(tmp_path) -> None:
    """Issue 52: the follower's broker answered the job again (after a silence) later than the
    follower's newest status: its crossing on the wall clock is not said; the telemetry to
    come says how far behind it is. Without the resumption, the same status is carried."""
    for back in (True, False):
        m, clock, sink = _setup_watched(tmp_path / str(back), {})
        _batch(m, 0, T0, T0 - 4_000)  # behind 4 s at T0: crosses lag/2 at T0 + 1 s
        if back:
            m.broker_watch._resumed = {2: (T0 + 500) / 1000}
        clock.t = (T0 + 1_000) / 1000
        assert bool(m.carry_forward()) is not back, back
        if back:
            _batch(m, 1, T0 + 1_500, T0 + 1_400, leo=20)  # the telemetry after the resumption: caught up
            clock.t = (T0 + 3_000) / 1000
            assert m.carry_forward() == [] and not _started(sink)
    # another cluster's broker of that id answering again refutes nothing
    m, clock, sink = _setup_watched(tmp_path / "other", {}, stated={"endpoints": []})
    _batch(m, 0, T0, T0 - 4_000)
    m.broker_watch._resumed = {2: (T0 + 500) / 1000}
    clock.t = (T0 + 1_000) / 1000
    assert m.carry_forward()


def test_a_restarted_job_still_knows_which_cluster_is_which_before_any_telemetry(tmp_path) -> None:
    """The identities are in the driver's checkpoint: a job restarted while its telemetry stands
    still (the broker holding it hung) uses its own evidence for that cluster at once."""
    m, clock, sink = _setup_watched(tmp_path, {2: (T0 + 1_000) / 1000})
    assert m.checkpoint is not None and m.checkpoint.identities_path.exists()
    m2, clock2, sink2 = _setup(tmp_path)  # the same checkpoint, nothing stated since
    m2.broker_watch = Brokers({2: (T0 + 1_000) / 1000})
    _batch(m2, 0, T0, T0, leo=20)
    clock2.t = (T0 + 20_000) / 1000
    assert m2.carry_forward(), "the restored identity lets the silence speak"
    assert set(m2.identities.as_json()) == {"c"}
    m2.checkpoint.identities_path.write_text("{not json")  # unreadable: started afresh, not a failed start
    m3, clock3, sink3 = _setup(tmp_path)
    assert m3.identities.as_json() == {}


def test_a_read_back_that_fails_is_tried_again_at_the_next_tick(tmp_path, caplog) -> None:
    """The state table's read can fail (a version pruned under it by a batch running beside
    the timer): logged, nothing carried, read again at the next tick."""
    monitor, clock, sink, asked = _not_ok_watched(tmp_path, True)
    read_back = monitor.followers_of
    failures = []

    def flaky(brokers):
        if not failures:
            failures.append(brokers)
            raise FileNotFoundError("replicas/v3")
        return read_back(brokers)

    monitor.followers_of = flaky
    _batch(monitor, 0, T0, T0, leo=20)
    clock.t = (T0 + 6_000) / 1000
    assert monitor.carry_forward() == []
    assert monitor.wait_read_back(30) and failures == [{("c", 2)}]
    assert "silent_followers_unread brokers=c/2 error=FileNotFoundError" in caplog.text
    clock.t = (T0 + 6_200) / 1000  # the next tick
    carried = monitor.carry_forward()  # asks again
    assert monitor.wait_read_back(30)
    [one] = carried + monitor.carry_forward()
    assert one.lag_state is State.NEARING and asked == [{("c", 2)}]


def test_the_timer_goes_on_while_a_silent_broker_s_followers_are_read_back(tmp_path) -> None:
    """The read back is a Spark job (~6 s for one broker of a 1M-replica fleet on 3 brokers):
    the timer's tick that asks for it returns while it is under way, and the stale check, the
    other carries and the query's failure check go on meanwhile. The followers are carried at
    the first tick after they are in, at their crossing's time, not the tick's."""
    monitor, clock, sink, asked = _not_ok_watched(tmp_path, True)
    read_back = monitor.followers_of
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow(brokers):
        started.set()
        release.wait(60)
        try:
            return read_back(brokers)
        finally:
            finished.set()

    monitor.followers_of = slow
    _batch(monitor, 0, T0, T0, leo=20)
    clock.t = (T0 + 6_000) / 1000
    assert monitor.carry_forward() == []
    assert started.wait(30) and not finished.is_set(), "the tick returned while the read was under way"
    clock.t = (T0 + 6_200) / 1000
    monitor.check_stale()
    assert monitor.carry_forward() == [] and asked == [], "one read at a time"
    release.set()
    assert monitor.wait_read_back(30) and asked == [{("c", 2)}]
    clock.t = (T0 + 6_400) / 1000
    [one] = monitor.carry_forward()
    assert one.lag_state is State.NEARING and one.eval_ms == T0 + 6_000
    assert (AlertName.NEARING.value, T0 + 6_000) in _started(sink)
    monitor.close(30)
    clock.t = (T0 + 6_600) / 1000
    monitor._held_silent.clear()
    monitor.carry_forward()
    assert monitor.wait_read_back(1) and asked == [{("c", 2)}], "no read after close"
