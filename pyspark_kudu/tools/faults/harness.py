"""The fault run: a standalone Spark cluster, an RF=3 table, a workload under a seeded fault
schedule, the replication state sampled every second, then the checker and the report.

Shape of a run (``python -m pyspark_kudu.tools.faults --mode short --seed 1 --out DIR``):

1. A :class:`StandaloneCluster` (``workers`` workers, 1 core each, data roots under
   ``DIR/spark``), a one-process master with a short tablet-server timeout
   (:mod:`.master`), one Spark application with ``sessions`` SparkSessions (the first and
   ``newSession()``\\s of it), each with its own :class:`KuduContext`: independent clients.
   A tablet is led by the client holding its leadership lease
   (:mod:`pyspark_kudu.spark.replication.lease_keeper`); the others forward their writes, read
   points and replication actions to it, so a tablet
   copy is not fenced by the other writer (before leases the two fenced each other all run
   long and healing starved). Only the first context runs the healer. Reads are
   ``linearizable`` (``read_table``): a READ_LATEST read may miss another writer's
   acknowledged writes, which the checker reports (it did).
2. ``create_table`` of an RF=3 table hash-partitioned on ``id`` over a small key space.
3. ``clients`` workload threads (:mod:`.workload`), each its own client id, client ``i`` on
   session ``i % sessions`` (two sessions of one application, **not** two applications: two
   driver processes, each with its own twin Spark cluster, are too heavy for the 2-core test
   machine -- two writer applications are covered by ``tests/cluster/test_two_writers.py``).
   Each does single-row ``insert`` / ``upsert`` / ``delete`` with unique values and
   full-table reads, recorded in ``DIR/history.jsonl`` (:mod:`.history`). Only the errors
   documented as outcome unknown make an op ``info``; any other error fails the run (exit
   2) with its traceback.
4. After ``warmup_s`` without faults, the :class:`.injector.FaultInjector` runs the schedule,
   one fault at a time, each once its precondition holds (a destructive fault: full
   replication again); a precondition unmet within ``precondition_deadline_s`` fails the run
   naming the fault and what did not happen -- every scheduled fault is applied or the run
   fails. From the start a sampler (:mod:`.sampler`) records ksck every second into
   ``DIR/samples.jsonl``. ``disk_full`` injects ENOSPC through the product's FileIO
   (``PYSPARK_KUDU_FULL_DISKS``, set for the whole cluster before it starts).
5. After the last fault, the run waits up to ``restore_deadline_s`` for full replication:
   ksck reports every tablet HEALTHY, every voter sits on a host that has an executor
   (a lost host's tablet server must have been replaced) and none is marked failed.
   Re-replication is the client's healer (:mod:`pyspark_kudu.spark.healing.healer`, every
   second here); not getting there within the deadline is reported ``"not restored"`` and
   fails the run (exit 2) after the checks.
6. Workload stops; the whole table is read; :func:`.checker.check`; ``report.json`` and
   ``timeline.png``; exit 1 on any violation, 2 when the run itself broke.

Deadlines are sized for a machine twice as slow as the 2-core CI machine; they bound waits
on conditions, never a sleep that hopes something happened.

Thread-safety: :func:`run` owns everything it starts; the workload threads share the
``KuduContext``\\s (thread-safe) and one :class:`HistoryWriter` (thread-safe).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pyspark_kudu.fileio import FULL_DISKS_ENV
from pyspark_kudu.tools.faults.chaos import (
    ACK_GOAL,
    ChaosInjector,
    ChaosWorkload,
    run_chaos,
    tserver_view,
)
from pyspark_kudu.tools.faults.chaos_report import chaos_summary, log_lines, plot_writes
from pyspark_kudu.tools.faults.checker import CheckResult, check
from pyspark_kudu.tools.faults.diagnose import replication_state
from pyspark_kudu.tools.faults.history import HistoryWriter, Key, Value, load_history
from pyspark_kudu.tools.faults.inject import FaultEvent, plan_schedule
from pyspark_kudu.tools.faults.injector import FaultInjector
from pyspark_kudu.tools.faults.report import write_report
from pyspark_kudu.tools.faults.sampler import ReplicationSampler, restored_after
from pyspark_kudu.tools.faults.workload import Workload

__all__ = ["MODES", "HarnessConfig", "RunOutcome", "run"]

_log = logging.getLogger(__name__)
TABLE = "faults"


@dataclass(frozen=True)
class HarnessConfig:
    """Everything a run depends on (saved in the report; ``seed`` drives the schedule and
    the clients' choices, not Spark's timing)."""

    mode: str = "short"
    seed: int = 1
    workers: int = 4
    clients: int = 2
    # Independent clients, one KuduContext per SparkSession of the application.
    sessions: int = 2
    keys: int = 6
    buckets: int = 2
    replicas: int = 3
    warmup_s: float = 8.0
    fault_window_s: float = 48.0
    tail_s: float = 5.0
    restore_deadline_s: float = 150.0
    unresponsive_s: float = 6.0
    # When the master declares a silent tablet server failed and has its replicas replaced
    # (None: after ``unresponsive_s``, as fast as it notices).
    failed_after_s: float | None = None
    # How long a fault waits for its precondition (full replication again, an executor on
    # the host, a replica WAL worth corrupting) before the run fails: full replication
    # takes ~20-40 s here after a fault, twice that on a machine twice as slow.
    precondition_deadline_s: float = 150.0
    # How long a kill's span waits for a new executor on the host (3-30 s here, the longer
    # on a loaded machine; not an error when exceeded: a later fault on that host waits for
    # an executor as its precondition).
    recover_deadline_s: float = 60.0
    lose_host: bool = True
    kinds: tuple[str, ...] = ("kill_executor", "restart_worker", "corrupt_replica",
                              "pause_host")
    down_s: tuple[float, float] = (8.0, 12.0)
    gap_s: tuple[float, float] = (4.0, 7.0)
    op_pause_s: float = 0.05
    mix: tuple[tuple[str, float], ...] = (("insert", 0.25), ("upsert", 0.35),
                                          ("delete", 0.15), ("read", 0.25))
    startup_deadline_s: float = 180.0
    executor_memory: str = "512m"
    # A replication round's Spark job is cancelled (a failed round, retried) after this:
    # shorter than a pause_host fault, so that rounds waiting on a paused host time out and
    # the host is left out as suspect (rounds here move little data and take ~0.3-2 s).
    round_timeout_s: float = 8.0
    # The whole run's budget: past it the watchdog dumps every thread's stack to
    # ``stacks.txt``, cancels the Spark jobs and stops the workload, so a stuck run still
    # ends with a report and an error naming what hung; ``budget_grace_s`` later it exits.
    # A hang guard, not a speed target: a short run takes ~2.5 min on an idle 2-core
    # machine and ~7 min on one loaded by other test clusters (seed 2, issue 19).
    budget_s: float = 720.0
    budget_grace_s: float = 150.0
    # Chaos mode (:mod:`.chaos`): one client's ``format("kudu")`` upserts of ``chaos_rows``
    # keys each, at most ``chaos_writes`` of them within ``fault_window_s``, while an
    # executor is killed every ``chaos_period_s``; reads with ``kudu.readMode`` =
    # ``chaos_read_mode``. ``chaos_ack_goal`` is reported, never an exit code.
    chaos: bool = False
    chaos_period_s: float = 8.0
    chaos_rows: int = 200
    chaos_writes: int = 30
    chaos_read_mode: str = "read_latest"
    chaos_ack_goal: float = ACK_GOAL
    # How long the chaos writes may run past ``fault_window_s``: the write under way when the
    # window closes finishes and is read back (measured on the loaded 2-core machine: a write
    # riding through failed rounds for 200 s, its read-back as long).
    chaos_write_grace_s: float = 600.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


MODES: dict[str, HarnessConfig] = {
    "short": HarnessConfig(),
    "long": HarnessConfig(mode="long", workers=6, clients=3, keys=12, buckets=3,
                          warmup_s=20.0, fault_window_s=300.0, tail_s=20.0,
                          restore_deadline_s=300.0, unresponsive_s=10.0, down_s=(8.0, 30.0),
                          gap_s=(5.0, 15.0), budget_s=1800.0,
                          kinds=("kill_executor", "restart_worker", "corrupt_replica",
                                 "disk_full", "pause_host")),
    # What a user sees: product defaults where they shape the outcome (a tablet server
    # silent 30 s is unavailable and failed -- replaced -- after 300 s, rounds time out
    # after 300 s): the kills are transient, so nothing is re-replicated.
    "chaos": HarnessConfig(mode="chaos", chaos=True, workers=6, clients=1, sessions=1,
                           keys=1000, buckets=3, warmup_s=5.0, fault_window_s=240.0,
                           tail_s=5.0, restore_deadline_s=300.0, unresponsive_s=30.0,
                           failed_after_s=300.0,
                           lose_host=False, kinds=("kill_executor",), round_timeout_s=300.0,
                           budget_s=1800.0),
}


@dataclass
class RunOutcome:
    """What :func:`run` produced: the checker's verdict (None if the run broke before the
    check), the report path and the process exit code."""

    exit_code: int
    report: Path | None
    result: CheckResult | None
    schedule: list[FaultEvent] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


# == the run ======================================================================================


class _Watchdog:
    """Ends a run that outlives its budget instead of letting it hang (CI must get a report
    and a reason, not a killed process): after ``budget_s`` it dumps every thread's stack to
    ``stacks.txt`` and stderr, records the overrun as an error, and calls ``on_expire``
    (cancel Spark's jobs, stop the workload); ``grace_s`` after that, a run still not done
    exits the process (status 2) with a second dump."""

    def __init__(self, budget_s: float, grace_s: float, stacks: Path,
                 log: Callable[[str], None]) -> None:
        self.budget_s = budget_s
        self.grace_s = grace_s
        self.stacks = stacks
        self.log = log
        self.expired = False
        # Set when the budget runs out: the run's own waits wait on it, so they end at once.
        self.stop_event = threading.Event()
        self.on_expire: Callable[[], None] = lambda: None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fault-watchdog")

    def start(self) -> _Watchdog:
        self._thread.start()
        return self

    def done(self) -> None:
        self._done.set()

    def dump(self, why: str, to_stderr: bool = True) -> None:
        with open(self.stacks, "a", encoding="utf-8") as f:
            f.write(f"== {why}\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        if to_stderr:
            faulthandler.dump_traceback(sys.stderr, all_threads=True)

    def _run(self) -> None:
        if self._done.wait(self.budget_s):
            return
        self.expired = True
        self.stop_event.set()
        self.log(f"the run exceeded its budget of {self.budget_s:.0f} s: thread stacks in "
                 f"{self.stacks}; cancelling Spark jobs and stopping the workload")
        self.dump(f"budget of {self.budget_s:.0f} s exceeded")
        try:
            self.on_expire()
        except Exception as e:
            self.log(f"watchdog: {type(e).__name__}: {e}")
        if self._done.wait(self.grace_s):
            return
        self.dump(f"still running {self.grace_s:.0f} s after the budget: exiting")
        self.log(f"the run did not end {self.grace_s:.0f} s after its budget: exiting (2)")
        os._exit(2)


def _spark_session(master_url: str, cfg: HarnessConfig, deadline_s: float, want: int) -> Any:
    from pyspark_kudu.testing.standalone_cluster import cluster_session

    # SESSION_CONF (in cluster_session): a barrier stage that asks for a lost host's slot
    # fails fast instead of after the default 15 s x 40 checks (DESIGN §4).
    return cluster_session(master_url, "pyspark-kudu-faults", want,
                           executor_memory=cfg.executor_memory,
                           conf={"spark.sql.shuffle.partitions": str(cfg.workers)},
                           deadline_s=deadline_s)


def replay_command(outdir: Path, cfg: HarnessConfig) -> str:
    return (f"python -m pyspark_kudu.tools.faults --mode {cfg.mode} --seed {cfg.seed} "
            f"--out {outdir}-replay --replay {outdir / 'schedule.json'}")


def run(cfg: HarnessConfig, outdir: Path, schedule: Sequence[FaultEvent] | None = None,
        log: Callable[[str], None] = print) -> RunOutcome:
    """One fault run (see the module docstring). ``schedule`` replays a saved one."""
    from pyspark_kudu.partitioning import HashDimension, PartitionSchema
    from pyspark_kudu.spark.api.context import KuduContext
    from pyspark_kudu.spark.pinned import executor_hosts
    from pyspark_kudu.testing.standalone_cluster import StandaloneCluster
    from pyspark_kudu.tools.faults.master import MasterProcess

    outdir.mkdir(parents=True, exist_ok=True)
    wall0 = time.monotonic()
    errors: list[str] = []
    notes: list[str] = [
        f"chaos: one client, {cfg.chaos_rows}-row format('kudu') upserts (at most "
        f"{cfg.chaos_writes} in {cfg.fault_window_s:.0f} s) each followed by a "
        f"format('kudu') read ({cfg.chaos_read_mode}), an executor killed every "
        f"{cfg.chaos_period_s:g} s" if cfg.chaos else
        f"{cfg.clients} client threads over {cfg.sessions} SparkSessions of one application, "
        "each session with its own KuduContext (independent clients; the lease holder of a "
        "tablet leads it, the other forwards); two applications with twin clusters are too "
        "heavy for 2 cores",
    ]
    # Every process of the run (workers, executors, their tablet servers) checks this
    # full-disk file on each durable write: disk_full faults list a data root in it.
    full_disks_before = os.environ.get(FULL_DISKS_ENV)
    os.environ[FULL_DISKS_ENV] = str(outdir / "full-disks.json")
    cluster = StandaloneCluster(outdir / "spark", workers=cfg.workers, cores=1)
    master = MasterProcess(outdir / "kudu-master", cfg.unresponsive_s, cfg.failed_after_s)
    spark: Any = None
    kudu: Any = None
    others: list[Any] = []  # the KuduContexts of the other sessions
    history: HistoryWriter | None = None
    sampler: ReplicationSampler | None = None
    injector: FaultInjector | None = None
    workload: Workload | None = None
    chaos: ChaosWorkload | None = None
    plan: list[FaultEvent] = list(schedule or [])
    final: dict[Key, Value] | None = None
    faults_end: float | None = None
    restored_s: float | None = None
    watchdog = _Watchdog(cfg.budget_s, cfg.budget_grace_s, outdir / "stacks.txt", log).start()
    try:
        log(f"starting {cfg.workers} Spark workers and a pyspark-kudu master under {outdir}")
        cluster.start(deadline_s=cfg.startup_deadline_s)
        master.start()
        spark = _spark_session(cluster.master_url, cfg, cfg.startup_deadline_s, cfg.workers)
        sc = spark.sparkContext

        def expire() -> None:
            if workload is not None:
                workload.stop.set()
            if injector is not None:
                injector.stop(0.0)
            sc.cancelAllJobs()

        watchdog.on_expire = expire

        def hosts_up() -> set[str]:
            return set(executor_hosts(sc))

        kudu = KuduContext(spark, master=master.address, warehouse=str(outdir / "warehouse"),
                           heal=True, heal_interval_s=1.0, round_timeout_s=cfg.round_timeout_s)
        for n in range(1, cfg.sessions):
            others.append(KuduContext(
                spark.newSession(), master=master.address,
                warehouse=str(outdir / f"warehouse-{n + 1}"), heal=False,
                round_timeout_s=cfg.round_timeout_s))
        kudu.create_table(TABLE, _struct(), keys=["id"], replicas=cfg.replicas,
                          partitioning=PartitionSchema((HashDimension(("id",), cfg.buckets),)))
        if not plan and not cfg.chaos:  # chaos: the kills struck are saved as its schedule
            plan = plan_schedule(random.Random(cfg.seed), cluster.hosts, cfg.fault_window_s,
                                 kinds=cfg.kinds, lose_host=cfg.lose_host, rf=cfg.replicas,
                                 down_s=cfg.down_s, gap_s=cfg.gap_s)
        _save_schedule(outdir, cfg, plan)
        log(f"seed {cfg.seed}; schedule: " + (json.dumps([e.to_dict() for e in plan]) if plan
                                              or not cfg.chaos else
                                              f"a kill every {cfg.chaos_period_s:g} s, hosts "
                                              f"in a seeded rotation"))

        history = HistoryWriter(outdir / "history.jsonl", {"seed": cfg.seed, "mode": cfg.mode})
        sampler = ReplicationSampler(master.address, history.now, hosts_up, cluster.data_root,
                                     outdir / "samples.jsonl").start()
        if cfg.chaos:
            workload = chaos = ChaosWorkload(
                spark, history, table=TABLE, master=master.address, seed=cfg.seed,
                keys=cfg.keys, rows=cfg.chaos_rows, writes=cfg.chaos_writes,
                window_s=cfg.fault_window_s, read_mode=cfg.chaos_read_mode,
                op_pause_s=cfg.op_pause_s, kudu=kudu, diagnose=lambda: tserver_view(kudu))
        else:
            workload = Workload([(kudu, spark), *((o, o.spark) for o in others)], history,
                                table=TABLE, seed=cfg.seed, clients=cfg.clients,
                                keys=cfg.keys, mix=cfg.mix, op_pause_s=cfg.op_pause_s)
        workload.start()
        watchdog.stop_event.wait(cfg.warmup_s)  # fault-free warm-up of the workload (pacing)
        _await_warm(workload, cfg, watchdog)
        if chaos is not None:
            injector = ChaosInjector(cluster, history.now, lambda h: h in hosts_up(),
                                     rng=random.Random(cfg.seed), period_s=cfg.chaos_period_s,
                                     planned=plan or None,
                                     precondition_deadline_s=cfg.precondition_deadline_s,
                                     recover_deadline_s=cfg.recover_deadline_s)
            errors.extend(run_chaos(
                chaos, injector, window_s=cfg.fault_window_s,
                grace_s=cfg.chaos_write_grace_s,
                join_s=cfg.precondition_deadline_s + cfg.recover_deadline_s + 30.0,
                stopped=watchdog.stop_event, log=log))
        else:
            injector = FaultInjector(cluster, plan, history.now, lambda h: h in hosts_up(),
                                     voters_on=sampler.voters_on,
                                     healthy_since=sampler.healthy_since,
                                     precondition_deadline_s=cfg.precondition_deadline_s,
                                     recover_deadline_s=cfg.recover_deadline_s,
                                     detect_deadline_s=cfg.restore_deadline_s).start()
            if not injector.join(injector.bound_s()):
                errors.append(f"the fault injector did not finish its schedule within "
                              f"{injector.bound_s():.0f} s (every wait at its deadline)")
        faults_end = history.now()
        log(f"faults over at {faults_end:.1f} s; waiting up to {cfg.restore_deadline_s:.0f} s "
            "for full replication")
        restore_end = time.monotonic() + cfg.restore_deadline_s
        tail_end = time.monotonic() + cfg.tail_s
        while time.monotonic() < max(restore_end if restored_s is None else 0.0,
                                     tail_end) and not watchdog.expired:
            if restored_s is None:
                restored_s = restored_after(sampler.recent(3), faults_end)
                if restored_s is not None:
                    log(f"full replication after {restored_s:.1f} s")
            watchdog.stop_event.wait(0.5)  # polling the sampler under the deadline above
        if restored_s is None:
            log("full replication NOT restored within the deadline")
            errors.append(f"full replication was not restored within "
                          f"{cfg.restore_deadline_s:.0f} s after the faults stopped")
            state = json.dumps(replication_state(kudu), default=str)
            notes.append(f"replication state when the deadline passed: {state}")
            log(f"replication state now (also in the report's notes; thread stacks in "
                f"{outdir / 'stacks.txt'}): {state}")
            watchdog.dump("full replication not restored", to_stderr=False)
        stuck = workload.join(60.0)
        if stuck:
            errors.append(f"client threads still blocked after the workload stopped: {stuck}")
        final = _final_read(workload, history, deadline_s=0.0 if watchdog.expired else 60.0)
        if final is None and chaos is not None and not watchdog.expired:
            # format("kudu") could not read (an unexpected error: the run fails); the
            # context's own read still lets the checker look for lost writes.
            final = _final_read(workload, history, deadline_s=60.0, client="reader-ctx")
            notes.append("the final read through format('kudu') failed; the final contents "
                         "are from KuduContext.read_table (linearizable)"
                         if final is not None else "no final read succeeded either way")
        if final is None:
            errors.append("the final read of the whole table failed until its deadline")
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}")
        log(traceback.format_exc())
    finally:
        if injector is not None:
            injector.stop(30.0)
        if sampler is not None:
            sampler.stop()
        if history is not None:
            history.close()
        faults = injector.snapshot() if injector is not None else []
        if injector is not None:
            errors.extend(injector.errors)
        if isinstance(injector, ChaosInjector):  # the kills struck are the schedule
            plan = list(injector.events)
            notes.extend(injector.cancelled)
            _save_schedule(outdir, cfg, plan)
        if workload is not None:
            errors.extend(workload.unexpected())
        for closer in (*(o.close for o in others), kudu.close if kudu is not None else None,
                       spark.stop if spark is not None else None, master.stop, cluster.stop):
            if closer is None:
                continue
            try:
                closer()
            except Exception as e:
                errors.append(f"shutdown: {type(e).__name__}: {e}")
        if full_disks_before is None:
            os.environ.pop(FULL_DISKS_ENV, None)
        else:
            os.environ[FULL_DISKS_ENV] = full_disks_before
        if watchdog.expired:
            errors.insert(0, f"the run exceeded its budget of {cfg.budget_s:.0f} s (thread "
                             f"stacks at that moment: {outdir / 'stacks.txt'})")
    watchdog.done()
    return _finish(cfg, outdir, plan, faults, sampler, final, faults_end, restored_s,
                   errors, notes, time.monotonic() - wall0, log, chaos)


def _save_schedule(outdir: Path, cfg: HarnessConfig, plan: Sequence[FaultEvent]) -> None:
    (outdir / "schedule.json").write_text(json.dumps(
        {"seed": cfg.seed, "mode": cfg.mode, "events": [e.to_dict() for e in plan]},
        indent=2) + "\n", encoding="utf-8")


def _await_warm(workload: Workload, cfg: HarnessConfig, watchdog: _Watchdog) -> None:
    """Faults start once every client had a write acknowledged (a run whose workload never
    got going proves nothing), waiting at most ``precondition_deadline_s``."""
    end = time.monotonic() + cfg.precondition_deadline_s
    while True:
        missing = sorted({f"c{i}" for i in range(cfg.clients)} - workload.acked_clients())
        if not missing:
            return
        if time.monotonic() >= end or watchdog.expired:
            raise RuntimeError(
                f"the workload did not warm up: clients {missing} had no write acknowledged "
                f"within {cfg.warmup_s + cfg.precondition_deadline_s:.0f} s of starting, so "
                f"no fault was applied")
        watchdog.stop_event.wait(0.5)  # polling under the deadline above


def _struct() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType([StructField("id", LongType(), False), StructField("v", StringType(),
                                                                          True)])


def _final_read(workload: Workload, history: HistoryWriter, deadline_s: float,
                client: str = "reader") -> dict[Key, Value] | None:
    """The whole table, retried until ``deadline_s`` (a tablet may be electing). Recorded as
    an op of ``client`` too; the checker also gets it as the final contents."""
    end = time.monotonic() + deadline_s
    while True:
        got = workload.read(client)
        if got is not None:
            return got
        if time.monotonic() > end:
            return None
        time.sleep(1.0)  # retry pacing under the deadline above


def _finish(cfg: HarnessConfig, outdir: Path, plan: Sequence[FaultEvent],
            faults: list[dict[str, Any]], sampler: ReplicationSampler | None,
            final: dict[Key, Value] | None, faults_end: float | None,
            restored_after: float | None, errors: list[str], notes: list[str],
            wall_s: float, log: Callable[[str], None],
            chaos: ChaosWorkload | None = None) -> RunOutcome:
    history_path = outdir / "history.jsonl"
    ops = load_history(history_path)[1] if history_path.exists() else []
    result: CheckResult | None = None
    if ops:
        t0 = time.monotonic()
        result = check(ops, final, keys=range(cfg.keys))
        notes.append(f"checker: {len(ops)} ops, {result.keys} keys, {result.states} search "
                     f"states in {time.monotonic() - t0:.2f} s")
        if final is None:
            notes.append("no final read: checked the intermediate reads only")
    replay = replay_command(outdir, cfg)
    extra: dict[str, Any] = {}
    if chaos is not None:
        extra["chaos"] = chaos_summary(
            ops, faults, chaos_ops=chaos.chaos_ops(), chaos_start=chaos.chaos_start,
            chaos_end=chaos.chaos_end, write_errors=chaos.write_errors(),
            read_errors=chaos.read_errors(), goal=cfg.chaos_ack_goal,
            period_s=cfg.chaos_period_s, rows=cfg.chaos_rows)
        plot_writes(outdir / "writes.png", ops, chaos.chaos_ops(), faults)
    report = write_report(
        outdir, config=cfg.to_dict(), seed=cfg.seed, schedule=[e.to_dict() for e in plan],
        faults=faults, ops=ops, result=result,
        samples=sampler.samples if sampler is not None else [], faults_end=faults_end,
        restored_after_s=restored_after, replay=replay, notes=notes,
        extra={"errors": errors, "wall_time_s": round(wall_s, 1),
               "final_rows": None if final is None else sum(v is not None
                                                            for v in final.values()),
               **extra})
    if result is not None:
        for v in result.violations:
            log(f"VIOLATION {v.kind} key={v.key!r} ops={list(v.ops)}: {v.explanation}")
        if result.inconclusive:
            log(f"inconclusive keys (search bound hit): {list(result.inconclusive)}")
    code = 1 if result is not None and not result.valid else (2 if errors or not ops else 0)
    for line in log_lines(extra["chaos"]) if "chaos" in extra else ():
        log(line)
    log(f"{len(ops)} ops; violations: {len(result.violations) if result else 'not checked'}; "
        f"errors: {errors or 'none'}; report {report}; wall time {wall_s:.0f} s")
    log(f"seed {cfg.seed}; replay with: {replay}")
    return RunOutcome(code, report, result, list(plan), errors)


def with_overrides(cfg: HarnessConfig, **overrides: Any) -> HarnessConfig:
    """``cfg`` with the given fields replaced (None values are ignored)."""
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
