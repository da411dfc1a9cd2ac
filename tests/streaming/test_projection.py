"""streaming.evaluation.projection.select: the same rows as DataFrame.select, each column list handed to
the JVM once, and a cache that stays bounded when a list is built afresh at every call."""

from __future__ import annotations

import pyspark.sql.functions as F

from streaming.evaluation import projection


def _counting(monkeypatch):
    calls = []
    real = projection._to_seq

    def to_seq(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(projection, "_to_seq", to_seq)
    return calls


def test_a_select_gives_what_dataframe_select_gives_and_converts_its_list_once(spark, monkeypatch):
    calls = _counting(monkeypatch)
    df = spark.createDataFrame([(1, "a"), (2, "b")], "n int, s string")
    doubled = (F.col("n") * 2).alias("twice")  # built once, as the job's Columns are
    for _ in range(3):
        got = projection.select(df, "s", doubled, "*")
        assert got.columns == df.select("s", doubled, "*").columns == ["s", "twice", "n", "s"]
        assert [tuple(r) for r in got.collect()] == [("a", 2, 1, "a"), ("b", 4, 2, "b")]
    assert len([c for c in calls if len(c) == 3]) == 1  # the list went to the JVM once, not three times


def test_a_column_list_built_at_every_call_keeps_the_cache_bounded_and_right(spark, monkeypatch):
    monkeypatch.setattr(projection, "LIMIT", 8)
    monkeypatch.setattr(projection, "_converted", type(projection._converted)())
    df = spark.createDataFrame([(3,)], "n int")
    for k in range(20):
        fresh = (F.col("n") + k).alias("m")  # a new Column each time (its id may be an old one's)
        assert projection.select(df, fresh).collect()[0]["m"] == 3 + k
    assert len(projection._converted) == 8
