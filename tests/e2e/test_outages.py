"""Issue 14, item 3: the telemetry cluster unreachable for two minutes; Alertmanager down
for five minutes while a follower's fault raises and resolves alerts.

Real parts: a watched 3-broker Kafka 0.9 cluster under produce load, nothing wrong with
it; isrwatch's own topics on a separate one-broker telemetry cluster (the recommended
layout, docs/deploy.md); the real collector and job as processes. The telemetry broker
is paused (SIGSTOP: it neither answers nor refuses, the harder case) for two minutes.

* both processes keep running through it (the collector's producer queues and re-sends,
  the job's source plans nothing from a leader that does not answer);
* the job raises ``IsrwatchTelemetryStale`` exactly once, during the outage, and it
  resolves after the broker is back;
* no replica alert, during or after: the gap in telemetry is not lag (docs/rule.md);
* afterwards the job catches up: its micro-batches again hold telemetry from after
  the outage, and it evaluates every follower of the watched topic again.

Alertmanager down (its process stopped) for five minutes, the job running, a follower broker
paused during it until the leaders drop it and then resumed, and the job killed (``kill -9``)
and restarted during it: every transition the job wrote to its alerts topic reaches
Alertmanager after it returns, in order per alert, none twice (what reached Alertmanager is
recorded by a forwarder in front of it, ``tests.support.http_recorder``).

Minutes of outage make these a campaign (``make reliability``, ``make campaign``).
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from typing import Any

import pytest

from isrwatch.alerts import AlertName
from localservices import Alertmanager
from tests.e2e.kafka_io import ProduceLoad, read_topic
from tests.e2e.pipeline import LAG_MS, ZK_SESSION_MS, Pipeline, until
from tests.e2e.results import Shrinks, print_figures, stale_episodes, stale_firing, write_result
from tests.support.http_recorder import HttpRecorder, Post

# A campaign: the telemetry cluster down 2 min, Alertmanager down 5 min.
pytestmark = [pytest.mark.slow, pytest.mark.campaign, pytest.mark.reliability]

OUTAGE_S = 120.0
AFTER_S = 40.0
TOPIC = "outage"
# every broker leads one partition and follows two: six follower replicas
ASSIGNMENT = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
FOLLOWERS = 6
STALE = AlertName.TELEMETRY_STALE.value
_BATCH = re.compile(r"\bbatch batch_id=(\d+) .*\btelemetry_lag_s=([\d.]+)")


def _batches(pipe: Pipeline) -> list[tuple[float, int, float]]:
    """(wall time read, batch id, telemetry lag) of every batch line so far: the log's own
    timestamps are the job's clock, so the wall time is taken from the line's prefix."""
    out = []
    for line in pipe.job_log().splitlines():
        m = _BATCH.search(line)
        if m:
            stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
            out.append((stamp, int(m.group(1)), float(m.group(2))))
    return out


def test_the_telemetry_cluster_unreachable_for_two_minutes(kafka_cluster_factory, tmp_path):
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    # The telemetry broker's ZooKeeper session outlives the pause, as a real broker's would
    # across a network partition shorter than its session: a session that expired would
    # make the broker re-register, which is not the fault measured here.
    telemetry = kafka_cluster_factory(brokers=1, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    cluster.create_topic(TOPIC, assignment=ASSIGNMENT)
    with (
        ProduceLoad(cluster, TOPIC, len(ASSIGNMENT), rate=200),
        Pipeline(cluster, tmp_path, telemetry_cluster=telemetry) as pipe,
    ):
        pipe.wait_watching(FOLLOWERS)
        until("no IsrwatchTelemetryStale firing before the outage", lambda: stale_firing(pipe) is None, 120, pipe)
        assert not [e for e in pipe.alerts() if "broker_id" in e.labels], "no replica alert before the outage"
        before = len(stale_episodes(pipe.alerts(STALE)))
        down_at = time.time()
        telemetry.pause(1)
        try:
            until("the end of the outage", lambda: time.time() >= down_at + OUTAGE_S, OUTAGE_S + 30, pipe)
        finally:
            telemetry.resume(1)
        up_at = time.time()
        until("IsrwatchTelemetryStale to resolve", lambda: stale_firing(pipe) is None, 180, pipe)

        def caught_up() -> bool:
            # a batch that started after the outage and holds telemetry from after it
            return any(t > up_at and t - lag > up_at for t, _, lag in _batches(pipe))

        until("a batch of telemetry from after the outage", caught_up, 180, pipe)
        until(f"{AFTER_S:.0f}s after the outage", lambda: time.time() >= up_at + AFTER_S, AFTER_S + 60, pipe)
        for what in ("collector", "job"):
            pipe.check_alive(f"the {what} through the outage")
        events = pipe.alerts()
        batches = _batches(pipe)
        collector_log = pipe.collector.log() if pipe.collector is not None else ""

    episodes = stale_episodes(events)[before:]
    replica_alerts = [e for e in events if "broker_id" in e.labels]
    lost = [int(n) for n in re.findall(r"\blost=(\d+)", collector_log)]
    write_result(
        "outage_telemetry_cluster",
        {
            "scenario": "the separate telemetry cluster's broker paused (SIGSTOP) for two minutes",
            "outage_s": OUTAGE_S,
            "down_at": down_at,
            "up_at": up_at,
            "stale_episodes": episodes,
            "replica_alerts": len(replica_alerts),
            "batches_during_outage": sum(1 for t, _, _ in batches if down_at < t < up_at),
            "first_batch_after": min((t - up_at for t, _, _ in batches if t > up_at), default=None),
            "collector_records_lost": max(lost, default=0),
            "alerts": [[e.arrived, e.name, e.status, *e.replica] for e in events],
        },
    )
    assert len(episodes) == 1, f"IsrwatchTelemetryStale episodes after the outage began: {episodes}"
    fired, resolved = episodes[0]
    assert down_at < fired < up_at, f"stale fired at {fired}, outage {down_at}..{up_at}"
    assert resolved is not None and resolved > up_at, f"stale resolved at {resolved}, the outage ended {up_at}"
    assert not replica_alerts, "replica alerts from a telemetry outage: " + "; ".join(
        f"{e.name} {e.status} {e.replica}" for e in replica_alerts
    )


AM_OUTAGE_S = 300.0
PAUSED = 3
# the pinned watched topic for the Alertmanager outage: the paused broker follows both partitions
AM_ASSIGNMENT = [[1, 2, 3], [2, 1, 3]]
Transition = tuple[str, float, str]  # (alert identity, startsAt, firing/resolved)


def _seconds(iso: str) -> float:
    return round(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp(), 3)


def _identity(body: dict[str, Any]) -> str:
    return json.dumps(body["labels"], sort_keys=True)


def topic_transitions(pipe: Pipeline) -> list[Transition]:
    """The job's record of what it announced: the alerts topic, in order per alert."""
    out = []
    for value in read_topic(pipe.telemetry_cluster, pipe.alerts_topic):
        body = json.loads(value or b"{}")
        out.append((_identity(body), _seconds(body["startsAt"]), body["status"]))
    return out


