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
3. ``clients`` workload threads, each its own client id, client ``i`` on session
   ``i % sessions`` (two sessions of one application, **not** two applications: two driver
   processes, each with its own twin Spark cluster, are too heavy for the 2-core test
   machine -- two writer applications are covered by ``tests/cluster/test_two_writers.py``).
   Each does single-row ``insert`` /
   ``upsert`` / ``delete`` with unique values and full-table reads, recorded in
   ``DIR/history.jsonl`` (:mod:`.history`). Outcomes: ``ok``; ``RowWriteError`` -> the
   rejected row ``fail``\\s; ``InvalidArgumentError`` (raised before anything is proposed)
   -> ``fail``; anything else (``FencedError``, ``RoundFailedError``, timeouts, Spark job
   failures) -> ``info``.
4. After ``warmup_s`` without faults, the :class:`FaultInjector` runs the schedule (one
   fault at a time: the next waits for the previous one to heal, up to
   ``recover_deadline_s``); from the start a sampler runs ksck
   (:mod:`pyspark_kudu.tools.cluster`) every second into ``DIR/samples.jsonl``.
5. After the last fault, the run waits up to ``restore_deadline_s`` for full replication:
   ksck reports every tablet HEALTHY and every voter sits on a host that has an executor
   (a lost host's tablet server must have been replaced). Re-replication is the client's
   healer (:mod:`pyspark_kudu.spark.healing.healer`, every second here); not getting there within
   the deadline is reported ``"not restored"`` and fails the run (exit 2) after the checks.
6. Workload stops; the whole table is read; :func:`.checker.check`; ``report.json`` and
   ``timeline.png``; exit 1 on any violation, 2 when the run itself broke.

Thread-safety: :func:`run` owns everything it starts; the workload threads share the
``KuduContext``\\s (thread-safe) and one :class:`HistoryWriter` (thread-safe).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import random
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pyspark_kudu.errors import InvalidArgumentError, RowWriteError
from pyspark_kudu.tools.faults.checker import CheckResult, check
from pyspark_kudu.tools.faults.history import HistoryWriter, Key, Value, load_history
from pyspark_kudu.tools.faults.inject import FaultEvent, FaultInjector, plan_schedule
from pyspark_kudu.tools.faults.report import write_report

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
    recover_deadline_s: float = 30.0
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
    budget_s: float = 540.0
    budget_grace_s: float = 150.0
    # MiB of a tmpfs mounted as the last worker's data root, for ``disk_full`` (0: none).
    small_disk_mb: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


MODES: dict[str, HarnessConfig] = {
    "short": HarnessConfig(),
    "long": HarnessConfig(mode="long", workers=6, clients=3, keys=12, buckets=3,
                          warmup_s=20.0, fault_window_s=300.0, tail_s=20.0,
                          restore_deadline_s=300.0, unresponsive_s=10.0, down_s=(8.0, 30.0),
                          gap_s=(5.0, 15.0), small_disk_mb=1024, budget_s=1800.0,
                          kinds=("kill_executor", "restart_worker", "corrupt_replica",
                                 "disk_full", "pause_host")),
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


# == workload =====================================================================================


class _Workload:
    """Client threads issuing single-row writes and full reads until stopped."""

    def __init__(self, sessions: Sequence[tuple[Any, Any]], history: HistoryWriter,
                 cfg: HarnessConfig) -> None:
        """``sessions``: (KuduContext, SparkSession) pairs; client ``i`` uses pair
        ``i % len(sessions)``, the final reader the first."""
        from pyspark.sql.types import LongType, StringType, StructField, StructType

        self.sessions = list(sessions)
        self.history = history
        self.cfg = cfg
        self.row = StructType([StructField("id", LongType(), False),
                               StructField("v", StringType(), True)])
        self.key_only = StructType([StructField("id", LongType(), False)])
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(f"c{i}",), daemon=True,
                                         name=f"fault-client-{i}")
                        for i in range(cfg.clients)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, deadline_s: float) -> list[str]:
        """Stop and wait; returns the clients still blocked in a call after the deadline
        (their last op stays without completion: unknown outcome)."""
        self.stop.set()
        end = time.monotonic() + deadline_s
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def _session(self, client: str) -> tuple[Any, Any]:
        i = int(client[1:]) if client[1:].isdigit() else 0
        return self.sessions[i % len(self.sessions)]

    def _client(self, client: str) -> None:
        rng = random.Random(f"{self.cfg.seed}/{client}")
        kinds = [k for k, _ in self.cfg.mix]
        weights = [w for _, w in self.cfg.mix]
        seq = 0
        while not self.stop.is_set():
            kind = rng.choices(kinds, weights)[0]
            if kind == "read":
                self.read(client)
            else:
                seq += 1
                self.write(client, kind, rng.randrange(self.cfg.keys), f"{client}-{seq}")
            self.stop.wait(self.cfg.op_pause_s)  # pacing only

    def write(self, client: str, kind: str, key: int, value: str) -> None:
        val: Value = None if kind == "delete" else value
        kudu, spark = self._session(client)
        op = self.history.invoke(client, kind, [key], [val])
        try:
            if kind == "delete":
                df = spark.createDataFrame([(key,)], self.key_only)
            else:
                df = spark.createDataFrame([(key, value)], self.row)
            kudu.write(df, TABLE, kind)
        except RowWriteError as e:
            rejected: dict[Key, str] = {}
            for _, row, status, _ in e.errors:
                rid = row.get("id")
                if isinstance(rid, int):
                    rejected[rid] = status
            if key in rejected:
                self.history.ok(op, row_errors=rejected)
            else:  # a rejection we cannot attribute: do not guess
                self.history.info(op, f"RowWriteError: {e}")
        except InvalidArgumentError as e:  # validated before anything was proposed
            self.history.fail(op, f"InvalidArgumentError: {e}")
        except Exception as e:  # FencedError, RoundFailedError, Spark job failures, ...
            self.history.info(op, f"{type(e).__name__}: {e}")
        else:
            self.history.ok(op)

    def read(self, client: str) -> dict[Key, Value] | None:
        keys = list(range(self.cfg.keys))
        kudu, _ = self._session(client)
        op = self.history.invoke(client, "read", keys)
        try:
            # Linearizable: with two writers, a READ_LATEST read may miss what the other
            # acknowledged (or a deposed leader's client its own successor's writes).
            rows = kudu.read_table(TABLE, read_mode="linearizable").collect()
        except Exception as e:
            self.history.info(op, f"{type(e).__name__}: {e}")
            return None
        results: dict[Key, Value] = dict.fromkeys(keys)
        for r in rows:
            results[int(r["id"])] = r["v"]
        self.history.ok(op, results=results)
        return results


