"""The broker's ISR rule, in every Kafka version isrwatch knows.

Pure Python: no Spark, Kafka or I/O. The streaming job, the simulator and the
what-if replay all call this module, so the rule lives in one place.

Three variants (``Rule``):

* ``legacy-messages`` (before 0.9): a follower is out of sync when it is at
  least ``replica.lag.max.messages`` behind the leader LEO, or has not fetched
  for ``replica.lag.time.max.ms``.
* ``kip16`` (0.9 - 0.10.1): a fetch at time t whose fetch offset reaches the
  leader LEO taken before the read sets ``lastCaughtUpTimeMs`` to t.
* ``kip16-refined`` (0.10.2+, KAFKA-4485, the default): as ``kip16``; else if
  the fetch offset reaches the leader LEO seen at the follower's *previous*
  fetch, ``lastCaughtUpTimeMs`` becomes the time of that previous fetch. From
  2.1 a follower whose LEO equals the leader LEO is caught up whatever its
  ``lastCaughtUpTimeMs`` (idle partitions are never shrunk).

Under the KIP-16 variants a follower is out of sync when
``now - lastCaughtUpTimeMs > replica.lag.time.max.ms``.

``caught_up_time`` is the broker's rule, which sees every fetch;
``observed_caught_up_time`` is what the monitor infers from its samples, where a
long interval between two observations is a gap in the evidence, not time out
of sync (docs/rule.md, "Gaps in telemetry"), and ``leader_change_caught_up_time``
adds what a new leader's election, or a new leader epoch under the same leader
(``new_leadership``), proves (docs/rule.md, "The previous observation, when the
collector has none, and leader changes").
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

__all__ = [
    "Rule",
    "RuleConfig",
    "FollowerState",
    "caught_up_time",
    "observed_caught_up_time",
    "leader_change_caught_up_time",
    "new_leadership",
    "check_period_ms",
    "removal_window",
    "on_fetch",
    "is_out_of_sync",
    "can_rejoin",
    "AUTO",
    "parse_kafka_version",
    "chosen_rule",
    "for_version",
    "BY_VERSION",
    "KAFKA_VERSION_PATTERN",
]

# ``--rule auto`` (the job's default): each cluster's variant from its Kafka version (``chosen_rule``).
AUTO = "auto"


class Rule(str, enum.Enum):  # noqa: UP042 (not StrEnum: str() and format() of a member stay as they are)
    LEGACY_MESSAGES = "legacy-messages"
    KIP16 = "kip16"
    KIP16_REFINED = "kip16-refined"

    @classmethod
    def parse(cls, value: str) -> Rule:
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(r.value for r in cls)
            raise ValueError(f"rule={value!r} is not one of: {allowed}") from None


@dataclass(frozen=True)
class RuleConfig:
    """The broker settings the rule depends on."""

    rule: Rule = Rule.KIP16_REFINED
    lag_time_max_ms: int = 10_000
    lag_max_messages: int = 4000
    # 2.1+: a follower at the leader LEO is caught up whatever its lcu.
    idle_is_caught_up: bool = True
    # ``--rule auto``: each cluster's variant from its Kafka version as its telemetry states it
    # (``for_version``); ``rule`` and ``idle_is_caught_up`` are then the variant of a cluster whose
    # version is not stated or not known.
    by_version: bool = False

    def __post_init__(self) -> None:
        if self.by_version and self.rule is Rule.LEGACY_MESSAGES:
            raise ValueError("rule=legacy-messages is never chosen by a cluster's version: give it with --rule")
        if self.lag_time_max_ms <= 0:
            raise ValueError(f"lag_time_max_ms={self.lag_time_max_ms} must be > 0")
        if self.lag_max_messages <= 0:
            raise ValueError(f"lag_max_messages={self.lag_max_messages} must be > 0")


# What reads as a version (the job's Spark form reads the same: ``streaming.evaluation.state.variant_exprs``).
KAFKA_VERSION_PATTERN = r"[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?"


def parse_kafka_version(version: str | None) -> tuple[int, int, int] | None:
    """A Kafka version as the telemetry states it (``"0.10.2"``, ``"2.1"``, ``"4.0"``) as
    (major, minor, patch); None when there is none or it does not read as one."""
    if version is None or not re.fullmatch(KAFKA_VERSION_PATTERN, version):
        return None
    major, minor, patch = (int(p) for p in (*version.split("."), "0")[:3])
    return major, minor, patch


# The variants by Kafka version, newest first: (first version, rule, idle_is_caught_up). Before
# 0.9 is not known (0.8 had no KIP-16; a cluster that old gets the default, as an unknown one).
BY_VERSION = (
    ((2, 1, 0), Rule.KIP16_REFINED, True),  # a follower at the leader LEO is never out of sync
    ((0, 10, 2), Rule.KIP16_REFINED, False),  # KAFKA-4485: the previous fetch's leader LEO counts
    ((0, 9, 0), Rule.KIP16, False),  # KIP-16
)


def chosen_rule(cfg: RuleConfig, kafka_version: str | None) -> tuple[Rule, bool, str]:
    """(rule, idle_is_caught_up, why) for a cluster whose telemetry states ``kafka_version``
    (None: states none) under ``cfg``: ``cfg``'s own variant when it was given
    (``by_version`` false), else the variant of that version (docs/rule.md, "Which variant a
    cluster gets"), else ``cfg``'s. ``why``: a short reason, for logs and ``isrwatch doctor``."""
    if not cfg.by_version:
        return cfg.rule, cfg.idle_is_caught_up, "given by --rule"
    if kafka_version is None:
        return cfg.rule, cfg.idle_is_caught_up, "no Kafka version in the telemetry: the default"
    parsed = parse_kafka_version(kafka_version)
    for first, rule, idle in BY_VERSION:
        if parsed is not None and parsed >= first:
            return rule, idle, f"Kafka {kafka_version}"
    return cfg.rule, cfg.idle_is_caught_up, f"Kafka version {kafka_version!r} not known: the default"


def for_version(cfg: RuleConfig, kafka_version: str | None) -> RuleConfig:
    """``cfg`` with the variant ``chosen_rule`` gives a cluster at ``kafka_version``
    (``cfg`` itself when the variant was given)."""
    if not cfg.by_version:
        return cfg
    rule, idle, _ = chosen_rule(cfg, kafka_version)
    return RuleConfig(rule, cfg.lag_time_max_ms, cfg.lag_max_messages, idle)


def check_period_ms(cfg: RuleConfig) -> int:
    """How often the leader runs its ISR check (``isr-expiration``).

    Every ``replica.lag.time.max.ms`` up to 0.10.1, every half of it from
    0.10.2 (KAFKA-4485).
    """
    if cfg.rule is Rule.KIP16_REFINED:
        return max(1, cfg.lag_time_max_ms // 2)
    return cfg.lag_time_max_ms


def removal_window(last_caught_up_ms: int, cfg: RuleConfig) -> tuple[int, int]:
    """The (earliest, latest] times at which the leader may drop the follower.

    The follower becomes out of sync just after ``lcu + maxLag``; the leader
    notices at its next check, at most one check period later.
    """
    earliest = last_caught_up_ms + cfg.lag_time_max_ms
    return earliest, earliest + check_period_ms(cfg)


def caught_up_time(
    rule: Rule,
    t_ms: int,
    fetch_offset: int | None,
    leader_leo: int | None,
    prev_t_ms: int | None,
    prev_leader_leo: int | None,
) -> int | None:
    """What one observation proves about ``lastCaughtUpTimeMs``.

    Returns the latest time at which the observation shows the follower was
    caught up, or None when it shows nothing. Because ``lastCaughtUpTimeMs``
    only moves forward, the state after many observations is the max of
    these values. This is the broker's rule (the simulator's leaders run it
    through ``on_fetch``); the streaming job folds ``observed_caught_up_time``,
    this with gaps in its evidence bridged, as a Spark ``max``.
    """
    if fetch_offset is None or leader_leo is None:
        return None
    if fetch_offset >= leader_leo:
        return t_ms
    if (
        rule is Rule.KIP16_REFINED
        and prev_t_ms is not None
        and prev_leader_leo is not None
        and fetch_offset >= prev_leader_leo
    ):
        return prev_t_ms
    return None


def observed_caught_up_time(
    rule: Rule,
    t_ms: int,
    fetch_offset: int | None,
    leader_leo: int | None,
    prev_t_ms: int | None,
    prev_leader_leo: int | None,
    max_gap_ms: int | None,
) -> int | None:
    """What one observation of the *monitor* shows about ``lastCaughtUpTimeMs``.

    ``caught_up_time``, except after a gap in the evidence: when the previous
    observation of the replica is more than ``max_gap_ms`` older
    (``t_ms - prev_t_ms > max_gap_ms``), the interval is not read as time out of
    sync. A follower whose fetch offset reaches the leader LEO of before the gap
    fetched at least everything the leader had then: the observation proves it
    caught up at ``t_ms`` (its evidence starts afresh, as a replica's does at its
    first observation). A follower below that LEO really is stuck: the broker's
    rule decides. ``legacy-messages`` is left alone (its time part counts from
    fetch progress). ``max_gap_ms`` None: off, the broker's rule alone.
    """
    if (
        max_gap_ms is not None
        and rule is not Rule.LEGACY_MESSAGES
        and prev_t_ms is not None
        and t_ms - prev_t_ms > max_gap_ms
        and fetch_offset is not None
        and prev_leader_leo is not None
        and fetch_offset >= prev_leader_leo
    ):
        return t_ms
    return caught_up_time(rule, t_ms, fetch_offset, leader_leo, prev_t_ms, prev_leader_leo)


def new_leadership(
    leader_id: int, prev_leader_id: int, leader_epoch: int | None, prev_leader_epoch: int | None
) -> bool:
    """Whether an observation shows the partition led anew since the replica's previous
    observation: another leader (both ids known, >= 0), or the same leader in a newer
    leader epoch (both epochs known, >= 0). A broker that becomes, or stays, the leader in a
    new epoch runs ``Partition.makeLeader``, which starts each in-sync follower's clock
    afresh (``leader_change_caught_up_time``): Kafka bumps the epoch under the same leader on
    reassignments, when a ZooKeeper controller removes a dead broker from the ISR, and in
    KRaft before metadata.version 3.6-IV0 on every ISR change (docs/rule.md, "Leader
    changes"). An epoch not known (None or -1: Metadata before v7, Kafka before 2.1, and
    the JMX collector) leaves the leader id alone to decide, as before epochs were read."""
    if leader_id < 0 or prev_leader_id < 0:
        return False
    if leader_id != prev_leader_id:
        return True
    return (
        leader_epoch is not None
        and prev_leader_epoch is not None
        and prev_leader_epoch >= 0
        and leader_epoch > prev_leader_epoch
    )


def leader_change_caught_up_time(
    t_ms: int,
    in_isr: bool,
    leader_changed: bool,
    prev_t_ms: int | None,
    max_gap_ms: int | None,
) -> int | None:
    """What an observation under a new leader shows about ``lastCaughtUpTimeMs``.

    A broker that becomes a partition's leader starts each in-sync follower's clock
    at its election (0.9's ``Partition.makeLeader`` resets every follower's fetch
    state, which sets ``lastCaughtUpTimeMs`` to now; later versions do so for the
    followers in the ISR), and so does a leader that stays leader in a new leader
    epoch (``makeLeader`` runs for every new epoch). So an observation of an in-sync
    follower under a leader other than the one the replica's previous observation
    showed, or under a newer epoch of the same leader (``leader_changed``:
    ``new_leadership``), proves a catch-up no earlier than the election, which lies
    after that previous observation (``prev_t_ms``): that time, a sound lower bound.
    When the two observations are more than ``max_gap_ms`` apart, or there is no
    previous one in evidence, the follower's evidence starts afresh at ``t_ms``, as
    after a gap (``observed_caught_up_time``): the case of a broker that led the
    partition and follows it again, whose previous observation as a follower
    predates its own leadership. Without this, its first observations under the new
    leader, a few messages behind, read the old catch-up as time out of sync.
    None: the observation shows nothing of the kind.
    """
    if not leader_changed or not in_isr:  # in_isr: or the ISR is not known
        return None
    if prev_t_ms is None or (max_gap_ms is not None and t_ms - prev_t_ms > max_gap_ms):
        return t_ms
    return prev_t_ms


def unseen_gap_caught_up_time(
    rule: Rule, t_ms: int, fetch_offset: int | None, prev_t_ms: int | None, max_gap_ms: int | None
) -> int | None:
    """What an observation the collector sent without its previous one shows, when the
    job's previous observation of the replica (``prev_t_ms``) is more than ``max_gap_ms``
    older and the replica's broker did not answer (``fetch_offset`` None).

    The collector sends no ``prev_*`` when it did not see the replica as a follower in
    its last round: the broker led the partition (a leader is caught up with itself),
    or the collector restarted. Nothing is known of the interval, so the replica's
    evidence starts afresh at ``t_ms``, as at its first observation: the interval is
    not read as time out of sync (found by the soak: a broker that led a partition for
    eight minutes, restarted, came back as a follower outside the ISR, and its lag
    alerts said they began before its leadership). With an answer,
    ``observed_caught_up_time``'s gap branch decides; ``legacy-messages`` is left alone.
    """
    if (
        max_gap_ms is None
        or rule is Rule.LEGACY_MESSAGES
        or fetch_offset is not None
        or prev_t_ms is None
        or t_ms - prev_t_ms <= max_gap_ms
    ):
        return None
    return t_ms


@dataclass(frozen=True)
class FollowerState:
    """What a leader knows about one follower."""

    last_caught_up_ms: int
    last_fetch_ms: int
    leo: int
    prev_fetch_ms: int | None = None
    prev_leader_leo: int | None = None

    @classmethod
    def new(cls, now_ms: int, leo: int = 0) -> FollowerState:
        """A follower as the leader starts tracking it (lcu starts at now)."""
        return cls(last_caught_up_ms=now_ms, last_fetch_ms=now_ms, leo=leo)


def on_fetch(
    state: FollowerState,
    cfg: RuleConfig,
    t_ms: int,
    fetch_offset: int,
    leader_leo: int,
) -> FollowerState:
    """Update the follower after a fetch at ``t_ms``.

    ``leader_leo`` is the leader's LEO taken *before* the read, as KIP-16 asks.
    The fetch offset is the follower's LEO at the time of the fetch.
    """
    seen = caught_up_time(cfg.rule, t_ms, fetch_offset, leader_leo, state.prev_fetch_ms, state.prev_leader_leo)
    lcu = state.last_caught_up_ms if seen is None else max(state.last_caught_up_ms, seen)
    # The constructor, not dataclasses.replace: this runs once per simulated fetch.
    return FollowerState(
        last_caught_up_ms=lcu,
        last_fetch_ms=max(state.last_fetch_ms, t_ms),
        leo=fetch_offset,
        prev_fetch_ms=t_ms,
        prev_leader_leo=leader_leo,
    )


def is_out_of_sync(state: FollowerState, cfg: RuleConfig, now_ms: int, leader_leo: int) -> bool:
    """The leader's check: should this follower leave the ISR at ``now_ms``?

    ``legacy-messages`` follows the seeds' example: with
    ``replica.lag.max.messages=4`` a follower 3 messages behind stays, 4
    behind goes.
    """
    if cfg.rule is Rule.LEGACY_MESSAGES:
        too_far = leader_leo - state.leo >= cfg.lag_max_messages
        stuck = now_ms - state.last_fetch_ms > cfg.lag_time_max_ms
        return too_far or stuck
    if cfg.rule is Rule.KIP16_REFINED and cfg.idle_is_caught_up and state.leo >= leader_leo:
        return False
    return now_ms - state.last_caught_up_ms > cfg.lag_time_max_ms


def can_rejoin(follower_leo: int, leader_hw: int, leader_epoch_start_offset: int | None = None) -> bool:
    """A follower outside the ISR rejoins once its LEO reaches the leader's HW
    (and, from 2.1, the start offset of the leader's epoch)."""
    if follower_leo < leader_hw:
        return False
    return leader_epoch_start_offset is None or follower_leo >= leader_epoch_start_offset
