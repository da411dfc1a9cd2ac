"""Ranges a read task could not finish are read in a later batch, the same way on a replay."""

from __future__ import annotations

from streaming.deferred import Deferred


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


def test_new_partitions_start_where_their_first_answer_put_them(tmp_path):
    d = Deferred(str(tmp_path))
    ranges, _ = d.plan({"t": {"0": 5}}, {"t": {"0": 6, "1": 9}}, late=set(), first={"t": {"1": 7}})
    assert sorted(ranges) == [("t", 0, 5, 6), ("t", 1, 7, 9)]