# == replication sampling =========================================================================


class _Sampler:
    """ksck every second (plus ground truth: voters on hosts without an executor)."""

    def __init__(self, master_address: str, clock: Callable[[], float],
                 executor_hosts: Callable[[], set[str]], path: Path) -> None:
        from pyspark_kudu.master.client import MasterClient

        self.client = MasterClient(master_address, timeout_s=3.0, rpc_timeout_s=2.0)
        self.clock = clock
        self.executor_hosts = executor_hosts
        self.path = path
        self.samples: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ksck-sampler")

    def start(self) -> _Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        self.client.close()

    def recent(self, n: int) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(s) for s in self.samples[-n:]]

    def sample(self) -> dict[str, Any]:
        from pyspark_kudu.tools.cluster import RECOVERING, UNAVAILABLE, UNDER_REPLICATED, ksck
        from pyspark_kudu.tools.connect import RemoteSource

        t = self.clock()
        state = RemoteSource(self.client).state()
        snap = state.snapshot()
        result = ksck(snap)
        statuses = [u["Status"] for u in result.unhealthy_tablets]
        hosts = self.executor_hosts()
        by_uuid = {ts.uuid: ts.host for ts in snap.tservers}
        rfs = {t.table_id: t.replication_factor for t in snap.tables}
        short = sum(1 for tb in snap.tablets
                    if sum(1 for r in tb.voters if by_uuid.get(r.ts_uuid) in hosts)
                    < rfs.get(tb.table_id, 3))
        return {"t": round(t, 2), "under_replicated": statuses.count(UNDER_REPLICATED),
                "unavailable": statuses.count(UNAVAILABLE),
                "recovering": statuses.count(RECOVERING),
                "tablets": len(snap.tablets), "live_tservers": len(state.live or ()),
                "tservers": len(snap.tservers), "executor_hosts": len(hosts),
                "voters_on_down_hosts": short}

    def _run(self) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    s = self.sample()
                except Exception as e:  # master busy or restarting: a gap in the samples
                    s = {"t": round(self.clock(), 2), "error": f"{type(e).__name__}: {e}"}
                with self._lock:
                    self.samples.append(s)
                f.write(json.dumps(s) + "\n")
                f.flush()
                self._stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))


def _fully_replicated(s: dict[str, Any]) -> bool:
    return ("error" not in s and s.get("tablets", 0) > 0
            and not s["under_replicated"] and not s["unavailable"] and not s["recovering"]
            and not s["voters_on_down_hosts"])


