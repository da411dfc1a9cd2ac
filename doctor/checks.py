"""The checks of ``isrwatch doctor``, one ``Row`` each, every one bounded in time.

Kafka is asked with the collector's own client (``collector.probe.ClusterProbe``,
kafka-python): the cluster's metadata, then every broker on its own connection,
so that a broker that accepts connections but does not answer (paused, swapping,
cut off) is named instead of holding the whole check up. The newest telemetry is
read with confluent-kafka, one bounded poll over every partition at once.
"""

from __future__ import annotations

import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from collector.probe import ClusterProbe, ConfigAnswers, Snapshot
from isrwatch import jsontext
from isrwatch.clientconfig import kafka_python_config, librdkafka_config
from isrwatch.exceptions import IsrwatchError
from isrwatch.rule import AUTO, Rule, RuleConfig, chosen_rule
from isrwatch.settings import kafka_config_pairs
from streaming.lifecycle import origin as origins

__all__ = ["Row", "OK", "WARN", "FAIL", "SKIP", "run_checks"]

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"


@dataclass(frozen=True)
class Row:
    check: str
    status: str  # OK, WARN, FAIL or SKIP
    found: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class _Cluster:
    """One Kafka cluster as the doctor saw it."""

    role: str  # "telemetry cluster" or "watched cluster"
    bootstrap: str
    probe: ClusterProbe | None = None
    snap: Snapshot | None = None


def run_checks(settings: Any) -> list[Row]:
    """Every check for ``settings`` (``doctor.settings.DoctorSettings``), in the order printed."""
    job = settings.run.job  # the job's own settings: the topics, checkpoint and rule it would use
    props = kafka_config_pairs(job.kafka_config)
    timeout = settings.timeout_seconds
    clusters = [_Cluster("telemetry cluster", job.bootstrap_servers)]
    watched = settings.watched_bootstrap_servers
    if watched and watched != job.bootstrap_servers:
        clusters.append(_Cluster("watched cluster", watched))
    rows: list[Row] = []
    try:
        for c in clusters:
            rows += _connect(c, props, timeout)
            if c.probe is not None:
                rows += _brokers(c, timeout)
        tel = clusters[0]
        if tel.snap is None:
            rows.append(Row("isrwatch topics", SKIP, "the telemetry cluster did not answer"))
        else:
            rows += _topics(tel.snap, job, on_watched=len(clusters) == 1)
            newest, telemetry_row = _newest_telemetry(tel.snap, job, props, timeout)
            rows.append(telemetry_row)
            watched_probe = clusters[-1].probe
            answers = watched_probe.describe_configs(timeout) if watched_probe is not None else ConfigAnswers()
            rows.append(_lag_setting(job, newest, answers))
            rows.append(_rule_variant(job, watched_probe, newest))
            if answers.min_isr:
                rows.append(_min_isr_setting(answers))
        rows.append(_checkpoint(job, tel))
    finally:
        for c in clusters:
            if c.probe is not None:
                c.probe.close()
    rows += [
        _http_check("alertmanager", url.rstrip("/") + "/api/v2/status", timeout, _am_found)
        for url in settings.run.alerting.alertmanager_url
    ] or [Row("alertmanager", SKIP, "no --alertmanager-url: the job prints alerts on stdout only")]
    rows += [
        _http_check("exporter", url.rstrip("/") + "/metrics", timeout, _metrics_found) for url in settings.exporter_url
    ] or [Row("exporter", SKIP, "no --exporter-url given")]
    return rows


# -- Kafka -----------------------------------------------------------------------------


