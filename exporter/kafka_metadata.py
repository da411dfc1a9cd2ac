"""Cluster metadata from whichever bootstrap broker answers first.

librdkafka sends a metadata request to one broker it holds a connection to, and
``list_topics`` waits for that broker alone. A broker that hangs without closing its
connections (SIGSTOP, a long GC pause, swapping) still looks connected, so a client
that picked it waits out the whole timeout while the other brokers would have
answered at once: a job or exporter started during such a fault failed its start-up
("cannot reach Kafka") about one time in three on a 3-broker cluster.

``first_metadata`` asks every bootstrap server at once and returns the first answer.
Each server is asked twice, on threads of their own:

* **directly**, over one connection to that server alone (kafka-python's
  ``BrokerConnection``, the settings translated by ``isrwatch.clientconfig``): nothing
  else is ever asked. A librdkafka client cannot promise that: once its first
  metadata answer names the cluster's brokers, it retires the bootstrap connection
  (with the requests still in flight on it) and sends them again to a broker it
  picks, which may be the hung one (found by tests/exporter/test_kafka_metadata.py,
  one run in six: every client's request ended on the paused broker);
* **from a librdkafka producer** that knows only that server, as before, for the
  settings kafka-python cannot express (a keystore, an OAuth token). Producers, not
  consumers: a consumer with a group id also connects to its group's coordinator, and
  when that was the hung broker every client could ask it (tests/e2e/test_restart.py).

A client still waiting on a hung broker finishes on its own thread when its timeout
ends, and is freed then.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

from isrwatch.clientconfig import kafka_python_config
from isrwatch.kafkawire import (
    METADATA_MAX_VERSION,
    broker_versions,
    metadata_brokers,
    metadata_partitions,
    metadata_request,
    request_version,
)

__all__ = ["first_metadata", "first_answer", "bootstrap_list"]

log = logging.getLogger("librdkafka")

# Consumer settings a producer would warn about (the callers pass their consumers' configuration).
_CONSUMER_ONLY = (
    "group.",
    "enable.auto.",
    "auto.commit.",
    "auto.offset.reset",
    "enable.partition.eof",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "partition.assignment.strategy",
    "fetch.",
    "queued.",
    "isolation.level",
    "check.crcs",
    "coordinator.",
)


def bootstrap_list(servers: str) -> list[str]:
    """``"a:1, b:2"`` -> ``["a:1", "b:2"]`` (duplicates and blanks dropped, order kept)."""
    out: list[str] = []
    for s in servers.split(","):
        s = s.strip()
        if s and s not in out:
            out.append(s)
    return out


def first_metadata(config: Mapping[str, Any], timeout_s: float, topic: str | None = None) -> Any:
    """The ``ClusterMetadata`` of the first bootstrap server of ``config`` to answer
    (a librdkafka consumer configuration); ``topic``: ask for that topic only.

    Raises a ``KafkaException`` (librdkafka's error when one answered with one) when none
    answers within ``timeout_s``.
    """
    return first_answer(config, timeout_s, topic)[0]


def first_answer(config: Mapping[str, Any], timeout_s: float, topic: str | None = None) -> tuple[Any, str]:
    """``first_metadata``, and the bootstrap server that gave it ("" when ``config`` names
    none): a client started on that server alone does not wait out a hung one first."""
    from confluent_kafka import KafkaError, KafkaException, Producer

    servers = bootstrap_list(str(config.get("bootstrap.servers", ""))) or [""]
    answers: queue.Queue[tuple[Any, BaseException | None, bool, str]] = queue.Queue()
    base = {k: v for k, v in config.items() if not k.startswith(_CONSUMER_ONLY)}
    base["logger"] = log

    def ask(server: str) -> None:
        try:
            client = Producer({**base, "bootstrap.servers": server})
        except (KafkaException, ValueError) as e:  # a bad setting: the caller's own check names it
            answers.put((None, KafkaException(KafkaError(KafkaError._INVALID_ARG, str(e))), True, server))
            return
        try:
            md = client.list_topics(topic, timeout=timeout_s) if topic else client.list_topics(timeout=timeout_s)
            answers.put((md, None, True, server))
        except KafkaException as e:
            answers.put((None, e, True, server))

    def ask_directly(server: str) -> None:
        try:
            answers.put((direct_metadata(config, server, timeout_s, topic), None, False, server))
        except Exception as e:  # noqa: BLE001 - any failure of this way is the other way's to cover
            answers.put((None, e, False, server))

    for server in servers:
        threading.Thread(target=ask, args=(server,), name=f"metadata-{server}", daemon=True).start()
        if server:
            threading.Thread(target=ask_directly, args=(server,), name=f"metadata-direct-{server}", daemon=True).start()
    asked = len(servers) + len([s for s in servers if s])
    librdkafka_error: BaseException | None = None
    direct_error: BaseException | None = None
    deadline = time.monotonic() + timeout_s + 5.0
    for _ in range(asked):
        try:
            md, err, from_librdkafka, server = answers.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if err is None:
            return md, server
        if from_librdkafka:
            librdkafka_error = err
        else:
            direct_error = err
    if librdkafka_error is not None:
        raise librdkafka_error
    detail = f"no broker answered: {direct_error}" if direct_error else "no broker answered"
    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, detail))


def direct_metadata(config: Mapping[str, Any], server: str, timeout_s: float, topic: str | None = None) -> Any:
    """``server``'s own metadata answer, asked over one connection to it alone, as a
    ``confluent_kafka.admin.ClusterMetadata``; ``config``: librdkafka settings.

    Raises ``TimeoutError`` when it does not answer within ``timeout_s``, ``ConnectionError``
    when it cannot be reached."""
    from kafka.conn import BrokerConnection
    from kafka.protocol.metadata import MetadataRequest

    host, _, port = server.rpartition(":")
    settings = kafka_python_config(server, config, quiet=True)
    settings.pop("bootstrap_servers", None)
    if "client.id" not in config:
        settings["client_id"] = "isrwatch-metadata"
    settings["request_timeout_ms"] = int(timeout_s * 1000) + 1000  # the deadline below ends it first
    settings["api_version_auto_timeout_ms"] = int(timeout_s * 1000)
    deadline = time.monotonic() + timeout_s
    conn = BrokerConnection(host.strip("[]"), int(port), socket.AF_UNSPEC, **settings)
    try:
        if not conn.connect_blocking(timeout_s):
            raise ConnectionError(f"{server}: no connection within {timeout_s:g} s")
        version = request_version(broker_versions(conn), MetadataRequest, METADATA_MAX_VERSION)
        future = conn.send(metadata_request(version, [topic] if topic else None))
        while not future.is_done:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{server}: no metadata answer within {timeout_s:g} s")
            for response, answered in conn.recv():  # the connection leaves the futures to its caller
                answered.success(response)
            time.sleep(0.005)
        if future.failed():
            raise ConnectionError(f"{server}: {future.exception}")
        return _cluster_metadata(future.value)
    finally:
        conn.close()


def _cluster_metadata(response: Any) -> Any:
    """A kafka-python MetadataResponse (versions 0 to 7) as librdkafka's ``ClusterMetadata``."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import BrokerMetadata, ClusterMetadata, PartitionMetadata, TopicMetadata

    version = response.API_VERSION
    md = ClusterMetadata()
    md.cluster_id = getattr(response, "cluster_id", None) if version >= 2 else None
    md.controller_id = getattr(response, "controller_id", -1) if version >= 1 else -1
    for broker_id, (host, port) in metadata_brokers(response).items():
        broker = BrokerMetadata()
        broker.id, broker.port = broker_id, port
        broker.host = host  # type: ignore[assignment]  # (confluent-kafka declares it None)
        md.brokers[broker.id] = broker
    topic_errors, partitions = metadata_partitions(response)
    for name, error in topic_errors.items():
        tmd = TopicMetadata()
        tmd.topic = name
        tmd.error = KafkaError(error) if error else None
        md.topics[name] = tmd
    for pm in partitions:
        p = PartitionMetadata()
        p.id, p.leader, p.replicas, p.isrs = pm.partition, pm.leader, list(pm.replicas), list(pm.isr)
        p.error = KafkaError(pm.error) if pm.error else None
        md.topics[pm.topic].partitions[p.id] = p
    return md
