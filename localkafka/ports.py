"""Free TCP ports on loopback for servers started later (brokers, exporters, Prometheus)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

_LOWEST_PORT = 20_000
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections (Linux; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now, for a server started later.

    Chosen below the kernel's ephemeral range: a port the kernel handed out
    (``bind(0)``) can be taken by any outgoing connection (a Kafka client, Spark)
    in the seconds before the server binds it, which made a job exit with
    "Address already in use". Not handed out twice by this process.
    """
    low = _ephemeral_low()
    if low - _LOWEST_PORT >= 1000:
        rng = random.Random()
        for _ in range(500):
            port = rng.randrange(_LOWEST_PORT, low)
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
