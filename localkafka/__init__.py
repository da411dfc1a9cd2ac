"""A real Kafka 0.9.0.1 cluster on loopback for tests and the demo (``isrwatch local-kafka``).

docs/kafka.md tells how; docs/architecture.md maps every module.
"""

from localkafka.brokerlog import IsrChangeLine, parse_isr_change, read_isr_changes
from localkafka.cluster import COMPAT_CONFIG, LocalKafka
from localkafka.ports import free_port
from localkafka.process import LocalKafkaError, find_libs

__all__ = [
    "COMPAT_CONFIG",
    "IsrChangeLine",
    "LocalKafka",
    "LocalKafkaError",
    "find_libs",
    "free_port",
    "parse_isr_change",
    "read_isr_changes",
]
