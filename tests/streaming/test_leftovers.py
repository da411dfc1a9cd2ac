"""``streaming.lifecycle.leftovers``: a killed job's temporary directories, removed by the next
job; a running job's, an unmarked one and anything else in the temp directory kept.

The owners are real processes: a child Python process claims a directory and exits (what a
job killed outright leaves: a mark of a process that is gone), and this test's own process
claims another (a job still running). The whole path, a real ``isrwatch run`` killed with
SIGKILL and the next one removing what it left, is
``tests/streaming/test_nothing_left_behind.py`` (its last test, in ``make campaign``) and
``tests/e2e/test_restart.py`` (a job killed during a broker pause)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from streaming.lifecycle import leftovers


def _claimed_by_a_process_gone(directory: Path) -> int:
    """``directory`` claimed by a child process that has exited since: its pid."""
    code = "import os, sys; from streaming.lifecycle.leftovers import claim; claim(sys.argv[1]); print(os.getpid())"
    out = subprocess.run([sys.executable, "-c", code, str(directory)], check=True, capture_output=True, text=True)
    return int(out.stdout)


def test_a_gone_process_s_directories_are_removed_and_the_rest_kept(tmp_path: Path) -> None:
    gone_scratch = tmp_path / "isrwatch-spark-gone"
    gone_checkpoint = tmp_path / "isrwatch-checkpoint-gone"
    running = tmp_path / "isrwatch-spark-running"
    unmarked = tmp_path / "isrwatch-spark-unmarked"
    torn = tmp_path / "isrwatch-checkpoint-torn"
    other = tmp_path / "someone-elses-gone"
    for d in (gone_scratch, gone_checkpoint, running, unmarked, torn, other):
        d.mkdir()
    (gone_scratch / "blockmgr-1").mkdir()
    (gone_scratch / "blockmgr-1" / "shuffle_0_0_0.data").write_bytes(b"x" * 1000)
    pid = _claimed_by_a_process_gone(gone_scratch)
    _claimed_by_a_process_gone(gone_checkpoint)
    _claimed_by_a_process_gone(other)  # a directory not named as a job's is never touched
    leftovers.claim(str(running))  # this process: a job still running
    (torn / leftovers.MARK).write_text("not a mark")
    (tmp_path / "isrwatch-spark-a-file").write_text("a file, not a directory")

    removed = leftovers.sweep(str(tmp_path))

    assert sorted(removed) == sorted([str(gone_scratch), str(gone_checkpoint)])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "isrwatch-checkpoint-torn",
        "isrwatch-spark-a-file",
        "isrwatch-spark-running",
        "isrwatch-spark-unmarked",
        "someone-elses-gone",
    ]
    assert pid != os.getpid()


def _marked(directory: Path, pid: int, started: str, namespace: str, boot: str, host: str) -> Path:
    directory.mkdir()
    (directory / leftovers.MARK).write_text(f"{pid} {started} {namespace} {boot} {host}\n")
    return directory


def test_where_a_mark_was_made_decides_whether_its_process_can_be_told_gone(tmp_path: Path) -> None:
    """This process's pid, but marked as started at another time (the pid reused since), or on
    this host's earlier boot: gone. A dead pid marked in another pid namespace or on another
    host (a temp directory shared between containers or machines): kept, it cannot be looked up."""
    namespace, boot, host = leftovers._owner()
    assert "-" not in (namespace, boot, host), "this machine has /proc"
    started = leftovers._started(os.getpid())
    assert started is not None
    probe = tmp_path / "probe"  # (not named as a job's directory: the sweep leaves it)
    probe.mkdir()
    dead = _claimed_by_a_process_gone(probe)  # a pid of no process now
    reused = _marked(tmp_path / "isrwatch-spark-reused", os.getpid(), str(int(started) - 1), namespace, boot, host)
    rebooted = _marked(tmp_path / "isrwatch-spark-rebooted", os.getpid(), started, namespace, "an-earlier-boot", host)
    _marked(tmp_path / "isrwatch-spark-container", dead, "1", "pid:[1]", boot, host)
    _marked(tmp_path / "isrwatch-spark-elsewhere", dead, "1", namespace, "another-boot", "another-host")
    _marked(tmp_path / "isrwatch-spark-mine", os.getpid(), started, namespace, boot, host)

    assert sorted(leftovers.sweep(str(tmp_path))) == sorted([str(reused), str(rebooted)])


def test_a_temp_directory_that_cannot_be_read_removes_nothing(tmp_path: Path) -> None:
    assert leftovers.sweep(str(tmp_path / "not-there")) == []