def delivered(posts: list[Post]) -> list[tuple[float, Transition]]:
    """Every alert in a post Alertmanager accepted: (accepted at, transition). A firing
    alert is posted with an endsAt ahead (it expires unless re-sent), a resolved one with
    its end, which is not after the post."""
    out = []
    for p in posts:
        if p.status < 300 and p.path.endswith("/api/v2/alerts"):
            for a in p.body:
                status = "resolved" if _seconds(a["endsAt"]) <= p.at + 1.0 else "firing"
                out.append((p.at, (_identity(a), _seconds(a["startsAt"]), status)))
    return out


def delivery_figures(announced: list[Transition], got: list[tuple[float, Transition]]) -> dict[str, int]:
    """Against the alerts topic: transitions missing at Alertmanager; resolutions accepted
    twice or episodes firing again after their resolution was taken (duplicated); alerts
    whose transitions Alertmanager first took in another order than the job announced them.
    Re-sending a firing alert is Alertmanager's protocol (it expires otherwise), not a repeat;
    an episode that began and ended during the outage may reach it as its resolution alone."""
    taken = {t for _, t in got}
    missing = [t for t in announced if t not in taken and (t[2] == "resolved" or (t[0], t[1], "resolved") not in taken)]
    duplicated = 0
    resolved_at: dict[tuple[str, float], float] = {}
    first: list[Transition] = []
    for at, t in got:
        episode = (t[0], t[1])
        if t[2] == "resolved":
            duplicated += episode in resolved_at
            resolved_at.setdefault(episode, at)
        elif episode in resolved_at:
            duplicated += 1
        if t not in first:
            first.append(t)
    out_of_order = 0
    for ident in {t[0] for t in announced}:
        mine = [t for t in announced if t[0] == ident and t in taken]
        theirs = [t for t in first if t[0] == ident and t in set(announced)]
        out_of_order += mine != theirs
    return {"missing": len(missing), "duplicated": duplicated, "out_of_order_alerts": out_of_order}


