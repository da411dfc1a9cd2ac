"""The embedded default's simulated cluster: a thread appending its telemetry to the
spool the job reads (``simulator.run.feed_spool``). The job's only tie to the simulator."""

from __future__ import annotations

import logging
import threading
from typing import IO

from isrwatch.rule import RuleConfig
from simulator.settings import EmbeddedSimulatorSettings

__all__ = ["Feeder", "DEFAULT_SCENARIO", "embedded_simulator"]

log = logging.getLogger("streaming.feeder")

DEFAULT_SCENARIO = "stuck-follower"


def embedded_simulator(settings: EmbeddedSimulatorSettings | None) -> EmbeddedSimulatorSettings:
    """The embedded simulator's settings, its defaults when the job was given none."""
    return settings or EmbeddedSimulatorSettings()


class Feeder(threading.Thread):
    """The embedded simulator, appending telemetry to the spool."""

    def __init__(
        self, settings: EmbeddedSimulatorSettings, cfg: RuleConfig, spool: str, truth_file: IO[str] | None
    ) -> None:
        super().__init__(name="isrwatch-simulator", daemon=True)
        self.settings = settings
        self.cfg = cfg
        self.spool = spool
        self.truth_file = truth_file
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from simulator.run import feed_spool

        try:
            feed_spool(
                self.spool,
                self.settings.simulate or DEFAULT_SCENARIO,
                self.settings.speed,
                seed=self.settings.seed,
                lag_time_max_ms=self.cfg.lag_time_max_ms,
                cluster=self.settings.cluster,
                stop_event=self.stop_event,
                truth_file=self.truth_file,
                rule=self.cfg.rule,
                lag_max_messages=self.cfg.lag_max_messages,
            )
        except BaseException as e:  # reported by the job's loop
            self.error = e
            log.exception("simulator_failed")

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)
