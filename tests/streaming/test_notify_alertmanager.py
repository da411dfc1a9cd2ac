"""AlertmanagerSink against a real Alertmanager on loopback."""

from __future__ import annotations

import subprocess
import time
import uuid
import warnings
from pathlib import Path

import pytest

from isrwatch.alerts import AlertBook, replica_alerts
from isrwatch.settings import Secret
from isrwatch.status import ReplicaStatus, State
from localservices import Alertmanager
from streaming.driver.notify import AlertmanagerSink
from tests.exporter.samples import replica
from tests.support.alertmanager import alertmanager  # noqa: F401
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.services

CONTRACT_LABELS = {"alertname", "severity", "cluster", "topic", "partition", "broker_id", "leader_id"}


def status(cluster: str, broker_id: int, state: State, now_ms: int, ratio: float = 0.0) -> ReplicaStatus:
    return replica(
        broker_id,
        state,
        cluster=cluster,
        partition=3,
        eval_ms=now_ms,
        ratio=ratio,
        offset_lag=int(ratio * 500),
        lag_time_max_ms=10_000,
    )


def now_ms() -> int:
    return int(time.time() * 1000)


def names(alerts: list[dict]) -> set[str]:
    return {a["labels"]["alertname"] for a in alerts}


def fresh_cluster() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


def test_alerts_arrive_with_contract_labels_and_resolve(alertmanager: Alertmanager) -> None:  # noqa: F811
    cluster = fresh_cluster()
    book = AlertBook()
    sink = AlertmanagerSink(
        [alertmanager.url],
        resend_seconds=60,
        generator_url="http://grafana.example:3000/d/isrwatch",
        runbook_base="http://127.0.0.1:9744/runbook",  # the job's own, as runbook_base gives it
    )
    try:
        t0 = now_ms()
        sink.send(book.update(replica_alerts(status(cluster, 2, State.CRITICAL, t0, 0.85)), t0), t0)
        assert sink.flush(10)
        got = alertmanager.wait_for(lambda a: len(a) == 2, cluster=cluster)
        assert names(got) == {"KafkaReplicaNearingIsrShrink", "KafkaReplicaIsrShrinkImminent"}
        for a in got:
            assert set(a["labels"]) >= CONTRACT_LABELS
            assert a["labels"]["cluster"] == cluster
            assert (a["labels"]["topic"], a["labels"]["partition"], a["labels"]["broker_id"]) == ("orders", "3", "2")
            assert a["labels"]["leader_id"] == "1"
            assert {"summary", "description", "runbook_url"} <= set(a["annotations"])
            assert (
                a["annotations"]["runbook_url"] == "http://127.0.0.1:9744/runbook#" + a["labels"]["alertname"].lower()
            )
            assert a["generatorURL"] == "http://grafana.example:3000/d/isrwatch"
            assert a["status"]["state"] == "active"
        severities = {a["labels"]["alertname"]: a["labels"]["severity"] for a in got}
        assert severities == {"KafkaReplicaNearingIsrShrink": "warning", "KafkaReplicaIsrShrinkImminent": "critical"}

        # Back under 0.8: the imminent alert resolves, the nearing one holds.
        t1 = t0 + 2000
        sink.send(book.update(replica_alerts(status(cluster, 2, State.NEARING, t1, 0.6)), t1), t1)
        assert sink.flush(10)
        got = alertmanager.wait_for(lambda a: len(a) == 1, cluster=cluster)
        assert names(got) == {"KafkaReplicaNearingIsrShrink"}

        t2 = t1 + 2000
        sink.send(book.update([], t2), t2)
        assert sink.flush(10)
        assert alertmanager.wait_for(lambda a: not a, cluster=cluster) == []
    finally:
        sink.close()


def test_every_url_of_an_ha_pair_gets_the_alerts(alertmanager: Alertmanager) -> None:  # noqa: F811
    cluster = fresh_cluster()
    with Alertmanager() as second:
        sink = AlertmanagerSink([alertmanager.url, second.url + "/"], resend_seconds=60)
        try:
            t0 = now_ms()
            sink.send(AlertBook().update(replica_alerts(status(cluster, 3, State.STALLED, t0)), t0), t0)
            assert sink.flush(10)
            for am in (alertmanager, second):
                got = am.wait_for(lambda a: len(a) == 1, cluster=cluster)
                assert names(got) == {"KafkaReplicaStalled"}
        finally:
            sink.close()


