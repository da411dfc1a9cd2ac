"""Where a batch's plan-building time goes: each DataFrame call of the job's code, timed.

Spark analyses every new DataFrame when it is made (``select``, ``where``,
``unionByName``...), ``persist`` plans the query it holds, and ``toArrow`` plans
and runs its one job. For a small batch these calls, not the data, are most of
the batch (docs/benchmarks.md, "A small batch's second"). ``timed()`` wraps
those methods of PySpark's DataFrame for the duration of a ``with`` block and
adds up each call's time by call site: the file and line in this repository
that made it (PySpark's own internal calls are counted at the job's line that
led to them); ``streaming.evaluation.projection.select`` counts as a ``select``. Each ``toArrow`` is also split by Spark's own planning tracker
(``QueryExecution.tracker``): its optimisation and physical planning, which belong
to building the plan, and the rest, its Spark job (``CallTimes.job_ms``).

A profiling aid for ``bench.stages --calls``; never used by the job.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from streaming.evaluation import projection

__all__ = ["CallTimes", "timed", "METHODS"]

METHODS = (
    "select",
    "withColumn",
    "withColumns",
    "where",
    "filter",
    "drop",
    "distinct",
    "limit",
    "unionByName",
    "join",
    "persist",
    "toArrow",
)
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class CallTimes:
    """Seconds and calls per (method, call site), over ``runs`` runs of the timed code."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self.job_seconds = 0.0  # toArrow's time less its optimisation and planning: the Spark job
        self._depth = 0

    def job_ms(self, runs: int = 1) -> float:
        """Milliseconds per run in ``toArrow``'s Spark jobs; every other timed millisecond
        (``plan_ms``) went to building and planning the batch's query."""
        return self.job_seconds * 1000 / runs

    def plan_ms(self, runs: int = 1) -> float:
        return sum(r[0] for r in self.rows(runs)) - self.job_ms(runs)

    def rows(self, runs: int = 1) -> list[tuple[float, float, str, str]]:
        """(ms per run, calls per run, method, site), the costliest first."""
        out = [(s * 1000 / runs, self.calls[k] / runs, *k) for k, s in self.seconds.items()]
        return sorted(out, reverse=True)

    def table(self, runs: int = 1, top: int = 20) -> str:
        rows = self.rows(runs)
        total = sum(r[0] for r in rows)
        lines = [
            f"{'ms/run':>8} {'calls':>5}  call (site)",
            *(f"{ms:8.1f} {n:5.1f}  {m} ({site})" for ms, n, m, site in rows[:top]),
        ]
        lines.append(f"{total:8.1f} {sum(r[1] for r in rows):5.1f}  all the DataFrame calls timed, per run")
        lines.append(
            f"{self.plan_ms(runs):8.1f}        of which building the plan (toArrow's optimisation and planning too)"
        )
        lines.append(f"{self.job_ms(runs):8.1f}        and the Spark job (toArrow less its optimisation and planning)")
        return "\n".join(lines)


def _planning_s(df: Any) -> float:
    """Seconds Spark's tracker recorded for optimising and planning ``df``'s query
    (analysis happened when ``df`` was made, in the calls before)."""
    phases = df._jdf.queryExecution().tracker().phases()
    it = phases.iterator()
    ms = 0
    while it.hasNext():
        phase = it.next()
        if phase._1() in ("optimization", "planning"):
            ms += phase._2().durationMs()
    return ms / 1000


def _site() -> str:
    """The innermost frame of this repository's own code (not this module, not an
    installed package such as PySpark in the repository's .venv): the job's line."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_ROOT) and "site-packages" not in name and not name.endswith("plan_calls.py"):
            return f"{name[len(_ROOT) :]}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


@contextlib.contextmanager
def timed(times: CallTimes | None = None) -> Iterator[CallTimes]:
    """Time the DataFrame calls made inside the block (one thread's: the job's driver),
    added to ``times`` (a new ``CallTimes`` when None)."""
    from pyspark.sql.classic.dataframe import DataFrame

    times = times if times is not None else CallTimes()
    originals = {name: DataFrame.__dict__[name] for name in METHODS if name in DataFrame.__dict__}

    def wrap(name: str, method: Any) -> Any:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if times._depth:  # a call inside another: counted in the outer one
                return method(self, *args, **kwargs)
            times._depth += 1
            t0 = time.perf_counter()
            try:
                out = method(self, *args, **kwargs)
            finally:
                times._depth -= 1
                key = (name, _site())
                took = time.perf_counter() - t0
                times.seconds[key] += took
                times.calls[key] += 1
            if name == "toArrow":
                times.job_seconds += took - _planning_s(self)
            return out

        return call

    for name, method in originals.items():
        setattr(DataFrame, name, wrap(name, method))
    # the job's selects of lists handed to the JVM once (streaming.evaluation.projection) are selects too
    projected = projection.select
    projection.select = wrap("select", projected)
    try:
        yield times
    finally:
        for name, method in originals.items():
            setattr(DataFrame, name, method)
        projection.select = projected
