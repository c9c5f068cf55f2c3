"""When the healer's daemon runs its next pass: every ``interval_s``, or right after the
master is due to count a silent tablet server as failed (the plan's ``next_failure_in_s``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from pyspark_kudu.errors import KuduError
from pyspark_kudu.spark.healing.healer import Healer
from tests.waiting import wait_until

pytestmark = pytest.mark.unit


class _Target:
    """A healer target whose master has nothing to do until ``failing`` is set."""

    def __init__(self) -> None:
        self.due: float | None = None
        self.plans = 0
        self.failing = False

    def replication_plan(self, max_actions: int) -> list[dict[str, Any]]:
        self.plans += 1
        return [{"action": "remove_replica", "tablet_id": "t", "ts_uuid": "ts0",
                 "table_name": "tb"}] if self.failing else []

    def execute_replication_actions(self, actions: Sequence[dict[str, Any]]
                                    ) -> list[tuple[KuduError | None, float]]:
        self.failing = False
        return [(None, 0.01)] * len(actions)

    def sweep_replicas(self) -> int:
        return 0

    def rebalance_plan(self, max_moves: int) -> list[dict[str, Any]]:
        return []

    def next_failure_in(self) -> float | None:
        return self.due


@pytest.mark.parametrize("due, wait", [(None, 5.0), (60.0, 5.0), (1.0, 1.05), (0.0, 0.05)])
def test_the_next_pass_comes_right_after_a_silent_server_is_due_to_fail(
        due: float | None, wait: float) -> None:
    target = _Target()
    target.due = due
    assert Healer(target, interval_s=5.0).next_wait() == pytest.approx(wait)


def test_the_daemon_acts_when_the_failure_is_due_not_a_whole_interval_later() -> None:
    """With an hour-long interval the only way the daemon can act within the deadline is
    the due time the target reported."""
    target = _Target()
    healer = Healer(target, interval_s=3600.0)
    target.due = 0.2
    target.failing = True
    healer.start()
    try:
        wait_until(lambda: len(healer.history) == 1, 60,
                   "the healer's pass at the reported failure time")
    finally:
        target.due = None
        healer.stop()
    assert healer.history[0].action == "remove_replica" and healer.history[0].outcome == "ok"
