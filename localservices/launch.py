"""Prometheus and Alertmanager started from a configuration file.

Each starts on a free 127.0.0.1 port, waits until the service says it is ready,
and is stopped (and its process reaped) when the ``with`` block ends.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from localkafka import free_port

__all__ = ["Service", "binary", "prometheus", "alertmanager"]


def binary(*names: str) -> str | None:
    """The first of ``names`` found on PATH."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass(frozen=True)
class Service:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"not ready at {url} after {deadline_s}s:\n{log.read_text(errors='replace')[-3000:]}")


@contextlib.contextmanager
def _running(argv: list[str], ready_path: str, port: int, workdir: Path) -> Iterator[Service]:
    log = workdir / "service.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url + ready_path, process, log)
        yield Service(url, process, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextlib.contextmanager
def prometheus(config_file: Path, workdir: Path) -> Iterator[Service]:
    """``prometheus`` with ``config_file`` (rule_files relative to it)."""
    exe = binary("prometheus")
    if exe is None:
        raise RuntimeError("prometheus is not installed (Debian package prometheus; `make system-packages`)")
    port = free_port()
    argv = [
        exe,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
    ]
    with _running(argv, "/-/ready", port, workdir) as service:
        yield service


@contextlib.contextmanager
def alertmanager(config_file: Path, workdir: Path) -> Iterator[Service]:
    """``alertmanager`` (or Debian's ``prometheus-alertmanager``), clustering off."""
    exe = binary("alertmanager", "prometheus-alertmanager")
    if exe is None:
        raise RuntimeError("alertmanager is not installed (Debian package prometheus-alertmanager)")
    port = free_port()
    argv = [
        exe,
        f"--config.file={config_file}",
        f"--storage.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    with _running(argv, "/-/ready", port, workdir) as service:
        yield service
