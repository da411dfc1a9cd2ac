"""Issue 14, item 2, the other two processes: the collector and the exporter each killed with
``kill -9`` twenty times (``ISRWATCH_KILLS``) while the job runs, each started again at once.

Real 3-broker Kafka 0.9 under produce load, the README's deployment: isrwatch's topics on the
watched cluster, placed by Kafka (so the paused broker leads some of them), ``isrwatch
collect``, ``isrwatch run`` and ``isrwatch exporter`` as processes. Each round, at a seeded
random moment (``ISRWATCH_KILL_SEED``) 1-6 s after the collector's last start, the collector
is SIGKILLed (mid-round, mid-publish or between rounds) and started again; then the exporter
is SIGKILLed and started again on the same port, and the test notes how long the new one takes
to serve every follower of the watched topic in the state the job's own /metrics shows. From
round 4 a follower broker is paused, and resumed from round 11 once its leaders have dropped
it, so that collectors start while a broker hangs and alerts start and resolve across the
kills; the exporter is not killed while it hangs (it leads state partitions, which a new
exporter reads only once it answers), so the rounds go on until each process has had its kills.

Figures (``kill_others.json``; goals in tools/reliability_table.py):

* observations lost or counted twice: the job's state per replica against the telemetry topic
  (a collector killed mid-publish leaves nothing half-written for the job);
* dead letters (a restarted collector's first records, with no previous round to refer to,
  must still be valid);
* replica alerts for any follower but the paused one: the collector's restarts are gaps in
  the telemetry, never a follower's fault;
* transitions repeated, alerts left firing;
* the exporter's time from its restart to serving every state again, against the shipped
  Prometheus scrape interval (deploy/prometheus/prometheus.yml): gauges back within a scrape.

``IsrwatchTelemetryStale`` episodes are recorded, not judged: a collector that takes longer
than ``--stale-after-seconds`` to start again (a hung broker) is a real gap, which the job
reports as its own.

A campaign (``make reliability``, ``make campaign``): about 20 s a round.
"""

from __future__ import annotations

import os
import random
import statistics
import time

import pytest

from isrwatch.alerts import AlertName
from tests.e2e.accounting import drain_and_count
from tests.e2e.gauges import GaugeWatch
from tests.e2e.kafka_io import ProduceLoad, read_topic
from tests.e2e.pipeline import LAG_MS, ZK_SESSION_MS, Pipeline, until
from tests.e2e.results import Shrinks, print_figures, repeated_transitions, write_result
from tools.reliability_table import SCRAPE_S

pytestmark = pytest.mark.reliability

KILLS = int(os.environ.get("ISRWATCH_KILLS", "20"))
SEED = int(os.environ.get("ISRWATCH_KILL_SEED", "14"))
PAUSED = 3
PAUSE_FROM, PAUSE_UNTIL = 4, 11  # rounds; the resume waits for the leaders' drops
# a kill lands this long (seconds, uniform) after the collector's start: it takes about a
# second to connect and publish its first round, then one a round (0.5 s)
KILL_AFTER_S = (1.0, 6.0)
SERVE_LIMIT_S = 120.0  # a stuck exporter, not a timing


def _serving_again(watch: GaugeWatch, pipe: Pipeline) -> float:
    """Seconds until the exporter serves every follower of the topic, each in the job's state."""
    started = time.monotonic()

    def agree() -> bool:
        job = watch.states("job")
        return bool(job) and watch.states("exporter") == job

    until("the restarted exporter to serve every state again", agree, SERVE_LIMIT_S, pipe)
    return time.monotonic() - started


