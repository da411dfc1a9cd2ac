"""The field layouts of the Kafka requests and answers isrwatch exchanges, as Apache Kafka's own
message specifications state them (``clients/src/main/resources/common/message/*.json``: each
field's name, type and the versions it is in), written down here as test data, with an encoder
and a decoder of our own that read them.

Two users: tests/isrwatch/test_kafkawire_layouts.py checks kafka-python's encoding of isrwatch's
requests, and isrwatch's reading of answers, against these layouts; the protocol fake
(tests/support/fakebroker.py) reads requests and writes answers with them, so a test against it
never checks kafka-python against kafka-python.

Only what isrwatch uses is written down: the request header, ApiVersions, Metadata,
ListOffsets and DescribeConfigs, in the versions listed in ``MODELLED``. Tagged fields are skipped on reading and
none is written.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Field",
    "Message",
    "API_VERSIONS",
    "METADATA",
    "LIST_OFFSETS",
    "DESCRIBE_CONFIGS",
    "MODELLED",
    "encode",
    "decode",
    "request_header",
    "read_request_header",
    "response_header",
]

OPEN = 1 << 15  # "N+": every version from N on


@dataclass(frozen=True)
class Field:
    """One field: ``kind`` a scalar type name (int8, int16, int32, int64, bool, string, uuid),
    ``[]`` + a scalar (an array of them), or a tuple of Fields (an array of structs)."""

    name: str
    kind: str | tuple[Field, ...]
    first: int = 0
    last: int = OPEN
    nullable_from: int = OPEN  # the versions in which the field (string or array) may be null

    def present(self, version: int) -> bool:
        return self.first <= version <= self.last


@dataclass(frozen=True)
class Message:
    name: str
    api_key: int
    flexible_from: int  # the first flexible version (compact strings and arrays, tagged fields)
    request: tuple[Field, ...]
    response: tuple[Field, ...]


# ApiVersionsRequest.json / ApiVersionsResponse.json (api key 18; flexible from version 3)
API_VERSIONS = Message(
    "ApiVersions",
    18,
    3,
    request=(
        Field("client_software_name", "string", 3),
        Field("client_software_version", "string", 3),
    ),
    response=(
        Field("error_code", "int16"),
        Field("api_keys", (Field("api_key", "int16"), Field("min_version", "int16"), Field("max_version", "int16"))),
        Field("throttle_time_ms", "int32", 1),
    ),
)

# MetadataRequest.json / MetadataResponse.json (api key 3; flexible from version 9)
METADATA = Message(
    "Metadata",
    3,
    9,
    request=(
        # version 0: an empty array asks for every topic; from 1 a null array does, an empty one for none
        Field("topics", (Field("topic_id", "uuid", 10), Field("name", "string")), nullable_from=1),
        Field("allow_auto_topic_creation", "bool", 4),
        Field("include_cluster_authorized_operations", "bool", 8, 10),
        Field("include_topic_authorized_operations", "bool", 8),
    ),
    response=(
        Field("throttle_time_ms", "int32", 3),
        Field(
            "brokers",
            (
                Field("node_id", "int32"),
                Field("host", "string"),
                Field("port", "int32"),
                Field("rack", "string", 1, nullable_from=1),
            ),
        ),
        Field("cluster_id", "string", 2, nullable_from=2),
        Field("controller_id", "int32", 1),
        Field(
            "topics",
            (
                Field("error_code", "int16"),
                Field("name", "string"),
                Field("is_internal", "bool", 1),
                Field(
                    "partitions",
                    (
                        Field("error_code", "int16"),
                        Field("partition_index", "int32"),
                        Field("leader_id", "int32"),
                        Field("leader_epoch", "int32", 7),
                        Field("replica_nodes", "[]int32"),
                        Field("isr_nodes", "[]int32"),
                        Field("offline_replicas", "[]int32", 5),
                    ),
                ),
                Field("topic_authorized_operations", "int32", 8),
            ),
        ),
        Field("cluster_authorized_operations", "int32", 8, 10),
    ),
)

# ListOffsetsRequest.json / ListOffsetsResponse.json (api key 2; flexible from version 6)
LIST_OFFSETS = Message(
    "ListOffsets",
    2,
    6,
    request=(
        Field("replica_id", "int32"),
        Field("isolation_level", "int8", 2),
        Field(
            "topics",
            (
                Field("name", "string"),
                Field(
                    "partitions",
                    (
                        Field("partition_index", "int32"),
                        Field("current_leader_epoch", "int32", 4),
                        Field("timestamp", "int64"),
                        Field("max_num_offsets", "int32", 0, 0),
                    ),
                ),
            ),
        ),
    ),
    response=(
        Field("throttle_time_ms", "int32", 2),
        Field(
            "topics",
            (
                Field("name", "string"),
                Field(
                    "partitions",
                    (
                        Field("partition_index", "int32"),
                        Field("error_code", "int16"),
                        Field("old_style_offsets", "[]int64", 0, 0),
                        Field("timestamp", "int64", 1),
                        Field("offset", "int64", 1),
                        Field("leader_epoch", "int32", 4),
                    ),
                ),
            ),
        ),
    ),
)

# DescribeConfigsRequest.json / DescribeConfigsResponse.json (api key 32; flexible from version 4;
# Kafka 4.0 accepts 1 to 4)
DESCRIBE_CONFIGS = Message(
    "DescribeConfigs",
    32,
    4,
    request=(
        Field(
            "resources",
            (
                Field("resource_type", "int8"),
                Field("resource_name", "string"),
                Field("configuration_keys", "[]string", nullable_from=0),  # null: every config
            ),
        ),
        Field("include_synonyms", "bool", 1),
        Field("include_documentation", "bool", 3),
    ),
    response=(
        Field("throttle_time_ms", "int32"),
        Field(
            "results",
            (
                Field("error_code", "int16"),
                Field("error_message", "string", nullable_from=0),
                Field("resource_type", "int8"),
                Field("resource_name", "string"),
                Field(
                    "configs",
                    (
                        Field("name", "string"),
                        Field("value", "string", nullable_from=0),
                        Field("read_only", "bool"),
                        Field("is_default", "bool", 0, 0),
                        Field("config_source", "int8", 1),
                        Field("is_sensitive", "bool"),
                        Field(
                            "synonyms",
                            (
                                Field("name", "string"),
                                Field("value", "string", nullable_from=0),
                                Field("source", "int8"),
                            ),
                            1,
                        ),
                        Field("config_type", "int8", 3),
                        Field("documentation", "string", 3, nullable_from=3),
                    ),
                ),
            ),
        ),
    ),
)

# The versions written down above, per message: what isrwatch and kafka-python send (ApiVersions
# 0 to 4, Metadata 0 to 8, ListOffsets 0 to 5, DescribeConfigs 0 to 2). Later versions add fields
# not listed here.
MODELLED = {
    API_VERSIONS.api_key: range(0, 5),
    METADATA.api_key: range(0, 9),
    LIST_OFFSETS.api_key: range(0, 6),
    DESCRIBE_CONFIGS.api_key: range(0, 3),
}
BY_KEY = {m.api_key: m for m in (API_VERSIONS, METADATA, LIST_OFFSETS, DESCRIBE_CONFIGS)}

_SCALARS = {"int8": ">b", "int16": ">h", "int32": ">i", "int64": ">q", "bool": ">?"}


# -- writing ----------------------------------------------------------------------------------


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _string(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return _uvarint(0) if flexible else struct.pack(">h", -1)
    data = value.encode()
    return (_uvarint(len(data) + 1) if flexible else struct.pack(">h", len(data))) + data


def _count(n: int | None, flexible: bool) -> bytes:
    if n is None:
        return _uvarint(0) if flexible else struct.pack(">i", -1)
    return _uvarint(n + 1) if flexible else struct.pack(">i", n)


def _value(kind: str, value: Any, flexible: bool) -> bytes:
    if kind in _SCALARS:
        return struct.pack(_SCALARS[kind], value)
    if kind == "string":
        return _string(value, flexible)
    if kind == "uuid":
        return bytes(value or bytes(16))
    raise ValueError(kind)


def encode(fields: tuple[Field, ...], version: int, values: dict[str, Any], flexible: bool) -> bytes:
    """``values`` (field name -> value; an array of structs: a list of dicts) in ``fields``'
    layout at ``version``. A field of the version missing from ``values`` is an error."""
    out = bytearray()
    for f in fields:
        if not f.present(version):
            continue
        value = values[f.name]
        if isinstance(f.kind, tuple):
            out += _count(None if value is None else len(value), flexible)
            for item in value or []:
                out += encode(f.kind, version, item, flexible)
        elif f.kind.startswith("[]"):
            out += _count(None if value is None else len(value), flexible)
            for item in value or []:
                out += _value(f.kind[2:], item, flexible)
        else:
            out += _value(f.kind, value, flexible)
    if flexible:
        out += _uvarint(0)  # no tagged fields
    return bytes(out)


# -- reading ----------------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError(f"{n} bytes wanted at {self.pos}, {len(self.data) - self.pos} left")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def fixed(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def uvarint(self) -> int:
        n = shift = 0
        while True:
            byte = self.take(1)[0]
            n |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return n
            shift += 7

    def string(self, flexible: bool) -> str | None:
        size = self.uvarint() - 1 if flexible else self.fixed(">h")
        return None if size < 0 else self.take(size).decode()

    def count(self, flexible: bool) -> int | None:
        n = self.uvarint() - 1 if flexible else self.fixed(">i")
        return None if n < 0 else n

    def tagged(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # the tag
            self.take(self.uvarint())


def _read_value(r: _Reader, kind: str, flexible: bool) -> Any:
    if kind in _SCALARS:
        return r.fixed(_SCALARS[kind])
    if kind == "string":
        return r.string(flexible)
    if kind == "uuid":
        return r.take(16)
    raise ValueError(kind)


def _read(r: _Reader, fields: tuple[Field, ...], version: int, flexible: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        if not f.present(version):
            continue
        if isinstance(f.kind, tuple):
            n = r.count(flexible)
            out[f.name] = None if n is None else [_read(r, f.kind, version, flexible) for _ in range(n)]
        elif f.kind.startswith("[]"):
            n = r.count(flexible)
            out[f.name] = None if n is None else [_read_value(r, f.kind[2:], flexible) for _ in range(n)]
        else:
            out[f.name] = _read_value(r, f.kind, flexible)
    if flexible:
        r.tagged()
    return out


def decode(fields: tuple[Field, ...], version: int, data: bytes, flexible: bool) -> dict[str, Any]:
    """``data`` read in ``fields``' layout at ``version``; ValueError when bytes are left over or missing."""
    r = _Reader(data)
    out = _read(r, fields, version, flexible)
    if r.pos != len(data):
        raise ValueError(f"{len(data) - r.pos} bytes left over")
    return out


