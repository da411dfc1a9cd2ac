"""``isrwatch simulate``: run a scenario and write its telemetry and truth."""

from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import ExitStack

from isrwatch.exceptions import ConfigError
from isrwatch.logs import kv
from isrwatch.settings import kafka_config_pairs
from simulator.run import Pacer, Simulation
from simulator.settings import SimulateSettings
from simulator.sinks import KafkaSink, SpoolSink, StreamSink, TelemetrySink
from simulator.truth import write_truth

__all__ = ["main", "PROGRESS_EVERY_S"]

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 10.0


def _sink(settings: SimulateSettings) -> TelemetrySink:
    if settings.spool_dir:
        return SpoolSink(settings.spool_dir)
    if settings.bootstrap_servers:
        return KafkaSink(
            settings.bootstrap_servers,
            settings.telemetry_topic,
            settings.cluster,
            kafka_config_pairs(settings.kafka_config),
        )
    return StreamSink()


def main(settings: SimulateSettings) -> int:
    sim = _simulation(settings)  # bad sizes fail before any output is opened
    try:
        return _simulate(settings, sim, _sink(settings))
    except BrokenPipeError:  # stdout closed early (``| head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _simulation(settings: SimulateSettings) -> Simulation:
    try:
        return Simulation(
            settings.scenario,
            seed=settings.seed,
            lag_time_max_ms=settings.lag_time_max_ms,
            cluster=settings.cluster,
            interval_ms=settings.interval_ms,
            mode=settings.mode,
            rule=settings.rule,
            lag_max_messages=settings.lag_max_messages,
            brokers=settings.brokers,
            topics=settings.topics,
            partitions=settings.partitions,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _simulate(settings: SimulateSettings, sim: Simulation, sink: TelemetrySink) -> int:
    log.info(
        "simulating %s",
        kv(
            scenario=sim.scenario.name,
            seed=settings.seed,
            speed=settings.speed,
            mode=sim.mode,
            partitions=len(sim.engine.partitions),
            duration_s=settings.duration,
        ),
    )
    log.info("scenario %s", kv(name=sim.scenario.name, what=repr(sim.scenario.description)))
    pacer = Pacer(sim.start_ms, settings.speed)
    written = 0
    last_log = time.monotonic()
    with ExitStack() as stack:
        stack.callback(sink.close)
        truth = stack.enter_context(open(settings.truth_file, "w")) if settings.truth_file else None
        for t, records in sim.rounds(settings.duration):
            pacer.wait_for(t)
            sink.write(records)
            new = sim.truth[written:]
            written = len(sim.truth)
            if truth is not None:
                write_truth(truth, new)
            for c in new:
                log.info(
                    "isr %s",
                    kv(
                        change=c.change,
                        cause=c.cause,
                        topic=c.topic,
                        partition=c.partition,
                        brokers=list(c.brokers),
                        isr=list(c.isr_after),
                        sim_s=(c.t_ms - sim.start_ms) / 1000,
                    ),
                )
            if time.monotonic() - last_log >= PROGRESS_EVERY_S:
                last_log = time.monotonic()
                log.info(
                    "progress %s",
                    kv(sim_s=(t - sim.start_ms) / 1000, records=sim.records, observations=sim.observations),
                )
    log.info(
        "done %s",
        kv(scenario=sim.scenario.name, records=sim.records, observations=sim.observations, isr_changes=len(sim.truth)),
    )
    return 0
