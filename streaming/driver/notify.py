"""Where alert transitions go: stdout, Alertmanager, the alerts topic.

Every sink takes ``isrwatch.alerts.Transition`` objects from ``send`` and
flushes what it still holds on ``close``:

* ``StdoutSink``: one JSON object per started or resolved alert, one per line.
* ``AlertmanagerSink``: posts to ``<url>/api/v2/alerts`` of every URL (an HA
  pair gets everything), re-sends firing alerts every ``resend_seconds`` and
  resolves them with ``endsAt``; a background thread retries with exponential
  backoff while an Alertmanager is down and keeps the firing set and pending
  resolutions until each URL has taken them; with a ``backlog``
  (``streaming.driver.checkpoint.DeliveryBacklog``) the pending resolutions survive a restart.
* ``KafkaAlertsSink``: one record per started or resolved alert; with an outbox
  (``streaming.driver.checkpoint.AlertsOutbox``) at least once across a kill, and not twice.

A sink with a ``stage(transitions)`` method is called with them before the job saves its
alert book (``streaming.driver.monitor``), ``send`` after.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol, TextIO

import requests

from isrwatch.alerts import Alert, AlertKey, PostableAlert, Transition
from isrwatch.logs import kv
from isrwatch.settings import Secret

if TYPE_CHECKING:
    from streaming.driver.checkpoint import AlertsOutbox, DeliveryBacklog
    from streaming.sinks.producer import RecordProducer

__all__ = [
    "AlertSink",
    "AlertEvent",
    "StdoutSink",
    "AlertmanagerSink",
    "KafkaAlertsSink",
    "alert_event",
    "alert_id",
]

log = logging.getLogger("streaming.notify")


class AlertSink(Protocol):
    """Where alert transitions go (stdout, Alertmanager, the alerts topic)."""

    def send(self, transition: Transition, now_ms: int) -> None: ...

    def close(self) -> None: ...


class AlertEvent(PostableAlert):
    """An alert as stdout and the alerts topic carry it: Alertmanager's object and its status."""

    status: str  # firing or resolved


def _postable(alert: Alert, generator_url: str = "", runbook_base: str | None = None) -> PostableAlert:
    """``Alert.to_alertmanager()`` with the deployment's Grafana and runbook links."""
    if generator_url and not alert.generator_url:
        alert = replace(alert, generator_url=generator_url)
    return alert.to_alertmanager(runbook_base)


def alert_event(alert: Alert, status: str, *, generator_url: str = "", runbook_base: str | None = None) -> AlertEvent:
    """The Alertmanager v2 object of ``alert`` plus ``"status"``
    (``firing``/``resolved``), the format of stdout and the alerts topic."""
    return {**_postable(alert, generator_url, runbook_base), "status": status}


def alert_id(alert: Alert) -> str:
    """A stable identity: alert name and its labels, ``name{k="v",...}``."""
    return alert.name.value + "{" + ",".join(f'{k}="{v}"' for k, v in alert.labels) + "}"


def _events(transition: Transition) -> Iterable[tuple[Alert, str]]:
    for a in transition.started:
        yield a, "firing"
    for a in transition.resolved:
        yield a, "resolved"


@dataclass
class StdoutSink:
    """Prints each started and resolved alert as a JSON line (the embedded
    default's alert output; logs go to stderr)."""

    stream: TextIO | None = None
    generator_url: str = ""
    runbook_base: str | None = None

    def send(self, transition: Transition, now_ms: int) -> None:
        out = self.stream or sys.stdout
        lines = [
            json.dumps(
                alert_event(alert, status, generator_url=self.generator_url, runbook_base=self.runbook_base),
                sort_keys=True,
            )
            + "\n"
            for alert, status in _events(transition)
        ]
        if lines:
            # One write for the whole transition: a job killed while announcing
            # a batch prints all of it or none of it (the book saved before
            # sending then says which).
            out.write("".join(lines))
            out.flush()

    def close(self) -> None:
        (self.stream or sys.stdout).flush()


