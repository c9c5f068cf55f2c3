"""The chaos mode's pure parts (error classification, the kill rotation, the summary) and
its injector on stand-in executor processes (real processes, really killed). The workload
itself runs against real Spark in ``tests/cluster/test_fault_chaos.py``."""

from __future__ import annotations

import itertools
import math
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyspark_kudu.errors import (
    InvalidArgumentError,
    NotLeaderError,
    RoundFailedError,
)
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, WorkerSpec
from pyspark_kudu.tools.faults.chaos import (
    ChaosInjector,
    classify,
    kill_rotation,
    outermost_python_error,
)
from pyspark_kudu.tools.faults.chaos_report import chaos_summary, distribution, log_lines
from pyspark_kudu.tools.faults.checker import check
from pyspark_kudu.tools.faults.history import Op
from pyspark_kudu.tools.faults.inject import FaultEvent, executor_pids

COMMIT_TB = '''Traceback (most recent call last):
  File "/work/main/pyspark_kudu/spark/api/datasource.py", line 391, in commit
    summary = SessionClient(self.plan.address).commit(
              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/work/main/pyspark_kudu/spark/replication/session_client.py", line 226, in call
    raise decode_error(reply.get("error") or {})
pyspark_kudu.errors.{name}: tablet X: no majority
second line of the message
'''


def _tb(name: str) -> str:
    return COMMIT_TB.replace("{name}", name)


class AnalysisException(Exception):
    def __init__(self, msg: str, action: str = "commit or abort") -> None:
        super().__init__(f"[PYTHON_DATA_SOURCE_ERROR] Failed to {action} Python data source "
                         f"write: {msg} SQLSTATE: 38000")
        self.msg = msg
        self.action = action

    def getCondition(self) -> str:
        return "PYTHON_DATA_SOURCE_ERROR"

    def getMessageParameters(self) -> dict[str, str]:
        return {"action": self.action, "type": "write", "msg": self.msg}


class Py4JJavaError(Exception):
    pass


@pytest.mark.parametrize(("name", "outcome"), [
    ("RoundFailedError", "info"), ("FencedError", "info"), ("TimedOutError", "info"),
    ("LocationMappingTimedOutError", "info"), ("InvalidArgumentError", "fail"),
    ("ServiceUnavailableError", None), ("NotLeaderError", None), ("RemoteError", None),
])
def test_a_commit_error_is_unwrapped_from_the_analysis_exception(name: str,
                                                                 outcome: str | None) -> None:
    info = classify(AnalysisException(_tb(name)))
    assert (info.error, info.outcome) == (name, outcome)
    assert info.raised == "AnalysisException"
    assert info.condition == "PYTHON_DATA_SOURCE_ERROR (commit or abort)"
    assert info.message == "tablet X: no majority"
    assert name in info.text()


def test_a_task_error_inside_a_job_abort_is_unwrapped() -> None:
    text = ("An error occurred while calling o681.save.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in "
            "stage 3.0 failed 4 times, most recent failure: Lost task 0.3 (TID 9) (127.0.0.3 "
            "executor 4): org.apache.spark.api.python.PythonException: Traceback (most recent "
            "call last):\n  File \"x.py\", line 1, in f\n    g()\n"
            "pyspark_kudu.errors.TimedOutError: round t: deadline\n\n"
            "\tat org.apache.spark.api.python.BasePythonRunner.handle(X.scala:1)\n")
    info = classify(Py4JJavaError(text))
    assert (info.error, info.outcome, info.raised) == ("TimedOutError", "info", "Py4JJavaError")
    assert info.condition is None


def test_no_python_traceback_is_unexpected_with_the_java_first_line() -> None:
    text = ("An error occurred while calling o681.save.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 2 "
            "failed 4 times: ExecutorLostFailure (executor 3 exited caused by one of the "
            "running tasks) Reason: Command exited with code 137\n\tat org.apache...\n")
    info = classify(Py4JJavaError(text))
    assert info.outcome is None and info.error is None
    assert info.message.startswith("org.apache.spark.SparkException: Job aborted")


