"""Real Prometheus and Alertmanager (Debian packages) on loopback, for the tests, the
tools and the benchmarks (as localkafka/ is for Kafka); docs/architecture.md maps every module.

* ``prometheus(config_file, workdir)`` / ``alertmanager(config_file, workdir)``: a
  service from a configuration file, as a context manager yielding its URL and log;
* ``Alertmanager``: one Alertmanager that drops what it receives and answers what it
  holds, started and stopped at will (a fault).
"""

from localservices.alertmanager import Alertmanager, alertmanager_binary
from localservices.launch import Service, alertmanager, binary, prometheus

__all__ = ["Alertmanager", "Service", "alertmanager", "alertmanager_binary", "binary", "prometheus"]