def _restored_after(recent: list[dict[str, Any]], faults_end: float) -> float | None:
    """Seconds from the end of the faults to full replication, once the last three samples
    (all taken after the faults ended) show it -- one clean sample right after a kill may
    predate the driver noticing the lost executor."""
    if len(recent) < 3 or not all(_fully_replicated(s) and float(s["t"]) >= faults_end
                                  for s in recent):
        return None
    return max(0.0, float(recent[0]["t"]) - faults_end)


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
        self.on_expire: Callable[[], None] = lambda: None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fault-watchdog")

    def start(self) -> _Watchdog:
        self._thread.start()
        return self

    def done(self) -> None:
        self._done.set()

    def _dump(self, why: str) -> None:
        with open(self.stacks, "a", encoding="utf-8") as f:
            f.write(f"== {why}\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        faulthandler.dump_traceback(sys.stderr, all_threads=True)

    def _run(self) -> None:
        if self._done.wait(self.budget_s):
            return
        self.expired = True
        self.log(f"the run exceeded its budget of {self.budget_s:.0f} s: thread stacks in "
                 f"{self.stacks}; cancelling Spark jobs and stopping the workload")
        self._dump(f"budget of {self.budget_s:.0f} s exceeded")
        try:
            self.on_expire()
        except Exception as e:
            self.log(f"watchdog: {type(e).__name__}: {e}")
        if self._done.wait(self.grace_s):
            return
        self._dump(f"still running {self.grace_s:.0f} s after the budget: exiting")
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


def _mount_tmpfs(where: Path, size_mb: int) -> str:
    """Mount a private ``size_mb`` MiB tmpfs at ``where``; "" or why it could not."""
    where.mkdir(parents=True, exist_ok=True)
    try:
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700",
                              "tmpfs", str(where)], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run mount ({e})"
    if out.returncode != 0:
        return f"mounting a tmpfs failed ({out.stderr.strip() or out.returncode})"
    return ""


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
        f"{cfg.clients} client threads over {cfg.sessions} SparkSessions of one application, "
        "each session with its own KuduContext (independent clients; the lease holder of a "
        "tablet leads it, the other forwards); two applications with twin clusters are too "
        "heavy for 2 cores",
    ]
    cluster = StandaloneCluster(outdir / "spark", workers=cfg.workers, cores=1)
    disk_host: str | None = None
    small = outdir / "small-disk"
    if cfg.small_disk_mb and "disk_full" in cfg.kinds:
        host = f"127.0.0.{cluster.first_host + cfg.workers - 1}"
        why = _mount_tmpfs(small, cfg.small_disk_mb)
        if why:
            notes.append(f"disk_full not planned: {why}")
        else:
            disk_host = host
            cluster.data_roots[host] = small
            notes.append(f"the data root of {host} is a {cfg.small_disk_mb} MiB tmpfs "
                         f"(disk_full faults fill it)")
    master = MasterProcess(outdir / "kudu-master", cfg.unresponsive_s)
    spark: Any = None
    kudu: Any = None
    others: list[Any] = []  # the KuduContexts of the other sessions
    history: HistoryWriter | None = None
    sampler: _Sampler | None = None
    injector: FaultInjector | None = None
    workload: _Workload | None = None
    plan: list[FaultEvent] = list(schedule or [])
    final: dict[Key, Value] | None = None
    faults_end: float | None = None
    restored_after: float | None = None
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
        if not plan:
            plan = plan_schedule(random.Random(cfg.seed), cluster.hosts, cfg.fault_window_s,
                                 kinds=cfg.kinds, lose_host=cfg.lose_host, rf=cfg.replicas,
                                 disk_host=disk_host,
                                 down_s=cfg.down_s, gap_s=cfg.gap_s)
        (outdir / "schedule.json").write_text(json.dumps(
            {"seed": cfg.seed, "mode": cfg.mode, "events": [e.to_dict() for e in plan]},
            indent=2) + "\n", encoding="utf-8")
        log(f"seed {cfg.seed}; schedule: " + json.dumps([e.to_dict() for e in plan]))

        history = HistoryWriter(outdir / "history.jsonl", {"seed": cfg.seed, "mode": cfg.mode})
        sampler = _Sampler(master.address, history.now, hosts_up,
                           outdir / "samples.jsonl").start()
        workload = _Workload([(kudu, spark), *((o, o.spark) for o in others)], history, cfg)
        workload.start()
        time.sleep(cfg.warmup_s)  # fault-free warm-up of the workload (pacing)
        def healthy() -> bool:
            recent = sampler.recent(2) if sampler is not None else []
            return len(recent) == 2 and all(_fully_replicated(x) for x in recent)

        injector = FaultInjector(cluster, plan, history.now, lambda h: h in hosts_up(),
                                 recover_deadline_s=cfg.recover_deadline_s,
                                 healthy=healthy, heal_deadline_s=cfg.restore_deadline_s
                                 ).start()
        window_end = max([cfg.fault_window_s, *(e.at_s + e.duration_s for e in plan)])
        if not injector.join(window_end + len(plan) * (cfg.recover_deadline_s + 15.0) + 30.0
                             + 2 * cfg.restore_deadline_s):
            errors.append("the fault injector did not finish its schedule in time")
        faults_end = history.now()
        log(f"faults over at {faults_end:.1f} s; waiting up to {cfg.restore_deadline_s:.0f} s "
            "for full replication")
        restore_end = time.monotonic() + cfg.restore_deadline_s
        tail_end = time.monotonic() + cfg.tail_s
        while time.monotonic() < max(restore_end if restored_after is None else 0.0,
                                     tail_end) and not watchdog.expired:
            if restored_after is None:
                restored_after = _restored_after(sampler.recent(3), faults_end)
                if restored_after is not None:
                    log(f"full replication after {restored_after:.1f} s")
            time.sleep(0.5)  # polling the sampler under the deadline above
        if restored_after is None:
            log("full replication NOT restored within the deadline")
            errors.append(f"full replication was not restored within "
                          f"{cfg.restore_deadline_s:.0f} s after the faults stopped")
        stuck = workload.join(60.0)
        if stuck:
            errors.append(f"client threads still blocked after the workload stopped: {stuck}")
        final = _final_read(workload, history, deadline_s=0.0 if watchdog.expired else 60.0)
        if final is None:
            errors.append("the final read of the whole table failed until its deadline")
        errors.extend(_undetected_corruption(injector.snapshot()))
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
        for closer in (*(o.close for o in others), kudu.close if kudu is not None else None,
                       spark.stop if spark is not None else None, master.stop, cluster.stop):
            if closer is None:
                continue
            try:
                closer()
            except Exception as e:
                errors.append(f"shutdown: {type(e).__name__}: {e}")
        if disk_host is not None:
            subprocess.run(["umount", str(small)], check=False, capture_output=True)
        if watchdog.expired:
            errors.insert(0, f"the run exceeded its budget of {cfg.budget_s:.0f} s (thread "
                             f"stacks at that moment: {outdir / 'stacks.txt'})")
    watchdog.done()
    return _finish(cfg, outdir, plan, faults, sampler, final, faults_end, restored_after,
                   errors, notes, time.monotonic() - wall0, log)


