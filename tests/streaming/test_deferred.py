"""Ranges a read task could not finish are read in a later batch, the same way on a replay."""

from __future__ import annotations

from streaming.deferred import Deferred, offsets_digest


def test_a_short_read_is_owed_to_the_next_batch_and_read_from_where_it_stopped(tmp_path):
    d = Deferred(str(tmp_path))
    s0, e0 = {"t": {"0": 0, "1": 0}}, {"t": {"0": 10, "1": 10}}
    ranges, owed = d.plan(s0, e0, late=set())
    assert sorted(ranges) == [("t", 0, 0, 10), ("t", 1, 0, 10)] and owed == {}
    d.stopped_short(("t", 1, 0, 10), 4)  # partition 1's leader hung after 4 records
    d.read_whole(("t", 0, 0, 10))
    e1 = {"t": {"0": 15, "1": 10}}
    # the leader of partition 1 still hangs: owed, not planned
    ranges, owed = d.plan(e0, e1, late={("t", 1)})
    assert ranges == [("t", 0, 10, 15)] and owed == {"t/1": 4}
    # it answers again: the batch after reads 4..12 of it
    e2 = {"t": {"0": 15, "1": 12}}
    ranges, owed = d.plan(e1, e2, late=set())
    assert ranges == [("t", 1, 4, 12)] and owed == {"t/1": 4}
    # read whole: nothing owed afterwards
    d.read_whole(("t", 1, 4, 12))
    ranges, owed = d.plan(e2, {"t": {"0": 16, "1": 12}}, late=set())
    assert ranges == [("t", 0, 15, 16)] and owed == {}


def test_a_replayed_batch_gets_the_same_ranges_even_after_its_short_read_was_finished(tmp_path):
    d = Deferred(str(tmp_path))
    s0, e0 = {"t": {"0": 0}}, {"t": {"0": 10}}
    d.plan(s0, e0, late=set())
    d.stopped_short(("t", 0, 0, 10), 3)
    e1 = {"t": {"0": 20}}
    first = d.plan(e0, e1, late=set())
    assert first == ([("t", 0, 3, 20)], {"t/0": 3})
    d.read_whole(("t", 0, 3, 20))  # the job died before Spark committed the batch
    assert Deferred(str(tmp_path)).plan(e0, e1, late=set()) == first  # Spark re-plans it: same ranges


def test_an_empty_batch_planned_before_a_short_read_does_not_hide_it(tmp_path):
    """The restarted job's Spark asked for (end, end) of its batch in flight before replaying
    it; that plan linked its end to itself, so when the replay's read stopped short, the next
    batch found no batch ending at its start and never read the rest (one telemetry record
    lost in tests/e2e/test_restart.py)."""
    d = Deferred(str(tmp_path))
    s0, e0 = {"t": {"0": 0, "1": 0}}, {"t": {"0": 10, "1": 10}}
    assert sorted(d.plan(s0, e0, late=set())[0]) == [("t", 0, 0, 10), ("t", 1, 0, 10)]
    assert d.plan(e0, e0, late=set()) == ([], {})  # nothing to read in it
    d.stopped_short(("t", 1, 0, 10), 6)  # the replay's task, after that question
    e1 = {"t": {"0": 12, "1": 10}}
    ranges, owed = d.plan(e0, e1, late=set())
    assert sorted(ranges) == [("t", 0, 10, 12), ("t", 1, 6, 10)] and owed == {"t/1": 6}


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
    d.stopped_short(("t", 1, 0, 10), 3)  # partition 1 owed from offset 3 on
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


def test_tidy_forgets_short_reads_an_hour_old(tmp_path):
    import os
    import time

    d = Deferred(str(tmp_path))
    d.stopped_short(("t", 0, 0, 10), 4)
    d.stopped_short(("t", 0, 10, 20), 12)
    old = tmp_path / "short" / "t-0-0-10.json"
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    d.tidy()
    assert not old.exists()
    assert (tmp_path / "short" / "t-0-10-20.json").exists()
