"""isrwatch's requests and its reading of answers, against the field layouts of Kafka's own
message specifications (tests/support/fakebroker_layouts.py: the facts of
``clients/src/main/resources/common/message/*.json`` written down as test data), in every
version isrwatch may send: the bytes kafka-python encodes for isrwatch's requests are the bytes
the layouts give for the same values, and answers written from the layouts read as they should.
A unit test: nothing runs."""

from __future__ import annotations

import pytest
from kafka.protocol.admin import DescribeConfigsResponse
from kafka.protocol.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.list_offsets import ListOffsetsResponse
from kafka.protocol.metadata import MetadataResponse

from isrwatch.kafkawire import (
    BROKER_RESOURCE,
    DESCRIBE_CONFIGS_MAX_VERSION,
    EARLIEST,
    LATEST,
    LIST_OFFSETS_MAX_VERSION,
    METADATA_MAX_VERSION,
    TOPIC_RESOURCE,
    describe_configs_answers,
    describe_configs_request,
    fallback_check,
    list_offsets_answers,
    list_offsets_request,
    metadata_brokers,
    metadata_partitions,
    metadata_request,
)
from tests.support.fakebroker_layouts import (
    API_VERSIONS,
    DESCRIBE_CONFIGS,
    LIST_OFFSETS,
    METADATA,
    Field,
    decode,
    encode,
    read_request_header,
    request_header,
)

METADATA_VERSIONS = range(METADATA_MAX_VERSION + 1)
LIST_OFFSETS_VERSIONS = range(LIST_OFFSETS_MAX_VERSION + 1)


def test_isrwatch_sends_no_flexible_version_the_layouts_would_not_cover() -> None:
    assert METADATA.flexible_from > METADATA_MAX_VERSION
    assert LIST_OFFSETS.flexible_from > LIST_OFFSETS_MAX_VERSION
    assert DESCRIBE_CONFIGS.flexible_from > DESCRIBE_CONFIGS_MAX_VERSION


# -- requests: kafka-python's bytes against the specification's layout -------------------------


@pytest.mark.parametrize("version", METADATA_VERSIONS)
@pytest.mark.parametrize("topics", [None, ["orders", "isr.telemetry"]], ids=["every-topic", "named"])
def test_a_metadata_request_is_laid_out_as_the_specification_says(version, topics) -> None:
    request = metadata_request(version, topics)  # (kafka-python binds encode weakly: the request is held)
    every = [] if version == 0 else None  # v0: an empty array asks for every topic; v1 on: null
    values = {
        "topics": every if topics is None else [{"topic_id": None, "name": t} for t in topics],
        "allow_auto_topic_creation": False,  # isrwatch never creates a topic by asking
        "include_cluster_authorized_operations": False,
        "include_topic_authorized_operations": False,
    }
    assert request.encode() == encode(METADATA.request, version, values, flexible=False)


@pytest.mark.parametrize("version", LIST_OFFSETS_VERSIONS)
@pytest.mark.parametrize("replica_id", [-2, -1])
@pytest.mark.parametrize("timestamp", [LATEST, EARLIEST])
def test_a_list_offsets_request_is_laid_out_as_the_specification_says(version, replica_id, timestamp) -> None:
    request = list_offsets_request(version, replica_id, [("a", 0), ("b", 3), ("a", 1)], timestamp)
    part = {"current_leader_epoch": -1, "timestamp": timestamp, "max_num_offsets": 1}
    values = {
        "replica_id": replica_id,
        "isolation_level": 0,  # read uncommitted: the high watermark, not the last stable offset
        "topics": [
            {"name": "a", "partitions": [{"partition_index": 0, **part}, {"partition_index": 1, **part}]},
            {"name": "b", "partitions": [{"partition_index": 3, **part}]},
        ],
    }
    assert request.encode() == encode(LIST_OFFSETS.request, version, values, flexible=False)


