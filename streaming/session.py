"""The job's SparkSession: local mode, loopback only, RocksDB state (changelog checkpointing), quiet logs."""

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

__all__ = ["ROCKSDB_PROVIDER", "build_session"]

log = logging.getLogger(__name__)

_LOG4J = Path(__file__).with_name("log4j2.properties").as_uri()

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise IsrwatchError("Java not found: Spark needs Java 17 (install openjdk-17-jre-headless, or set JAVA_HOME)")


def build_session(
    master: str = "local[2]", shuffle_partitions: int = 2, app_name: str = "isrwatch", scratch_dir: str | None = None
) -> SparkSession:
    """Create (or reuse) the SparkSession the job runs on.

    ``scratch_dir``: the JVM's temp directory and Spark's local directories (default:
    the temp directory, ``TMPDIR`` honoured).

    Python workers run on this interpreter (the virtualenv's), Spark binds to
    loopback, its UI is off and its own log4j output is held at WARN so the
    user sees isrwatch's progress lines rather than Spark's.
    """
    _check_java()
    scratch = scratch_dir or tempfile.gettempdir()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    try:
        spark = (
            SparkSession.builder.master(master)
            .appName(app_name)
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
            .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
            # Each commit writes the batch's changes, not a new RocksDB checkpoint of
            # the whole store: ~10% more throughput end to end (docs/benchmarks.md).
            .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.adaptive.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            # The Python side's socket timeout with the JVM (15 s by default): on a busy machine
            # (load 15-26 on 2 cores, measured) an always-on job waits longer rather than fail.
            # (The JVM's own wait for a new Python worker, 10 s, is not configurable.)
            .config("spark.python.authenticate.socketTimeout", "120s")
            .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
            # Spark's scratch directories (spark.local.dir defaults to the JVM's temp directory)
            # follow TMPDIR like everything else of isrwatch's (the JVM's own default is /tmp
            # whatever TMPDIR says).
            .config(
                "spark.driver.extraJavaOptions",
                f"-Dlog4j2.configurationFile={_LOG4J} -Djava.io.tmpdir={scratch}",
            )
            .getOrCreate()
        )
    except Exception as e:  # the JVM did not start: say so in one line
        raise IsrwatchError(f"Spark did not start ({master}): {str(e).splitlines()[0] if str(e) else e!r}") from e
    spark.sparkContext.setLogLevel("WARN")
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    from streaming import source_spool

    source_spool.register(spark)
    log.info("spark started master=%s shuffle_partitions=%s version=%s", master, shuffle_partitions, spark.version)
    return spark
