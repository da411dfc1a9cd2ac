"""exporter.kafka_metadata: metadata from whichever bootstrap broker answers first.

A broker that hangs (SIGSTOP) still accepts TCP connections (the kernel does) and never
answers. A silent listener on loopback is that broker as a client sees it, so these tests
put one first among the bootstrap servers of the real shared cluster, without pausing a
broker the other tests use. tests/e2e/test_restart_during_pause.py does the same with a
really paused broker.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException

from exporter.kafka_metadata import bootstrap_list, first_metadata


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """host:port of a listener that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    t.join()
    for c in held:
        c.close()
    server.close()


def test_bootstrap_list_drops_blanks_and_repeats() -> None:
    assert bootstrap_list(" a:1, b:2,,a:1 ") == ["a:1", "b:2"]
    assert bootstrap_list("") == []


def test_a_silent_broker_alone_times_out_and_first_metadata_says_so(kafka_cluster, silent_broker) -> None:
    config = {**kafka_cluster.client_config(), "bootstrap.servers": silent_broker}
    plain = Consumer({**config, "group.id": "kafka-metadata-test"})
    try:
        with pytest.raises(KafkaException):
            plain.list_topics(timeout=2.0)  # what a client that picked the hung broker gets
    finally:
        plain.close()
    with pytest.raises(KafkaException) as err:
        first_metadata(config, 2.0)
    assert err.value.args[0].code() == KafkaError._TIMED_OUT, err.value


def test_the_answering_brokers_win_over_a_silent_one_named_first(kafka_cluster, silent_broker) -> None:
    config = {
        **kafka_cluster.client_config(),
        "bootstrap.servers": f"{silent_broker},{kafka_cluster.bootstrap_servers}",
    }
    for _ in range(3):
        md = first_metadata(config, 5.0)
        assert sorted(md.brokers) == sorted(kafka_cluster.broker_ids)
