"""What a job killed outright left in the temp directory, removed by the next job to start.

A job that is stopped (its duration, SIGTERM, Ctrl-C) removes the temporary directories it
made: Spark's scratch space (``isrwatch-spark-*``: the block manager's shuffle and spill files,
which grow with the batches) and the embedded default's checkpoint (``isrwatch-checkpoint-*``).
A job killed with SIGKILL, or whose machine lost power, cannot, and a job kept always on by a
service manager that kills it now and then would fill the temp directory over the weeks.

So each job marks the directories it makes with its own process (``claim``: its pid and the
time the system started that process), and each job, as it starts, removes the ones whose
process is gone (``sweep``). A directory is kept when its process is still there (the same
pid with the same start time: another job on the machine), when it has no mark (being made
this moment, or made by a version before the mark) or a mark that cannot be read, and when it
belongs to another user.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from isrwatch.logs import kv

__all__ = ["PREFIXES", "claim", "sweep"]

log = logging.getLogger("streaming.job")

PREFIXES = ("isrwatch-spark-", "isrwatch-checkpoint-")  # the temporary directories a job makes
MARK = ".isrwatch-owner"  # in each: "<pid> <start time>" of the process that made it


def _started(pid: int) -> str | None:
    """When the system started process ``pid``, in clock ticks since boot (``/proc``'s
    ``starttime``), or None where that cannot be read (no such process, no ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (command) state ppid ...": the command may hold spaces and parentheses
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None  # field 22 of the whole line


def _alive(pid: int, started: str) -> bool:
    """Whether the process that wrote a mark ``pid started`` is still running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, another user's
        return True
    now = _started(pid)
    # the pid reused by another process since (its own start time), unless it cannot be told
    return now is None or started == "-" or now == started


def claim(directory: str) -> None:
    """Mark ``directory`` as this process's, for ``sweep`` in the jobs after it."""
    pid = os.getpid()
    tmp = os.path.join(directory, MARK + ".tmp")
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{pid} {_started(pid) or '-'}\n")
    os.replace(tmp, os.path.join(directory, MARK))


def sweep(parent: str) -> list[str]:
    """Remove the job directories in ``parent`` (the temp directory) whose process is gone;
    the ones removed, each logged (``left_behind_removed``)."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    removed = []
    for entry in entries:
        if not entry.name.startswith(PREFIXES) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            pid_text, started = Path(entry.path, MARK).read_text(encoding="ascii").split()
            pid = int(pid_text)
        except (OSError, ValueError):
            continue  # no mark yet, or none readable: kept
        if _alive(pid, started):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
        log.info("left_behind_removed %s", kv(dir=entry.path, owner_pid=pid))
    return removed