def test_a_chain_is_followed_to_its_outermost_exception() -> None:
    chained = ('Traceback (most recent call last):\n  File "a.py", line 1, in f\n    x()\n'
               "pyspark_kudu.errors.FencedError: fenced\n\n"
               "The above exception was the direct cause of the following exception:\n\n"
               'Traceback (most recent call last):\n  File "b.py", line 2, in g\n    y()\n'
               "pyspark_kudu.errors.RemoteError: Py4JJavaError in the kudu session service\n")
    assert outermost_python_error(chained) == ("pyspark_kudu.errors.RemoteError",
                                               "Py4JJavaError in the kudu session service")
    assert classify(AnalysisException(chained)).outcome is None
    flipped = chained.replace("FencedError: fenced", "X").replace(
        "RemoteError: Py4JJavaError in the kudu session service", "RoundFailedError: r")
    assert classify(AnalysisException(flipped)).outcome == "info"
    other = chained.replace("pyspark_kudu.errors.RemoteError", "ConnectionResetError")
    info = classify(AnalysisException(other))
    assert info.outcome is None and info.error == "ConnectionResetError"


def test_a_project_error_raised_directly_and_reads() -> None:
    assert classify(RoundFailedError("r")).outcome == "info"
    assert classify(InvalidArgumentError("bad")).outcome == "fail"
    assert classify(InvalidArgumentError("bad"), write=False).outcome is None
    assert classify(NotLeaderError("n")).outcome is None
    assert classify(KeyError("id")).outcome is None
    tb = AnalysisException(_tb("FencedError"), action="read")
    assert classify(tb, write=False).outcome == "info"


def test_the_rotation_is_seeded_covers_every_host_per_cycle_and_never_repeats() -> None:
    hosts = ["a", "b", "c", "d"]
    for seed in range(30):
        got = kill_rotation(random.Random(seed), hosts, 40)
        assert got == kill_rotation(random.Random(seed), hosts, 40)
        for i in range(0, 40, 4):
            assert sorted(got[i:i + 4]) == hosts
        assert all(a != b for a, b in itertools.pairwise(got)), got
    assert kill_rotation(random.Random(1), hosts, 8) != kill_rotation(random.Random(2), hosts, 8)


def _op(i: int, inv: float, comp: float, outcome: str, keys: tuple[int, ...] = (1, 2),
        error: str = "", kind: str = "upsert", client: str = "c0") -> Op:
    vals = tuple(f"c0-{i}-{k}" for k in keys) if kind != "read" else ()
    return Op(i, client, kind, keys, vals, inv, comp, outcome, error=error)


def test_the_summary_counts_writes_latencies_and_timing_against_kills() -> None:
    ops = [_op(0, 0.0, 1.0, "ok"),  # warm-up: not a chaos write
           _op(1, 10.0, 11.0, "ok"), _op(2, 12.0, 30.0, "info", error="RoundFailedError: x"),
           _op(3, 31.0, 33.0, "ok"), _op(4, 34.0, 40.0, "info", error="unexpected KeyError"),
           _op(5, 41.0, math.inf, "info", error="never completed")]
    faults = [{"kind": "kill_executor", "host": "h1", "start": 15.0},
              {"kind": "kill_executor", "host": "h2", "start": 23.0},
              {"kind": "kill_executor", "host": "h1", "start": 39.0}]
    errs: dict[int, dict[str, Any]] = {
        2: {"raised": "AnalysisException", "condition": "C", "error": "RoundFailedError",
            "message": "x", "outcome": "info"},
        4: {"raised": "KeyError", "condition": None, "error": None, "message": "'id'",
            "outcome": None}}
    s = chaos_summary(ops, faults, chaos_ops=[1, 2, 3, 4, 5], chaos_start=9.0, chaos_end=45.0,
                      write_errors=errs, read_errors=[], goal=0.95, period_s=8.0, rows=2)
    assert s["writes"] == {"attempted": 5, "acknowledged": 2, "failed": 3,
                           "by_outcome": {"acknowledged": 2, "info": 1, "unexpected": 1,
                                          "never completed": 1}}
    assert s["acknowledged_fraction"] == 0.4 and s["goal_met"] is False
    assert s["latency_s"]["acknowledged"]["sorted"] == [1.0, 2.0]
    assert s["latency_s"]["failed"]["max"] == 18.0
    first = s["failed_writes"][0]
    assert first["write"] == 2 and first["error"] == "RoundFailedError"
    assert [k["host"] for k in first["kills_during"]] == ["h1", "h2"]
    assert first["kills_during"][0]["after_invoke_s"] == 3.0
    assert first["nearest_kill_to_raise"] == {"host": "h2", "at_s": 23.0, "offset_s": -7.0}
    assert first["last_kill_before_invoke"] is None
    assert s["failed_writes"][1]["last_kill_before_invoke"]["host"] == "h2"
    assert s["kills"] == {"applied": 3, "scheduled": 3, "per_host": {"h1": 2, "h2": 1}}
    lines = log_lines(s)
    assert "NOT MET" in lines[-1] and len(lines) == 4


