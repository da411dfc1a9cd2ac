"""The streaming job (``isrwatch run``): telemetry in, replica states and alerts out.

A micro-batch's path, in one direction: its records come from ``sources``; Spark computes
what the driver needs in ``evaluation`` (the records parsed, the rule at every observation
against the state carried in); the ``driver`` turns those rows into alerts, ``/metrics`` and
the lookahead between batches; ``sinks`` write isrwatch's topics. The ``lifecycle`` wires
them: the job started and stopped, its one query and the work per micro-batch
(``streaming.lifecycle.handler``). Loggers keep the names they had before the subpackages
(`streaming.job`, `streaming.monitor`, ...): operators' log filters use them.
docs/architecture.md maps every module, docs/streaming.md tells how.
"""

__all__: list[str] = []
