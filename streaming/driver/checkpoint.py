"""The driver's part of the checkpoint: the alert book and what it reflects.

Spark checkpoints the source offsets and the per-replica state; the alerts
the job has already announced live here, next to them
(``<checkpoint>/isrwatch/alerts.json``), written atomically (temporary file,
fsync, rename) after each batch. A restarted job loads the book and skips
the transitions of every batch id it already handled, so a batch Spark
re-runs after a crash announces nothing twice.

``side.json`` does the same for the batch's dead letters and ISR change
counts: the last batch id whose output was written.

``alertmanager-backlog.json`` (``DeliveryBacklog``) holds the resolutions an
Alertmanager has not taken yet, so that a job stopped or killed while one is
down still resolves those alerts once it is back (firing alerts need no file:
the restored book sends them again).

``forgotten.json`` holds the replicas the driver forgot as gone or elected leader, each with
its telemetry time, for the forget time (``Monitor._forgotten``): a record from before that,
read after a restart, does not bring the replica back.

``identities.json`` holds what each watched cluster's collector said of it (its cluster id and
brokers' addresses, ``streaming.driver.identity``), so a job restarted while its telemetry stands
still knows which watched cluster its own look at the brokers speaks of.

``alerts-outbox.json`` (``AlertsOutbox``) holds the alerts-topic records of transitions the
topic has not confirmed yet, written before the book that says they were announced: a job
killed between the two re-sends them on restart (``streaming.driver.notify.KafkaAlertsSink``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast  # Any: JSON read back from the files (_read, _key)

from isrwatch.alerts import AlertBook, AlertKey, PostableAlert
from isrwatch.exceptions import IsrwatchError

__all__ = ["DriverCheckpoint", "DeliveryBacklog", "AlertsOutbox"]

log = logging.getLogger("streaming.checkpoint")


def _write_atomic(path: Path, data: Mapping[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, separators=(",", ":"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:  # Any: a JSON value, which each reader checks
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise IsrwatchError(
            f"checkpoint file {path} is unreadable ({e}); move the checkpoint away to start fresh"
        ) from None
    if not isinstance(data, dict):
        raise IsrwatchError(f"checkpoint file {path} is not a JSON object; move the checkpoint away to start fresh")
    return data


# The query side.json's batch ids belong to (the job's one query).
_QUERY = "isrwatch"


class DriverCheckpoint:
    def __init__(self, checkpoint_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(checkpoint_dir) / "isrwatch"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    @property
    def alerts_path(self) -> Path:
        return self.dir / "alerts.json"

    @property
    def side_path(self) -> Path:
        return self.dir / "side.json"

    def load_book(self) -> tuple[AlertBook, int]:
        """The saved book and the last batch id it reflects (-1: none)."""
        data = _read(self.alerts_path)
        if data is None:
            return AlertBook(), -1
        return AlertBook.from_json(data.get("active", [])), int(data.get("batch_id", -1))

    def save_book(self, book: AlertBook, batch_id: int) -> None:
        with self._lock:
            _write_atomic(self.alerts_path, {"batch_id": batch_id, "active": book.to_json()})

    @property
    def forgotten_path(self) -> Path:
        return self.dir / "forgotten.json"

    def load_forgotten(self) -> dict[tuple[str, str, int, int], int]:
        """(cluster, topic, partition, broker) -> the telemetry time it was forgotten at; empty
        when there is no file. A file that cannot be read is logged and left: the memory only
        keeps late records out, and the replicas' forget time still ends what they bring back."""
        try:
            data = _read(self.forgotten_path) or {}
            return {(str(c), str(t), int(p), int(b)): int(at) for c, t, p, b, at in data.get("replicas", [])}
        except (IsrwatchError, TypeError, ValueError) as e:
            log.warning("forgotten_replicas_unreadable path=%s error=%s", self.forgotten_path, str(e).splitlines()[0])
            return {}

    def save_forgotten(self, forgotten: dict[tuple[str, str, int, int], int]) -> None:
        with self._lock:
            _write_atomic(self.forgotten_path, {"replicas": [[*k, at] for k, at in forgotten.items()]})

    @property
    def identities_path(self) -> Path:
        return self.dir / "identities.json"

    def load_identities(self) -> dict[str, dict[str, object]]:
        """cluster -> what its collector said of it (``Identities.as_json``); empty when there is
        no file. A file that cannot be read is logged and left: the next telemetry says it again."""
        try:
            data = _read(self.identities_path) or {}
            clusters = data.get("clusters", {})
            return {str(c): dict(v) for c, v in clusters.items()} if isinstance(clusters, dict) else {}
        except (IsrwatchError, TypeError, ValueError, AttributeError) as e:
            log.warning("identities_unreadable path=%s error=%s", self.identities_path, str(e).splitlines()[0])
            return {}

    def save_identities(self, identities: Mapping[str, Mapping[str, object]]) -> None:
        with self._lock:
            _write_atomic(self.identities_path, {"clusters": identities})

    def load_side(self) -> int:
        """The last batch id whose dead letters and ISR change counts were written
        (-1: none; also for the file of the earlier separate side query, whose batch
        ids were its own)."""
        data = _read(self.side_path)
        if data is None or data.get("query") != _QUERY:
            return -1
        return int(data.get("batch_id", -1))

    def save_side(self, batch_id: int) -> None:
        with self._lock:
            _write_atomic(self.side_path, {"batch_id": batch_id, "query": _QUERY})


