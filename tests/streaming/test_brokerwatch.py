"""streaming.driver.brokerwatch: Kafka's Metadata v0 on a socket of its own, and a real broker paused."""

from __future__ import annotations

import struct
import time

import pytest

from streaming.driver.brokerwatch import BrokerWatch, metadata_request, parse_metadata


def _string(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


def _response(corr: int, brokers=(1, 2), partitions=((0, (1, 2), (1,), 0), (1, (2, 1), (2, 1), 0))) -> bytes:
    """A Metadata v0 answer: ``brokers`` on 127.0.0.1:9091+id; ``partitions`` of ``orders`` as
    (partition, replicas, isr, error code), the leader the first replica."""
    out = struct.pack(">i", corr) + struct.pack(">i", len(brokers))
    for b in brokers:
        out += struct.pack(">i", b) + _string("127.0.0.1") + struct.pack(">i", 9091 + b)
    out += struct.pack(">i", 1) + struct.pack(">h", 0) + _string("orders") + struct.pack(">i", len(partitions))
    for partition, replicas, isr, error in partitions:
        out += struct.pack(">hii", error, partition, replicas[0])
        out += struct.pack(f">i{len(replicas)}i", len(replicas), *replicas)
        out += struct.pack(f">i{len(isr)}i", len(isr), *isr)
    return out


def test_a_request_and_a_response_as_kafka_lays_them_out() -> None:
    raw = metadata_request(7, ["orders"])
    (size,) = struct.unpack(">i", raw[:4])
    assert size == len(raw) - 4
    assert struct.unpack(">hhi", raw[4:12]) == (3, 0, 7)  # Metadata, version 0, correlation id
    assert raw.endswith(struct.pack(">i", 1) + _string("orders"))
    md = parse_metadata(_response(7))
    assert md.correlation_id == 7
    assert md.brokers == {1: ("127.0.0.1", 9092), 2: ("127.0.0.1", 9093)}
    assert md.errors == {}
    assert md.replicas == {("orders", 0): (1, 2), ("orders", 1): (2, 1)}


def test_a_broker_that_left_kafka_0_9s_metadata_keeps_its_address_in_the_identity() -> None:
    """Kafka 0.9 stops listing an unregistered broker (killed, or hung past its ZooKeeper
    session): the watch keeps its connection and address, so the job still sees it silent and
    still knows it for the watched cluster's broker of that id (streaming.driver.identity)."""
    watch = BrokerWatch("127.0.0.1:9092", "orders", cluster_id="abc")  # not started: nothing is asked
    watch._learn(parse_metadata(_response(1)))
    assert watch.identity().endpoints == {1: ("127.0.0.1", 9092), 2: ("127.0.0.1", 9093)}
    assert watch.identity().cluster_id == "abc"
    gone = _response(2, brokers=(1,), partitions=((0, (1,), (1,), 9), (1, (1,), (1,), 5)))
    assert parse_metadata(gone).errors == {("orders", 0): 9, ("orders", 1): 5}
    watch._learn(parse_metadata(gone))
    assert watch.identity().endpoints == {1: ("127.0.0.1", 9092), 2: ("127.0.0.1", 9093)}
    # a broker given another address: the newest one
    moved = parse_metadata(_response(3))
    moved.brokers[2] = ("Kafka2.example", 9093)
    watch._learn(moved)
    assert watch.identity().endpoints[2] == ("kafka2.example", 9093)


def test_a_broker_answering_again_after_a_gap_is_resumed_only_past_the_gap_asked() -> None:
    """A unit test of the bookkeeping (answers stamped by hand; nothing is asked)."""
    now = [1000.0]
    watch = BrokerWatch("127.0.0.1:9092", "orders", interval_s=0.5, timeout_s=1.0, clock=lambda: now[0])
    watch._learn(parse_metadata(_response(1)))

    class Answers:
        def __init__(self, broker: int) -> None:
            self.address = ("127.0.0.1", 9091 + broker)

        def ask(self, topics: list[str]) -> object:
            return parse_metadata(_response(1))

        def close(self) -> None:
            pass

    watch._connections = {1: Answers(1), 2: Answers(2)}  # type: ignore[dict-item]
    watch.round()
    now[0] += 0.5
    watch.round()
    assert watch.resumed(1.0) == {}  # answering every round: no gap
    now[0] += 6.0  # six seconds without a round: every broker was silent that long
    watch.round()
    assert watch.resumed(5.0) == {1: 1006.5, 2: 1006.5}
    assert watch.resumed(7.0) == {}  # a gap shorter than asked is no resumption


@pytest.mark.parametrize("cut", [0, 3, 10, 40])
def test_a_response_cut_short_is_an_error_not_a_wrong_answer(cut: int) -> None:
    with pytest.raises(ValueError):
        parse_metadata(_response(1)[:cut])


def test_a_paused_broker_is_silent_while_the_other_answers(kafka_cluster_factory) -> None:
    cluster = kafka_cluster_factory(brokers=2)
    # Pinned so that each broker leads one partition of the watched topic, the paused one too
    # (the assertions below read the assignment back); nothing is kept away from the fault.
    cluster.create_topic("orders", assignment=[[1, 2], [2, 1]])
    watch = BrokerWatch(cluster.bootstrap_servers, "orders", interval_s=0.2, timeout_s=0.5).start()
    try:
        deadline = time.monotonic() + 30
        while len(watch._answered) < 2:
            assert time.monotonic() < deadline, "the watch never heard both brokers"
            time.sleep(0.2)
        # the brokers' addresses as their metadata gives them: what a collector of this cluster states
        assert set(watch.identity().endpoints) == {1, 2}
        assert watch.silent(time.time(), 1.0) == {}
        assert watch.resumed(1.0) == {}
        paused_at = time.time()
        cluster.pause(2)
        try:
            time.sleep(2.5)
            silent = watch.silent(time.time(), 1.0)
            assert list(silent) == [2]
            assert paused_at - 1.0 <= silent[2] <= paused_at + 0.5, (silent, paused_at)
        finally:
            cluster.resume(2)
        resumed_at = time.time()
        deadline = time.monotonic() + 15
        while watch.silent(time.time(), 1.0):
            assert time.monotonic() < deadline, "the broker resumed but stays silent"
            time.sleep(0.2)
        # answering again after its silence: the job's newer evidence (streaming.driver.lookahead.due)
        back = watch.resumed(1.0)
        assert list(back) == [2] and resumed_at - 0.5 <= back[2] <= time.time(), (back, resumed_at)
        # nothing answering at all (both brokers paused): the job's own network, not a broker
        cluster.pause(1)
        cluster.pause(2)
        try:
            time.sleep(2.5)
            assert watch.silent(time.time(), 1.0) == {}
        finally:
            cluster.resume(1)
            cluster.resume(2)
    finally:
        watch.stop()


def test_the_watch_outlives_an_unexpected_error(caplog: pytest.LogCaptureFixture) -> None:
    """A unit test of the thread's loop (its round replaced; nothing is asked): an error no
    broker's answer explains is logged with its traceback and the next round still runs."""
    rounds: list[int] = []
    watch = BrokerWatch("127.0.0.1:9", "orders", interval_s=0.05)

    def flaky() -> None:
        rounds.append(1)
        if len(rounds) == 1:
            raise RuntimeError("something no one foresaw")

    watch.round = flaky  # type: ignore[method-assign]
    watch.start()
    try:
        deadline = time.monotonic() + 10
        while len(rounds) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watch.stop()
    assert len(rounds) >= 3 and watch.errors == 1
    [record] = [r for r in caplog.records if "brokerwatch_error" in r.getMessage()]
    assert record.exc_info is not None
