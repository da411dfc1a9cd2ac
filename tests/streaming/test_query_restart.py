"""A query that fails is started again in the same process (``streaming.lifecycle.restarts.RestartPolicy``).

Found by the reliability campaign (2026-11-26, load average 15 on the 2 cores): the job exited
with ``isrwatch run: error: query isrwatch stopped: Python worker failed to connect back.``
Spark gives the Python worker that runs the job's source 10 s to start and connect back; on a
loaded machine it can take longer, and one late start ended an always-on monitor.

Reproduced with real Spark: ``PYSPARK_PYTHON`` is a wrapper that starts the source's first
worker (``pyspark.sql.streaming.python_streaming_source_runner``) 15 s late, as a loaded machine
does, and every later one at once. The embedded default must say it restarts the query, go on
completing batches after it, and stop as asked (``--duration``): exit 0, no traceback. Before
the fix it exited 1 with the line above.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# make campaign and make reliability (~65 s: a worker started 15 s late, then the query restarted
# from its checkpoint); make test keeps the restart's policy by unit test
# (tests/streaming/test_restarts.py) and a real query failed and restarted in the job's process
# (tests/streaming/test_lifecycle.py).
pytestmark = [pytest.mark.spark, pytest.mark.campaign, pytest.mark.reliability]

ISRWATCH = str(Path(sys.executable).with_name("isrwatch"))
LATE_S = 15  # past Spark's 10 s for a worker to connect back


def _late_first_source_worker(tmp_path: Path) -> Path:
    wrapper = tmp_path / "python-late-once"
    mark = tmp_path / "late-once"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *python_streaming_source_runner*)\n'
        f'  if mkdir "{mark}" 2>/dev/null; then sleep {LATE_S}; fi;;\n'
        "esac\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def test_a_source_worker_that_connects_back_too_late_does_not_end_the_job(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    env = dict(os.environ, PYSPARK_PYTHON=str(_late_first_source_worker(tmp_path)))
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [ISRWATCH, "run", "--simulate", "steady", "--metrics-port", "0", "--duration", "45"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            start_new_session=True,
        )
    try:
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text(errors="replace")
    assert (tmp_path / "late-once").is_dir(), "the wrapper never started the source's worker: the test tested nothing"
    restarting = [line for line in text.splitlines() if "query_restarting" in line]
    assert restarting, f"no restart said: {text[-3000:]}"
    assert "connect back" in restarting[0], restarting
    after = text[text.index("query_restarted") :] if "query_restarted" in text else ""
    assert "streaming.job batch " in after, f"no batch after the restart: {text[-3000:]}"
    assert rc == 0, f"exit {rc}: {text[-3000:]}"
    assert "Traceback" not in text, text[-3000:]
    assert "isrwatch run: error" not in text, text[-3000:]
