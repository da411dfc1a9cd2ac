"""The raw record columns are stated twice for two readers: Spark's schema of the sources
(``RAW_SCHEMA``) and the Arrow schema their read tasks hand Spark; they must agree."""

from __future__ import annotations

from pyspark.sql.pandas.types import to_arrow_schema

from streaming.sources.source_spool import RAW_SCHEMA, raw_arrow_schema


def test_the_arrow_batches_have_the_sources_spark_schema() -> None:
    expected = to_arrow_schema(RAW_SCHEMA)
    got = raw_arrow_schema()
    assert got.names == expected.names
    for name in got.names:
        want, have = expected.field(name).type, got.field(name).type
        # Spark's TimestampType is an instant: Arrow says so with a zone, any zone
        assert str(have).split(",")[0] == str(want).split(",")[0], (name, have, want)
