"""Issue 18: ``isrwatch run``, ``collect`` and ``exporter`` pointed at an address where
nothing listens end with one line naming it: non-zero exit, no traceback, and not
hundreds of lines of the Kafka clients' retries (isrwatch.logs.RepeatFilter).
Run as a user runs them: the console script, a real closed port on loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from localkafka import free_port

pytestmark = pytest.mark.spark

ISRWATCH = str(Path(sys.executable).with_name("isrwatch"))


@pytest.mark.parametrize("command", ["run", "collect", "exporter"])
def test_nothing_listening_is_said_in_one_line(command: str, tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"  # nobody listens there
    # The collector and the exporter give up after --startup-timeout (15 s by default); 3 s here,
    # as the message, not the wait, is what is tested. The job's 15 s is not an option.
    extra = (
        ["--checkpoint-dir", str(tmp_path / "ck"), "--metrics-port", "0"]
        if command == "run"
        else ["--startup-timeout", "3"]
    )
    done = subprocess.run(
        [ISRWATCH, command, "--bootstrap-servers", address, *extra],
        capture_output=True,
        text=True,
        timeout=30,  # the bound: a hang fails here
        cwd=tmp_path,
    )
    err = done.stderr
    assert done.returncode != 0, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"isrwatch {command}: error:") and address in last, err
    assert len(err.strip().splitlines()) <= 10, f"{len(err.splitlines())} lines:\n{err[:3000]}"