def _connect(c: _Cluster, props: dict[str, str], timeout: float) -> list[Row]:
    """The cluster's metadata from the first bootstrap server that answers, each tried on
    its own (a paused one must not hide the others)."""
    started = time.monotonic()
    silent: list[str] = []
    reason = ""
    for server in [s.strip() for s in c.bootstrap.split(",") if s.strip()]:
        probe = ClusterProbe(kafka_python_config(server, props), round_timeout_s=timeout)
        try:
            snap = probe.connect(timeout)
        except IsrwatchError as e:
            probe.close()
            silent.append(server)
            reason = str(e)
            continue
        c.probe, c.snap = probe, snap
        break
    if c.snap is None:
        return [
            Row(
                c.role,
                FAIL,
                reason if len(silent) == 1 else f"no answer from {', '.join(silent)} ({reason})",
                "check --bootstrap-servers (host:port of a broker), that Kafka runs, and --kafka-config for "
                "security settings",
            )
        ]
    snap = c.snap
    leaders = {p.leader for p in snap.partitions}
    found = (
        f"{len(snap.brokers)} brokers, {len({p.topic for p in snap.partitions})} topics, metadata in "
        f"{(time.monotonic() - started) * 1000:.0f} ms"
        + (f" (no answer from bootstrap {', '.join(silent)})" if silent else "")
    )
    if -1 in leaders:
        leaderless = sorted(f"{p.topic}[{p.partition}]" for p in snap.partitions if p.leader == -1)
        return [Row(c.role, FAIL, f"{found}; no leader for {', '.join(leaderless[:5])}", "a broker is down")]
    return [Row(c.role, WARN if silent else OK, found, "a bootstrap server did not answer" if silent else "")]


def _brokers(c: _Cluster, timeout: float) -> list[Row]:
    """A row a broker: does it accept a connection, and answer a metadata request, how fast."""
    assert c.probe is not None and c.snap is not None
    answered = c.probe.answer_times(timeout)
    rows = []
    for broker, address in sorted(c.snap.brokers.items()):
        name = f"broker {broker} ({c.role})"
        if broker in answered:
            rows.append(Row(name, OK, f"{address} answered in {answered[broker] * 1000:.0f} ms"))
            continue
        refused = _tcp_refused(address, timeout)
        if refused:
            rows.append(Row(name, FAIL, f"{address} does not accept connections ({refused})", "start the broker"))
        else:
            rows.append(
                Row(
                    name,
                    FAIL,
                    f"{address} accepts connections but did not answer within {timeout:g} s",
                    "the broker is paused, overloaded or cut off: check its process (state T = stopped), GC "
                    "and disk; its followers will drop out of the ISR",
                )
            )
    return rows


def _tcp_refused(address: str, timeout: float) -> str | None:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as e:
        return e.strerror or type(e).__name__


def _topics(snap: Snapshot, settings: Any, on_watched: bool) -> list[Row]:
    names = [
        ("telemetry topic", settings.telemetry_topic),
        ("state topic", settings.state_topic),
        ("alerts topic", settings.alerts_topic),
        ("dead-letter topic", settings.deadletter_topic),
    ]
    by_topic: dict[str, list[Any]] = {}
    for p in snap.partitions:
        by_topic.setdefault(p.topic, []).append(p)
    rows = []
    for role, topic in names:
        parts = by_topic.get(topic)
        check = f"{role} {topic}"
        if not parts:
            rows.append(
                Row(
                    check,
                    FAIL,
                    "missing",
                    "create it before the first start (docs/deploy.md, 'Two layouts': several partitions, spread "
                    "over the brokers)",
                )
            )
            continue
        leaders = sorted({p.leader for p in parts})
        rf = max(len(p.replicas) for p in parts)
        found = f"{len(parts)} partitions, leaders {','.join(map(str, leaders))}, replication factor {rf}"
        if len(leaders) < min(2, len(snap.brokers)):
            rows.append(
                Row(check, WARN, found, "one broker leads every partition: when it hangs, so does isrwatch's path")
            )
        elif on_watched and rf > 1:
            rows.append(
                Row(
                    check,
                    WARN,
                    found,
                    "replicated on the watched cluster: a hung follower holds its records back until the leader "
                    "drops it (docs/deploy.md, 'Why one replica on the watched cluster')",
                )
            )
        else:
            rows.append(Row(check, OK, found))
    return rows


