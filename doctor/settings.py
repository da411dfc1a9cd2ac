"""Settings of ``isrwatch doctor``: those of ``isrwatch run`` (the same flags, env and
config file work: the doctor checks what the job would use), plus what only the doctor needs."""

from __future__ import annotations

from dataclasses import dataclass

from isrwatch.commands import RunSettings
from isrwatch.settings import group, host_ports, http_urls, option, positive

__all__ = ["DoctorSettings", "FORMATS"]

FORMATS = ("table", "json")


@dataclass(frozen=True)
class DoctorSettings:
    run: RunSettings = group(RunSettings)
    watched_bootstrap_servers: str | None = option(
        None,
        "bootstrap servers of the watched cluster, when isrwatch's topics live on another (default: the same)",
        check=host_ports,
        metavar="HOSTS",
    )
    exporter_url: list[str] = option(
        [],
        "base URL of an isrwatch exporter (or job) whose /metrics to check (repeatable)",
        check=http_urls,
        metavar="URL",
    )
    timeout_seconds: float = option(
        5.0, "how long one check waits for an answer (a broker, a partition, a URL)", check=positive
    )
    format: str = option("table", "output: table (for people) or json (for scripts)", choices=FORMATS)

    def validate(self) -> str | None:
        if not self.run.job.bootstrap_servers:
            return "--bootstrap-servers is required (the cluster holding isrwatch's telemetry topic)"
        return None
