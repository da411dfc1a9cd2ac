"""The simulator: one simulated Kafka cluster, with the broker's own ISR bookkeeping.

Leaders, followers (one replica fetcher per broker pair), a producer and the
controller run in one discrete-event model (``model``) whose leaders apply
``isrwatch.rule``. It emits telemetry in the collector's format (or one
observation per fetch) and records every true ISR change (``truth``). It is the
embedded default source of ``isrwatch run`` and the benchmark load. docs/simulator.md
tells how; docs/architecture.md maps every module.
"""

from simulator.cluster import ClusterSpec
from simulator.profiles import ProduceProfile
from simulator.run import Simulation, feed_spool, iter_records
from simulator.scenarios import Scenario, build_scenario
from simulator.settings import MODES, SCENARIOS
from simulator.truth import TrueChange, read_truth, write_truth

__all__ = [
    "SCENARIOS",
    "MODES",
    "ClusterSpec",
    "ProduceProfile",
    "Scenario",
    "Simulation",
    "TrueChange",
    "build_scenario",
    "feed_spool",
    "iter_records",
    "read_truth",
    "write_truth",
]