@pytest.mark.services
def test_alertmanager_down_five_minutes_gets_every_transition_after_it_returns(kafka_cluster_factory, tmp_path):
    cluster = kafka_cluster_factory(replica_lag_time_max_ms=LAG_MS, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    cluster.create_topic(TOPIC, assignment=AM_ASSIGNMENT)
    # isrwatch's topics apart from the paused broker (as in test_kill_campaign.py)
    telemetry = kafka_cluster_factory(brokers=1, zookeeper_session_timeout_ms=ZK_SESSION_MS)
    with Alertmanager() as am, HttpRecorder(am.url) as recorder:
        # (stale telemetry at 60 s, as in the fuzz campaign: a loaded machine's slow batches are not the fault here)
        job_args = ["--alertmanager-url", recorder.url, "--stale-after-seconds", "60"]
        with (
            ProduceLoad(cluster, TOPIC, len(AM_ASSIGNMENT), rate=200),
            Pipeline(cluster, tmp_path, telemetry_cluster=telemetry, job_args=job_args) as pipe,
        ):
            pipe.wait_watching(4)
            assert not [t for t in topic_transitions(pipe) if '"broker_id"' in t[0]], (
                "no replica alert before the fault"
            )
            am.stop()
            down_at = time.time()
            paused = True
            cluster.pause(PAUSED)
            try:

                def announced(status: str) -> bool:
                    time.sleep(2)  # (the topic is read whole each time)
                    return any(s == status for *_, s in topic_transitions(pipe))

                until("an alert for the paused follower", lambda: announced("firing"), 120, pipe)
                until("the leaders to drop it", lambda: bool(Shrinks.read(cluster, TOPIC, down_at).lines), 120, pipe)
                cluster.resume(PAUSED)
                paused = False

                def all_resolved() -> bool:
                    last = {i: s for i, _, s in topic_transitions(pipe)}
                    time.sleep(2)
                    return bool(last) and set(last.values()) == {"resolved"}

                until("every alert resolved", all_resolved, 180, pipe)
                # killed with resolutions Alertmanager has not taken: the restarted job has them
                assert pipe.job is not None
                pipe.job.kill()
                killed_at = time.time()
                pipe.start_job()
                before = len(pipe.batches())
                until("the restarted job's first batch", lambda: len(pipe.batches()) > before, 240, pipe)
                assert time.time() < down_at + AM_OUTAGE_S, (
                    "the fault outlasted the outage: nothing to deliver after it"
                )
                until("the end of the outage", lambda: time.time() >= down_at + AM_OUTAGE_S, AM_OUTAGE_S + 30, pipe)
            finally:
                if paused:
                    cluster.resume(PAUSED)
            taken_during = len(delivered(recorder.accepted()))
            am.start()
            up_at = time.time()
            announced_all = topic_transitions(pipe)
            until(
                "Alertmanager to have every transition",
                lambda: delivery_figures(announced_all, delivered(recorder.accepted()))["missing"] == 0,
                180,
                pipe,
            )
            delivered_in_s = max(at for at, _ in delivered(recorder.accepted())) - up_at
            until("two more re-sends", lambda: time.time() >= up_at + delivered_in_s + 70, 120, pipe)
            announced_all = topic_transitions(pipe)
            active = [a for a in am.alerts() if a["labels"].get("cluster") == "e2e"]
            pipe.check_alive("the job through the outage")
        got = delivered(recorder.accepted())
        posts_refused = sum(1 for p in recorder.posts if p.status >= 300)

    figures = {
        "outage_s": AM_OUTAGE_S,
        "transitions_announced": len(announced_all),
        "job_killed_during_outage_at_s": round(killed_at - down_at, 1),
        "accepted_during_outage": taken_during,
        "posts_refused_during_outage": posts_refused,
        "all_delivered_within_s_of_return": round(delivered_in_s, 1),
        **{f"transitions_{k}": v for k, v in delivery_figures(announced_all, got).items()},
        "alerts_active_at_alertmanager_at_end": len(active),
    }
    print_figures("Alertmanager down five minutes", figures)
    write_result("outage_alertmanager", figures)
    assert {s for *_, s in announced_all} == {"firing", "resolved"}, "the fault raised and resolved alerts"
    assert taken_during == 0, "Alertmanager took alerts while it was down"
    assert figures["transitions_missing"] == 0
    assert figures["transitions_duplicated"] == 0
    assert figures["transitions_out_of_order_alerts"] == 0
    assert not active, f"alerts still active at Alertmanager: {[a['labels'] for a in active]}"