def _newest_telemetry(
    snap: Snapshot, settings: Any, props: dict[str, str], timeout: float
) -> tuple[dict[str, Any] | None, Row]:
    """The newest telemetry record (decoded) and the row saying how old it is."""
    from confluent_kafka import Consumer, TopicPartition

    from isrwatch.telemetry import decode_record

    topic = settings.telemetry_topic
    check = "newest telemetry"
    parts = [p.partition for p in snap.partitions if p.topic == topic]
    if not parts:
        return None, Row(check, SKIP, f"no topic {topic}")
    ends = {p: snap.hw[(topic, p)] for p in parts if (topic, p) in snap.hw}
    silent = sorted(set(parts) - set(ends))
    wanted = [TopicPartition(topic, p, end - 1) for p, end in ends.items() if end > 0]
    newest: dict[str, Any] | None = None
    if wanted:
        consumer = Consumer(
            librdkafka_config(
                settings.bootstrap_servers,
                props,
                **{"group.id": "isrwatch-doctor", "enable.auto.commit": False, "logger": _quiet()},
            )
        )
        try:
            consumer.assign(wanted)
            left = {tp.partition for tp in wanted}
            deadline = time.monotonic() + timeout
            while left and time.monotonic() < deadline:
                for m in consumer.consume(len(left), timeout=min(0.5, max(0.05, deadline - time.monotonic()))):
                    if m.error() is not None or m.partition() not in left:
                        continue
                    left.discard(m.partition())
                    try:
                        rec = decode_record(m.value() or b"")
                    except ValueError:
                        continue
                    if newest is None or rec.sent_ms > newest["sent_ms"]:
                        newest = {"sent_ms": rec.sent_ms, "cluster": rec.cluster, "record": rec}
            silent += sorted(left)
        finally:
            consumer.close()
    late = f"; partitions {','.join(map(str, sorted(set(silent))))} did not answer" if silent else ""
    if newest is None:
        found = "no telemetry record" + late
        return None, Row(check, FAIL, found, "start isrwatch collect against the watched cluster")
    age = time.time() - newest["sent_ms"] / 1000
    found = f"from cluster {newest['cluster']!r}, {age:.1f} s old{late}"
    if age > settings.stale_after_seconds:
        return newest, Row(
            check,
            FAIL,
            found,
            f"older than --stale-after-seconds ({settings.stale_after_seconds:g}): is isrwatch collect running?",
        )
    return newest, Row(check, WARN if silent else OK, found, "a leader of the telemetry topic hangs" if silent else "")


def _lag_setting(settings: Any, newest: dict[str, Any] | None, answers: ConfigAnswers) -> Row:
    """The brokers' ``replica.lag.time.max.ms`` where they say it (DescribeConfigs, Kafka 0.11 on:
    the collector writes each partition's leader's into the telemetry), else the one the
    collector reports, against the job's setting."""
    check = "replica.lag.time.max.ms"
    reported = None
    if newest is not None:
        values = {o.lag_time_max_ms for o in newest["record"].observations if o.lag_time_max_ms}
        reported = max(values) if values else None
    job = settings.lag_time_max_ms
    read = answers.lag_time_max_ms
    if read:
        return _lag_read(check, read, answers, reported, job)
    if reported is None:
        return Row(
            check,
            SKIP if job else WARN,
            f"the telemetry does not say; the job uses {job or 30000} ms" + ("" if job else " (its default)"),
            "" if job else "give isrwatch collect and run --lag-time-max-ms = the brokers' replica.lag.time.max.ms",
        )
    if job and job != reported:
        return Row(
            check,
            WARN,
            f"the collector reports {reported} ms, the job's --lag-time-max-ms is {job} ms (the telemetry's wins)",
            "set both to the brokers' replica.lag.time.max.ms",
        )
    return Row(check, OK, f"{reported} ms (from the collector; the brokers' own is not readable before Kafka 0.11)")


