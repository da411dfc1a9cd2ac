"""The job's SparkSession: loopback only in local mode, RocksDB state (changelog
checkpointing), quiet logs; on a cluster master (``spark://``, ``yarn``, ``k8s://``)
its UI on and its executors sized and logging like the driver."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from isrwatch.exceptions import IsrwatchError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ROCKSDB_PROVIDER", "SPARK_LOG_LEVEL", "build_session", "spark_conf_pairs", "is_local"]

log = logging.getLogger("streaming.session")

_LOG4J = Path(__file__).with_name("log4j2.properties").as_uri()

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Spark's own log level in every session build_session makes.
SPARK_LOG_LEVEL = "WARN"


def _check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise IsrwatchError("Java not found: Spark needs Java 17 (install openjdk-17-jre-headless, or set JAVA_HOME)")


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def spark_conf_pairs(items: list[str]) -> dict[str, str]:
    """``--spark-conf KEY=VALUE`` items (checked by ``streaming.settings``) as a dict."""
    return {key.strip(): value for key, _, value in (item.partition("=") for item in items)}


def _on_loopback(master: str) -> bool:
    host = master.split("://", 1)[-1].split(":", 1)[0].split(",", 1)[0]
    return host in ("127.0.0.1", "localhost", "[::1]")


def build_session(
    master: str = "local[2]",
    shuffle_partitions: int = 2,
    app_name: str = "isrwatch",
    scratch_dir: str | None = None,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """Create (or reuse) the SparkSession the job runs on.

    ``scratch_dir``: the JVM's temp directory and Spark's local directories (default:
    the temp directory, ``TMPDIR`` honoured). ``conf``: the user's Spark properties,
    applied last.

    Python workers run on this interpreter (the virtualenv's; on a cluster the same path
    must hold the same environment on every worker), the driver binds to loopback in
    local mode, Spark's own log4j output is held at WARN so the user sees isrwatch's
    progress lines rather than Spark's. The UI is off in local mode and on with a cluster
    (where it is how an operator sees executors and tasks).
    """
    _check_java()
    scratch = scratch_dir or tempfile.gettempdir()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if is_local(master) or _on_loopback(master):
        # a master on this machine's loopback: the driver (which executors call back) too
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    local = is_local(master)
    java_options = f"-Dlog4j2.configurationFile={_LOG4J} -Djava.io.tmpdir={scratch}"
    settings: dict[str, str] = {
        "spark.ui.enabled": "false" if local else "true",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        # Each commit writes the batch's changes, not a new RocksDB checkpoint of
        # the whole store: ~10% more throughput end to end (docs/benchmarks.md).
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.adaptive.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # The Python side's socket timeout with the JVM (15 s by default): on a busy machine
        # (load 15-26 on 2 cores, measured) an always-on job waits longer rather than fail.
        # (The JVM's own wait for a new Python worker, 10 s, is not configurable.)
        "spark.python.authenticate.socketTimeout": "120s",
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        # Spark's scratch directories (spark.local.dir defaults to the JVM's temp directory)
        # follow TMPDIR like everything else of isrwatch's (the JVM's own default is /tmp
        # whatever TMPDIR says).
        "spark.driver.extraJavaOptions": java_options,
    }
    if local or _on_loopback(master):
        settings.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    if not local:
        # Executors log like the driver; one core each, so a task per telemetry partition
        # spreads over the workers (more with --spark-conf spark.executor.cores=N).
        settings.update(
            {
                "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile={_LOG4J}",
                "spark.executor.cores": "1",
                "spark.executor.memory": "1g",
            }
        )
    settings.update(conf or {})
    try:
        builder = SparkSession.builder.master(master).appName(app_name)
        for key, value in settings.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
    except Exception as e:  # the JVM did not start: say so in one line
        raise IsrwatchError(f"Spark did not start ({master}): {str(e).splitlines()[0] if str(e) else e!r}") from e
    spark.sparkContext.setLogLevel(SPARK_LOG_LEVEL)
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))

    from streaming.sources import source_spool

    source_spool.register(spark)
    log.info("spark started master=%s shuffle_partitions=%s version=%s", master, shuffle_partitions, spark.version)
    return spark
