"""The requests isrwatch builds and how their answers read (isrwatch.kafkawire), in every
version it may speak: each request is encoded and decoded with kafka-python's own classes, and
each answer built with them (the real brokers here speak v0 only; the collector's and the job's
real-Kafka tests cover v0 on the wire)."""

from __future__ import annotations

import pytest
from kafka.protocol.broker_api_versions import BROKER_API_VERSIONS
from kafka.protocol.list_offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import MetadataRequest

from isrwatch.exceptions import UnsupportedBrokerError
from isrwatch.kafkawire import (
    EARLIEST,
    LATEST,
    LIST_OFFSETS_MAX_VERSION,
    METADATA_MAX_VERSION,
    broker_versions,
    cluster_kafka_version,
    kafka_version,
    kept_replicas,
    list_offsets_answers,
    list_offsets_request,
    metadata_request,
    request_version,
)


@pytest.mark.parametrize("version", range(6))
@pytest.mark.parametrize("timestamp", [LATEST, EARLIEST])
def test_a_list_offsets_request_asks_for_each_partition_at_the_timestamp(version, timestamp) -> None:
    request = list_offsets_request(version, -2, [("a", 0), ("b", 3), ("a", 1)], timestamp)
    decoded = ListOffsetsRequest[version].decode(request.encode())
    assert decoded.replica_id == -2
    asked = {(t, p[0]): p for t, parts in decoded.topics for p in parts}
    assert sorted(asked) == [("a", 0), ("a", 1), ("b", 3)]
    # the timestamp's place: (partition, timestamp, max offsets) in v0; (partition, leader epoch, timestamp) from v4
    at = 2 if version >= 4 else 1
    assert {p[at] for p in asked.values()} == {timestamp}


@pytest.mark.parametrize("version", range(6))
def test_list_offsets_answers_read_offsets_and_errors(version) -> None:
    if version == 0:
        parts = [(0, 0, [42]), (1, 6, []), (2, 0, [])]
    elif version < 4:
        parts = [(0, 0, -1, 42), (1, 6, -1, -1), (2, 0, -1, 7)]
    else:
        parts = [(0, 0, -1, 42, 5), (1, 6, -1, -1, -1), (2, 0, -1, 7, 5)]
    head = [] if version < 2 else [0]
    answers = list_offsets_answers(ListOffsetsResponse[version](*head, [("t", parts)]))
    # a v0 answer that lists no offset gives none
    assert answers == [("t", 0, 0, 42), ("t", 1, 6, None), ("t", 2, 0, None if version == 0 else 7)]


@pytest.mark.parametrize("version", range(6))
def test_a_metadata_request_for_every_topic_never_creates_one(version) -> None:
    request = metadata_request(version)  # (kafka-python binds encode weakly: the request must be held)
    decoded = MetadataRequest[version].decode(request.encode())
    assert decoded.topics == MetadataRequest[version].ALL_TOPICS
    if version >= 4:
        assert decoded.allow_auto_topic_creation is False
        request = metadata_request(version, ["t"])
        named = MetadataRequest[version].decode(request.encode())
        assert named.topics == ["t"] and named.allow_auto_topic_creation is False


# -- replicas a Kafka 0.9 metadata answer leaves out (isrwatch.kafkawire.kept_replicas) -------

BEFORE = (1, 2, 3)


@pytest.mark.parametrize(
    ("listed", "error", "registered", "expected"),
    [
        # broker 2 no longer registered: 0.9 leaves it out and says so (REPLICA_NOT_AVAILABLE)
        ((1, 3), 9, {1, 3}, (1, 2, 3)),
        # brokers 1 (the leader) and 2 gone, no new leader yet (LEADER_NOT_AVAILABLE)
        ((3,), 5, {3}, (1, 2, 3)),
        # no error: every assigned replica is listed; 2 is gone from the assignment
        ((1, 3), 0, {1, 3}, (1, 3)),
        # 2 left out but its broker is registered: not a dead broker's replica, the answer stands
        ((1, 3), 9, {1, 2, 3}, (1, 3)),
        # a replica not seen before: the assignment changed, the answer stands
        ((1, 4), 9, {1, 4}, (1, 4)),
        # a later Kafka lists every replica, error or not: nothing added or lost
        ((1, 2, 3), 9, {1, 3}, (1, 2, 3)),
    ],
)
def test_replicas_of_unregistered_brokers_are_kept_while_the_answer_says_some_are_missing(
    listed, error, registered, expected
):
    assert kept_replicas(BEFORE, listed, error, registered) == expected


def test_nothing_is_kept_for_a_partition_seen_for_the_first_time():
    assert kept_replicas(None, (1, 3), 9, {1, 3}) == (1, 3)


# -- the version of each request isrwatch sends, for every broker kafka-python knows ------------

_BROKERS = sorted(BROKER_API_VERSIONS)
_REQUESTS = [
    ("Metadata", MetadataRequest, METADATA_MAX_VERSION),
    ("ListOffsets", ListOffsetsRequest, LIST_OFFSETS_MAX_VERSION),
]


