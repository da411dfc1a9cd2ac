"""Ranges a read task could not finish are read in a later batch, the same way on a replay;
every read of a range in its batch reads it as far as the first read that finished."""

from __future__ import annotations

import json
import multiprocessing

from streaming.sources.deferred import Deferred, offsets_digest, plan_id


def test_a_short_read_is_owed_to_the_next_batch_and_read_from_where_it_stopped(tmp_path):
    d = Deferred(str(tmp_path))
    s0, e0 = {"t": {"0": 0, "1": 0}}, {"t": {"0": 10, "1": 10}}
    ranges, owed = d.plan(s0, e0, late=set())
    assert sorted(ranges) == [("t", 0, 0, 10), ("t", 1, 0, 10)] and owed == {}
    d.decide(plan_id(s0, e0), ("t", 1, 0, 10), 4)  # partition 1's leader hung after 4 records
    d.decide(plan_id(s0, e0), ("t", 0, 0, 10), 10)
    e1 = {"t": {"0": 15, "1": 10}}
    # the leader of partition 1 still hangs: owed, not planned
    ranges, owed = d.plan(e0, e1, late={("t", 1)})
    assert ranges == [("t", 0, 10, 15)] and owed == {"t/1": 4}
    d.decide(plan_id(e0, e1), ("t", 0, 10, 15), 15)
    # it answers again: the batch after reads 4..12 of it
    e2 = {"t": {"0": 15, "1": 12}}
    ranges, owed = d.plan(e1, e2, late=set())
    assert ranges == [("t", 1, 4, 12)] and owed == {"t/1": 4}
    # read whole: nothing owed afterwards
    d.decide(plan_id(e1, e2), ("t", 1, 4, 12), 12)
    ranges, owed = d.plan(e2, {"t": {"0": 16, "1": 12}}, late=set())
    assert ranges == [("t", 0, 15, 16)] and owed == {}


def test_the_first_read_to_decide_a_range_decides_it_for_its_batch_only(tmp_path):
    """Two reads of one range in one batch (two executors, a lost executor's partition read
    again): the second is told where the first stopped; another batch's range is its own."""
    d = Deferred(str(tmp_path))
    r = ("t", 0, 17, 18)
    assert d.decided("batch-a", r) is None
    assert d.decide("batch-a", r, 17) == 17  # stopped short: its leader hangs
    assert d.decide("batch-a", r, 18) == 17  # a read that got the record: the batch reads up to 17
    assert Deferred(str(tmp_path)).decided("batch-a", r) == 17
    assert d.decide("batch-b", r, 18) == 18  # the next batch owes it and reads it whole
    assert not list((tmp_path / "reads").rglob(".*.tmp"))


def _decide(args: tuple[str, int]) -> int:
    state_dir, upto = args
    return Deferred(state_dir).decide("batch", ("t", 3, 0, 100), upto)


def test_reads_racing_to_decide_all_get_one_answer(tmp_path):
    """Processes deciding the same range at once: one wins, every one is told its answer."""
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        answers = pool.map(_decide, [(str(tmp_path), upto) for upto in range(40, 100)])
    assert len(set(answers)) == 1, answers
    assert Deferred(str(tmp_path)).decided("batch", ("t", 3, 0, 100)) == answers[0]


def test_only_the_newest_batch_keeps_its_reads(tmp_path):
    """A batch's reads are folded into the next plan's ``resume``; then they go."""
    d = Deferred(str(tmp_path))
    start, end = {"t": {"0": 0}}, {"t": {"0": 10}}
    d.plan(start, end, late=set())
    d.decide(plan_id(start, end), ("t", 0, 0, 10), 6)
    for n in range(2, 6):
        start, end = end, {"t": {"0": 10 * n}}
        ranges, owed = d.plan(start, end, late=set())
        assert owed == ({"t/0": 6} if n == 2 else {})
        d.decide(plan_id(start, end), ranges[0], ranges[0][3])
    assert [p.name for p in (tmp_path / "reads").iterdir()] == [plan_id(start, end)]


def test_a_replayed_batch_gets_the_same_ranges_and_decides_its_reads_afresh(tmp_path):
    """The run before the restart never committed: its replay reads the same ranges, as far
    as they go now (the first run's read stopped short, the replay's gets it all)."""
    d = Deferred(str(tmp_path))
    s0, e0 = {"t": {"0": 0}}, {"t": {"0": 10}}
    d.plan(s0, e0, late=set())
    d.decide(plan_id(s0, e0), ("t", 0, 0, 10), 3)
    e1 = {"t": {"0": 20}}
    first = d.plan(e0, e1, late=set())
    assert first == ([("t", 0, 3, 20)], {"t/0": 3})
    d.decide(plan_id(e0, e1), ("t", 0, 3, 20), 8)  # stopped short; the job died before Spark committed the batch
    again = Deferred(str(tmp_path))
    assert again.plan(e0, e1, late=set()) == first  # Spark re-plans it: same ranges
    again.forget_reads(plan_id(e0, e1))  # the restarted job's source, once per run of a batch
    assert again.decide(plan_id(e0, e1), ("t", 0, 3, 20), 20) == 20
    assert again.plan(e1, {"t": {"0": 25}}, late=set()) == ([("t", 0, 20, 25)], {})


