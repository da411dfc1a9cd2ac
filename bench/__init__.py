"""Benchmarks of isrwatch (issue 5): scripts that print numbers, not tests.

* ``bench.throughput``: observations/s end to end (real Kafka -> the job) beside
  the in-memory aggregation ceiling, the input ceiling and the naive design;
* ``bench.latency``: publish -> real Alertmanager holds the alert, job path
  beside the rule-based path (real Prometheus over the exporter);
* ``bench.exposure``: exporter scrape time and size against series;
* ``bench.quick`` (``make bench-quick``) and ``bench.all`` (``make bench``).

Every script prints the exact command, the machine and the versions first.
"""

__all__ = ["machine", "load", "kafka", "throughput", "naive", "latency", "exposure", "chart", "quick", "all"]
