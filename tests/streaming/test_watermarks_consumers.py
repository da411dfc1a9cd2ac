"""How ``streaming.watermarks.Watermarks`` lends its consumers (unit: a fake consumer, no Kafka;
the real leader paused is tests/streaming/test_watermarks.py).

The fake stands for what librdkafka does while one leader hangs: a question about that leader's
partition fails after a while, and the handle that asked it stays stuck on that broker for a
while longer (its metadata request went there), so a question behind it on the same handle
is late too; a new handle's first request may also go to the hung broker. The planner must then
see only the hung leader's partition late.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from streaming.watermarks import Watermarks

STUCK_S = 1.5  # how long a handle stays stuck on the hung broker
ANSWER_S = 0.5  # the planner's wait (room for a loaded machine's threads; the hung leader takes STUCK_S)


class _Cluster:
    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.hung = False
        self.made = 0
        self.lock = threading.Lock()


class _Consumer:
    def __init__(self, cluster: _Cluster) -> None:
        self.cluster = cluster
        self.stuck_until = 0.0
        self.asked = False
        with cluster.lock:
            cluster.made += 1

    def _request(self) -> None:
        if not self.asked:  # a new handle's first request: to any broker, the hung one too
            self.asked = True
            if self.cluster.hung:
                self.stuck_until = time.monotonic() + STUCK_S
        time.sleep(max(0.0, self.stuck_until - time.monotonic()))

    def list_topics(self, topic: str | None = None, timeout: float | None = None) -> Any:
        self._request()
        parts = dict.fromkeys(range(self.cluster.partitions))
        return SimpleNamespace(topics={"t": SimpleNamespace(error=None, partitions=parts)})

    def get_watermark_offsets(self, tp: Any, timeout: float | None = None, cached: bool = False) -> tuple[int, int]:
        self._request()
        if self.cluster.hung and tp.partition == 0:
            time.sleep(STUCK_S)  # librdkafka gives up on the hung leader...
            self.stuck_until = time.monotonic() + STUCK_S  # ...and the handle waits on it a while more
            raise RuntimeError("Local: Timed out")
        return 0, 10

    def close(self) -> None:
        pass


def test_only_the_hung_leaders_partition_is_late_however_the_consumers_are_lent() -> None:
    cluster = _Cluster(partitions=4)
    marks = Watermarks(lambda: _Consumer(cluster), ["t"], answer_s=ANSWER_S)
    try:
        healthy = time.monotonic() + 10  # every leader answering: polls come back with nothing late
        marks.poll()
        while marks.late and time.monotonic() < healthy:
            marks.poll()
        assert marks.late == frozenset(), marks.late
        marks.poll()
        deadline = time.monotonic() + 5
        while cluster.made < 5 and time.monotonic() < deadline:  # one consumer a question, and the metadata's
            time.sleep(0.05)
        cluster.hung = True
        seen = []
        started = time.monotonic()
        while time.monotonic() - started < 6 * STUCK_S:
            marks.poll()
            seen.append(sorted(marks.late))
        wrong = [late for late in seen[1:] if late != [("t", 0)]]  # (the first poll: p0 not asked late yet)
        assert not wrong, f"late partitions per poll while only partition 0's leader hung: {seen}"
    finally:
        marks.close()