def test_the_fallback_check_is_a_list_offsets_v0_for_no_partition() -> None:
    """The question a broker pinned by the 0.9 settings is asked first: 0.9 answers it, a broker
    that removed ListOffsets v0 (Kafka 4) refuses it."""
    request = fallback_check()
    assert request.API_VERSION == 0
    assert request.encode() == encode(LIST_OFFSETS.request, 0, {"replica_id": -1, "topics": []}, flexible=False)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_kafka_pythons_api_versions_request_and_its_header_read_as_the_specification_says(version) -> None:
    """The question every connection asks first (kafka-python sends it; isrwatch reads its answer)."""
    flexible = version >= API_VERSIONS.flexible_from
    if flexible:
        body = ApiVersionsRequest[version](
            client_software_name="isrwatch", client_software_version="1", _tagged_fields={}
        )
    else:
        body = ApiVersionsRequest[version]()
    frame = request_header(API_VERSIONS.api_key, version, 7, "isrwatch-collector", flexible) + body.encode()
    api_key, read_version, correlation_id, client_id, rest = read_request_header(frame)
    assert (api_key, read_version, correlation_id, client_id) == (18, version, 7, "isrwatch-collector")
    expected = {"client_software_name": "isrwatch", "client_software_version": "1"} if flexible else {}
    assert decode(API_VERSIONS.request, version, rest, flexible) == expected


# -- answers: written from the specification's layout, read by kafka-python and isrwatch ------


def _metadata_answer(version: int) -> dict:
    part = {"error_code": 0, "offline_replicas": [], "leader_epoch": 12}
    return {
        "throttle_time_ms": 0,
        "brokers": [
            {"node_id": 1, "host": "k1", "port": 9092, "rack": None},
            {"node_id": 2, "host": "k2", "port": 9093, "rack": "r2"},
        ],
        "cluster_id": "c-1",
        "controller_id": 1,
        "topics": [
            {
                "error_code": 0,
                "name": "orders",
                "is_internal": False,
                "partitions": [
                    {**part, "partition_index": 1, "leader_id": 2, "replica_nodes": [2, 1], "isr_nodes": [2]},
                    {**part, "partition_index": 0, "leader_id": 1, "replica_nodes": [1, 2], "isr_nodes": [1, 2]},
                ],
                "topic_authorized_operations": -(2**31),
            },
            {
                "error_code": 3,
                "name": "gone",
                "is_internal": False,
                "partitions": [],
                "topic_authorized_operations": -(2**31),
            },
        ],
        "cluster_authorized_operations": -(2**31),
    }


@pytest.mark.parametrize("version", METADATA_VERSIONS)
def test_a_metadata_answer_laid_out_as_the_specification_says_reads_as_isrwatch_needs(version) -> None:
    data = encode(METADATA.response, version, _metadata_answer(version), flexible=False)
    response = MetadataResponse[version].decode(data)
    assert metadata_brokers(response) == {1: ("k1", 9092), 2: ("k2", 9093)}
    errors, partitions = metadata_partitions(response)
    assert errors == {"orders": 0, "gone": 3}
    read = [(p.topic, p.partition, p.leader, p.replicas, p.isr, p.error, p.leader_epoch) for p in partitions]
    epoch = 12 if version >= 7 else -1  # the leader epoch is in the answer from version 7
    assert read == [("orders", 0, 1, (1, 2), (1, 2), 0, epoch), ("orders", 1, 2, (2, 1), (2,), 0, epoch)]


@pytest.mark.parametrize("version", LIST_OFFSETS_VERSIONS)
def test_a_list_offsets_answer_laid_out_as_the_specification_says_reads_as_isrwatch_needs(version) -> None:
    def part(p: int, error: int, offset: int) -> dict:
        old = [offset] if offset >= 0 else []
        return {"partition_index": p, "error_code": error, "old_style_offsets": old, "timestamp": -1, "offset": offset}

    values = {
        "throttle_time_ms": 0,
        "topics": [
            {
                "name": "a",
                "partitions": [{**part(0, 0, 42), "leader_epoch": 3}, {**part(1, 6, -1), "leader_epoch": -1}],
            },
            {"name": "b", "partitions": [{**part(3, 0, 0), "leader_epoch": 3}]},
        ],
    }
    data = encode(LIST_OFFSETS.response, version, values, flexible=False)
    # offset 0 (an empty log) is an offset, an error is none
    assert list_offsets_answers(ListOffsetsResponse[version].decode(data)) == [
        ("a", 0, 0, 42),
        ("a", 1, 6, None),
        ("b", 3, 0, 0),
    ]


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_an_api_versions_answer_laid_out_as_the_specification_says_reads_as_the_ranges(version) -> None:
    keys = [{"api_key": 2, "min_version": 1, "max_version": 10}, {"api_key": 3, "min_version": 0, "max_version": 13}]
    flexible = version >= API_VERSIONS.flexible_from
    data = encode(API_VERSIONS.response, version, {"error_code": 0, "api_keys": keys, "throttle_time_ms": 0}, flexible)
    response = ApiVersionsResponse[version].decode(data)
    assert response.error_code == 0
    assert {k[0]: (k[1], k[2]) for k in response.api_versions} == {2: (1, 10), 3: (0, 13)}


