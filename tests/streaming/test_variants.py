"""streaming.driver.variants: the job says once per cluster which rule variant it gets, and why."""

from __future__ import annotations

import logging

import pytest

from isrwatch.rule import Rule, RuleConfig
from streaming.driver.variants import RuleVariants

AUTO = RuleConfig(Rule.KIP16_REFINED, 10_000, by_version=True)


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "streaming.variants"]


def test_each_cluster_is_said_once_and_again_when_its_version_changes(caplog) -> None:
    caplog.set_level(logging.INFO, logger="streaming.variants")
    said = RuleVariants(AUTO)
    said.stated([("old", {"kafka_version": "0.10.1", "endpoints": []}), ("new", {"kafka_version": "4.0"})])
    said.seen(["old", "new", "sim"])
    said.stated([("old", {"kafka_version": "0.10.1"})])  # the same again: nothing
    said.seen(["old", "new", "sim"])
    assert _lines(caplog) == [
        "event=rule_variant cluster=old rule=kip16 idle_is_caught_up=false kafka_version=0.10.1 reason=Kafka 0.10.1",
        "event=rule_variant cluster=new rule=kip16-refined idle_is_caught_up=true kafka_version=4.0 reason=Kafka 4.0",
        "event=rule_variant cluster=sim rule=kip16-refined idle_is_caught_up=true kafka_version=unknown "
        "reason=no Kafka version in the telemetry: the default",
    ]
    caplog.clear()
    said.stated([("old", {"kafka_version": "2.1"})])  # upgraded
    assert _lines(caplog) == [
        "event=rule_variant cluster=old rule=kip16-refined idle_is_caught_up=true kafka_version=2.1 reason=Kafka 2.1"
    ]


def test_a_rule_given_is_said_for_every_cluster_with_its_reason(caplog) -> None:
    caplog.set_level(logging.INFO, logger="streaming.variants")
    RuleVariants(RuleConfig(Rule.KIP16, 10_000)).stated([("new", {"kafka_version": "4.0"})])
    assert _lines(caplog) == [
        "event=rule_variant cluster=new rule=kip16 idle_is_caught_up=false kafka_version=4.0 reason=given by --rule"
    ]