def test_distribution_nearest_rank() -> None:
    d = distribution([float(x) for x in range(1, 101)])
    assert (d["p50"], d["p90"], d["p99"], d["max"]) == (50.0, 90.0, 99.0, 100.0)
    assert sum(b["count"] for b in d["histogram"]) == 100
    assert distribution([])["p50"] is None


def test_multi_row_writes_check_every_key() -> None:
    w1 = Op(0, "c0", "upsert", (1, 2), ("a1", "a2"), 0.0, 1.0, "ok")
    w2 = Op(1, "c0", "upsert", (2, 3), ("b2", "b3"), 2.0, 3.0, "info")
    r = Op(2, "c0", "read", (1, 2, 3), (), 4.0, 5.0, "ok",
           results={1: "a1", 2: "a2", 3: None})
    assert check([w1, w2, r], {1: "a1", 2: "b2", 3: "b3"}, keys=range(4)).valid
    lost = check([w1, w2, r], {1: None, 2: "b2", 3: "b3"}, keys=range(4))
    assert [v.kind for v in lost.violations] == ["lost-acknowledged-write"]
    saw = Op(3, "c0", "read", (1, 2, 3), (), 6.0, 7.0, "ok",
             results={1: "a1", 2: "b2", 3: None})
    stale = Op(4, "c0", "read", (1, 2, 3), (), 8.0, 9.0, "ok",
               results={1: "a1", 2: "a2", 3: None})  # b2 was seen earlier: a2 is stale now
    bad = check([w1, w2, r, saw, stale], None, keys=range(4))
    assert not bad.valid


# == the injector on stand-in processes ==========================================================

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
PATIENCE_S = 120.0
_SUPERVISOR = """
import subprocess, sys, time
while True:
    subprocess.run([sys.executable, "-c", "import time; time.sleep(3600)",
                    "CoarseGrainedExecutorBackend"])
    time.sleep(float(sys.argv[1]))
"""


def _wait(cond: Any, what: str) -> None:
    end = time.monotonic() + PATIENCE_S
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.05)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[StandaloneCluster]:
    c = StandaloneCluster(tmp_path / "spark", workers=len(HOSTS))
    for n, host in enumerate(HOSTS):
        wdir = tmp_path / "spark" / f"worker-{host}"
        c.worker_specs.append(WorkerSpec(host, wdir / "data", wdir / "work", wdir / "log", 0))
        spec = c.worker_specs[-1]
        spec.data_root.mkdir(parents=True, exist_ok=True)
        # the last host restarts its executor slowly: the next kill waits for it
        delay = "3.0" if n == len(HOSTS) - 1 else "0.1"
        spec.process = subprocess.Popen([sys.executable, "-c", _SUPERVISOR, delay],
                                        start_new_session=True)
    try:
        _wait(lambda: all(executor_pids(c, h) for h in HOSTS), "stand-in executors")
        yield c
    finally:
        c.stop()