# -- headers (RequestHeader.json, ResponseHeader.json) -----------------------------------------


def request_header(api_key: int, version: int, correlation_id: int, client_id: str | None, flexible: bool) -> bytes:
    """Request header version 1 (2 when the request is flexible: tagged fields after the client
    id, which stays a non-compact nullable string)."""
    out = struct.pack(">hhi", api_key, version, correlation_id) + _string(client_id, flexible=False)
    return out + (_uvarint(0) if flexible else b"")


def read_request_header(frame: bytes) -> tuple[int, int, int, str | None, bytes]:
    """(api key, version, correlation id, client id, the body) of a request frame (its size taken off)."""
    r = _Reader(frame)
    api_key, version, correlation_id = r.fixed(">h"), r.fixed(">h"), r.fixed(">i")
    client_id = r.string(flexible=False)
    message = BY_KEY.get(api_key)
    if message is not None and version >= message.flexible_from:
        r.tagged()
    return api_key, version, correlation_id, client_id, frame[r.pos :]


def response_header(api_key: int, version: int, correlation_id: int) -> bytes:
    """Response header version 0, or 1 (tagged fields) for a flexible answer, but ApiVersions'
    answer keeps version 0 in every version (a client must read it before it knows the broker's)."""
    flexible = api_key != API_VERSIONS.api_key and version >= BY_KEY[api_key].flexible_from
    return struct.pack(">i", correlation_id) + (_uvarint(0) if flexible else b"")