def test_alerts_started_while_alertmanager_is_down_arrive_once_it_is_back() -> None:
    cluster = fresh_cluster()
    with Alertmanager() as am:
        book = AlertBook()
        sink = AlertmanagerSink([am.url], resend_seconds=1, backoff_initial_s=0.2, backoff_max_s=1, timeout_s=2)
        try:
            t0 = now_ms()
            sink.send(book.update(replica_alerts(status(cluster, 2, State.NEARING, t0, 0.6)), t0), t0)
            assert sink.flush(10)
            assert names(am.wait_for(lambda a: len(a) == 1, cluster=cluster)) == {"KafkaReplicaNearingIsrShrink"}

            am.stop()  # Alertmanager keeps alerts in memory only: a restart forgets them
            t1 = now_ms()
            holding = replica_alerts(status(cluster, 2, State.NEARING, t1, 0.6))
            sink.send(book.update(holding + replica_alerts(status(cluster, 3, State.STALLED, t1)), t1), t1)
            assert not sink.flush(1.5), "nothing can be delivered while Alertmanager is down"

            am.start()
            assert sink.flush(15)
            # The start made while it was down, and the alert that held (re-sent).
            got = am.wait_for(lambda a: len(a) == 2, cluster=cluster)
            assert names(got) == {"KafkaReplicaNearingIsrShrink", "KafkaReplicaStalled"}

            # Another restart with nothing new to send: the periodic re-send
            # alone brings the firing alerts back.
            am.stop()
            am.start()
            got = am.wait_for(lambda a: len(a) == 2, cluster=cluster)
            assert names(got) == {"KafkaReplicaNearingIsrShrink", "KafkaReplicaStalled"}
            assert all(a["endsAt"] > a["startsAt"] for a in got)
        finally:
            sink.close()


def test_a_resolution_made_during_a_network_fault_is_delivered_after_it() -> None:
    cluster = fresh_cluster()
    with Alertmanager() as am:
        proxy = TcpProxy(am.port)
        book = AlertBook()
        sink = AlertmanagerSink(
            [f"http://127.0.0.1:{proxy.port}"], resend_seconds=60, backoff_initial_s=0.2, backoff_max_s=1, timeout_s=2
        )
        try:
            t0 = now_ms()
            sink.send(book.update(replica_alerts(status(cluster, 2, State.STALLED, t0)), t0), t0)
            assert sink.flush(10)
            assert names(am.wait_for(lambda a: len(a) == 1, cluster=cluster)) == {"KafkaReplicaStalled"}

            proxy.cut()
            t1 = now_ms()
            sink.send(book.update([], t1), t1)  # resolved while Alertmanager cannot be reached
            assert not sink.flush(1.5)
            assert list(sink.pending().values()) == [1]
            assert names(am.alerts(cluster=cluster)) == {"KafkaReplicaStalled"}  # still firing there

            proxy.restore()
            assert sink.flush(15)
            assert am.wait_for(lambda a: not a, cluster=cluster) == []
            assert list(sink.pending().values()) == [0]
        finally:
            sink.close()
            proxy.close()


def test_a_resolution_pending_when_the_job_stops_is_delivered_by_the_next_run(tmp_path: Path) -> None:
    """Issue 14, item 3: the delivery backlog survives a restart. Alertmanager cannot be
    reached when an alert resolves and the job stops; the next run, on the same checkpoint,
    resolves it once Alertmanager answers (without the file the alert would stay firing
    there until its endsAt, four re-send intervals: 4 minutes here)."""
    from streaming.driver.checkpoint import DeliveryBacklog

    cluster = fresh_cluster()
    with Alertmanager() as am:
        proxy = TcpProxy(am.port)
        url = f"http://127.0.0.1:{proxy.port}"
        book = AlertBook()
        options = {"resend_seconds": 60, "backoff_initial_s": 0.2, "backoff_max_s": 1, "timeout_s": 2}
        first = AlertmanagerSink([url], backlog=DeliveryBacklog(tmp_path), **options)
        try:
            t0 = now_ms()
            first.send(book.update(replica_alerts(status(cluster, 2, State.STALLED, t0)), t0), t0)
            assert first.flush(10)
            assert names(am.wait_for(lambda a: len(a) == 1, cluster=cluster)) == {"KafkaReplicaStalled"}
            proxy.cut()
            t1 = now_ms()
            first.send(book.update([], t1), t1)
        finally:
            first.close(timeout_s=1)  # the job stops: the resolution is still pending
        assert names(am.alerts(cluster=cluster)) == {"KafkaReplicaStalled"}
        proxy.restore()
        second = AlertmanagerSink([url], backlog=DeliveryBacklog(tmp_path), **options)
        try:
            assert second.pending() == {f"{url}/api/v2/alerts": 1}
            assert second.flush(15)
            assert am.wait_for(lambda a: not a, cluster=cluster) == []
            assert second.pending() == {f"{url}/api/v2/alerts": 0}
        finally:
            second.close()
            proxy.close()
        # delivered: a third run has nothing left to send
        assert DeliveryBacklog(tmp_path).load() == {}


