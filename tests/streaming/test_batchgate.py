"""streaming.lifecycle.stopping.BatchGate.park: a batch that found the gate closed waits for the
query's stop, then gives the stop's exception (unit tests of its logic; the job's stop on real
Spark: tests/streaming/test_stop_mid_batch.py)."""

from __future__ import annotations

import threading
import time

from streaming.lifecycle.stopping import BatchGate, BatchStopped


class _Query:
    """A query whose ``isActive`` answers ``answers`` in turn (an exception is raised), then False."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.asked = 0

    @property
    def isActive(self) -> bool:  # noqa: N802 - pyspark's name
        self.asked += 1
        answer = self.answers.pop(0) if self.answers else False
        if isinstance(answer, BaseException):
            raise answer
        return bool(answer)


def test_a_parked_batch_waits_for_the_query_to_stop() -> None:
    gate = BatchGate()
    gate.stopping.set()
    q = _Query(True, True, False)
    assert isinstance(gate.park(q, 7), BatchStopped)  # type: ignore[arg-type]
    assert q.asked == 3


def test_a_parked_batch_ends_as_stopped_when_the_jvm_cannot_be_asked() -> None:
    gate = BatchGate()
    gate.stopping.set()
    q = _Query(True, ConnectionRefusedError("the JVM is gone"), True)
    started = time.monotonic()
    stopped = gate.park(q, 7)  # type: ignore[arg-type]
    assert isinstance(stopped, BatchStopped) and "7" in str(stopped)
    assert q.asked == 2  # not asked again once it could not answer
    assert time.monotonic() - started < BatchGate.PARKED_WAIT_S


def test_a_parked_batch_waits_for_the_stop_to_begin() -> None:
    gate = BatchGate()
    q = _Query(False)
    threading.Timer(0.2, gate.stopping.set).start()
    started = time.monotonic()
    assert isinstance(gate.park(q, 1), BatchStopped)  # type: ignore[arg-type]
    assert time.monotonic() - started >= 0.15 and q.asked == 1
