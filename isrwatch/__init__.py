"""isrwatch: warns before Kafka drops a follower replica from the ISR.

This package is the core every component uses, with no Spark in it:
the broker's ISR rule (``rule``), a replica's status (``status``), alerts (``alerts``), the
telemetry format (``telemetry``), settings (``settings``) and the command line
(``cli``). The components are the top-level packages collector/, streaming/, exporter/,
simulator/ and the rest; docs/architecture.md maps every module.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
