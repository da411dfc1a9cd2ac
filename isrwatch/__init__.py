"""isrwatch: warns before Kafka drops a follower replica from the ISR.

The shared core: the KIP-16 rule (``rule``), the telemetry format
(``telemetry``), replica evaluation (``status``), alerts (``alerts``) and
settings. Components live in the top-level packages ``collector``,
``streaming``, ``exporter``, ``simulator`` and ``localkafka``.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
