"""Where a micro-batch's records come from: the telemetry topic (``source_kafka``, planned on the
driver, read by ``range_read`` tasks) or the embedded simulator's spool (``source_spool``, fed by
``feeder``); ``source`` picks one. docs/architecture.md maps every module."""