class DeliveryBacklog:
    """Per Alertmanager URL, the resolutions it has not taken yet: ``(alert key, wire body)``
    pairs (``streaming.driver.notify.AlertmanagerSink`` writes it whenever the set changes)."""

    def __init__(self, checkpoint_dir: str | os.PathLike[str]) -> None:
        self.path = Path(checkpoint_dir) / "isrwatch" / "alertmanager-backlog.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def load(self) -> dict[str, list[tuple[AlertKey, PostableAlert]]]:
        """URL -> [(key, body)]; empty when there is no file. A file that cannot be read is
        logged and left (the alerts it held expire at their endsAt in Alertmanager)."""
        try:
            data = _read(self.path) or {}
            return {
                url: [(_key(item["key"]), cast(PostableAlert, dict(item["body"]))) for item in items]
                for url, items in dict(data.get("targets", {})).items()
            }
        except (IsrwatchError, KeyError, TypeError, ValueError) as e:
            log.warning("alertmanager_backlog_unreadable path=%s error=%s", self.path, str(e).splitlines()[0])
            return {}

    def save(self, pending: Mapping[str, list[tuple[AlertKey, PostableAlert]]]) -> None:
        targets = {url: [{"key": key, "body": body} for key, body in items] for url, items in pending.items() if items}
        _write_atomic(self.path, {"targets": targets})


class AlertsOutbox:
    """The alerts-topic records (key, value) not yet confirmed by the topic, oldest first."""

    def __init__(self, checkpoint_dir: str | os.PathLike[str]) -> None:
        self.path = Path(checkpoint_dir) / "isrwatch" / "alerts-outbox.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def load(self) -> list[tuple[bytes, bytes]]:
        """The records; empty when there is no file. A file that cannot be read is logged and
        left (its transitions may then be missing on the topic, never repeated)."""
        try:
            data = _read(self.path) or {}
            return [(str(k).encode(), str(v).encode()) for k, v in data.get("records", [])]
        except (IsrwatchError, TypeError, ValueError) as e:
            log.warning("alerts_outbox_unreadable path=%s error=%s", self.path, str(e).splitlines()[0])
            return []

    def save(self, records: list[tuple[bytes, bytes]]) -> None:
        """Raises OSError (a full disk): the caller must not announce what is not saved."""
        _write_atomic(self.path, {"records": [[k.decode(), v.decode()] for k, v in records]})


def _key(raw: Any) -> AlertKey:  # Any: a JSON value, [name, [[label, value], ...]]
    """An alert key read back from JSON (lists) as the tuples ``Alert.key`` is made of."""
    name, labels = raw
    return str(name), tuple((str(k), str(v)) for k, v in labels)
