"""Which variant of the rule each watched cluster gets, said once per cluster.

Under ``--rule auto`` (the default) the job's Spark expressions pick each row's variant from the
Kafka version its record states (``streaming.evaluation.state.variant_exprs``, ``isrwatch.rule.chosen_rule``);
the driver only says which, from what the collectors state of their clusters
(``parse.side_items``' identity items) and the clusters the batch observed: one INFO line per
cluster, again when its version changes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from isrwatch.logs import kv
from isrwatch.rule import Rule, RuleConfig, chosen_rule

__all__ = ["RuleVariants"]

log = logging.getLogger("streaming.variants")


class RuleVariants:
    """The variant said per cluster (``stated``: what collectors state; ``seen``: clusters observed)."""

    def __init__(self, cfg: RuleConfig) -> None:
        self.cfg = cfg
        self._said: dict[str, str | None] = {}  # cluster -> the Kafka version its line said

    def stated(self, identities: Iterable[tuple[str, Mapping[str, object]]]) -> None:
        """What the batch's records state of their clusters (cluster, payload with ``kafka_version``)."""
        for cluster, payload in identities:
            version = payload.get("kafka_version")
            self._say(cluster, version if isinstance(version, str) else None)

    def seen(self, clusters: Iterable[str]) -> None:
        """Clusters the batch observed: one whose telemetry never stated a version is said once."""
        for cluster in clusters:
            if cluster not in self._said:
                self._say(cluster, None)

    def _say(self, cluster: str, version: str | None) -> None:
        if cluster in self._said and self._said[cluster] == version:
            return
        self._said[cluster] = version
        rule, idle, why = chosen_rule(self.cfg, version)
        log.info(
            kv(
                event="rule_variant",
                cluster=cluster,
                rule=rule.value,
                idle_is_caught_up=str(idle and rule is Rule.KIP16_REFINED).lower(),  # (kip16 has no such branch)
                kafka_version=version or "unknown",
                reason=why,
            )
        )
