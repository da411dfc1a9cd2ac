"""The simulated cluster's shape and its partitions' replication state.

``ClusterSpec`` holds the broker settings and sizes (brokers, topics,
partitions per topic, replication factor) and the fetch/produce mechanics;
``Partition`` is one partition's state as the brokers hold it: the replicas'
logs (only their end offsets), the leader, its epoch, the ISR, the high
watermark and the leader's view of each follower (``isrwatch.rule.FollowerState``).
"""

from __future__ import annotations

from dataclasses import dataclass

from isrwatch.rule import FollowerState

__all__ = ["ClusterSpec", "Partition", "build_partitions", "DEFAULT_TOPICS"]

DEFAULT_TOPICS = ("orders", "payments", "clicks", "audit")


@dataclass(frozen=True)
class ClusterSpec:
    """Sizes and broker settings of one simulated cluster.

    Offsets count messages; ``fetch_max_messages`` stands for
    ``replica.fetch.max.bytes`` (per partition and fetch) and
    ``fetch_bandwidth`` (messages per ms per replica fetcher) for the network
    and disk throughput between one follower broker and one leader broker.
    """

    brokers: int = 3
    topics: int = 2
    partitions: int = 3  # per topic
    replication_factor: int = 3
    min_isr: int = 2
    initial_offset: int = 100_000
    produce_tick_ms: int = 50  # the producer sends one batch per partition per tick (linger)
    fetch_wait_max_ms: int = 500  # replica.fetch.wait.max.ms
    fetch_max_messages: int = 1000  # replica.fetch.max.bytes, in messages
    fetch_bandwidth: float = 50.0  # messages per ms per fetcher
    latency_ms: tuple[int, int] = (1, 4)  # one-way network latency, uniform range
    session_timeout_ms: int = 6000  # zookeeper.session.timeout.ms

    def __post_init__(self) -> None:
        for name in ("brokers", "topics", "partitions", "replication_factor", "min_isr", "produce_tick_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.replication_factor > self.brokers:
            raise ValueError(f"replication_factor={self.replication_factor} exceeds brokers={self.brokers}")
        if self.fetch_max_messages < 1 or self.fetch_bandwidth <= 0 or self.fetch_wait_max_ms < 1:
            raise ValueError("fetch_max_messages, fetch_bandwidth and fetch_wait_max_ms must be > 0")
        lo, hi = self.latency_ms
        if not 0 <= lo <= hi:
            raise ValueError(f"latency_ms={self.latency_ms} must be (low, high) with 0 <= low <= high")

    def topic_names(self) -> list[str]:
        named = list(DEFAULT_TOPICS[: self.topics])
        return named + [f"topic-{i}" for i in range(len(named), self.topics)]


class Partition:
    """One partition as the brokers hold it.

    ``leo`` maps every replica's broker id to its log end offset (the real
    logs). ``followers`` is what the *current leader* knows about each
    follower; it is reset when the leader changes.
    """

    __slots__ = (
        "topic",
        "index",
        "replicas",
        "leader",
        "epoch",
        "epoch_start",
        "isr",
        "hw",
        "leo",
        "followers",
    )

    def __init__(self, topic: str, index: int, replicas: tuple[int, ...], offset: int, now_ms: int) -> None:
        self.topic = topic
        self.index = index
        self.replicas = replicas
        self.leader: int | None = replicas[0]
        self.epoch = 0
        self.epoch_start = 0
        self.isr: tuple[int, ...] = replicas
        self.hw = offset
        self.leo = dict.fromkeys(replicas, offset)
        self.followers = {r: FollowerState.new(now_ms, leo=offset) for r in replicas[1:]}

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.index} leader={self.leader} isr={list(self.isr)} hw={self.hw})"

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.index}"

    def update_hw(self) -> None:
        """High watermark: the lowest LEO in the ISR as the leader knows it; it never moves back."""
        leader = self.leader
        if leader is None:
            return
        low = self.leo[leader]
        followers = self.followers
        for r in self.isr:
            if r != leader:
                f_leo = followers[r].leo
                if f_leo < low:
                    low = f_leo
        if low > self.hw:
            self.hw = low


def build_partitions(spec: ClusterSpec, now_ms: int) -> list[Partition]:
    """Partitions with their replicas spread round-robin, leaders on the first replica."""
    out = []
    n = spec.brokers
    g = 0
    for topic in spec.topic_names():
        for i in range(spec.partitions):
            replicas = tuple((g + k) % n + 1 for k in range(spec.replication_factor))
            out.append(Partition(topic, i, replicas, spec.initial_offset, now_ms))
            g += 1
    return out
