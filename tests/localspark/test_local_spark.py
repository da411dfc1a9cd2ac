"""``isrwatch local-spark``: a real Spark standalone master and workers on loopback,
started from the pyspark package's jars, and everything gone after SIGTERM."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # three JVMs (no fixture says so)


def _spark_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "org.apache.spark.deploy.(master.Master|worker.Worker)"], capture_output=True)
    return {int(p) for p in out.stdout.split()}


def test_local_spark_starts_a_master_with_its_workers_and_stops_on_sigterm(tmp_path) -> None:
    before = _spark_pids()
    proc = subprocess.Popen(
        [sys.executable, "-m", "isrwatch", "local-spark", "--workers", "2", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Ctrl-C"):
                break
        text = "".join(lines)
        assert "Spark is up: master spark://127.0.0.1:" in text, text
        ui = re.search(r"master UI:\s+(http://127\.0\.0\.1:\d+)", text)
        assert ui, text
        with urllib.request.urlopen(f"{ui.group(1)}/json/", timeout=10) as r:
            state = json.load(r)
        alive = [w for w in state["workers"] if w["state"] == "ALIVE"]
        assert len(alive) == 2 and all(w["host"] == "127.0.0.1" for w in alive), state["workers"]
        assert len(_spark_pids() - before) == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        deadline = time.monotonic() + 20
        while _spark_pids() - before and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _spark_pids() - before, "a master or worker outlived the command"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
