"""The requests isrwatch builds and how their answers read (isrwatch.kafkawire), in every
version it may speak: each request is encoded and decoded with kafka-python's own classes, and
each answer built with them (the real brokers here speak v0 only; the collector's and the job's
real-Kafka tests cover v0 on the wire)."""

from __future__ import annotations

import pytest
from kafka.protocol.list_offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import MetadataRequest

from isrwatch.kafkawire import (
    EARLIEST,
    LATEST,
    list_offsets_answers,
    list_offsets_request,
    metadata_request,
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
