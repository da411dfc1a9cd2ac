"""Between micro-batches, the clock runs on: a follower's Nearing at the moment it crosses.

``Lookahead`` keeps, for each follower that is behind and ok, the time it will cross
``nearing_ratio`` (``lcu + nearing_ratio * lag``), and once that time has come on the job's
wall clock says the replica is nearing then (``carry``: its newest status carried forward to
the crossing, nothing else changed). What it infers is bounded: at most ``horizon`` past the
replica's newest status (``--lookahead-ms``, else ``HORIZON_SHARE`` of its lag, or
``STALLED_HORIZON_SHARE`` for a stalled follower), only while its cluster's telemetry is within ``live_ms`` of the wall clock, only
Nearing; ``silent_due`` is the crossing of a follower on a broker the job itself sees silent.
Why, and the bounds in full: docs/streaming.md, "Between batches: the clock runs on".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping

from isrwatch.alerts import AlertKey, AlertName, replica_alerts
from isrwatch.rule import Rule, RuleConfig
from isrwatch.status import ReplicaKey, ReplicaStatus, State, Thresholds, lag_state_of, last_caught_up_ms

__all__ = ["Lookahead", "carry", "kept_up", "last_caught_up_ms", "HORIZON_SHARE", "STALLED_HORIZON_SHARE"]

# The default horizon, as a share of the replica's replica.lag.time.max.ms: at Kafka's
# default 30 s, 7.5 s past the newest telemetry; a follower is carried to Nearing only if
# its newest status already showed it behind for at least nearing_ratio - this share.
HORIZON_SHARE = 0.25
# The horizon of a stalled follower: any crossing of the default nearing ratio.
STALLED_HORIZON_SHARE = 0.5


def carry(s: ReplicaStatus, at_ms: int, th: Thresholds) -> ReplicaStatus:
    """``s`` at the later time ``at_ms``, with no new evidence: the age since the last
    catch-up grows, everything else stays."""
    lag = s.lag_time_max_ms
    age = max(0, at_ms - last_caught_up_ms(s))
    ratio = age / lag
    lag_state = lag_state_of(ratio, False, th)  # (only followers in the ISR are carried)
    return dataclasses.replace(
        s,
        eval_ms=at_ms,
        state=State.STALLED if s.state is State.STALLED else lag_state,
        lag_state=lag_state,
        time_since_caught_up_s=age / 1000.0,
        lag_ratio=ratio,
        peak_lag_ratio=max(ratio, s.peak_lag_ratio or 0.0),
        time_to_shrink_s=max(0, s.shrink_window_start_ms - at_ms) / 1000.0,
    )


def kept_up(s: ReplicaStatus, prev_t_ms: int | None) -> bool:
    """Whether ``s`` shows its follower caught up as of its previous observation (at ``prev_t_ms``;
    None: not known). Spark's ``streaming.evaluation.evaluate.kept_up`` is the same test."""
    return prev_t_ms is not None and last_caught_up_ms(s) >= prev_t_ms


