"""A real Spark standalone cluster on loopback (the demo and the scale-out tests).

docs/scaling.md tells how; docs/architecture.md maps every module.
"""

from localspark.cluster import LocalSpark, LocalSparkError, spark_home

__all__ = ["LocalSpark", "LocalSparkError", "spark_home"]