def _lag_read(check: str, read: dict[int, int], answers: ConfigAnswers, reported: int | None, job: int | None) -> Row:
    """The lag row when some brokers said theirs: where each value came from, and what differs."""
    values = sorted(set(read.values()))
    each = ", ".join(f"broker {b}: {ms}" for b, ms in sorted(read.items()))
    unread = sorted(w for w in answers.unread if w.startswith("broker "))
    found = (
        f"{values[0]} ms on every broker that answered (DescribeConfigs)" if len(values) == 1 else f"{each} ms"
    ) + (f"; not read: {', '.join(unread)} ({answers.unread[unread[0]]})" if unread else "")
    if len(values) > 1:
        return Row(
            check,
            WARN,
            f"the brokers differ: {found}",
            "give every broker the same replica.lag.time.max.ms (the collector writes each partition's "
            "leader's value, so a partition's rule changes with its leader)",
        )
    if reported is not None and reported != values[0]:
        return Row(
            check,
            WARN,
            f"{found}; the collector reports {reported} ms (its --lag-time-max-ms wins over the brokers')",
            "drop isrwatch collect's --lag-time-max-ms, or set it to the brokers' value",
        )
    if reported is None and job and job != values[0]:
        return Row(
            check,
            WARN,
            f"{found}; the job's --lag-time-max-ms is {job} ms and the telemetry does not say (yet)",
            "drop the job's --lag-time-max-ms, or set it to the brokers' value",
        )
    return Row(check, WARN if unread else OK, found + ("" if reported is None else "; the collector reports the same"))


def _variant_name(rule: Rule, idle: bool) -> str:
    if rule is Rule.KIP16_REFINED and idle:
        return f"{rule.value}, a follower at the leader's log end never out of sync"
    return rule.value


def _rule_variant(settings: Any, probe: ClusterProbe | None, newest: dict[str, Any] | None) -> Row:
    """The rule variant the job gives the watched cluster and why: ``--rule`` when given, else
    the variant of the Kafka version its brokers' ApiVersions answers show, which the
    collector writes into the telemetry (``isrwatch.rule.chosen_rule``; docs/rule.md)."""
    check = "rule variant"
    auto = settings.rule == AUTO
    cfg = RuleConfig(Rule.KIP16_REFINED, by_version=True) if auto else RuleConfig(Rule.parse(settings.rule))
    version = probe.kafka_version if probe is not None else None
    where = (
        f"the brokers answer ApiVersions as Kafka {version}"
        if version
        else "no broker answered ApiVersions (Kafka 0.9): the collector writes no version"
    )
    stated = ""
    if newest is not None:
        said = newest["record"].kafka_version
        stated = f"; the newest telemetry (cluster {newest['cluster']!r}) states {said or 'no version'}"
    rule, idle, why = chosen_rule(cfg, version)
    found = f"{_variant_name(rule, idle)} ({why}); {where}{stated}"
    if auto:
        hint = "" if version else "; give --rule kip16 for Kafka 0.9's own rule"
        return Row(check, OK, found + hint)
    own_rule, own_idle, _ = chosen_rule(RuleConfig(Rule.KIP16_REFINED, by_version=True), version)
    if version and _variant_name(own_rule, own_idle) != _variant_name(rule, idle):
        return Row(
            check,
            WARN,
            f"{found}, whose own variant is {_variant_name(own_rule, own_idle)}",
            "leave --rule out: the job then picks each cluster's variant from its Kafka version",
        )
    return Row(check, OK, found)


def _min_isr_setting(answers: ConfigAnswers) -> Row:
    """Each topic's ``min.insync.replicas`` as the brokers say it (the value in effect)."""
    by_value: dict[int, list[str]] = {}
    for topic, n in sorted(answers.min_isr.items()):
        by_value.setdefault(n, []).append(topic)
    found = "; ".join(
        f"{n} for {len(ts)} topic{'s' if len(ts) > 1 else ''} ({', '.join(ts[:3])}{', ...' if len(ts) > 3 else ''})"
        for n, ts in sorted(by_value.items())
    )
    unread = sorted(w for w in answers.unread if w.startswith("topic "))
    if unread:
        return Row(
            "min.insync.replicas", WARN, f"{found}; not read: {len(unread)} topics ({answers.unread[unread[0]]})"
        )
    return Row("min.insync.replicas", OK, f"{found} (DescribeConfigs; the collector writes each topic's)")


