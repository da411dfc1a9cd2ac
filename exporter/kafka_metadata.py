"""Cluster metadata from whichever bootstrap broker answers first.

librdkafka sends a metadata request to one broker it holds a connection to, and
``list_topics`` waits for that broker alone. A broker that hangs without closing its
connections (SIGSTOP, a long GC pause, swapping) still looks connected, so a client
that picked it waits out the whole timeout while the other brokers would have
answered at once: a job or exporter started during such a fault failed its start-up
("cannot reach Kafka") about one time in three on a 3-broker cluster.

``first_metadata`` asks every bootstrap server at once, each from its own client
that knows only that server, and returns the first answer. A client still waiting
on a hung broker finishes on its own thread when its timeout ends, and is freed then.

The clients are producers. A consumer with a group id also finds its group's
coordinator and connects to it, and librdkafka sends a metadata request to any
broker it is connected to: when the hung broker was the coordinator, every client
could ask it (found by tests/e2e/test_restart.py: the restarted job could not start
again). A producer connects to nothing but its bootstrap server until it needs to.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["first_metadata", "bootstrap_list"]

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

    Raises the last ``KafkaException`` when none answers within ``timeout_s``.
    """
    from confluent_kafka import KafkaError, KafkaException, Producer

    servers = bootstrap_list(str(config.get("bootstrap.servers", ""))) or [""]
    answers: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue()
    base = {k: v for k, v in config.items() if not k.startswith(_CONSUMER_ONLY)}
    base["logger"] = log

    def ask(server: str) -> None:
        try:
            client = Producer({**base, "bootstrap.servers": server})
        except (KafkaException, ValueError) as e:  # a bad setting: the caller's own check names it
            answers.put((None, KafkaException(KafkaError(KafkaError._INVALID_ARG, str(e)))))
            return
        try:
            md = client.list_topics(topic, timeout=timeout_s) if topic else client.list_topics(timeout=timeout_s)
            answers.put((md, None))
        except KafkaException as e:
            answers.put((None, e))

    for server in servers:
        threading.Thread(target=ask, args=(server,), name=f"metadata-{server}", daemon=True).start()
    last: BaseException | None = None
    for _ in servers:
        try:
            md, err = answers.get(timeout=timeout_s + 5.0)
        except queue.Empty:
            break
        if err is None:
            return md
        last = err
    raise last or KafkaException(KafkaError(KafkaError._TIMED_OUT, "no broker answered"))