def _undetected_corruption(faults: list[dict[str, Any]]) -> list[str]:
    """Every WAL :func:`.inject.corrupt_replica` damaged must have been found failed (the
    injector waits for the replica's ``failed`` marker); one never found is an error."""
    return [f"the replica corrupted on {f['host']} was not found failed: {f['note']}"
            for f in faults if f["kind"] == "corrupt_replica" and f["start"] is not None
            and "found failed" not in str(f.get("note", ""))]


def _struct() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType([StructField("id", LongType(), False), StructField("v", StringType(),
                                                                          True)])


def _final_read(workload: _Workload, history: HistoryWriter, deadline_s: float
                ) -> dict[Key, Value] | None:
    """The whole table, retried until ``deadline_s`` (a tablet may be electing). Recorded as
    an op of client ``reader`` too; the checker also gets it as the final contents."""
    end = time.monotonic() + deadline_s
    while True:
        got = workload.read("reader")
        if got is not None:
            return got
        if time.monotonic() > end:
            return None
        time.sleep(1.0)  # retry pacing under the deadline


def _finish(cfg: HarnessConfig, outdir: Path, plan: Sequence[FaultEvent],
            faults: list[dict[str, Any]], sampler: _Sampler | None,
            final: dict[Key, Value] | None, faults_end: float | None,
            restored_after: float | None, errors: list[str], notes: list[str],
            wall_s: float, log: Callable[[str], None]) -> RunOutcome:
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
    report = write_report(
        outdir, config=cfg.to_dict(), seed=cfg.seed, schedule=[e.to_dict() for e in plan],
        faults=faults, ops=ops, result=result,
        samples=sampler.samples if sampler is not None else [], faults_end=faults_end,
        restored_after_s=restored_after, replay=replay, notes=notes,
        extra={"errors": errors, "wall_time_s": round(wall_s, 1),
               "final_rows": None if final is None else sum(v is not None
                                                            for v in final.values())})
    if result is not None:
        for v in result.violations:
            log(f"VIOLATION {v.kind} key={v.key!r} ops={list(v.ops)}: {v.explanation}")
        if result.inconclusive:
            log(f"inconclusive keys (search bound hit): {list(result.inconclusive)}")
    code = 1 if result is not None and not result.valid else (2 if errors or not ops else 0)
    log(f"{len(ops)} ops; violations: {len(result.violations) if result else 'not checked'}; "
        f"errors: {errors or 'none'}; report {report}; wall time {wall_s:.0f} s")
    log(f"seed {cfg.seed}; replay with: {replay}")
    return RunOutcome(code, report, result, list(plan), errors)


def with_overrides(cfg: HarnessConfig, **overrides: Any) -> HarnessConfig:
    """``cfg`` with the given fields replaced (None values are ignored)."""
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