class Lookahead:
    """The followers due to cross ``nearing_ratio`` between batches, and those carried there.
    Not thread-safe: ``streaming.driver.monitor.Monitor`` calls it under its lock."""

    # a follower's horizon, as a share of its lag time (``streaming.evaluation.evaluate.within_reach`` too)
    horizon_share = HORIZON_SHARE

    def __init__(self, cfg: RuleConfig, th: Thresholds, *, live_ms: int, horizon_ms: int | None = None) -> None:
        self.th = th
        self.live_ms = live_ms
        self.horizon_ms = horizon_ms
        # The legacy rule's ratio is also a message count, which does not grow with the clock.
        self.enabled = cfg.rule is not Rule.LEGACY_MESSAGES and horizon_ms != 0
        self._due: dict[ReplicaKey, int] = {}  # key -> its crossing, within the horizon of its status
        self.carried: dict[ReplicaKey, ReplicaStatus] = {}  # key -> the status carried to its crossing
        self._silent: set[ReplicaKey] = set()  # carried on the job's own evidence (silent_due)

    def watched(self) -> set[ReplicaKey]:
        """The followers due to cross between batches or carried there: the driver needs
        each of their observations (``Monitor.watched_keys``)."""
        return {*self._due, *self.carried}

    def horizon(self, s: ReplicaStatus) -> int:
        """How far past ``s``'s time its crossing may be inferred: ``--lookahead-ms`` when
        given, else a share of the replica's lag (a stalled follower's is wider)."""
        if self.horizon_ms is not None:
            return self.horizon_ms
        share = STALLED_HORIZON_SHARE if s.state is State.STALLED else HORIZON_SHARE
        return int(s.lag_time_max_ms * share)

    def observe(self, key: ReplicaKey, s: ReplicaStatus, prev_t_ms: int | None = None) -> ReplicaStatus:
        """Take in ``s``, a status made from telemetry; returns the status to hold for the
        replica: ``s``, or, for a replica carried to Nearing that ``s`` still shows behind
        and due to cross within the horizon, ``s`` carried to its crossing. (Telemetry that
        arrives late can move the last catch-up a collector round on: the alert holds.)

        ``prev_t_ms``: the time of the replica's observation before ``s``'s (Spark's
        ``streaming.evaluation.evaluate.PREV_OBSERVED``), None when not known (its first
        observation, a status restored from the state table). A follower caught up at or
        after it is not planned to cross: its age is no more than the interval between two
        observations, which says how often the collector polls it, not that it stopped
        fetching, and the next observation (one interval on) would come after the crossing it
        would infer once that interval is past the horizon's start (a collector polling every
        6 s at a 20 s lag time: a follower that keeps up is 6 s behind at each observation, due
        to cross 4 s later). It is planned at the next observation that still shows it behind.
        Not so a stalled follower (its broker silent while its leader answers): that status is
        evidence."""
        if not self.enabled:
            return s
        held = s
        carried = self.carried.pop(key, None)
        silent = key in self._silent
        self._silent.discard(key)
        if carried is not None:
            crossing = self._crossing(s)
            if crossing is not None:
                held = self.carried[key] = carry(s, max(crossing, carried.eval_ms), self.th)
            elif silent and self._agrees(s, carried):
                # telemetry from the silence (the backlog once the broker answers) that shows
                # no catch-up after the one assumed: it does not refute the job's own evidence
                held = self.carried[key] = carried
                self._silent.add(key)
        if carried is None and s.state is not State.STALLED and kept_up(s, prev_t_ms):
            self._due.pop(key, None)  # caught up as of its previous observation: polled, not stopped
        else:
            self._plan(key, held)
        return held

    def resume(self, key: ReplicaKey, s: ReplicaStatus, firing: Collection[AlertKey]) -> ReplicaStatus:
        """After a restart: ``s``, restored from telemetry, carried again to its crossing if
        the restored alert book (``firing``: the keys of its alerts) has it nearing and ``s``
        agrees (behind, due within the horizon); else the first batch would resolve the
        alert and a later one say it again."""
        crossing = self._crossing(s) if self.enabled else None
        if crossing is None:
            return s
        carried = carry(s, crossing, self.th)
        nearing = [a for a in replica_alerts(carried, self.th) if a.name is AlertName.NEARING]
        if not nearing or nearing[0].key not in firing:
            return s
        self.carried[key] = carried
        self._due.pop(key, None)
        return carried

    def _agrees(self, s: ReplicaStatus, carried: ReplicaStatus) -> bool:
        """``s`` shows the follower in the ISR, ok, and caught up no later than ``carried``
        assumed (within the stall time: the broker's last answer to the job and the
        telemetry's last view of it are that far apart at most)."""
        return (
            s.in_isr
            and s.lag_state is State.OK
            and last_caught_up_ms(s) <= last_caught_up_ms(carried) + self.th.stall_after_ms
        )

    def _crossing(self, s: ReplicaStatus) -> int | None:
        """When ``s``'s follower crosses ``nearing_ratio`` if it is ok, in the ISR and behind,
        and that is within the horizon of ``s``'s time; else None."""
        if s.lag_state is not State.OK or not s.in_isr or s.time_since_caught_up_s <= 0:
            return None
        crossing = last_caught_up_ms(s) + math.ceil(self.th.nearing_ratio * s.lag_time_max_ms)
        return crossing if crossing - s.eval_ms <= self.horizon(s) else None

    def _plan(self, key: ReplicaKey, s: ReplicaStatus) -> None:
        crossing = self._crossing(s)
        if crossing is None:
            self._due.pop(key, None)
        else:
            self._due[key] = crossing

    def due(
        self,
        wall_ms: int,
        cluster_now: dict[str, int],
        statuses: dict[ReplicaKey, ReplicaStatus],
        resumed: Mapping[tuple[str, int], float] | None = None,
    ) -> list[ReplicaStatus]:
        """The followers whose crossing has come on the wall clock, each carried to it (and
        remembered as such). Not a follower whose broker the job itself saw answer again
        after a silence (``resumed``: (cluster, broker) -> wall time, only the telemetry
        cluster's brokers, ``streaming.driver.identity``) later than its status: a broker that
        answers fetches again, and the telemetry to come says how far behind it is; the
        crossing from before is refuted, not carried (for at most its lag after the resume)."""
        out = []
        for key, crossing in list(self._due.items()):
            s = statuses.get(key)
            if s is None:
                del self._due[key]
                continue
            if wall_ms - cluster_now.get(key[0], s.eval_ms) > self.live_ms:
                continue  # the cluster's telemetry is behind: wait for it
            back = int(resumed.get((key[0], key[3]), 0) * 1000) if resumed else 0
            if s.eval_ms < back and wall_ms - back < s.lag_time_max_ms:
                continue  # answering again since this status: wait for the telemetry
            if crossing <= wall_ms:
                del self._due[key]
                carried = self.carried[key] = carry(s, crossing, self.th)
                out.append(carried)
        return out

    def silent_due(
        self,
        wall_ms: int,
        still_for: dict[str, int],
        statuses: dict[ReplicaKey, ReplicaStatus],
        silent: Mapping[tuple[str, int], float],
    ) -> list[ReplicaStatus]:
        """The followers on a broker that the job itself sees silent (``silent``: (cluster,
        broker) -> wall time of its last answer to the job, ``streaming.driver.brokerwatch``; only
        a watched cluster's broker that is the telemetry cluster's by identity,
        ``streaming.driver.identity``) while their
        cluster's telemetry has stood still (``still_for``: per cluster, for how long, on the
        job's clock: ``Monitor._still_for``) nearly as long as a crossing, carried to Nearing once
        their crossing has come. Their last catch-up is taken to be the broker's last answer
        to the job: a broker that answers nobody fetches nothing. They are said stalled too.

        Only replicas in the ISR, ok and not carried already. This is the telemetry's own
        stall when isrwatch's topics are on the watched cluster: the collector cannot
        publish, or the job read, past a hung broker until its leaders drop it."""
        if not self.enabled or not silent:
            return []
        out = []
        for key, s in statuses.items():
            cluster, _, _, broker = key
            last_answer = silent.get((cluster, broker))
            if last_answer is None or key in self.carried:
                continue
            if still_for.get(cluster, 0) < self._still_ms(s):
                continue  # the telemetry goes on: it shows the broker's silence itself
            if not s.in_isr or s.lag_state is not State.OK:
                continue
            # The broker's last answer to the job: a follower under load fetches continuously,
            # so it last caught up about then (it cannot have after). Not the telemetry's last
            # catch-up: under load the telemetry ends seconds before the silence began, and a
            # crossing from there comes early and is refuted by the backlog once it arrives.
            caught_up = int(last_answer * 1000)
            crossing = caught_up + math.ceil(self.th.nearing_ratio * s.lag_time_max_ms)
            if crossing > wall_ms:
                continue
            # silent to the job while another broker answers: stalled, as the telemetry says it
            since = dataclasses.replace(s, state=State.STALLED, shrink_window_start_ms=caught_up + s.lag_time_max_ms)
            self._due.pop(key, None)
            self._silent.add(key)
            out.append(self.carried.setdefault(key, carry(since, crossing, self.th)))
        return out

    def _still_ms(self, s: ReplicaStatus) -> int:
        """How long the telemetry must have stood still before the job's own evidence speaks:
        nearly as long as a follower takes to cross (a telemetry that flows, a few seconds
        behind under load, never does; one frozen with the broker does by its crossing)."""
        return max(self.th.stall_after_ms, math.ceil(self.th.nearing_ratio * s.lag_time_max_ms) - 1000)

    def forget(self, key: ReplicaKey) -> None:
        self._silent.discard(key)
        self._due.pop(key, None)
        self.carried.pop(key, None)
