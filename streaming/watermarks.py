"""The telemetry topic's end offsets, asked for without ever waiting on one broker.

A micro-batch is planned from each partition's watermarks (its leader answers a
ListOffsets request). Asked one after another with librdkafka's timeouts, one
hung leader (SIGSTOP, a long GC) held every batch for tens of seconds, even
when it led only empty partitions. ``Watermarks.poll`` asks every partition at
once, each in its own thread, and waits at most ``answer_s``: a partition whose
leader has not answered by then keeps its last known offsets (so nothing new is
planned from it) and is asked again once its previous question returns. The
topic's partition list is refreshed the same way, falling back to the last one.

Each question has a consumer to itself: questions on one librdkafka handle
wait behind each other, so with one shared consumer a single hung leader made
every partition late (measured: 8-10 s for the healthy ones). The consumers are
lent and given back, so a question asked while a leader hangs takes one that has
asked before and knows the partitions' leaders; a new consumer's first request
for metadata goes to whichever broker librdkafka picks, the hung one too, and
made a healthy partition late for up to 10 s (test_watermarks, once in ten runs
when each thread of the pool had a consumer of its own).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from isrwatch.logs import kv

__all__ = ["Watermarks", "Offsets"]

log = logging.getLogger(__name__)

Offsets = dict[str, dict[str, int]]

# How long one question may take before librdkafka gives up on it (it then runs
# in the background: the planner never waits this long).
_QUESTION_TIMEOUT_S = 10.0
_METADATA_EVERY_S = 10.0
# Questions asked at once (the pool's threads), so also the consumers lent at once.
_POOL_SIZE = 16


class Watermarks:
    """(low, high) watermarks of the subscribed topics' partitions, from whoever answers within ``answer_s``."""

    def __init__(self, consumer_factory: Callable[[], Any], topics: list[str], answer_s: float = 1.0) -> None:
        self._factory = consumer_factory
        self._consumers: list[Any] = []  # every consumer made, to close
        self._idle: list[Any] = []  # those no question holds, newest given back last
        self._warming = 0  # consumers being made in the background (_warm_up)
        # consumers whose question failed, kept for that question (partition, or None: metadata)
        self._pinned: dict[tuple[str, int] | None, Any] = {}
        self._consumers_lock = threading.Lock()
        self.topics = topics
        self.answer_s = answer_s
        self._pool: ThreadPoolExecutor | None = None
        self._asking: dict[tuple[str, int], Future[tuple[int, int]]] = {}
        self._known: dict[tuple[str, int], tuple[int, int]] = {}
        self._partitions: dict[str, list[int]] = {}
        self._metadata: Future[Any] | None = None
        self._metadata_at = 0.0
        self._late: frozenset[tuple[str, int]] = frozenset()

    def _borrow(self) -> Any:
        """A consumer no other question holds: one that has asked before, else a new one."""
        with self._consumers_lock:
            if self._idle:
                return self._idle.pop()
        consumer = self._factory()
        with self._consumers_lock:
            self._consumers.append(consumer)
        return consumer

    def _warm_up(self, wanted: int) -> None:
        """Make consumers until there are ``wanted``, each asking for the topics' metadata
        once (its leaders known before a fault needs it), in the background."""
        with self._consumers_lock:
            missing = wanted - len(self._consumers) - self._warming
            self._warming += max(0, missing)
        for _ in range(missing):
            self._executor().submit(self._warm_one)

    def _warm_one(self) -> None:
        consumer = self._factory()
        try:
            consumer.list_topics(self.topics[0], timeout=_QUESTION_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - still a consumer; it learns the leaders on its first question
            log.debug(kv(event="watermark_consumer_warm_up_failed"))
        with self._consumers_lock:
            self._warming -= 1
            self._consumers.append(consumer)
            self._idle.insert(0, consumer)  # taken after those that have asked already

    def _with_consumer(self, key: tuple[str, int] | None, question: Callable[[Any], Any]) -> Any:
        """``question(consumer)`` about partition ``key`` (None: the metadata) on a lent consumer.
        One whose question failed (librdkafka gave up on a hung leader) is kept for that
        question alone: its handle may still wait on that broker, and a question about another
        partition behind it would wait too; it is lent again, last, once its question is answered."""
        consumer = self._pinned.pop(key, None)
        pinned = consumer is not None
        if consumer is None:
            consumer = self._borrow()
        try:
            answer = question(consumer)
        except Exception:
            with self._consumers_lock:
                self._pinned[key] = consumer
            raise
        with self._consumers_lock:
            if pinned:
                self._idle.insert(0, consumer)
            else:
                self._idle.append(consumer)
        return answer

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=_POOL_SIZE, thread_name_prefix="isrwatch-watermarks")
        return self._pool

    def _refresh_partitions(self, deadline: float) -> None:
        now = time.monotonic()
        if self._metadata is None and (not self._partitions or now - self._metadata_at >= _METADATA_EVERY_S):
            self._metadata = self._executor().submit(
                self._with_consumer, None, lambda c: c.list_topics(timeout=_QUESTION_TIMEOUT_S)
            )
            self._metadata_at = now
        if self._metadata is None:
            return
        wait([self._metadata], timeout=max(0.0, deadline - time.monotonic()))
        if not self._metadata.done():
            return  # ask again once it returns; plan with the partitions known
        future, self._metadata = self._metadata, None
        try:
            md = future.result()
        except Exception as e:  # noqa: BLE001 - KafkaException: keep the last list
            log.warning(kv(event="telemetry_metadata_failed", error=str(e).splitlines()[0] if str(e) else type(e)))
            return
        for topic in self.topics:
            tmd = md.topics.get(topic)
            if tmd is not None and tmd.error is None and tmd.partitions:
                self._partitions[topic] = sorted(tmd.partitions)

    def _ask(self, topic: str, partition: int) -> tuple[int, int]:
        from confluent_kafka import TopicPartition

        lo, hi = self._with_consumer(
            (topic, partition),
            lambda c: c.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=_QUESTION_TIMEOUT_S, cached=False
            ),
        )
        return int(lo), int(hi)

    def poll(self, wait_s: float | None = None) -> tuple[Offsets, Offsets]:
        """(low, high) of every partition that has ever answered; the newest answers within
        ``wait_s`` (default ``answer_s``)."""
        deadline = time.monotonic() + (self.answer_s if wait_s is None else wait_s)
        self._refresh_partitions(deadline)
        pool = self._executor()
        fresh = []
        for topic, parts in self._partitions.items():
            for p in parts:
                if (topic, p) not in self._asking:
                    self._asking[(topic, p)] = pool.submit(self._ask, topic, p)
                    fresh.append(self._asking[(topic, p)])
        # Wait only for this poll's questions: one still open from an earlier poll is
        # already known to be late, and waiting for it would slow every batch.
        wait(fresh, timeout=max(0.0, deadline - time.monotonic()))
        failed = set()
        for key, future in list(self._asking.items()):
            if not future.done():
                continue
            del self._asking[key]
            try:
                self._known[key] = future.result()
            except Exception as e:  # noqa: BLE001 - no answer this time: keep the last one
                log.debug(kv(event="watermark_failed", topic=key[0], partition=key[1], error=str(e)))
                failed.add(key)  # (librdkafka gave up on a leader that hangs: still late)
        late = frozenset(self._asking) | frozenset(failed)
        if not late:  # every leader answers: have a consumer ready for each question (and the metadata's)
            self._warm_up(min(_POOL_SIZE, sum(len(parts) for parts in self._partitions.values()) + 1))
        if late != self._late:
            log.warning(
                kv(
                    event="telemetry_partitions_late",
                    partitions=",".join(f"{t}[{p}]" for t, p in sorted(late)) or "none",
                    hint="planned from their last known end offsets until their leaders answer",
                )
            )
            self._late = late
        low: Offsets = {}
        high: Offsets = {}
        for (topic, p), (lo, hi) in sorted(self._known.items()):
            low.setdefault(topic, {})[str(p)] = lo
            high.setdefault(topic, {})[str(p)] = hi
        return low, high

    @property
    def late(self) -> frozenset[tuple[str, int]]:
        """Partitions whose leader did not answer the last poll in time."""
        return self._late

    def close(self) -> None:
        # Questions still running hold the consumer: let them end (at most
        # _QUESTION_TIMEOUT_S, only when a leader hangs) before closing it.
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        with self._consumers_lock:
            consumers, self._consumers, self._idle, self._pinned = self._consumers, [], [], {}
        for consumer in consumers:
            consumer.close()