@pytest.mark.campaign
@pytest.mark.timeout(900 + KILLS * 200)
def test_the_collector_and_the_exporter_killed_twenty_times_lose_and_alert_nothing(
    kafka_cluster_factory, tmp_path, spark_reader
):
    started = time.monotonic()
    rng = random.Random(SEED)
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    topic = "ledger"
    # The watched topic pinned so that the paused broker follows both partitions (the fault
    # needs a follower to drop); isrwatch's own topics are placed by Kafka.
    cluster.create_topic(topic, assignment=[[1, 2, 3], [2, 1, 3]])
    rounds = []
    counts = {"collector": 0, "exporter": 0}
    paused_at = resumed_at = None
    with ProduceLoad(cluster, topic, 2, rate=200), Pipeline(cluster, tmp_path) as pipe:
        pipe.wait_watching(4)
        port = pipe.start_exporter()
        watch = GaugeWatch(
            topic, f"http://127.0.0.1:{pipe.metrics_port}/metrics", f"http://127.0.0.1:{port}/metrics", ""
        )
        _serving_again(watch, pipe)
        try:
            n = 0
            while min(counts.values()) < KILLS:
                n += 1
                if n == PAUSE_FROM:
                    cluster.pause(PAUSED)
                    paused_at = time.time()
                if n >= PAUSE_UNTIL and paused_at is not None and resumed_at is None:
                    shrinks = Shrinks.read(cluster, topic, paused_at)
                    dropped = all(shrinks.first(p, PAUSED) is not None for p in (0, 1))
                    if dropped or time.time() - paused_at > 4 * LAG_MS / 1000:  # (a leader stuck: resume anyway)
                        cluster.resume(PAUSED)
                        resumed_at = time.time()
                delay = rng.uniform(*KILL_AFTER_S)
                time.sleep(delay)
                assert pipe.collector is not None
                pipe.collector.kill()
                pipe.start_collector()
                counts["collector"] += 1
                served_s = None
                # Not while the broker hangs: it leads some of the state topic's partitions, and
                # an exporter reads those only once it answers (docs/reliability.md).
                if paused_at is None or resumed_at is not None:
                    pipe.restart_exporter()
                    served_s = _serving_again(watch, pipe)
                    counts["exporter"] += 1
                rounds.append({"round": n, "collector_killed_after_s": round(delay, 2), "exporter_served_s": served_s})
                pipe.check_alive(f"round {n}")
        finally:
            if paused_at is not None and resumed_at is None:
                cluster.resume(PAUSED)
                resumed_at = time.time()

        def settled() -> bool:
            last = {e.identity: e.status for e in pipe.alerts() if e.replica[2] >= 0}
            return bool(last) and set(last.values()) == {"resolved"}

        until("every replica alert resolved", settled, 300, pipe)
        letters = read_topic(cluster, pipe.deadletter_topic)
        high, expected, got = drain_and_count(cluster, pipe, spark_reader)

    alerts = pipe.alerts()
    replica_alerts = [e for e in alerts if e.replica[2] >= 0]
    elsewhere = sorted({str(e.identity) for e in replica_alerts if e.replica != (topic, e.replica[1], PAUSED)})
    stale = [e for e in alerts if e.name == AlertName.TELEMETRY_STALE.value and e.status == "firing"]
    left_firing = sorted(str(i) for i, s in {e.identity: e.status for e in alerts}.items() if s != "resolved")
    served = [r["exporter_served_s"] for r in rounds if r["exporter_served_s"] is not None]
    figures = {
        "collector_kills": counts["collector"],
        "exporter_kills": counts["exporter"],
        "telemetry_records": high,
        "observations_on_topic": sum(expected.values()),
        "observations_lost": sum(max(0, expected[k] - got.get(k, 0)) for k in expected),
        "observations_counted_twice": sum(max(0, got[k] - expected.get(k, 0)) for k in got),
        "dead_letters": len(letters),
        "replica_alerts_not_of_the_paused_follower": len(elsewhere),
        "paused_follower_alerts": len({e.identity for e in replica_alerts}),
        "transitions_repeated": len(repeated_transitions(alerts)),
        "alerts_left_firing": len(left_firing),
        "stale_episodes": len(stale),
        "exporter_served_again_max_s": round(max(served), 2) if served else None,
        "exporter_served_again_median_s": round(statistics.median(served), 2) if served else None,
        "scrape_interval_s": SCRAPE_S,
        "campaign_s": round(time.monotonic() - started),
    }
    print_figures(f"collector and exporter kill -9 campaign (seed {SEED})", figures)
    write_result(
        "kill_others",
        {
            **figures,
            "seed": SEED,
            "paused": [paused_at, resumed_at],
            "rounds": rounds,
            "alerts_not_of_the_paused_follower": elsewhere,
            "alerts": [[e.arrived, e.body] for e in alerts],
        },
    )
    assert figures["paused_follower_alerts"] > 0, "the paused follower was never announced: no alert exercised"
    assert not elsewhere, f"replica alerts from the collector's gaps: {elsewhere}"
    assert not letters, f"{len(letters)} dead letters: {letters[:3]}"
    assert figures["observations_lost"] == 0 and figures["observations_counted_twice"] == 0, figures
    assert figures["transitions_repeated"] == 0, repeated_transitions(alerts)
    assert not left_firing, f"alerts never resolved: {left_firing}"
    assert max(served) <= SCRAPE_S, f"the exporter took more than a scrape ({SCRAPE_S} s) to serve again: {served}"
