"""Self-healing from the client: the master decides, the client's Spark jobs carry it out.

There are no storage daemons (DESIGN §1), so the process that can copy a tablet is a client
that runs Spark jobs. :class:`Healer` runs in the
:class:`~pyspark_kudu.spark.api.context.KuduContext` (``spark.kudu.heal.enabled``, default on)
and, every ``interval_s`` (sooner when the master is about to count a silent tablet server
as failed, :meth:`Healer.next_wait`):

1. asks the leader master for its re-replication plan
   (:func:`~pyspark_kudu.master.redrive.replication_plan`): the master alone decides which
   tablet servers have failed (unheard of for ``follower_unavailable_considered_failed_sec``)
   and, with its placement policy, where new replicas go;
2. carries out at most ``max_moves`` actions, each on the tablet's leader (this client
   elects itself for the tablet if it does not lead it; a writer elsewhere is fenced and its
   write fails retryably, as with any leader change): ``add_replica`` creates the replica,
   adds it as a NON_VOTER, copies the tablet to it and promotes it once caught up, then
   (as Kudu's leader does) evicts the failed or REPLACE-marked voter it replaces, the plan's
   ``replacing`` (3-4-3 in one action); ``promote_replica`` finishes an add that was
   interrupted, the same way; ``remove_replica`` evicts a doomed replica left over (e.g. an
   eviction that failed). Each action runs on the replication service's round
   thread, so writes and membership changes of one tablet never interleave inside a round;
3. reports each new configuration to the master (a tablet report with its Raft index);
   when nothing needs healing and ``rebalance`` is on (``spark.kudu.autoRebalance``, off by
   default as Kudu's auto-rebalancer), carries out up to ``max_moves`` of the master's
   rebalancing moves (``move_replica``: add the new replica, then remove the old one), so
   that placement compliance and balance come back on their own, e.g. after a lost rack
   returns;
4. every ``sweep_every`` passes, lists the replicas on every tablet server with an executor
   and deletes those the catalog says are evicted or belong to deleted tables
   (:func:`~pyspark_kudu.master.redrive.pending_actions`' ``delete_tablet``: only replicas
   the catalog knows, never a true orphan).

``heal_once`` is the same pass, callable directly (tests, ``jobs/``).

Thread-safety: thread-safe; passes (the daemon's or a direct ``heal_once``) run one at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyspark_kudu.errors import KuduError

__all__ = ["HealAction", "Healer", "HealerTarget"]

_log = logging.getLogger(__name__)
#: How long after a server's expected failure time the daemon asks for a plan again.
_AFTER_DUE_S = 0.05
#: Passes the daemon runs back to back while they make progress (a 3-4-3 replacement's
#: steps), before it waits for the next interval again.
_MAX_BACK_TO_BACK = 8


@dataclass(frozen=True)
class HealAction:
    """One action of a pass and how it ended (``outcome`` is "ok" or the error)."""

    action: str
    tablet_id: str
    ts_uuid: str
    table: str
    outcome: str
    seconds: float
    at: float = field(default_factory=time.time)
    replacing: str = ""  # add/promote: the doomed voter evicted in the same action


class HealerTarget(Protocol):
    """What the healer needs from its client (the ``KuduContext`` provides it)."""

    def replication_plan(self, max_actions: int) -> list[dict[str, Any]]: ...

    def execute_replication_actions(self, actions: Sequence[dict[str, Any]]
                                    ) -> list[tuple[KuduError | None, float]]:
        """Per action: its error (None if done) and its duration (-1: skipped as stale)."""
        ...

    def sweep_replicas(self) -> int: ...

    def rebalance_plan(self, max_moves: int) -> list[dict[str, Any]]: ...

    def next_failure_in(self) -> float | None:
        """Seconds until the master counts the next silent server as failed, as of the
        last plan (None: none pending)."""
        ...


class Healer:
    """Runs :meth:`heal_once` every ``interval_s`` on a daemon thread (see module docs)."""

    def __init__(self, target: HealerTarget, interval_s: float = 5.0, max_moves: int = 4,
                 sweep_every: int = 6, rebalance: bool = False,
                 on_action: Callable[[HealAction], None] | None = None) -> None:
        self._target = target
        self.rebalance = rebalance
        self.interval_s = interval_s
        self.max_moves = max_moves
        self.sweep_every = max(1, sweep_every)
        self._on_action = on_action
        self.history: list[HealAction] = []
        self.passes = 0
        self.swept = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._pass_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="kudu-healer")

    def start(self) -> Healer:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """Whether the daemon thread is alive."""
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=120)

    def heal_once(self, rebalance: bool | None = None) -> list[HealAction]:
        """One pass: the plan's actions (at most ``max_moves``), then maybe a sweep.
        ``rebalance`` overrides the healer's own setting for this pass."""
        with self._pass_lock:
            return self._pass(self.rebalance if rebalance is None else rebalance)

    def until_quiet(self, timeout_s: float, rebalance: bool = False, poll_s: float = 1.0
                    ) -> tuple[bool, list[HealAction]]:
        """Passes until the master has nothing left to do (no re-replication and, with
        ``rebalance``, no rebalancing move), or ``timeout_s`` passed. Returns whether it got
        quiet and every action taken. A server not yet declared failed is not "to do"."""
        end = time.monotonic() + timeout_s
        done: list[HealAction] = []
        while True:
            acts = self.heal_once(rebalance)
            done.extend(acts)
            if not acts:
                left = self._target.replication_plan(1) or (
                    rebalance and self._target.rebalance_plan(1))
                if not left:
                    return True, done
            if time.monotonic() > end:
                return False, done
            if not acts or all(a.outcome != "ok" for a in acts):
                # Nothing could be done yet (e.g. a server not yet declared failed): pace
                # the passes. Not ``_stop``: callers driving passes themselves stop the
                # background thread first.
                time.sleep(poll_s)

    def _pass(self, rebalance: bool) -> list[HealAction]:
        self.passes += 1
        done: list[HealAction] = []
        plan = self._target.replication_plan(self.max_moves)[:self.max_moves]
        if not plan and rebalance:
            plan = self._target.rebalance_plan(self.max_moves)[:self.max_moves]
        # Actions of different tablets run concurrently (at most ``max_moves`` of them).
        try:
            results = self._target.execute_replication_actions(plan)
        except KuduError as e:  # the whole batch failed (e.g. the service is closing)
            results = [(e, 0.0)] * len(plan)
        for act, (err, seconds) in zip(plan, results, strict=True):
            outcome = ("skipped: stale plan" if err is None and seconds < 0 else
                       "ok" if err is None else f"{type(err).__name__}: {err}")
            seconds = max(seconds, 0.0)
            if err is not None:
                _log.warning("healing: %s of tablet %s on %s failed: %s", act["action"],
                             act["tablet_id"], act["ts_uuid"], err)
            rec = HealAction(str(act["action"]), str(act["tablet_id"]), str(act["ts_uuid"]),
                             str(act.get("table_name", "")), outcome, seconds,
                             replacing=str(act.get("replacing", "")))
            done.append(rec)
            if self._on_action is not None:
                self._on_action(rec)
        self.history.extend(done)
        if self.passes % self.sweep_every == 0:
            self.swept += self._target.sweep_replicas()
        return done

    def next_wait(self) -> float:
        """How long the daemon waits before its next pass: ``interval_s``, or less when
        the master will count a silent tablet server as failed sooner (the last plan's
        ``next_failure_in_s``): the pass then comes right after, so replacing a lost
        server's replicas starts at the failure threshold, not up to a whole interval
        later (measured: the first action came 0.1-1.5 s after the master's threshold with
        a 1 s interval)."""
        due = self._target.next_failure_in()
        if due is None:
            return self.interval_s
        return min(self.interval_s, max(_AFTER_DUE_S, due + _AFTER_DUE_S))

    def _run(self) -> None:
        while not self._stop.wait(self.next_wait()):
            try:
                # More steps of a replacement may be due right away, after progress only:
                # an action that failed (e.g. no leader could be elected yet) waits for the
                # next pass, or its retries would hold the round thread from every write.
                # At most _MAX_BACK_TO_BACK passes in a row: an action that succeeds without
                # changing what the master plans must not spin.
                for _ in range(_MAX_BACK_TO_BACK):
                    if self._stop.is_set() or not any(
                            a.outcome == "ok" for a in self.heal_once()):
                        break
            except KuduError as e:
                self.last_error = f"{type(e).__name__}: {e}"
                _log.warning("healing pass failed: %s", e)
            except Exception as e:  # the SparkContext may be stopping under us
                self.last_error = f"{type(e).__name__}: {e}"
                _log.warning("healing pass failed: %s", e)