# -- the layouts' own reader and writer agree (else every test above could pass on a shared mistake) --


def test_the_layouts_write_what_they_read_and_refuse_bytes_left_over() -> None:
    fields = (Field("a", "int16"), Field("s", "string", nullable_from=0), Field("xs", (Field("n", "int64"),), 1))
    for flexible in (False, True):
        for version in (0, 1):
            values = {"a": -3, "s": None, "xs": [{"n": 2**40}, {"n": -1}]}
            data = encode(fields, version, values, flexible)
            expected = {k: v for k, v in values.items() if k != "xs" or version >= 1}
            assert decode(fields, version, data, flexible) == expected
            with pytest.raises(ValueError, match="left over"):
                decode(fields, version, data + b"\0", flexible)
    # the classic encodings, spelt out: int16 -3, null string, array of one int64
    assert encode(fields, 1, {"a": -3, "s": None, "xs": [{"n": 1}]}, flexible=False) == (
        b"\xff\xfd" + b"\xff\xff" + b"\0\0\0\x01" + b"\0" * 7 + b"\x01"
    )
    # compact: string length + 1 and array count + 1 as unsigned varints, and a tagged-field count per struct
    assert encode(fields, 1, {"a": 1, "s": "k", "xs": []}, flexible=True) == b"\0\x01" + b"\x02k" + b"\x01" + b"\0"


DESCRIBE_CONFIGS_VERSIONS = range(DESCRIBE_CONFIGS_MAX_VERSION + 1)


@pytest.mark.parametrize("version", DESCRIBE_CONFIGS_VERSIONS)
def test_a_describe_configs_request_is_laid_out_as_the_specification_says(version) -> None:
    wanted = [(BROKER_RESOURCE, "2", ["replica.lag.time.max.ms"]), (TOPIC_RESOURCE, "orders", ["min.insync.replicas"])]
    request = describe_configs_request(version, wanted)
    values = {
        "resources": [{"resource_type": t, "resource_name": n, "configuration_keys": k} for t, n, k in wanted],
        "include_synonyms": False,
        "include_documentation": False,
    }
    assert request.encode() == encode(DESCRIBE_CONFIGS.request, version, values, flexible=False)


@pytest.mark.parametrize("version", DESCRIBE_CONFIGS_VERSIONS)
def test_a_describe_configs_answer_laid_out_as_the_specification_says_reads_as_the_values(version) -> None:
    def entry(name: str, value: str | None) -> dict:
        return {"name": name, "value": value, "read_only": False, "is_default": False, "config_source": 5,
                "is_sensitive": False, "synonyms": [{"name": name, "value": value, "source": 5}]}  # fmt: skip

    def result(kind: int, name: str, error: int, entries: list[dict]) -> dict:
        return {"error_code": error, "error_message": None, "resource_type": kind, "resource_name": name,
                "configs": entries}  # fmt: skip

    values = {
        "throttle_time_ms": 0,
        "results": [
            result(BROKER_RESOURCE, "2", 0, [entry("replica.lag.time.max.ms", "10000")]),
            result(TOPIC_RESOURCE, "orders", 0, [entry("min.insync.replicas", "3")]),
            result(TOPIC_RESOURCE, "gone", 3, []),
        ],
    }
    data = encode(DESCRIBE_CONFIGS.response, version, values, flexible=False)
    assert describe_configs_answers(DescribeConfigsResponse[version].decode(data)) == [
        (BROKER_RESOURCE, "2", 0, {"replica.lag.time.max.ms": "10000"}),
        (TOPIC_RESOURCE, "orders", 0, {"min.insync.replicas": "3"}),
        (TOPIC_RESOURCE, "gone", 3, {}),
    ]
