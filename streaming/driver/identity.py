"""Which watched cluster carries the job's own telemetry: known, never guessed.

The job watches its telemetry cluster's brokers itself (``streaming.driver.brokerwatch``). What it
sees there speaks of a watched cluster's broker only when that is the same broker:

* the same cluster by its id, where both sides know it (Kafka 0.10.1 and later: the job from
  its telemetry cluster's metadata, the collector from the cluster it polls);
* else (Kafka 0.9 has no cluster id) the same broker id at the same address, as the
  collector of that cluster states its brokers in the telemetry (``endpoints``);
* or the operator names the cluster (``--telemetry-cluster``).

Every other case is unknown, and unknown is not the same: no evidence crosses. Topic names,
partition numbers and broker ids alike prove nothing (clusters built from one template).
docs/deploy.md says what an operator sets, and when.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from isrwatch.logs import kv

__all__ = ["ClusterIdentity", "Identities", "Address", "StatedIdentity"]

log = logging.getLogger("streaming.identity")

Address = tuple[str, int]  # (host, port), the host lower-cased, without IPv6 brackets


class StatedEndpoint(TypedDict):
    broker_id: int
    host: str
    port: int


class StatedIdentity(TypedDict):
    """What a collector says of the cluster it polls (a telemetry record's ``cluster_id`` and
    ``endpoints``), as ``Identities.as_json`` keeps it."""

    cluster_id: str | None
    endpoints: list[StatedEndpoint]


def address(host: str, port: int) -> Address:
    return host.strip("[]").lower(), int(port)


@dataclass(frozen=True)
class ClusterIdentity:
    """A cluster as one side knows it: its id (None on Kafka 0.9) and its brokers' addresses."""

    cluster_id: str | None = None
    endpoints: Mapping[int, Address] = field(default_factory=dict)

    @classmethod
    def stated(cls, payload: Mapping[str, object]) -> ClusterIdentity:
        """What a telemetry record says (``{"cluster_id": ..., "endpoints": [{"broker_id",
        "host", "port"}]}``, as the job's parse hands it over); entries it cannot read are
        left out."""
        endpoints: dict[int, Address] = {}
        given = payload.get("endpoints")
        for e in given if isinstance(given, Iterable) else ():
            if not isinstance(e, Mapping):
                continue
            broker, host, port = e.get("broker_id"), e.get("host"), e.get("port")
            if isinstance(broker, int) and isinstance(host, str) and host and isinstance(port, int):
                endpoints[broker] = address(host, port)
        cluster_id = payload.get("cluster_id")
        return cls(cluster_id if isinstance(cluster_id, str) and cluster_id else None, endpoints)


class Identities:
    """What each watched cluster's collector last said of it, and whether a broker of it is
    one of the telemetry cluster's (``own``: that cluster as the job itself sees it).
    ``named``: the watched cluster the operator said is the telemetry cluster, if any."""

    def __init__(self, named: str | None = None) -> None:
        self.named = named or None
        self._stated: dict[str, ClusterIdentity] = {}
        self._logged: dict[str, str] = {}  # cluster -> how it was last found (logged on change)

    def learn(self, stated: Iterable[tuple[str, Mapping[str, object]]]) -> bool:
        """Take in what collectors said (``streaming.evaluation.batch.BatchOutput.identities``, or the
        checkpoint's copy, ``as_json``); whether anything changed. A broker's address is kept
        until a collector gives it another: a broker hung past its session leaves the
        cluster's metadata, and its address must not go with it."""
        changed = False
        for cluster, payload in stated:
            new = ClusterIdentity.stated(payload)
            old = self._stated.get(cluster, ClusterIdentity())
            merged = ClusterIdentity(new.cluster_id or old.cluster_id, {**old.endpoints, **new.endpoints})
            if merged != old:
                self._stated[cluster] = merged
                changed = True
        return changed

    def as_json(self) -> dict[str, StatedIdentity]:
        """What collectors said, as ``learn`` takes it: kept in the checkpoint, so a job restarted
        while the telemetry stands still (its broker hung) still knows which cluster is which."""
        return {
            cluster: {
                "cluster_id": known.cluster_id,
                "endpoints": [{"broker_id": b, "host": h, "port": p} for b, (h, p) in sorted(known.endpoints.items())],
            }
            for cluster, known in self._stated.items()
        }

    def is_own(self, own: ClusterIdentity, cluster: str, broker_id: int) -> bool:
        """Whether broker ``broker_id`` of watched cluster ``cluster`` is the telemetry
        cluster's broker of that id."""
        return self._how(own, cluster, broker_id) is not None

    def _how(self, own: ClusterIdentity, cluster: str, broker_id: int) -> str | None:
        if cluster == self.named:
            return "setting"
        stated = self._stated.get(cluster)
        if stated is None:
            return None
        if stated.cluster_id and own.cluster_id:
            return "cluster_id" if stated.cluster_id == own.cluster_id else None
        mine = stated.endpoints.get(broker_id)
        return "endpoints" if mine is not None and mine == own.endpoints.get(broker_id) else None

    def own_brokers(
        self, own: ClusterIdentity, clusters: Iterable[str], evidence: Mapping[int, float]
    ) -> dict[tuple[str, int], float]:
        """``evidence`` (telemetry-cluster broker id -> a time), keyed by (cluster, broker id)
        for the watched ``clusters`` whose broker of that id it is; the first finding for a
        cluster, and each change, is logged."""
        out = {}
        for cluster in clusters:
            found = None
            for broker, t in evidence.items():
                how = self._how(own, cluster, broker)
                if how is not None:
                    out[(cluster, broker)] = t
                    found = found or how
            if evidence:
                self._note(cluster, found or "unknown")
        return out

    def _note(self, cluster: str, how: str) -> None:
        if self._logged.get(cluster) != how:
            self._logged[cluster] = how
            if how == "unknown":
                log.info("telemetry_cluster_unknown %s", kv(cluster=cluster, evidence="not used"))
            else:
                log.info("telemetry_cluster_identified %s", kv(cluster=cluster, by=how))
