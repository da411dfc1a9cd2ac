"""``isrwatch replay``: recorded telemetry evaluated under other rules and settings.

What would ``replica.lag.time.max.ms=10000`` instead of 30000, or the old message-count rule,
have done to the ISR? The job's own Spark expressions (``streaming.evaluation.replicas``) evaluate the
recording once per setting, in Spark batch mode; ``tally`` counts what each setting would
have done (shrinks, expands, flaps, time out of the ISR, partitions under
``min.insync.replicas``). docs/replay.md tells how; docs/architecture.md maps every module.
"""