def test_the_source_starts_a_batchs_reads_afresh_once_per_run(tmp_path):
    """Spark may ask for one batch's partitions more than once in a run: the reads its tasks
    decided stay; a restarted job's source (a new reader) forgets them before its replay."""
    from streaming.sources.source_kafka import KafkaStreamReader

    options = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t", "stateDir": str(tmp_path)}
    start, end = {"t": {"0": 0}}, {"t": {"0": 10}}
    reader = KafkaStreamReader(options)
    (r,) = reader.partitions(start, end)
    Deferred(str(tmp_path)).decide(r.plan, r.key, 4)  # a task's read stopped short
    (again,) = reader.partitions(start, end)
    assert again.plan == r.plan and Deferred(str(tmp_path)).decided(r.plan, r.key) == 4
    (replayed,) = KafkaStreamReader(options).partitions(start, end)
    assert replayed.plan == r.plan and Deferred(str(tmp_path)).decided(r.plan, r.key) is None


def test_an_empty_batch_planned_before_a_short_read_does_not_hide_it(tmp_path):
    """The restarted job's Spark asked for (end, end) of its batch in flight before replaying
    it; that plan linked its end to itself, so when the replay's read stopped short, the next
    batch found no batch ending at its start and never read the rest (one telemetry record
    lost in tests/e2e/test_restart.py)."""
    d = Deferred(str(tmp_path))
    s0, e0 = {"t": {"0": 0, "1": 0}}, {"t": {"0": 10, "1": 10}}
    assert sorted(d.plan(s0, e0, late=set())[0]) == [("t", 0, 0, 10), ("t", 1, 0, 10)]
    assert d.plan(e0, e0, late=set()) == ([], {})  # nothing to read in it
    d.decide(plan_id(s0, e0), ("t", 1, 0, 10), 6)  # the replay's task, after that question
    e1 = {"t": {"0": 12, "1": 10}}
    ranges, owed = d.plan(e0, e1, late=set())
    assert sorted(ranges) == [("t", 0, 10, 12), ("t", 1, 6, 10)] and owed == {"t/1": 6}


def test_a_short_read_an_earlier_version_recorded_is_still_owed(tmp_path):
    """A checkpoint left by a version before the ``reads`` files: its short read's file."""
    d = Deferred(str(tmp_path))
    s0, e0 = {"t": {"0": 0}}, {"t": {"0": 10}}
    d.plan(s0, e0, late=set())
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "t-0-0-10.json").write_text(json.dumps({"upto": 7}))
    assert d.plan(e0, {"t": {"0": 12}}, late=set()) == ([("t", 0, 7, 12)], {"t/0": 7})


def test_new_partitions_start_where_their_first_answer_put_them(tmp_path):
    d = Deferred(str(tmp_path))
    ranges, _ = d.plan({"t": {"0": 5}}, {"t": {"0": 6, "1": 9}}, late=set(), first={"t": {"1": 7}})
    assert sorted(ranges) == [("t", 0, 5, 6), ("t", 1, 7, 9)]


def test_tidy_keeps_the_newest_plans_and_what_is_still_owed(tmp_path):
    """Many batches, one partition owed (its leader hangs) the whole time: tidy keeps a bounded
    number of plans, and the owed offset and a replay's ranges survive it."""
    import os

    def aged(start, end, n):  # the batch's two files written n seconds after the first batch's
        for f in (
            tmp_path / "plans" / f"{offsets_digest(start)}.json",
            tmp_path / "plans" / "by-end" / f"{offsets_digest(end)}.json",
        ):
            os.utime(f, (1_000_000 + n, 1_000_000 + n))

    d = Deferred(str(tmp_path))
    start = {"t": {"0": 0, "1": 0}}
    end = {"t": {"0": 10, "1": 10}}
    d.plan(start, end, late=set())
    aged(start, end, 1)
    d.decide(plan_id(start, end), ("t", 1, 0, 10), 3)  # partition 1 owed from offset 3 on
    for n in range(2, 40):
        start, end = end, {"t": {"0": 10 * n, "1": 10}}
        ranges, owed = d.plan(start, end, late={("t", 1)})
        aged(start, end, n)
    assert owed == {"t/1": 3}
    d.tidy(keep=5)
    assert len(list((tmp_path / "plans").glob("*.json"))) == 5
    assert len(list((tmp_path / "plans" / "by-end").glob("*.json"))) == 5
    # a replay of the newest batch gets the same ranges; the next batch still owes partition 1
    assert d.plan(start, end, late={("t", 1)})[0] == ranges
    assert d.plan(end, {"t": {"0": 500, "1": 10}}, late={("t", 1)})[1] == {"t/1": 3}


def test_tidy_forgets_an_earlier_versions_short_reads_an_hour_old(tmp_path):
    import os
    import time

    (tmp_path / "short").mkdir()
    old, new = tmp_path / "short" / "t-0-0-10.json", tmp_path / "short" / "t-0-10-20.json"
    old.write_text(json.dumps({"upto": 4}))
    new.write_text(json.dumps({"upto": 12}))
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    Deferred(str(tmp_path)).tidy()
    assert not old.exists()
    assert new.exists()
