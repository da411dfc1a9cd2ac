"""``isrwatch local-kafka``: a real Kafka 0.9 cluster on loopback until Ctrl-C."""

from __future__ import annotations

import sys

from isrwatch.signals import StopSignals
from localkafka.cluster import COMPAT_CONFIG, LocalKafka
from localkafka.settings import LocalKafkaSettings

__all__ = ["main"]


def main(settings: LocalKafkaSettings) -> int:
    with StopSignals(name="local-kafka") as stop:
        cluster = LocalKafka(
            brokers=settings.brokers,
            broker_settings={
                "replica.lag.time.max.ms": settings.lag_time_max_ms,
                "zookeeper.session.timeout.ms": settings.zookeeper_session_timeout_ms,
            },
            data_dir=settings.data_dir,
        )
        with cluster:
            flags = " ".join(f"--kafka-config {k}={v}" for k, v in COMPAT_CONFIG.items())
            servers = cluster.bootstrap_servers
            jmx = " ".join(cluster.jmx_flags())
            print(
                f"Kafka 0.9.0.1 is up: {len(cluster.broker_ids)} brokers, ZooKeeper {cluster.zookeeper_connect}\n"
                f"  bootstrap servers: {servers}\n"
                f"  broker logs:       {cluster.dir}/broker-*/server.log\n"
                f"  broker JMX:        {', '.join(f'{b}={cluster.jmx_address(b)}' for b in cluster.broker_ids)}\n"
                f"  collector: isrwatch collect --bootstrap-servers {servers} "
                f"--lag-time-max-ms {settings.lag_time_max_ms} {flags}\n"
                f"  collector over JMX: isrwatch collect --source jmx {jmx} --bootstrap-servers {servers} "
                f"--lag-time-max-ms {settings.lag_time_max_ms} {flags}\n"
                f"  job:       isrwatch run --bootstrap-servers {servers} {flags}\n"
                f"  exporter:  isrwatch exporter --bootstrap-servers {servers} {flags}\n"
                "Ctrl-C stops it.",
                flush=True,
            )
            try:
                while not stop.wait(1.0):
                    if not all(cluster.running(b) for b in cluster.broker_ids):
                        down = [b for b in cluster.broker_ids if not cluster.running(b)]
                        print(f"broker(s) {down} exited; see {cluster.dir}", file=sys.stderr)
                        return 1
            except KeyboardInterrupt:
                pass
        return 0