def _tls_and_auth(tmp: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and an Alertmanager web config
    with TLS and a basic auth user ``isrwatch`` / ``s3cret``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        crypt = pytest.importorskip("crypt", reason="bcrypt hashing needs the crypt module (Python < 3.13)")
    hashed = crypt.crypt("s3cret", crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1 << 4))
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    web = tmp / "web.yml"
    web.write_text(
        f'tls_server_config:\n  cert_file: "{cert}"\n  key_file: "{key}"\nbasic_auth_users:\n  isrwatch: "{hashed}"\n'
    )
    return cert, web


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_tls_and_basic_auth(tmp_path: Path) -> None:
    cert, web = _tls_and_auth(tmp_path)
    cluster = fresh_cluster()
    with Alertmanager(web_config=str(web), ca_file=str(cert), auth=("isrwatch", "s3cret")) as am:
        t0 = now_ms()
        started = AlertBook().update(replica_alerts(status(cluster, 2, State.STALLED, t0)), t0)

        wrong = AlertmanagerSink([am.url], username="isrwatch", password=Secret("nope"), ca_file=str(cert))
        untrusted = AlertmanagerSink([am.url], username="isrwatch", password=Secret("s3cret"))
        good = AlertmanagerSink([am.url], username="isrwatch", password=Secret("s3cret"), ca_file=str(cert))
        insecure = AlertmanagerSink([am.url], username="isrwatch", password=Secret("s3cret"), insecure=True)
        try:
            for sink in (wrong, untrusted):
                sink.send(started, t0)
                assert not sink.flush(1.5)
            assert am.alerts(cluster=cluster) == []

            good.send(started, t0)
            assert good.flush(10)
            assert names(am.wait_for(lambda a: len(a) == 1, cluster=cluster)) == {"KafkaReplicaStalled"}

            resolved = AlertBook(dict(good_book_items(started))).update([], t0 + 1000)
            insecure.send(resolved, t0 + 1000)
            assert insecure.flush(10)
            assert am.wait_for(lambda a: not a, cluster=cluster) == []
        finally:
            for sink in (wrong, untrusted, good, insecure):
                sink.close(timeout_s=0.5)


def good_book_items(transition):  # the alerts ``transition`` started, keyed as AlertBook keys them
    return [(a.key, a) for a in transition.started]


def test_delivery_outlives_an_unexpected_error(alertmanager: Alertmanager, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    """An error in the delivery thread that no Alertmanager answer explains (forced here: the
    first payload built raises) is logged with its traceback, and the alerts still arrive: the
    thread is the product's output and must not end before ``close``."""
    cluster = fresh_cluster()
    book = AlertBook()
    sink = AlertmanagerSink([alertmanager.url], resend_seconds=60)
    payload, failed = sink._payload, []

    def once_broken(target):  # type: ignore[no-untyped-def]
        if not failed:
            failed.append(1)
            raise RuntimeError("something no one foresaw")
        return payload(target)

    sink._payload = once_broken  # type: ignore[method-assign]
    try:
        t0 = now_ms()
        sink.send(book.update(replica_alerts(status(cluster, 2, State.CRITICAL, t0, 0.85)), t0), t0)
        got = alertmanager.wait_for(lambda a: len(a) == 2, cluster=cluster)
        assert names(got) == {"KafkaReplicaNearingIsrShrink", "KafkaReplicaIsrShrinkImminent"}
        assert failed and sink.errors == 1
        [record] = [r for r in caplog.records if "event=alertmanager_sink_error" in r.getMessage()]
        assert record.exc_info is not None
    finally:
        sink.close()
