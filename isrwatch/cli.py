"""The ``isrwatch`` command: one subcommand per component.

Each component declares its settings dataclass in ``<component>/settings.py``
(cheap to import, so ``--help`` is instant) and its entry point
``main(settings) -> int`` elsewhere (imported only when that command runs).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from isrwatch import __version__
from isrwatch.exceptions import IsrwatchError
from isrwatch.logs import setup_logging
from isrwatch.settings import add_options, load

__all__ = ["COMMANDS", "main", "build_parser"]

# name -> (one-line help, settings class, entry point)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": (
        "run the streaming job (embedded simulator by default, or a real cluster's telemetry topic)",
        "isrwatch.commands:RunSettings",
        "isrwatch.commands:run",
    ),
    "collect": (
        "poll a real Kafka cluster for replica offsets and publish telemetry",
        "collector.settings:CollectSettings",
        "collector.main:main",
    ),
    "exporter": (
        "serve Prometheus gauges from the replica state topic",
        "exporter.settings:ExporterSettings",
        "exporter.main:main",
    ),
    "doctor": (
        "check the whole path (brokers, isrwatch's topics, telemetry, checkpoint, Alertmanager, exporter)",
        "doctor.settings:DoctorSettings",
        "doctor.main:main",
    ),
    "simulate": (
        "run a simulated cluster and write its telemetry (to Kafka, a spool directory or stdout)",
        "simulator.settings:SimulateSettings",
        "simulator.main:main",
    ),
    "replay": (
        "evaluate recorded telemetry under other rules and replica.lag.time.max.ms values (what-if)",
        "replay.settings:ReplaySettings",
        "replay.main:main",
    ),
    "local-kafka": (
        "start a real 3-broker Kafka 0.9 cluster + ZooKeeper on loopback (demo and tests)",
        "localkafka.settings:LocalKafkaSettings",
        "localkafka.main:main",
    ),
    "local-spark": (
        "start a real Spark standalone cluster (master and workers) on loopback (demo and tests)",
        "localspark.settings:LocalSparkSettings",
        "localspark.main:main",
    ),
}


def _resolve(path: str) -> object:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="isrwatch",
        description="Warns before Kafka drops a follower from the ISR (KIP-16 rule, recomputed live).",
    )
    parser.add_argument("--version", action="version", version=f"isrwatch {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (text, settings_path, _) in COMMANDS.items():
        p = sub.add_parser(name, help=text, description=text)
        add_options(p, _resolve(settings_path))  # type: ignore[arg-type]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    setup_logging(args.log_level)
    _, settings_path, entry = COMMANDS[args.command]
    try:
        settings: object = load(_resolve(settings_path), args)  # type: ignore[arg-type]
        return int(_resolve(entry)(settings) or 0)  # type: ignore[operator]
    except IsrwatchError as e:
        print(f"isrwatch {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
