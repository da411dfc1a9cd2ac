"""A purpose-built generator of valid telemetry (``isrwatch/telemetry.py``, version 1, which the job still reads).

The simulator (``simulator/``) models every fetch of every follower and
produces about 5,000 observations per second of CPU here: far too slow for
millions of observations. ``Fleet`` writes the same documented format for a
fleet of N follower replicas (3 brokers, replication factor 3, so 2
followers per partition, 1,000 partitions per topic), one polling round at a
time, many observations per record like the collector, at a few hundred
thousand observations per second: the static part of each observation is
rendered once.

Replica ``i`` is caught up in every round unless it is in ``slow`` (index ->
round): from that round on it fetches at half its leader's pace, so it keeps
making progress (not stalled) while its time since caught up grows, exactly
as a slow follower's does; taken out of ``slow``, it is caught up again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from isrwatch.telemetry import observation_fields

__all__ = ["Fleet", "PER_RECORD", "BROKERS", "as_version"]

PER_RECORD = 500
BROKERS = 3
_PARTITIONS_PER_TOPIC = 1000

_OBS = '"t_ms":%d,"leo":%d,"leader_leo":%d,"hw":%d,"prev_t_ms":%s,"prev_leo":%s,"prev_leader_leo":%s,'


class Fleet:
    """``replicas`` followers of one cluster; ``round(r, t_ms)`` -> encoded records."""

    def __init__(
        self,
        replicas: int,
        *,
        cluster: str = "bench",
        per_record: int = PER_RECORD,
        lag_time_max_ms: int = 10_000,
        min_isr: int = 2,
        interval_ms: int = 1000,
        leo_step: int = 50,
    ) -> None:
        if replicas < 1 or per_record < 1:
            raise ValueError("replicas and per_record must be at least 1")
        self.replicas = replicas
        self.cluster = cluster
        self.per_record = per_record
        self.interval_ms = interval_ms
        self.leo_step = leo_step
        self.keys: list[tuple[str, int, int]] = []
        self._prefix: list[str] = []
        self._base: list[int] = []
        isr = "[1,2,3]"
        for i in range(replicas):
            p = i // 2
            leader = 1 + p % BROKERS
            followers = [b for b in range(1, BROKERS + 1) if b != leader]
            broker = followers[i % 2]
            topic = f"bench-{p // _PARTITIONS_PER_TOPIC:04d}"
            part = p % _PARTITIONS_PER_TOPIC
            self.keys.append((topic, part, broker))
            self._prefix.append(f'{{"topic":"{topic}","partition":{part},"broker_id":{broker},"leader_id":{leader},')
            self._base.append(1000 + (p % 997))
        self._suffix_text = f'"isr":{isr},"replicas":{isr},"lag_time_max_ms":{lag_time_max_ms},"min_isr":{min_isr}}}'

    def leader_leo(self, i: int, r: int) -> int:
        return self._base[i] + r * self.leo_step

    def values(self, i: int, r: int, slow: Mapping[int, int] | None = None) -> tuple[int, int, int | None, int | None]:
        """(leo, leader_leo, prev_leo, prev_leader_leo) of replica ``i`` in round ``r``."""
        step = self.leo_step
        lleo = self._base[i] + r * step
        prev_l = None if r == 0 else lleo - step
        since = (slow or {}).get(i)
        if since is None or r < since:
            return lleo, lleo, prev_l, prev_l
        return self._slow_leo(i, r, since), lleo, None if r == 0 else self._slow_leo(i, r - 1, since), prev_l

    def _slow_leo(self, i: int, r: int, since: int) -> int:
        # From round ``since`` on, the follower fetches half as fast as its leader grows.
        if r < since:
            return self._base[i] + r * self.leo_step
        return self._base[i] + (since - 1) * self.leo_step + (r - since + 1) * (self.leo_step // 2)

    def round(
        self, r: int, t_ms: int, slow: Mapping[int, int] | None = None, lo: int = 0, hi: int | None = None
    ) -> list[bytes]:
        """Round ``r`` (0, 1, ...) observed at ``t_ms``: every replica once, or the replicas
        ``lo`` to ``hi`` (a slice of a round, for a feed spread over the round).
        ``slow``: replica index -> the round from which it falls behind."""
        slow = slow or {}
        step = self.leo_step
        suffix = self._suffix_text
        prev_t = "null" if r == 0 else str(t_ms - self.interval_ms)
        obs: list[str] = []
        append = obs.append
        for i in range(lo, self.replicas if hi is None else min(hi, self.replicas)):
            prefix = self._prefix[i]
            if i in slow:
                leo, lleo, pl, pll = self.values(i, r, slow)
                fields = (t_ms, leo, lleo, lleo, prev_t, _js(pl), _js(pll))
            else:
                lleo = self._base[i] + r * step
                prev_l = "null" if r == 0 else str(lleo - step)
                fields = (t_ms, lleo, lleo, lleo, prev_t, prev_l, prev_l)
            append(prefix + _OBS % fields + suffix)
        head = f'{{"version":1,"cluster":"{self.cluster}","source":"bench","sent_ms":{t_ms},"observations":['
        n = self.per_record
        return [(head + ",".join(obs[k : k + n]) + "]}").encode() for k in range(0, len(obs), n)]

    def records_per_round(self) -> int:
        return -(-self.replicas // self.per_record)


def as_version(record: bytes, version: int) -> bytes:
    """A version-1 record of ``Fleet`` in telemetry ``version`` (the same observations)."""
    body = json.loads(record)
    observations = body.pop("observations")
    body["version"] = version
    return json.dumps({**body, **observation_fields(version, observations)}, separators=(",", ":")).encode()


def _js(v: int | None) -> str:
    return "null" if v is None else str(v)
