"""Test telemetry: several simulated clusters into one spool, plus bad records.

One writer for the spool (two writers would race for offsets): the rounds of
every simulation, paced on the wall clock like ``simulator.run.feed_spool``,
and any extra records the test queues.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from isrwatch.spool import SpoolWriter
from simulator.run import Pacer, Simulation


class MultiFeed(threading.Thread):
    def __init__(self, path: str, sims: Sequence[Simulation], speed: float, duration_s: float) -> None:
        super().__init__(name="test-feed", daemon=True)
        self.writer = SpoolWriter(path)
        self.sims = list(sims)
        self.speed = speed
        self.duration_s = duration_s
        self.stop_event = threading.Event()
        self.extra: list[bytes] = []
        self._lock = threading.Lock()
        self.done = threading.Event()

    def inject(self, records: Sequence[bytes]) -> None:
        with self._lock:
            self.extra.extend(records)

    def run(self) -> None:
        start = self.sims[0].start_ms
        pacer = Pacer(start, self.speed, self.stop_event)
        rounds = [s.rounds(self.duration_s) for s in self.sims]
        try:
            while True:
                batch: list[bytes] = []
                t = None
                for r in rounds:
                    t, records = next(r)
                    batch.extend(records)
                assert t is not None
                if not pacer.wait_for(t):
                    return
                with self._lock:
                    batch.extend(self.extra)
                    self.extra.clear()
                self.writer.append(batch)
        except StopIteration:
            return
        finally:
            self.done.set()


class RunningJob:
    """``streaming.lifecycle.job.run`` on a thread (the tests' shared Spark session), alerts to ``stream``;
    ``parts``: the other components' settings, as ``streaming.lifecycle.job.Job`` takes them."""

    def __init__(self, settings, spark, stream, **parts) -> None:
        from streaming.driver.notify import StdoutSink
        from streaming.lifecycle.job import JobHandles, run

        self.handles = JobHandles()
        self.stop = threading.Event()
        self.result: dict = {}

        def target() -> None:
            try:
                self.result["rc"] = run(
                    settings,
                    spark=spark,
                    handles=self.handles,
                    stop_event=self.stop,
                    sinks=[StdoutSink(stream=stream)],
                    **parts,
                )
            except BaseException as e:  # reported by the test
                self.result["error"] = e

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()
