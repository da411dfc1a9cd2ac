"""``select`` with its column list handed to the JVM once, not every micro-batch.

PySpark hands a select's columns to the JVM as a new Java list at every call: one call into
the JVM for each column name given as text and one for each element of the list, ~0.3 ms
apiece here. The job builds the same projections every batch (their Columns are built once:
``functools.cache`` on the builders), so converting their lists again, with the few Columns
still built per batch, was a quarter of a warm small batch: 1.37-1.61 s before, 1.05-1.17 s
after (docs/benchmarks.md, "A small batch's calls into the JVM"). ``select`` converts each
distinct list once and reuses the Java list afterwards.

It pays for lists that are the same in every batch (names, and Columns built once). The
cache keeps the ``LIMIT`` lists used last, each with its Columns (so that the id of a Column
in a key is not reused while it is cached); a list built afresh at each call only churns it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql.classic.column import _to_java_column, _to_seq
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

__all__ = ["select", "LIMIT"]

LIMIT = 256

# key -> (the columns, kept so that no id in a key is reused while it is cached; the Java list)
_converted: OrderedDict[tuple[object, ...], tuple[tuple[Column | str, ...], Any]] = OrderedDict()
_lock = threading.Lock()


def select(df: DataFrame, *cols: Column | str) -> DataFrame:
    """``df.select(*cols)``, the list of ``cols`` converted into the JVM once per process."""
    key = tuple(c if isinstance(c, str) else id(c) for c in cols)
    with _lock:
        hit = _converted.get(key)
        if hit is None:
            seq = _to_seq(df.sparkSession.sparkContext, cols, _to_java_column)
            hit = _converted[key] = (cols, seq)
            if len(_converted) > LIMIT:
                _converted.popitem(last=False)
        else:
            _converted.move_to_end(key)
    return ClassicDataFrame(df._jdf.select(hit[1]), df.sparkSession)
