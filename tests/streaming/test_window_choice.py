"""Which replicas a batch puts through the window (unit: ``BatchHandler._observed_only``
alone; that both choices give the same state and rows is tests/streaming/test_state_table.py's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from streaming.lifecycle.handler import BatchHandler


@pytest.mark.parametrize(
    ("observed_before", "held_before", "observed_only"),
    [
        (0, 0, False),  # the first batch: nothing known, the whole window
        (0, 1_000_000, False),  # the batch before observed nothing (an empty batch): the whole window
        (200_000, 1_000_000, True),  # 1M replicas polled every 5 s at a 1 s trigger: one in five
        (499_999, 1_000_000, True),
        (500_000, 1_000_000, False),  # half of them: matching the carried rows costs more than it saves
        (20_000, 20_000, False),  # every replica in every batch
    ],
)
def test_only_the_observed_replicas_go_through_the_window_when_the_batch_before_saw_under_half(
    observed_before, held_before, observed_only
) -> None:
    handler = SimpleNamespace(_observed_before=observed_before, _held_before=held_before)
    assert BatchHandler._observed_only(handler) is observed_only  # type: ignore[arg-type]
