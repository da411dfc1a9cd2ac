"""The streaming job (``isrwatch run``): telemetry in, replica states and alerts out.

Modules: ``source_spool`` / ``source_kafka`` (Python data sources), ``source``
(picks one), ``parse`` (validation in Spark SQL), ``state`` (the per-replica
aggregation), ``query`` (the two streaming queries), ``monitor`` (the driver's
per-batch evaluation and alerts), ``checkpoint`` (the alert book beside
Spark's checkpoint), ``outputs`` (state topic, dead letters), ``notify``
(alert sinks), ``session`` (the SparkSession), ``job`` (``main``).
"""

__all__: list[str] = []