# -- the checkpoint --------------------------------------------------------------------


def _checkpoint(settings: Any, tel: _Cluster) -> Row:
    directory = settings.checkpoint_dir or origins.default_checkpoint_dir(
        settings.bootstrap_servers, settings.telemetry_topic
    )
    check = "checkpoint"
    try:
        made_for = origins.recorded_origin(directory)
    except IsrwatchError as e:
        return Row(check, FAIL, str(e), "")
    if made_for is None:
        return Row(check, OK, f"{directory}: none yet (the job starts one)")
    cluster_id = tel.probe.cluster_id if tel.probe else None
    here = origins.kafka_origin(settings.bootstrap_servers, settings.telemetry_topic, cluster_id)
    problem = origins.not_made_for(directory, made_for, here)
    if problem:
        return Row(check, FAIL, f"made for {made_for.describe()}", problem.split(": ", 1)[-1])
    offsets = origins.checkpoint_offsets(directory, origins.QUERY_DIR)
    if offsets and tel.snap is not None:
        topic = settings.telemetry_topic
        high = {topic: {str(p): hw for (t, p), hw in tel.snap.hw.items() if t == topic}}
        past = origins.offsets_past_end(offsets, high)
        if past:
            topic, p, off, hi = past[0]
            return Row(
                check,
                WARN,
                f"{directory}: at offset {off} of {topic}[{p}], which ends at {hi}"
                + (f" (and {len(past) - 1} more partitions)" if len(past) > 1 else ""),
                "the topic was created again or its log cut back: the job reads it from its new end once "
                "that has stayed behind 10 s, and what was written there before the job looks is not read",
            )
    return Row(check, OK, f"{directory}: made for {made_for.describe()}")


# -- HTTP ------------------------------------------------------------------------------


def _http_check(check: str, url: str, timeout: float, found: Callable[[bytes], tuple[str, str]]) -> Row:
    started = time.monotonic()
    try:
        ctx = ssl.create_default_context() if url.startswith("https") else None
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:  # noqa: S310 (the user's URL)
            body = r.read(4 << 20)
    except urllib.error.HTTPError as e:
        return Row(check, FAIL, f"{url}: HTTP {e.code}", "check the URL (base URL, without a path)")
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        return Row(check, FAIL, f"{url}: {reason}", "is it running, and is the URL right?")
    status, text = found(body)
    return Row(check, status, f"{url}: {text}, in {(time.monotonic() - started) * 1000:.0f} ms")


def _am_found(body: bytes) -> tuple[str, str]:
    try:
        data = jsontext.loads(body)  # any answer: JSON, or a ValueError (nesting too deep included)
        return OK, f"Alertmanager {data['versionInfo']['version']}, cluster {data['cluster']['status']}"
    except (ValueError, KeyError, TypeError):
        return FAIL, "answered, but not as Alertmanager's v2 status"


def _metrics_found(body: bytes) -> tuple[str, str]:
    text = body.decode("utf-8", "replace")
    up = [line for line in text.splitlines() if line.startswith("isrwatch_up ")]
    if not up:
        return FAIL, "answered, but without isrwatch_up: not an isrwatch /metrics"
    try:
        value = float(up[0].split()[1])
    except (IndexError, ValueError):
        return FAIL, f"answered, but its isrwatch_up line is not a sample: {up[0][:80]!r}"
    if value != 1.0:
        return FAIL, "isrwatch_up is 0: its input (the state topic or telemetry) is not healthy"
    return OK, "isrwatch_up 1"


def _quiet() -> Any:
    import logging

    return logging.getLogger("doctor.rdkafka")


def summary(rows: Iterable[Row]) -> bool:
    """True when nothing failed."""
    return all(r.status != FAIL for r in rows)
