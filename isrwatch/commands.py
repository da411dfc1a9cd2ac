"""Commands whose settings span components, composed here at the CLI.

``isrwatch run`` is the streaming job (``streaming.settings.JobSettings``), where
its alerts go (``streaming.settings.AlertingSettings``), which series its own
/metrics serves (``exporter.settings.SeriesSettings``, the exporter's options)
and, when it is given no telemetry source, the embedded simulator
(``simulator.settings.EmbeddedSimulatorSettings``). Each component declares and
checks its own options; what only makes sense across them is checked here. The
flags, environment variables and config file keys stay flat: ``--replica-series``,
not ``--series-replica-series``.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.settings import SeriesSettings
from isrwatch.settings import group
from simulator.settings import EmbeddedSimulatorSettings
from streaming.settings import AlertingSettings, JobSettings

__all__ = ["RunSettings", "run"]


@dataclass(frozen=True)
class RunSettings:
    simulator: EmbeddedSimulatorSettings = group(EmbeddedSimulatorSettings)
    job: JobSettings = group(JobSettings)
    series: SeriesSettings = group(SeriesSettings)
    alerting: AlertingSettings = group(AlertingSettings)

    def validate(self) -> str | None:
        if self.simulator.simulate and self.job.bootstrap_servers:
            return "--simulate and --bootstrap-servers exclude each other: pick the embedded simulator or a cluster"
        if self.simulator.simulate and self.job.spool_dir:
            return "--spool-dir and --simulate exclude each other: pick one telemetry source"
        return None


def run(settings: RunSettings) -> int:
    """``isrwatch run``: the job, given each component's settings."""
    from streaming.lifecycle.job import run as run_job

    return run_job(settings.job, alerting=settings.alerting, series=settings.series, simulator=settings.simulator)
