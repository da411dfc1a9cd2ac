"""OutputProducer never raises BufferError and keeps the newest state per replica
(unit test of its logic: a stand-in producer whose queue fills up)."""

from __future__ import annotations

from streaming.sinks.producer import OutputProducer


class _Msg:
    def __init__(self, topic):
        self._topic = topic

    def topic(self):
        return self._topic


class FullQueue:
    """A producer whose queue holds ``room`` records; ``poll`` delivers them all."""

    def __init__(self, room):
        self.room = room
        self.queue = []
        self.delivered = []

    def produce(self, topic, key=None, value=None, on_delivery=None):
        if len(self.queue) >= self.room:
            raise BufferError("queue full")
        self.queue.append((topic, key, value, on_delivery))

    def poll(self, timeout=0):
        n = len(self.queue)
        for topic, key, value, cb in self.queue:
            self.delivered.append((topic, key, value))
            cb(None, _Msg(topic))
        self.queue = []
        return n

    def flush(self, timeout=0):
        self.poll()
        return 0

    def __len__(self):
        return len(self.queue)


def test_state_records_past_a_full_queue_are_held_newest_per_key_and_sent_later():
    raw = FullQueue(room=1)
    out = OutputProducer(raw, latest_wins={"state"})
    out.produce("state", key=b"r1", value=b"v1")  # fits
    out.produce("state", key=b"r2", value=b"a")  # held
    out.produce("state", key=b"r2", value=b"b")  # replaces the held one
    out.produce("state", key=b"r1", value=b"v2")  # held behind r2
    # stats() serves the delivery reports first: r1/v1 is acknowledged, two are held
    assert out.stats()["state"].pending == 2
    out.poll()  # delivers r1/v1, then offers the held: r2/b goes into the queue
    out.poll()
    out.poll()
    assert raw.delivered == [("state", b"r1", b"v1"), ("state", b"r2", b"b"), ("state", b"r1", b"v2")]
    assert out.stats()["state"].pending == 0


def test_alerts_are_held_in_order_and_the_oldest_dropped_past_the_bound():
    raw = FullQueue(room=0)
    out = OutputProducer(raw, max_held=3)
    for i in range(5):
        out.produce("alerts", key=b"k", value=str(i).encode())
    assert out.stats()["alerts"].dropped == 2
    raw.room = 10
    assert out.flush(1) == 0
    assert [v for _, _, v in raw.delivered] == [b"2", b"3", b"4"]
