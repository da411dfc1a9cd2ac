"""``isrwatch run`` as a real child process, for the end-to-end tests.

The job runs in its own process group (it starts a JVM for Spark); ``stop()``
sends SIGTERM (the job lets its running batch finish and stops Spark), then kills the group if it
does not exit in time. Its stdout is the alert events (one JSON object per
line, from the embedded default's stdout sink), its stderr the logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import requests

__all__ = ["JobProcess", "running_job", "Sample", "parse_metrics"]

Sample = tuple[str, frozenset[tuple[str, str]]]


class JobProcess:
    def __init__(self, args: Sequence[str], workdir: Path, metrics_port: int) -> None:
        self.args = list(args)
        self.workdir = workdir
        self.metrics_port = metrics_port
        self.stdout = workdir / "job.stdout"
        self.stderr = workdir / "job.stderr"
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self) -> JobProcess:
        argv = [sys.executable, "-m", "isrwatch", "run", *self.args, "--metrics-port", str(self.metrics_port)]
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=self.workdir, start_new_session=True
            )
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 90.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the job's process group."""
        if self.proc is None:
            return self.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the JVM, if left behind
        self.returncode = self.proc.wait(timeout=30)
        self.proc = None
        return self.returncode

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        self.returncode = self.proc.wait(timeout=timeout_s)
        return self.returncode

    def log_tail(self, chars: int = 4000) -> str:
        return self.stderr.read_text(errors="replace")[-chars:] if self.stderr.exists() else ""

    def events(self) -> list[dict]:
        """Alert events printed so far (complete lines only)."""
        if not self.stdout.exists():
            return []
        text = self.stdout.read_text(errors="replace")
        lines = text.split("\n")[:-1]  # the last piece may be half written
        return [json.loads(line) for line in lines if line.startswith("{")]

    def metrics(self) -> dict[Sample, float]:
        """One scrape of the job's /metrics; empty while it does not answer."""
        try:
            text = requests.get(self.metrics_url, timeout=5).text
        except requests.RequestException:
            return {}
        return parse_metrics(text)

    def wait_for_metrics(self, timeout_s: float = 180.0) -> None:
        """Until /metrics answers (the job's store is up; Spark may still be starting)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.running():
                raise RuntimeError(f"isrwatch run exited with {self.proc and self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(self.metrics_url, timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"isrwatch run: no /metrics after {timeout_s}s:\n{self.log_tail()}")


def parse_metrics(text: str) -> dict[Sample, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[Sample, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


@contextlib.contextmanager
def running_job(args: Sequence[str], workdir: Path, metrics_port: int) -> Iterator[JobProcess]:
    job = JobProcess(args, workdir, metrics_port).start()
    try:
        yield job
    finally:
        job.stop()
