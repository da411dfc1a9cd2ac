"""Produce profiles: how many messages the producer appends to a partition per tick."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["ProduceProfile", "STEADY", "BURST", "LOW_VOLUME"]


@dataclass(frozen=True)
class ProduceProfile:
    """Messages per partition over time.

    ``rate_per_s`` is the mean rate between bursts (Poisson arrivals per
    tick); every ``burst_every_ms`` one tick carries an extra batch of
    ``burst_messages``; with ``idle_ms`` > 0 the producer alternates
    ``active_ms`` of traffic with ``idle_ms`` of silence.
    """

    name: str
    rate_per_s: float
    burst_every_ms: int = 0
    burst_messages: int = 0
    active_ms: int = 0
    idle_ms: int = 0

    def __post_init__(self) -> None:
        if self.rate_per_s < 0 or self.burst_every_ms < 0 or self.burst_messages < 0:
            raise ValueError(f"profile {self.name}: rates and sizes must be >= 0")
        if self.idle_ms and self.active_ms <= 0:
            raise ValueError(f"profile {self.name}: idle_ms needs active_ms > 0")

    def messages(self, rng: random.Random, t_rel_ms: int, elapsed_ms: int) -> int:
        """Messages for one partition in the batch sent ``t_rel_ms`` after the start,
        ``elapsed_ms`` after the previous batch."""
        if self.idle_ms and t_rel_ms % (self.active_ms + self.idle_ms) >= self.active_ms:
            return 0
        n = _poisson(rng, self.rate_per_s * elapsed_ms / 1000.0) if self.rate_per_s else 0
        every = self.burst_every_ms
        if every and t_rel_ms // every > (t_rel_ms - elapsed_ms) // every and t_rel_ms >= every:
            n += self.burst_messages
        return n


def _poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    if mean > 30:  # normal approximation, fast and close enough for load
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


# ~2 MB/s per partition of 1 KB messages: far below what one fetcher moves.
STEADY = ProduceProfile("steady", rate_per_s=2000.0)
# Light traffic with a 20 000-message batch per partition every 20 s.
BURST = ProduceProfile("burst", rate_per_s=200.0, burst_every_ms=20_000, burst_messages=20_000)
# A message every few seconds, and 40 s silences.
LOW_VOLUME = ProduceProfile("low-volume", rate_per_s=0.3, active_ms=30_000, idle_ms=40_000)
