"""Issue 18, nothing left behind: the embedded default, however it ends, leaves
no new entry in the temp directory (its temporary checkpoint, Spark's scratch
directories, temp files).

``isrwatch run`` is started as a user starts it (the console script, in its own
process group like a shell job) with ``TMPDIR`` pointing at a directory of the
test's own, so "new entry" is exact; it is ended by ``--duration``, by Ctrl-C
(SIGINT to the whole process group, as a terminal sends it) and by SIGTERM to the
whole process group (systemd's default ``KillMode=control-group`` does the same): that
also ends Spark's JVM and Python workers under the job while it stops, and the job still
cleans up, exits 0 and prints no Python traceback (issue 14, item 4). Killed outright
(SIGKILL), it cannot clean up: the next job to start removes what it left (the last test).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.results import write_result

pytestmark = [pytest.mark.spark, pytest.mark.reliability]

ISRWATCH = str(Path(sys.executable).with_name("isrwatch"))


def _start(tmp: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, TMPDIR=str(tmp))
    with log.open("wb") as err:
        return subprocess.Popen(
            [ISRWATCH, "run", "--simulate", "steady", "--metrics-port", "0", *args],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            start_new_session=True,
        )


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, f"isrwatch run ended early: {log.read_text(errors='replace')[-2000:]}"
        time.sleep(0.5)
    raise AssertionError(f"no {text!r} within {timeout_s}s: {log.read_text(errors='replace')[-2000:]}")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _ended(proc: subprocess.Popen[bytes]) -> None:
    """The job's whole process group ended: SIGKILL to what is still running of it, then wait.
    The Spark JVM outlives the Python process by a moment: it exits when its pipe from Python
    closes, and its shutdown hooks delete its scratch directories. The job has ended when its
    whole process group has (no JVM left running either)."""
    if proc.poll() is None or _group_alive(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 60
    while _group_alive(proc.pid):
        assert time.monotonic() < deadline, "a process of the job outlived it by 60 s"
        time.sleep(0.2)


# make test keeps SIGTERM (a service manager's stop); the other three endings (~25-45 s each: a job
# start each) run in make campaign and make reliability.
# What Spark printed at a healthy start or stop, saying nothing to an operator.
SPARK_NOISE = (
    "InterruptedException",
    "Interrupted while joining",
    "Failed to cancel job group",
    "Truncated the string representation of a plan",
)


@pytest.mark.parametrize(
    "ending",
    [
        pytest.param("duration", marks=pytest.mark.campaign),
        pytest.param("sigint", marks=pytest.mark.campaign),
        "sigterm",
        pytest.param("sigterm-python", marks=pytest.mark.campaign),
    ],
)
def test_the_embedded_default_leaves_nothing_in_the_temp_directory(tmp_path: Path, ending: str) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    log = tmp_path / "stderr.log"
    proc = _start(tmp, log, *(["--duration", "20"] if ending == "duration" else []))
    try:
        _wait_for(log, "streaming.job started ", proc, 180)
        # the job did make its temporary checkpoint and Spark its scratch space here
        assert any(p.name.startswith("isrwatch-checkpoint-") for p in tmp.iterdir()), sorted(os.listdir(tmp))
        if ending != "duration":
            _wait_for(log, "streaming.job batch ", proc, 180)  # a running job, a batch done
            if ending == "sigterm-python":  # the Python process alone (Kubernetes, docker stop)
                os.kill(proc.pid, signal.SIGTERM)
            else:  # the whole process group: a terminal's Ctrl-C, systemd's default
                os.killpg(proc.pid, signal.SIGINT if ending == "sigint" else signal.SIGTERM)
        rc = proc.wait(timeout=180)
    finally:
        _ended(proc)
    text = log.read_text(errors="replace")
    left = sorted(os.listdir(tmp))
    expected = 130 if ending == "sigint" else 0  # Ctrl-C: the shell's convention
    write_result(  # issue 14, item 4: tools/reliability_table.py's rows
        f"stopping_{ending}",
        {"exit_code": rc, "exit_code_expected": expected, "traceback": "Traceback" in text, "left_in_temp": left},
    )
    assert "Traceback" not in text, text[-3000:]
    # Nor Spark's warnings of the stop's own interruption (a Java stack at every stop until
    # 2026-12-06: streaming.lifecycle.stopping._INTERRUPTION_LOGGERS), nor its plan-string hint.
    noise = [line for line in text.splitlines() if any(n in line for n in SPARK_NOISE)]
    assert not noise, noise
    assert "removed=temporary" in text, text[-2000:]
    assert rc == expected, text[-2000:]
    assert left == [], f"left in the temp directory after {ending}: {left}"


@pytest.mark.campaign
def test_a_job_killed_outright_leaves_what_the_next_job_to_start_removes(tmp_path: Path) -> None:
    """SIGKILL to the whole process group (the OOM killer, a service manager's last resort):
    nothing can clean up, so the temporary checkpoint and Spark's scratch space stay; the next
    job to start in the same temp directory removes them (``streaming.lifecycle.leftovers``),
    and itself, stopped, leaves nothing."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = _start(tmp, first_log)
    try:
        _wait_for(first_log, "streaming.job batch ", first, 180)
    finally:
        _ended(first)  # SIGKILL to the whole group: the JVM too
    left = sorted(os.listdir(tmp))
    assert any(n.startswith("isrwatch-checkpoint-") for n in left), left
    assert any(n.startswith("isrwatch-spark-") for n in left), left

    second = _start(tmp, second_log)
    try:
        _wait_for(second_log, "streaming.job started ", second, 180)
        os.killpg(second.pid, signal.SIGTERM)
        rc = second.wait(timeout=180)
    finally:
        _ended(second)
    text = second_log.read_text(errors="replace")
    said = [line for line in text.splitlines() if "left_behind_removed" in line]
    removed = sorted(n for n in left if any(f"dir={tmp / n} " in line for line in said))
    assert removed == left, said
    assert rc == 0, text[-2000:]
    assert sorted(os.listdir(tmp)) == [], f"left in the temp directory: {sorted(os.listdir(tmp))}"
