"""Issue 4, done-when 1: a scenario through the real job (``isrwatch run
--simulate stuck-follower``, a child process with Spark in local mode) into
two real Alertmanagers (an HA pair, Debian package, loopback), read back
through GET /api/v2/alerts.

* the stuck follower's lag alerts arrive with the contract labels and
  annotations, and no alert for any other replica;
* Alertmanager B is stopped once the first alert is in and restarted while
  the fault still holds: the alerts arrive there once it is back;
* they resolve in both when the follower resumes (45 s into the scenario).

The scenario runs at half speed: Spark's start and first micro-batch take
half a minute on a loaded 2-core machine, and the fault must still be on
when Alertmanager B comes back.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from isrwatch.alerts import SEVERITY, AlertName
from localkafka import free_port
from localservices import Alertmanager, alertmanager_binary
from tests.e2e_observability.running_job import JobProcess, running_job

pytestmark = [
    # make campaign (~2 min, the scenario at half speed): make test keeps the job's Alertmanager sink
    # against a real Alertmanager (tests/streaming/test_notify_alertmanager.py: the contract's labels,
    # an HA pair, Alertmanager down and back, a resolution across the job's restart, TLS and auth).
    pytest.mark.campaign,
    pytest.mark.services,
    pytest.mark.spark,
    pytest.mark.skipif(alertmanager_binary() is None, reason="alertmanager not installed (Debian package)"),
]

LAG_ALERTS = (AlertName.NEARING, AlertName.IMMINENT, AlertName.OUT_OF_SYNC)
FAULTY = (("orders", "0", "3", "1"), ("payments", "0", "3", "1"))  # topic, partition, broker_id, leader_id
CONTRACT_LABELS = {"alertname", "severity", "cluster", "topic", "partition", "broker_id", "leader_id"}
SPEED = 0.5
RESEND_S = 5
# Generous bounds for a loaded machine; each wait ends as soon as its condition holds.
START_S = 240
FAULT_S = 45 / SPEED + 60

AlertId = tuple[str, str, str, str, str]  # alertname, topic, partition, broker_id, leader_id


def ident(alert: dict) -> AlertId:
    labels = alert["labels"]
    return (labels["alertname"], labels["topic"], labels["partition"], labels["broker_id"], labels["leader_id"])


EXPECTED: set[AlertId] = {(name.value, *replica) for name in LAG_ALERTS for replica in FAULTY}
NEARING: set[AlertId] = {(AlertName.NEARING.value, *replica) for replica in FAULTY}


def until(what: str, predicate: Callable[[], bool], timeout_s: float, job: JobProcess) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if not job.running():
            pytest.fail(f"job exited while waiting for {what}:\n{job.log_tail()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}:\n{job.log_tail()}")
        time.sleep(0.5)


def check_contract(alert: dict, cluster: str, runbook: str) -> None:
    labels, annotations = alert["labels"], alert["annotations"]
    name = AlertName(labels["alertname"])
    assert set(labels) == CONTRACT_LABELS, labels
    assert labels["cluster"] == cluster
    assert labels["severity"] == SEVERITY[name]
    assert {"summary", "description", "runbook_url"} <= set(annotations), annotations
    # the default runbook_url is the job's own /runbook (issue 18): the link answers, with the section
    url = annotations["runbook_url"]
    assert url == f"{runbook}#{name.value.lower()}"
    page = requests.get(url.split("#")[0], timeout=10)
    assert page.status_code == 200 and f'id="{name.value.lower()}"' in page.text, url
    where = f"{labels['topic']}-{labels['partition']} on broker {labels['broker_id']}"
    assert where in annotations["summary"], annotations["summary"]
    assert annotations["description"].strip()
    assert alert["status"]["state"] == "active"


def test_alerts_arrive_survive_an_alertmanager_restart_and_resolve(tmp_path: Path) -> None:
    cluster = f"e2e-am-{uuid.uuid4().hex[:8]}"
    seen_a: set[AlertId] = set()  # every alert A ever showed for the cluster

    with Alertmanager() as am_a, Alertmanager() as am_b:

        def held(am: Alertmanager) -> set[AlertId]:
            got = {ident(a) for a in am.alerts(cluster=cluster)}
            if am is am_a:
                seen_a.update(got)
            return got

        args = [
            "--simulate", "stuck-follower",
            "--lag-time-max-ms", "10000",
            "--speed", str(SPEED),
            "--cluster", cluster,
            "--alertmanager-url", am_a.url,
            "--alertmanager-url", am_b.url,
            "--resend-seconds", str(RESEND_S),
            "--checkpoint-dir", str(tmp_path / "checkpoint"),
        ]  # fmt: skip
        port = free_port()
        runbook = f"http://127.0.0.1:{port}/runbook"
        with running_job(args, tmp_path, port) as job:
            job.wait_for_metrics()

            # The first warnings reach both; then B goes down in the middle of the fault.
            until("Nearing in A", lambda: held(am_a) >= NEARING, START_S, job)
            until("Nearing in B", lambda: held(am_b) >= NEARING, 30, job)
            am_b.stop()
            until("every lag alert in A", lambda: held(am_a) >= EXPECTED, FAULT_S, job)
            for alert in am_a.alerts(cluster=cluster):
                check_contract(alert, cluster, runbook)

            # The job has noticed B is down (a re-send failed) before B comes back empty.
            b_down = re.compile(rf"alertmanager_(unreachable|backoff) url={re.escape(am_b.url)}")
            until("a failed post to B", lambda: bool(b_down.search(job.log_tail(200_000))), 3 * RESEND_S + 30, job)
            am_b.start()  # empty: Alertmanager keeps no alerts across a restart
            until("every lag alert in B after its restart", lambda: held(am_b) >= EXPECTED, 60, job)
            fault_still_on = held(am_a) >= EXPECTED
            for alert in am_b.alerts(cluster=cluster):
                check_contract(alert, cluster, runbook)

            # The follower resumes at 45 s: everything resolves, in both.
            until("resolution in A and B", lambda: not held(am_a) and not held(am_b), FAULT_S, job)
            events = job.events()
            assert job.running(), job.log_tail()

        assert job.returncode == 0, job.log_tail()

    assert fault_still_on, "B came back after the fault ended: the restart was not tested during the fault"
    # Nothing for any other replica (healthy followers of the same cluster stay quiet).
    assert seen_a == EXPECTED
    # The job's own record (stdout): each alert started once and was resolved once, with endsAt.
    mine = [e for e in events if e["labels"]["cluster"] == cluster]
    started = sorted(ident(e) for e in mine if e["status"] == "firing")
    resolved = sorted(ident(e) for e in mine if e["status"] == "resolved")
    assert started == sorted(EXPECTED)
    assert resolved == sorted(EXPECTED)
    assert all(e["endsAt"] >= e["startsAt"] for e in mine if e["status"] == "resolved")
