"""What a job killed outright left in the temp directory, removed by the next job to start.

A job that is stopped (its duration, SIGTERM, Ctrl-C) removes the temporary directories it
made: Spark's scratch space (``isrwatch-spark-*``: the block manager's shuffle and spill files,
which grow with the batches) and the embedded default's checkpoint (``isrwatch-checkpoint-*``).
A job killed with SIGKILL, or whose machine lost power, cannot, and a job kept always on by a
service manager that kills it now and then would fill the temp directory over the weeks.

So each job marks the directories it makes with its own process (``claim``: its pid, the time
the system started that process, the pid namespace the pid is of, the boot and the host's
name), and each job, as it starts, removes the ones whose process is gone (``sweep``): made on
this host before it last booted, or by a pid of this boot and namespace that is no longer there
or is now another process's (the same pid, another start time). A directory is kept when its
process is still there (another job on the machine), when it was made on another host or in
another pid namespace (a temp directory shared between machines or containers: that process
cannot be looked up from here), when it has no mark (being made this moment, or made by a
version before the mark) or a mark that cannot be read, and when it belongs to another user.
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
MARK = ".isrwatch-owner"  # in each: "<pid> <start time> <pid namespace> <boot> <host>" of its process
_UNKNOWN = "-"  # a part of the mark this system does not give (no /proc)


def _read(path: str) -> str:
    """A one-line system file's text (``/proc``), or ``_UNKNOWN``."""
    try:
        return Path(path).read_text().strip() or _UNKNOWN
    except OSError:
        return _UNKNOWN


def _namespace() -> str:
    """This process's pid namespace (``pid:[4026531836]``), or ``_UNKNOWN``."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return _UNKNOWN


def _boot() -> str:
    """This boot's id, or ``_UNKNOWN``."""
    return _read("/proc/sys/kernel/random/boot_id")


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


def _owner() -> tuple[str, str, str]:
    """This process's (pid namespace, boot, host): where its pid means this process."""
    return _namespace(), _boot(), os.uname().nodename or _UNKNOWN


def _gone(pid: int, started: str, where: tuple[str, str, str]) -> bool:
    """Whether the process that wrote a mark (``where``: its ``_owner``) is known to be gone."""
    namespace, boot, host = where
    here = _owner()
    if _UNKNOWN in (*where, *here) or host != here[2]:
        return False  # another host's (a shared temp directory), or not to be told
    if boot != here[1]:
        return True  # this host booted since: every process of then is gone
    return namespace == here[0] and not _alive(pid, started)  # another namespace's pid: not seen here


def _alive(pid: int, started: str) -> bool:
    """Whether process ``pid``, started at ``started`` (``_started``), is still running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, another user's
        return True
    now = _started(pid)
    # the pid reused by another process since (its own start time), unless it cannot be told
    return now is None or started == _UNKNOWN or now == started


def claim(directory: str) -> None:
    """Mark ``directory`` as this process's, for ``sweep`` in the jobs after it."""
    pid = os.getpid()
    tmp = os.path.join(directory, MARK + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(" ".join((str(pid), _started(pid) or _UNKNOWN, *_owner())) + "\n")
        os.replace(tmp, os.path.join(directory, MARK))
    except OSError as e:  # the job goes on: only a kill would leave the directory behind
        log.warning("left_behind_mark_failed %s", kv(dir=directory, error=e.strerror))


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
            pid_text, started, namespace, boot, host = Path(entry.path, MARK).read_text(encoding="utf-8").split()
            pid = int(pid_text)
        except (OSError, ValueError):
            continue  # no mark yet, or none readable: kept
        if not _gone(pid, started, (namespace, boot, host)):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
        log.info("left_behind_removed %s", kv(dir=entry.path, owner_pid=pid))
    return removed
