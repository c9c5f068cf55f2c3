"""When the healer's daemon runs its next pass: every ``interval_s``, or right after the
master is due to count a silent tablet server as failed (the plan's ``next_failure_in_s``)."""

from __future__ import annotations

import time
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


class _Stuck(_Target):
    """A target whose one action fails every time (e.g. no leader can be elected), or
    succeeds ``ok_steps`` times in a row (the steps of one replacement) before it runs out."""

    def __init__(self, ok_steps: int = 0) -> None:
        super().__init__()
        self.failing = True
        self.ok_steps = ok_steps
        self.executed = 0

    def replication_plan(self, max_actions: int) -> list[dict[str, Any]]:
        plan = super().replication_plan(max_actions)
        self.due = None  # due once: later passes come only from the daemon's own loop
        return plan

    def execute_replication_actions(self, actions: Sequence[dict[str, Any]]
                                    ) -> list[tuple[KuduError | None, float]]:
        self.executed += 1
        if self.ok_steps > 0:
            self.ok_steps -= 1
            self.failing = self.ok_steps > 0
            return [(None, 0.01)] * len(actions)
        return [(KuduError("no replica could become leader"), 0.01)] * len(actions)


def test_a_failing_action_waits_for_the_next_pass_instead_of_holding_the_round_thread() -> None:
    """The daemon retries at once only after progress: a pass whose actions all failed is
    followed by the next one an interval later, so writes get the round thread meanwhile
    (a CI fault run showed ~50 elections in 20 s and a write workload starved)."""
    target = _Stuck()
    healer = Healer(target, interval_s=0.5)
    healer.start()
    try:
        wait_until(lambda: target.executed >= 2, 30, "a second pass after the failed one")
    finally:
        healer.stop()
    gaps = [b.at - a.at for a, b in zip(healer.history, healer.history[1:], strict=False)]
    assert gaps and min(gaps) >= 0.4, (
        f"failed actions were retried without waiting for the interval: {gaps}")


def test_the_steps_of_a_replacement_follow_each_other_without_waiting() -> None:
    """Progress (an action that succeeded) is followed by the next pass at once: three
    steps with an hour-long interval all run."""
    target = _Stuck(ok_steps=3)
    healer = Healer(target, interval_s=3600.0)
    target.due = 0.0
    healer.start()
    try:
        wait_until(lambda: sum(a.outcome == "ok" for a in healer.history) == 3, 30,
                   "three successful steps in a row")
    finally:
        healer.stop()


def test_actions_that_succeed_without_changing_the_plan_do_not_spin() -> None:
    """An action reported ok that leaves the plan as it was (a CI fault run: 2,731 passes
    in minutes) runs back to back a bounded number of times (8), then waits for the
    interval (an hour here)."""
    target = _Stuck(ok_steps=10**9)
    healer = Healer(target, interval_s=3600.0)
    target.due = 0.0
    healer.start()
    try:
        wait_until(lambda: target.executed >= 8, 30, "eight passes back to back")
        time.sleep(0.5)  # a spinning daemon would run many more passes meanwhile
    finally:
        healer.stop()
    assert target.executed == 8, target.executed
