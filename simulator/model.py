"""The discrete-event model: producers, leaders, replica fetchers and the controller.

Time is simulated, in epoch milliseconds. One event queue drives everything,
so a run is fully determined by its seed.

* The producer appends a batch to every partition's leader each
  ``produce_tick_ms`` (the profile says how many messages).
* One replica fetcher per (follower broker, leader broker), as in Kafka: it
  sends one fetch for all its partitions; the leader takes each partition's
  LEO *before* the read, updates its view of the follower with
  ``isrwatch.rule.on_fetch``, lets the follower rejoin the ISR when its
  offset reaches the high watermark (``rule.can_rejoin``) and answers at
  once when there is data, otherwise parks the fetch up to
  ``replica.fetch.wait.max.ms``. The response carries up to
  ``fetch_max_messages`` per partition and takes latency + size/bandwidth.
* Each broker runs the ISR check every ``rule.check_period_ms`` (random
  phase) and drops the followers ``rule.is_out_of_sync`` names.
* The controller removes a broker paused past its session timeout from
  every ISR and moves its leaderships to the first other ISR member.
* A new leader starts a new leader epoch; with ``epoch_per_isr_change`` (KRaft
  before metadata.version 3.6-IV0) so does every ISR change under the same
  leader, and the leader then starts each in-sync follower's clock afresh
  (``Partition.makeLeader``: ``lastCaughtUpTimeMs`` = now).
* A paused broker does nothing: events addressed to it wait until it resumes.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections.abc import Callable
from typing import Any

from isrwatch.logs import kv
from isrwatch.rule import FollowerState, Rule, RuleConfig, can_rejoin, check_period_ms, is_out_of_sync, on_fetch
from simulator.cluster import ClusterSpec, Partition, build_partitions
from simulator.profiles import ProduceProfile
from simulator.truth import TrueChange

__all__ = ["Engine", "Fetcher", "FetchHook"]

log = logging.getLogger(__name__)

# Called for every fetch a leader serves, before it updates its view:
# (partition, follower, t_ms, fetch_offset, leader_leo, follower_state_before).
FetchHook = Callable[[Partition, int, int, int, int, FollowerState], None]

# One partition in a fetch request: (partition, leader epoch, fetch offset).
_Item = tuple[Partition, int, int]


class Fetcher:
    """The replica fetcher of ``follower`` for the partitions ``leader`` leads."""

    __slots__ = ("follower", "leader", "busy", "stalled", "bandwidth", "partitions")

    def __init__(self, follower: int, leader: int, bandwidth: float) -> None:
        self.follower = follower
        self.leader = leader
        self.busy = False  # a request or its response is in flight
        self.stalled = False
        self.bandwidth = bandwidth
        self.partitions: list[Partition] = []


class Engine:
    def __init__(
        self,
        spec: ClusterSpec,
        rule: RuleConfig,
        profile: ProduceProfile,
        *,
        seed: int,
        start_ms: int,
        fetch_hook: FetchHook | None = None,
    ) -> None:
        self.spec = spec
        self.rule = rule
        self.profile = profile
        self.rng = random.Random(seed)
        self.start_ms = start_ms
        self.now = start_ms
        self.fetch_hook = fetch_hook
        self.partitions = build_partitions(spec, start_ms)
        self.brokers = list(range(1, spec.brokers + 1))
        self.changes: list[TrueChange] = []
        self._queue: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self._paused: dict[int, list[tuple[Callable[..., None], tuple[Any, ...]]]] = {}
        self._pause_count = dict.fromkeys(self.brokers, 0)
        self._truncations: dict[int, list[tuple[Partition, int]]] = {}
        self._parked: dict[int, dict[int, tuple[Fetcher, list[_Item]]]] = {b: {} for b in self.brokers}
        self._next_request = 0
        self.fetchers = {
            (f, ld): Fetcher(f, ld, spec.fetch_bandwidth) for f in self.brokers for ld in self.brokers if f != ld
        }
        self._period = check_period_ms(rule)
        self._epoch_start_rule = rule.rule is Rule.KIP16_REFINED and rule.idle_is_caught_up
        # KRaft before metadata.version 3.6-IV0: every ISR change bumps the leader epoch
        # (faults.EpochPerIsrChange); such a cluster's metadata gives the epoch (Metadata v7+).
        self.epoch_per_isr_change = False
        self.check_phase: dict[int, int] = {}  # each broker's first ISR check, ms after the start

    # -- event queue ---------------------------------------------------

    def schedule(self, t_ms: int, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (t_ms, self._seq, fn, args))

    def at(self, rel_ms: int, fn: Callable[..., None], *args: Any) -> None:
        """Schedule at ``rel_ms`` after the start."""
        self.schedule(self.start_ms + rel_ms, fn, *args)

    def on_broker(self, t_ms: int, broker: int, fn: Callable[..., None], *args: Any) -> None:
        """Schedule work done *by* ``broker``: it waits while the broker is paused."""
        self.schedule(t_ms, self._run_on_broker, broker, fn, args)

    def _run_on_broker(self, broker: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        deferred = self._paused.get(broker)
        if deferred is not None:
            deferred.append((fn, args))
        else:
            fn(*args)

    def start(self) -> None:
        """Start the producer, the ISR check timers and the fetchers."""
        self.schedule(self.start_ms + self.spec.produce_tick_ms, self._produce, self.start_ms)
        for b in self.brokers:
            phase = self.check_phase[b] = self.rng.randrange(self._period)
            self.on_broker(self.start_ms + phase, b, self._isr_check, b, self.start_ms + phase)
        self._refresh_fetchers()

    def run_until(self, t_ms: int) -> None:
        """Process every event up to and including ``t_ms``; then now = t_ms."""
        q = self._queue
        while q and q[0][0] <= t_ms:
            t, _, fn, args = heapq.heappop(q)
            self.now = t
            fn(*args)
        self.now = t_ms

    def latency(self) -> int:
        lo, hi = self.spec.latency_ms
        return self.rng.randint(lo, hi)

    def next_check_ms(self, broker: int, rel_ms: int) -> int:
        """When (ms after the start) ``broker`` runs its first ISR check at or after ``rel_ms``,
        pauses aside. Known once the engine has started."""
        phase = self.check_phase[broker]
        return phase + max(0, -(-(rel_ms - phase) // self._period)) * self._period

    def is_paused(self, broker: int) -> bool:
        return broker in self._paused

    # -- producer ------------------------------------------------------

    def _produce(self, last: int) -> None:
        """One producer batch to every partition; the next comes a tick later, +-20%."""
        tick = self.spec.produce_tick_ms
        rel, elapsed = self.now - self.start_ms, self.now - last
        woken = set()
        for p in self.partitions:
            leader = p.leader
            if leader is None or leader in self._paused:
                continue
            n = self.profile.messages(self.rng, rel, elapsed)
            if n:
                p.leo[leader] += n
                woken.add(leader)
        for b in sorted(woken):
            self._wake_parked(b)
        jitter = tick // 5
        self.schedule(self.now + tick + self.rng.randint(-jitter, jitter), self._produce, self.now)

    # -- fetch path ----------------------------------------------------

    def _refresh_fetchers(self) -> None:
        """Recompute each fetcher's partitions (after a leadership change) and start idle ones."""
        for fx in self.fetchers.values():
            fx.partitions = []
        for p in self.partitions:
            if p.leader is None:
                continue
            for r in p.replicas:
                if r != p.leader:
                    self.fetchers[(r, p.leader)].partitions.append(p)
        for fx in self.fetchers.values():
            if fx.partitions and not fx.busy and not fx.stalled and fx.follower not in self._paused:
                self._send_fetch(fx)

    def _send_fetch(self, fx: Fetcher) -> None:
        if fx.stalled or not fx.partitions:
            fx.busy = False
            return
        f = fx.follower
        request = [(p, p.epoch, p.leo[f]) for p in fx.partitions]
        fx.busy = True
        self.on_broker(self.now + self.latency(), fx.leader, self._serve_fetch, fx, request)

    def _serve_fetch(self, fx: Fetcher, request: list[_Item]) -> None:
        """The leader handles a fetch: the KIP-16 bookkeeping, then answer or park."""
        now, cfg, leader, f = self.now, self.rule, fx.leader, fx.follower
        valid: list[_Item] = []
        has_data = False
        for item in request:
            p, epoch, offset = item
            if p.epoch != epoch or p.leader != leader:
                continue  # NOT_LEADER / FENCED_LEADER_EPOCH: the follower learns it elsewhere
            leader_leo = p.leo[leader]
            state = p.followers[f]
            if self.fetch_hook is not None:
                self.fetch_hook(p, f, now, offset, leader_leo, state)
            p.followers[f] = on_fetch(state, cfg, now, offset, leader_leo)
            if f in p.isr:
                p.update_hw()
            else:
                start = p.epoch_start if self._epoch_start_rule else None
                if can_rejoin(offset, p.hw, start):
                    self._change_isr(p, (*p.isr, f), "expand", "follower-fetch", (f,), leo=offset)
            valid.append(item)
            if offset < leader_leo:
                has_data = True
        if has_data or not valid:
            self._respond(fx, valid)
            return
        self._next_request += 1
        rid = self._next_request
        self._parked[leader][rid] = (fx, valid)
        self.on_broker(now + self.spec.fetch_wait_max_ms, leader, self._fetch_timeout, leader, rid)

    def _wake_parked(self, leader: int) -> None:
        parked = self._parked[leader]
        for rid in list(parked):
            fx, items = parked[rid]
            if any(p.leader == leader and p.leo[leader] > offset for p, _, offset in items):
                del parked[rid]
                self._respond(fx, items)

    def _fetch_timeout(self, leader: int, rid: int) -> None:
        entry = self._parked[leader].pop(rid, None)
        if entry is not None:
            self._respond(*entry)

    def _respond(self, fx: Fetcher, items: list[_Item]) -> None:
        leader, cap = fx.leader, self.spec.fetch_max_messages
        response = []
        total = 0
        for p, epoch, offset in items:
            n = 0
            if p.epoch == epoch and p.leader == leader:
                n = min(cap, max(0, p.leo[leader] - offset))
            total += n
            response.append((p, epoch, offset, n))
        transfer = self.latency() + round(total / fx.bandwidth)
        self.on_broker(self.now + transfer, fx.follower, self._apply_response, fx, response)

    def _apply_response(self, fx: Fetcher, response: list[tuple[Partition, int, int, int]]) -> None:
        f = fx.follower
        for p, epoch, offset, n in response:
            if n and p.epoch == epoch and p.leader != f and p.leo[f] == offset:
                p.leo[f] = offset + n
        self._send_fetch(fx)

    # -- the leader's ISR check ----------------------------------------

    def _isr_check(self, broker: int, scheduled: int) -> None:
        now, cfg = self.now, self.rule
        for p in self.partitions:
            if p.leader != broker or len(p.isr) < 2:
                continue
            leader_leo = p.leo[broker]
            out = tuple(r for r in p.isr if r != broker and is_out_of_sync(p.followers[r], cfg, now, leader_leo))
            if out:
                lcu = tuple(p.followers[r].last_caught_up_ms for r in out)
                isr = tuple(r for r in p.isr if r not in out)
                self._change_isr(p, isr, "shrink", "leader-check", out, last_caught_up_ms=lcu)
        nxt = scheduled + self._period
        while nxt <= now:
            nxt += self._period
        self.on_broker(nxt, broker, self._isr_check, broker, nxt)

    def _change_isr(
        self,
        p: Partition,
        isr: tuple[int, ...],
        change: str,
        cause: str,
        brokers: tuple[int, ...],
        *,
        leader: int | None = None,
        last_caught_up_ms: tuple[int, ...] = (),
        leo: int | None = None,
    ) -> None:
        before, leader_before = p.isr, p.leader
        p.isr = isr
        if leader is not None and leader != p.leader:
            self._elect(p, leader)
        elif self.epoch_per_isr_change and p.leader is not None:
            self._bump_epoch(p)
        p.update_hw()
        c = TrueChange(
            t_ms=self.now,
            topic=p.topic,
            partition=p.index,
            change=change,
            cause=cause,
            brokers=brokers,
            isr_before=before,
            isr_after=isr,
            leader_before=leader_before,
            leader_after=p.leader,
            hw=p.hw,
            last_caught_up_ms=last_caught_up_ms,
            leo=leo,
        )
        self.changes.append(c)
        log.debug(
            "isr %s",
            kv(change=change, cause=cause, topic=p.topic, partition=p.index, isr=list(isr), t_ms=self.now),
        )

    # -- controller and faults -----------------------------------------

    def _elect(self, p: Partition, leader: int) -> None:
        """Leadership moves: new epoch starting at the new leader's LEO; others truncate to it."""
        p.leader = leader
        p.epoch += 1
        start = p.leo[leader]
        p.epoch_start = start
        p.hw = min(p.hw, start)
        for r in p.replicas:
            if r == leader:
                continue
            if r in self._paused:
                self._truncations.setdefault(r, []).append((p, start))
            elif p.leo[r] > start:
                p.leo[r] = start
        p.followers = {r: FollowerState.new(self.now, leo=p.hw if r in p.isr else 0) for r in p.replicas if r != leader}

    def _bump_epoch(self, p: Partition) -> None:
        """A new leader epoch under the same leader: ``Partition.makeLeader`` runs again and
        starts each in-sync follower's clock at now (``Replica.resetReplicaState``)."""
        assert p.leader is not None
        p.epoch += 1
        p.epoch_start = p.leo[p.leader]
        for r in p.isr:
            if r != p.leader:
                f = p.followers[r]
                p.followers[r] = FollowerState(
                    max(f.last_caught_up_ms, self.now), f.last_fetch_ms, f.leo, f.prev_fetch_ms, f.prev_leader_leo
                )

    def pause_broker(self, broker: int) -> None:
        if broker in self._paused:
            return
        self._paused[broker] = []
        self._pause_count[broker] += 1
        log.info("pause %s", kv(broker_id=broker, t_ms=self.now))
        self.schedule(self.now + self.spec.session_timeout_ms, self._session_expired, broker, self._pause_count[broker])

    def _session_expired(self, broker: int, pause: int) -> None:
        if broker not in self._paused or self._pause_count[broker] != pause:
            return
        log.info("session expired %s", kv(broker_id=broker, t_ms=self.now))
        for p in self.partitions:
            if broker not in p.isr:
                continue
            isr = tuple(r for r in p.isr if r != broker)
            if p.leader == broker and not isr:
                continue  # no other in-sync replica: offline, no unclean election
            leader = isr[0] if p.leader == broker else None
            self._change_isr(p, isr, "shrink", "controller", (broker,), leader=leader)
        self._refresh_fetchers()

    def resume_broker(self, broker: int) -> None:
        deferred = self._paused.pop(broker, None)
        if deferred is None:
            return
        log.info("resume %s", kv(broker_id=broker, t_ms=self.now))
        # Leaders elected while it slept: drop what it holds past each new epoch's start.
        for p, start in self._truncations.pop(broker, ()):
            if p.leader != broker and p.leo[broker] > start:
                p.leo[broker] = start
        for fn, args in deferred:
            self.schedule(self.now, fn, *args)
        self._refresh_fetchers()

    def stall_fetcher(self, follower: int, leader: int, stalled: bool) -> None:
        fx = self.fetchers[(follower, leader)]
        fx.stalled = stalled
        log.info("fetcher %s", kv(follower=follower, leader=leader, stalled=stalled, t_ms=self.now))
        if not stalled and not fx.busy and follower not in self._paused:
            self._send_fetch(fx)

    def set_bandwidth(self, follower: int, leader: int, bandwidth: float | None) -> None:
        fx = self.fetchers[(follower, leader)]
        fx.bandwidth = self.spec.fetch_bandwidth if bandwidth is None else bandwidth
        log.info("fetcher %s", kv(follower=follower, leader=leader, bandwidth=fx.bandwidth, t_ms=self.now))

    def bootstrap_follower(self, follower: int, backlog: int) -> None:
        """Before start: the other replicas hold ``backlog`` more messages than ``follower``,
        which is out of the ISR of every partition it follows."""
        for p in self.partitions:
            if follower not in p.replicas or p.leader == follower:
                continue
            for r in p.replicas:
                if r != follower:
                    p.leo[r] += backlog
            p.hw += backlog
            p.isr = tuple(r for r in p.isr if r != follower)
            p.followers = {r: FollowerState.new(self.now, leo=p.leo[r]) for r in p.replicas if r != p.leader}