@dataclass
class KafkaAlertsSink:
    """Writes each started and resolved alert to the alerts topic, keyed by
    ``alert_id``. ``producer`` is a confluent_kafka.Producer (or anything
    with ``produce``, ``poll`` and ``flush``).

    With an ``outbox`` (``streaming.driver.checkpoint.AlertsOutbox``) delivery is at least once
    across a kill: ``stage`` writes a batch's records there before the job saves the book
    that says they were announced, and a restarted sink sends again those the topic had
    not confirmed. ``delivered_tail(topic, n)`` (the records at the end of each partition,
    None when the topic cannot be read) lets it skip those that did arrive, so nothing is
    written twice."""

    producer: RecordProducer
    topic: str
    generator_url: str = ""
    runbook_base: str | None = None
    flush_timeout_s: float = 10.0
    outbox: AlertsOutbox | None = None
    delivered_tail: Callable[[str, int], set[tuple[bytes, bytes]] | None] | None = None
    _unconfirmed: list[tuple[bytes, bytes]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.outbox is not None:
            self._send_unconfirmed(self.outbox.load())

    def _records(self, transition: Transition) -> list[tuple[bytes, bytes]]:
        return [
            (
                alert_id(alert).encode(),
                json.dumps(
                    alert_event(alert, status, generator_url=self.generator_url, runbook_base=self.runbook_base)
                ).encode(),
            )
            for alert, status in _events(transition)
        ]

    def stage(self, transitions: Iterable[Transition]) -> None:
        """Keep these transitions' records, and those the topic has not confirmed yet, in the
        outbox. Called before the book is saved; raises OSError when the outbox cannot be
        written (the book then is not saved either)."""
        records = [r for t in transitions for r in self._records(t)]
        if self.outbox is None or not records:
            return
        if self._pending() == 0:
            self._unconfirmed.clear()
        self._unconfirmed.extend(records)
        self.outbox.save(self._unconfirmed)

    def _pending(self) -> int:
        """Alerts-topic records produced and not yet acknowledged (or given up on)."""
        stats = getattr(self.producer, "stats", None)
        if stats is None:  # a plain confluent-kafka producer: whatever its queue holds
            self.producer.poll(0)
            return len(self.producer)
        out = stats().get(self.topic)
        return out.pending if out is not None else 0

    def _send_unconfirmed(self, saved: list[tuple[bytes, bytes]]) -> None:
        """A restart: send what an earlier run staged and the topic does not have."""
        if not saved:
            return
        on_topic = self.delivered_tail(self.topic, len(saved)) if self.delivered_tail is not None else None
        if on_topic is None:
            log.warning(kv(event="alerts_outbox_unchecked", topic=self.topic, records=len(saved)))
            on_topic = set()
        todo = [r for r in saved if r not in on_topic]
        log.info(kv(event="alerts_outbox_restored", topic=self.topic, records=len(saved), resent=len(todo)))
        self._unconfirmed = list(todo)
        if len(todo) < len(saved):
            self._save_outbox()
        for key, value in todo:
            self.producer.produce(self.topic, key=key, value=value)
        self.producer.poll(0)

    def send(self, transition: Transition, now_ms: int) -> None:
        for key, value in self._records(transition):
            self.producer.produce(self.topic, key=key, value=value)
        self.producer.poll(0)

    def close(self) -> None:
        left = self.producer.flush(self.flush_timeout_s)
        if left:
            log.warning(kv(event="alerts_topic_unflushed", topic=self.topic, records=left))
        elif self.outbox is not None and self._unconfirmed:
            self._unconfirmed.clear()
            self._save_outbox()

    def _save_outbox(self) -> None:
        """Trim the outbox to what is unconfirmed (not needed for correctness: a restart checks the topic)."""
        if self.outbox is None:
            return
        try:
            self.outbox.save(self._unconfirmed)
        except OSError as e:
            log.warning(kv(event="alerts_outbox_not_trimmed", error=e.strerror or type(e).__name__))


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class _Target:
    """One Alertmanager and what it has not taken yet."""

    url: str
    resolved: dict[AlertKey, Alert] = field(default_factory=dict)  # pending resolutions
    # pending resolutions of an earlier run of the job, as it would have posted them
    restored: dict[AlertKey, PostableAlert] = field(default_factory=dict)
    next_at: float = 0.0  # monotonic time of the next post
    failures: int = 0
    delivered_gen: int = -1  # the sink's generation this target has fully taken


class AlertmanagerSink:
    """Delivers alerts to Alertmanager API v2 from a background thread."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        username: str | None = None,
        password: Secret | str | None = None,
        ca_file: str | None = None,
        insecure: bool = False,
        resend_seconds: float = 30.0,
        generator_url: str = "",
        runbook_base: str | None = None,
        timeout_s: float = 10.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        backlog: DeliveryBacklog | None = None,
    ) -> None:
        if not urls:
            raise ValueError("AlertmanagerSink needs at least one URL")
        self.resend_seconds = resend_seconds
        self.generator_url = generator_url
        self.runbook_base = runbook_base
        self.timeout_s = timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._clock = clock
        self._session = requests.Session()
        if username is not None or password is not None:
            secret = password.reveal() if isinstance(password, Secret) else (password or "")
            self._session.auth = (username or "", secret)
        # Passed on every request: a session-level verify loses to REQUESTS_CA_BUNDLE.
        self._verify: str | bool = False if insecure else (ca_file or True)
        self._session.headers["Content-Type"] = "application/json"
        self._targets = [_Target(u.rstrip("/") + "/api/v2/alerts") for u in urls]
        self._backlog = backlog
        if backlog is not None:
            self._restore(backlog.load())
        self._firing: dict[AlertKey, Alert] = {}
        self._gen = 0
        self._closing = False
        self.errors = 0  # unexpected errors the delivery thread survived (_run)
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="alertmanager-sink", daemon=True)
        self._thread.start()

    # -- the job's side -------------------------------------------------

    def send(self, transition: Transition, now_ms: int) -> None:
        with self._cond:
            # An alert held but unknown here (the job restored its alert book
            # after a restart) is news too: deliver it now, not at the next re-send.
            news = bool(transition.started or transition.resolved)
            news = news or any(a.key not in self._firing for a in transition.holding)
            changed = bool(transition.resolved)
            for alert in (*transition.started, *transition.holding):
                self._firing[alert.key] = alert
                for t in self._targets:
                    changed = t.resolved.pop(alert.key, None) is not None or changed
                    changed = t.restored.pop(alert.key, None) is not None or changed
            for alert in transition.resolved:
                self._firing.pop(alert.key, None)
                for t in self._targets:
                    t.resolved[alert.key] = alert
            if changed:
                self._save()
            if news:
                self._gen += 1
                now = time.monotonic()
                for t in self._targets:
                    if t.failures == 0:  # in backoff: the retry takes the news along
                        t.next_at = min(t.next_at, now)
                self._cond.notify_all()

    @property
    def firing(self) -> list[Alert]:
        with self._cond:
            return list(self._firing.values())

    def pending(self) -> dict[str, int]:
        """Per URL, resolutions not yet delivered (for logs and tests)."""
        with self._cond:
            return {t.url: len(t.resolved) + len(t.restored) for t in self._targets}

    def _restore(self, saved: dict[str, list[tuple[AlertKey, PostableAlert]]]) -> None:
        """Take the pending resolutions of an earlier run, for the URLs still configured."""
        by_url = {t.url: t for t in self._targets}
        for url, items in saved.items():
            target = by_url.get(url)
            if target is None:
                log.warning(kv(event="alertmanager_backlog_dropped", url=url, resolutions=len(items)))
                continue
            target.restored.update(items)
            log.info(kv(event="alertmanager_backlog_restored", url=url, resolutions=len(items)))

    def _save(self) -> None:
        """Under the lock: write the pending resolutions (when a backlog is kept)."""
        if self._backlog is None:
            return
        now = self._clock()
        pending = {
            t.url: [*t.restored.items(), *((k, self._wire(a, now, None)) for k, a in t.resolved.items())]
            for t in self._targets
        }
        try:
            self._backlog.save(pending)
        except OSError as e:  # a full disk must not stop the delivery itself
            log.warning(kv(event="alertmanager_backlog_not_saved", error=e.strerror or type(e).__name__))

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every URL has taken every start and resolution sent so
        far; False if ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            now = time.monotonic()
            for t in self._targets:
                if t.delivered_gen < self._gen and t.failures == 0:
                    t.next_at = min(t.next_at, now)
            self._cond.notify_all()
            while any(t.delivered_gen < self._gen for t in self._targets):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Try once more to deliver what is pending, then stop the thread.
        Firing alerts are not resolved: they expire at their endsAt."""
        self.flush(timeout_s)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=self.timeout_s + 1)
        self._session.close()
        undelivered = {t.url: len(t.resolved) for t in self._targets if t.delivered_gen < self._gen}
        if undelivered:
            log.warning(kv(event="alertmanager_undelivered_at_close", targets=undelivered))

    # -- the delivery thread --------------------------------------------

    def _payload(self, target: _Target) -> tuple[list[PostableAlert], dict[AlertKey, Alert | PostableAlert], int]:
        """Under the lock: the body to post now, the resolutions it carries
        and the generation it covers."""
        now = self._clock()
        ends = now + 4 * self.resend_seconds  # as Prometheus does: expires if isrwatch goes away
        body = []
        for alert in self._firing.values():
            body.append(self._wire(alert, now, ends))
        carried: dict[AlertKey, Alert | PostableAlert] = dict(target.resolved)
        for alert in target.resolved.values():
            body.append(self._wire(alert, now, None))
        carried.update(target.restored)
        body.extend(target.restored.values())
        return body, carried, self._gen

    def _wire(self, alert: Alert, now: float, firing_ends: float | None) -> PostableAlert:
        body = _postable(alert, self.generator_url, self.runbook_base)
        # Never ahead of Alertmanager's clock (the telemetry clock may be), and
        # startsAt <= endsAt always, or Alertmanager rejects the whole post.
        starts = min(alert.starts_ms / 1000, now)
        body["startsAt"] = _iso(starts)
        if firing_ends is not None:
            body["endsAt"] = _iso(firing_ends)
        else:
            ends = min((alert.ends_ms or alert.starts_ms) / 1000, now)
            body["endsAt"] = _iso(max(starts, ends))
        return body

    def _post(self, url: str, body: list[PostableAlert]) -> str:
        """'ok', 'retry' or 'drop' (Alertmanager refused the content)."""
        try:
            r = self._session.post(url, data=json.dumps(body), timeout=self.timeout_s, verify=self._verify)
        except requests.RequestException as e:
            log.warning(kv(event="alertmanager_unreachable", url=url, error=type(e).__name__))
            return "retry"
        if r.status_code < 300:
            return "ok"
        if r.status_code in (400, 413, 422):  # the content itself is refused: re-sending cannot help
            log.error(kv(event="alertmanager_rejected", url=url, status=r.status_code, reason=r.text[:200].strip()))
            return "drop"
        # Down, overloaded, or credentials/URL wrong (fixable without losing alerts): retry.
        level = logging.ERROR if r.status_code in (401, 403, 404) else logging.WARNING
        log.log(level, kv(event="alertmanager_error", url=url, status=r.status_code))
        return "retry"

    def _run(self) -> None:
        """The delivery loop, kept alive: an error no Alertmanager answer explains (those are
        handled in ``_post``) is logged with its traceback and delivery resumes a second
        later. Alerts are the product's output; this thread must not end before ``close``."""
        while True:
            try:
                self._deliver()
                return  # closing
            except Exception as e:  # noqa: BLE001
                self.errors += 1
                log.exception(kv(event="alertmanager_sink_error", errors=self.errors, error=type(e).__name__))
                time.sleep(1.0)

    def _deliver(self) -> None:
        while True:
            with self._cond:
                while not self._closing:
                    now = time.monotonic()
                    due = [t for t in self._targets if t.next_at <= now]
                    if due:
                        break
                    self._cond.wait(min(t.next_at for t in self._targets) - now)
                if self._closing:
                    return
                work = [(t, *self._payload(t)) for t in due]
            for target, body, carried, gen in work:
                outcome = self._post(target.url, body) if body else "ok"
                with self._cond:
                    now = time.monotonic()
                    if outcome == "retry":
                        if target.failures == 0:
                            log.warning(kv(event="alertmanager_backoff", url=target.url, alerts=len(body)))
                        target.failures += 1
                        delay = min(self.backoff_max_s, self.backoff_initial_s * 2 ** (target.failures - 1))
                        target.next_at = now + delay
                    else:
                        if target.failures:
                            log.info(kv(event="alertmanager_back", url=target.url, retries=target.failures))
                        target.failures = 0
                        for key, alert in carried.items():
                            if target.resolved.get(key) is alert:
                                del target.resolved[key]
                            elif target.restored.get(key) is alert:
                                del target.restored[key]
                        if carried:
                            self._save()
                        target.delivered_gen = max(target.delivered_gen, gen)
                        target.next_at = now + self.resend_seconds
                        if outcome == "ok" and body:
                            log.debug(kv(event="alertmanager_posted", url=target.url, alerts=len(body)))
                        if target.delivered_gen < self._gen:
                            target.next_at = now  # news arrived during the post
                    self._cond.notify_all()