@pytest.mark.parametrize("broker", _BROKERS, ids=lambda v: ".".join(map(str, v)))
@pytest.mark.parametrize(("name", "request_class", "highest"), _REQUESTS, ids=[r[0] for r in _REQUESTS])
def test_every_request_is_sent_in_a_version_the_broker_speaks(broker, name, request_class, highest) -> None:
    """Issue 55: every broker version kafka-python records (0.8 to 4.0), each request isrwatch
    sends over its own connections: the version chosen is inside the broker's range (never below
    its minimum: 4.0 removed ListOffsets v0), the newest isrwatch reads, and one kafka-python encodes."""
    ranges = BROKER_API_VERSIONS[broker]
    low, high = ranges[request_class[0].API_KEY]
    version = request_version(ranges, request_class, highest)
    assert low <= version <= high
    assert version == min(high, highest)
    request_class[version]  # kafka-python has the class (the encoding) of that version


def test_a_broker_that_cannot_answer_api_versions_gets_version_0_and_one_beyond_isrwatch_is_refused() -> None:
    assert request_version({}, ListOffsetsRequest, LIST_OFFSETS_MAX_VERSION) == 0  # Kafka 0.9
    assert request_version(BROKER_API_VERSIONS[(4, 0)], ListOffsetsRequest, 5) == 5
    with pytest.raises(UnsupportedBrokerError, match="ListOffsetsRequest: the broker speaks versions 6 to 9"):
        request_version({ListOffsetsRequest[0].API_KEY: (6, 9)}, ListOffsetsRequest, LIST_OFFSETS_MAX_VERSION)


# -- which ranges a connection's broker speaks (isrwatch.kafkawire.broker_versions) -----------


class _Connection:
    """What kafka-python's BrokerConnection keeps once connected: the version it found
    (from the broker's ApiVersions answer, or for an older broker from its own probe) and the ranges."""

    def __init__(self, found: tuple[int, ...], ranges: dict[int, tuple[int, int]]) -> None:
        self._api_version = found
        self._ranges = ranges

    def get_api_versions(self) -> dict[int, tuple[int, int]]:
        return self._ranges


@pytest.mark.parametrize("broker", [b for b in _BROKERS if b >= (0, 10)], ids=lambda v: ".".join(map(str, v)))
@pytest.mark.parametrize(("name", "request_class", "highest"), _REQUESTS, ids=[r[0] for r in _REQUESTS])
def test_a_broker_that_answers_api_versions_is_asked_in_its_own_ranges_whatever_the_fallback(
    broker, name, request_class, highest
) -> None:
    """The 0.9 settings (api.version.request=false, broker.version.fallback=0.9.0.1) given for
    every broker of the table: only a broker that cannot answer ApiVersions gets 0.9's versions."""
    ranges = BROKER_API_VERSIONS[broker]
    versions = broker_versions(_Connection(broker, dict(ranges)), fallback=(0, 9))
    low, high = ranges[request_class[0].API_KEY]
    assert low <= request_version(versions, request_class, highest) <= high


def test_a_broker_that_cannot_answer_api_versions_gets_the_fallbacks_ranges() -> None:
    kafka_09 = _Connection((0, 9), dict(BROKER_API_VERSIONS[(0, 9)]))  # kafka-python's probe found 0.9
    assert request_version(broker_versions(kafka_09), ListOffsetsRequest, LIST_OFFSETS_MAX_VERSION) == 0
    assert request_version(broker_versions(kafka_09, (0, 9)), MetadataRequest, METADATA_MAX_VERSION) == 0
    # a fallback of an older broker is taken over the probe's finding
    assert broker_versions(kafka_09, (0, 8, 2)) == BROKER_API_VERSIONS[(0, 8, 2)]


@pytest.mark.parametrize("broker", [v for v in BROKER_API_VERSIONS if v >= (0, 10)], ids=str)
def test_each_versions_api_versions_answer_reads_as_that_version(broker) -> None:
    assert kafka_version(BROKER_API_VERSIONS[broker]) == broker


def test_a_cluster_reads_as_its_oldest_broker_and_as_unknown_when_one_cannot_answer() -> None:
    newest = dict(BROKER_API_VERSIONS[(4, 0)])
    assert kafka_version(newest | {999: (0, 1)}) == (4, 0)  # an API the table does not know: newer than it
    assert kafka_version({18: (0, 0)}) == (0, 10, 0)  # ApiVersions alone: 0.10, kafka-python's fallback
    assert kafka_version({}) is None
    assert cluster_kafka_version([newest, BROKER_API_VERSIONS[(0, 10, 2)], newest]) == "0.10.2"
    assert cluster_kafka_version([BROKER_API_VERSIONS[(2, 1)]]) == "2.1"
    assert cluster_kafka_version([newest, None]) is None  # a 0.9 broker among them
    assert cluster_kafka_version([]) is None