def test_kills_every_period_in_rotation_one_host_down_at_a_time(
        cluster: StandaloneCluster) -> None:
    has = lambda h: bool(executor_pids(cluster, h))  # noqa: E731
    inj = ChaosInjector(cluster, time.monotonic, has, rng=random.Random(4), period_s=0.5,
                        precondition_deadline_s=PATIENCE_S, recover_deadline_s=PATIENCE_S,
                        poll_s=0.05)
    inj.start()
    _wait(lambda: len([r for r in inj.snapshot() if r["start"] is not None]) >= 7, "7 kills")
    inj.finish()
    assert inj.join(PATIENCE_S)
    recs = inj.snapshot()
    assert inj.errors == [] and all(r["start"] is not None for r in recs), recs
    assert [r["host"] for r in recs] == kill_rotation(random.Random(4), HOSTS, len(recs))
    assert [e.host for e in inj.events] == [r["host"] for r in recs]
    starts = [r["start"] for r in recs]
    assert all(b - a >= 0.5 for a, b in itertools.pairwise(starts)), starts
    assert all(r["end"] is not None and r["end"] >= r["start"] for r in recs), recs
    # No kill while the previous host was still without its executor -- the slow host's
    # 3 s restart held the next kill back past the 0.5 s period.
    assert all(b["start"] >= a["end"] for a, b in itertools.pairwise(recs)), recs
    slow = [i for i, r in enumerate(recs[:-1]) if r["host"] == HOSTS[-1]]
    assert slow, "the rotation never killed the slow host"
    assert all(recs[i + 1]["start"] - recs[i]["start"] >= 2.5 for i in slow), recs


def test_a_kill_that_cannot_happen_fails_loudly(cluster: StandaloneCluster) -> None:
    inj = ChaosInjector(cluster, time.monotonic, lambda h: h != HOSTS[1],
                        rng=random.Random(1), period_s=0.2,
                        planned=[FaultEvent(0.2, "kill_executor", HOSTS[0]),
                                 FaultEvent(0.4, "kill_executor", HOSTS[1]),
                                 FaultEvent(0.6, "kill_executor", HOSTS[2])],
                        precondition_deadline_s=1.0, recover_deadline_s=PATIENCE_S,
                        poll_s=0.05)
    inj.start()
    assert inj.join(PATIENCE_S)
    recs = inj.snapshot()
    assert recs[0]["start"] is not None and recs[1]["start"] is None, recs
    assert len(recs) == 2 and "NOT APPLIED" in recs[1]["note"]
    (err,) = inj.errors
    assert err.startswith(f"kill_executor on {HOSTS[1]}") and "lists no executor" in err


def test_a_kill_waiting_when_the_writes_end_is_dropped_not_failed(
        cluster: StandaloneCluster) -> None:
    inj = ChaosInjector(cluster, time.monotonic, lambda h: h != HOSTS[1],
                        rng=random.Random(1), period_s=0.2,
                        planned=[FaultEvent(0.2, "kill_executor", HOSTS[0]),
                                 FaultEvent(0.4, "kill_executor", HOSTS[1])],
                        precondition_deadline_s=PATIENCE_S, recover_deadline_s=PATIENCE_S,
                        poll_s=0.05)
    inj.start()
    _wait(lambda: len(inj.snapshot()) == 2 and "lists no executor" in inj.snapshot()[1]["note"],
          "the second kill waiting")
    inj.finish()
    assert inj.join(PATIENCE_S)
    (rec,) = inj.snapshot()
    assert rec["host"] == HOSTS[0] and rec["start"] is not None
    assert inj.errors == [] and [e.host for e in inj.events] == [HOSTS[0]]
    (note,) = inj.cancelled
    assert HOSTS[1] in note and "dropped" in note
