"""What a benchmark ran on: command, machine, load, versions; process memory."""

from __future__ import annotations

import contextlib
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["header", "print_header", "rss_mb", "dir_mb", "load_average", "median_of_measured"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return 0.0


def _java_version() -> str:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20)
        return (out.stderr or out.stdout).splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return "not found"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def header() -> dict[str, Any]:
    return {
        "command": " ".join(shlex.quote(a) for a in [os.path.relpath(sys.executable), "-m", *_module_argv()]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "nproc": os.cpu_count(),
        "memory_gb": _mem_total_gb(),
        "cpu": _cpu_model(),
        "load_average": load_average(),
        "python": platform.python_version(),
        "pyspark": _version("pyspark"),
        "java": _java_version(),
        "confluent_kafka": _version("confluent-kafka"),
        "pyarrow": _version("pyarrow"),
        "protobuf": _version("protobuf"),
    }


def _module_argv() -> list[str]:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = spec.name if spec is not None else sys.argv[0]
    return [name, *sys.argv[1:]]


def print_header(title: str) -> dict[str, Any]:
    h = header()
    print(f"# {title}")
    for k, v in h.items():
        print(f"{k}: {v}")
    sys.stdout.flush()
    return h


def rss_mb(pid: int | None = None, field: str = "VmRSS") -> float:
    """Resident memory of a process (this one by default), MiB; ``field="VmHWM"``: its peak so far."""
    path = Path(f"/proc/{pid or os.getpid()}/status")
    try:
        for line in path.read_text().splitlines():
            if line.startswith(f"{field}:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


def dir_mb(path: str | os.PathLike[str]) -> float:
    """Bytes on disk under ``path``, MiB."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
    return round(total / 1024 / 1024, 1)


def cpu_seconds(process_groups: set[int]) -> float:
    """CPU time (user + system) of every live process in ``process_groups``, seconds.

    A Spark standalone worker and its executors share a process group (the worker's);
    the driver's JVM and its Python workers share this process's. Processes that have
    exited are not counted: compare runs of the same shape."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        # after "pid (comm)": state ppid pgrp session ... utime (14th field of the line) stime
        if int(fields[2]) in process_groups:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def median_of_measured(values: list[Any]) -> Any:
    """The median of the runs that measured it, skipping None (a run that measured nothing);
    None when none did."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
