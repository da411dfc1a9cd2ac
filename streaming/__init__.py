"""The streaming job (``isrwatch run``): telemetry in, replica states and alerts out.

One Spark Structured Streaming query (``query``): each micro-batch (``batch``) evaluates the
rule at every observation against the state carried in a state table (``replicas``); the
driver (``monitor``) turns the result into alerts, ``/metrics`` and state records. ``job``
starts and stops it; docs/architecture.md maps every module, docs/streaming.md tells how.
"""

__all__: list[str] = []
