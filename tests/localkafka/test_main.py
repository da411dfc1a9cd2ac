"""``isrwatch local-kafka`` starts a real cluster, prints how to use it, and stops it on SIGTERM/Ctrl-C."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_local_kafka_command_runs_until_stopped(sig):
    proc = subprocess.Popen(
        [sys.executable, "-m", "isrwatch", "local-kafka", "--brokers", "2", "--lag-time-max-ms", "4000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("Ctrl-C"):
                break
        text = "".join(lines)
        m = re.search(r"bootstrap servers: (\S+)", text)
        assert m, text
        servers = m.group(1).split(",")
        assert len(servers) == 2
        assert "--kafka-config api.version.request=false" in text and "--lag-time-max-ms 4000" in text
        for s in servers:
            host, port = s.split(":")
            socket.create_connection((host, int(port)), timeout=5).close()
        jmx = re.search(r"broker JMX: +1=(127\.0\.0\.1:\d+), 2=(127\.0\.0\.1:\d+)", text)
        assert jmx, text
        assert f"isrwatch collect --source jmx --jmx {jmx.group(1)} --jmx {jmx.group(2)} " in text
        for s in jmx.groups():
            host, port = s.split(":")
            socket.create_connection((host, int(port)), timeout=5).close()
        proc.send_signal(sig)
        assert proc.wait(60) in (0, 130)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10
    for s in servers:
        host, port = s.split(":")
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
            except OSError:
                break
            assert time.monotonic() < deadline, f"broker at {s} still answers after the command stopped"
            time.sleep(0.2)
