"""One Alertmanager with its own temporary storage and a receiver that drops
everything: what isrwatch sends is read back through its API.

``stop()`` and ``start()`` again on the same port (a fault); ``web_config`` for TLS
and basic auth; ``alerts()`` reads back what Alertmanager holds (GET /api/v2/alerts).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from localkafka import free_port
from localservices.launch import binary

__all__ = ["Alertmanager", "alertmanager_binary"]

_CONFIG = """\
route:
  receiver: "null"
  group_wait: 1h
receivers:
  - name: "null"
"""


def alertmanager_binary() -> str | None:
    return binary("alertmanager", "prometheus-alertmanager")


class Alertmanager:
    """One Alertmanager process with its own temp storage and config."""

    def __init__(self, web_config: str | None = None, ca_file: str | None = None, auth: tuple[str, str] | None = None):
        binary = alertmanager_binary()
        if binary is None:
            raise RuntimeError("Alertmanager is not installed (Debian package prometheus-alertmanager)")
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="isrwatch-am-"))
        self.port = free_port()
        (self.dir / "alertmanager.yml").write_text(_CONFIG)
        self.web_config = web_config
        self.scheme = "https" if ca_file else "http"
        self.verify: str | bool = ca_file or True
        self.auth = auth
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> Alertmanager:
        args = [
            self.binary,
            f"--config.file={self.dir / 'alertmanager.yml'}",
            f"--storage.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # no gossip: a lone instance
            "--log.level=warn",
        ]
        if self.web_config:
            args.append(f"--web.config.file={self.web_config}")
        log = open(self.dir / "alertmanager.log", "ab")  # noqa: SIM115 (owned by the process)
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Alertmanager exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                r = requests.get(f"{self.url}/-/ready", timeout=1, verify=self.verify, auth=self.auth)
                if r.status_code == 200:
                    return self
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Alertmanager not ready after {timeout_s}s: {self.log_tail()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Alertmanager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (self.dir / "alertmanager.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """Active alerts (GET /api/v2/alerts); ``filters`` are label matchers."""
        params = [("filter", f'{k}="{v}"') for k, v in filters.items()]
        r = requests.get(f"{self.url}/api/v2/alerts", params=params, timeout=5, verify=self.verify, auth=self.auth)
        r.raise_for_status()
        return list(r.json())

    def wait_for(self, predicate: Any, timeout_s: float = 30.0, **filters: str) -> list[dict[str, Any]]:
        """Poll ``alerts(**filters)`` until ``predicate(alerts)`` holds; the
        last answer either way (the test asserts on it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.alerts(**filters)
            if predicate(got) or time.monotonic() > deadline:
                return got
            time.sleep(0.2)
