"""The fault harness in short mode (issue 8, "Proof"): its own standalone cluster, an RF=3
table, a workload under killed executors, a restarted worker, a paused host, a corrupted WAL
and a lost host; the checker finds no violation, the healer restores full replication, and
the report files exist and parse. Every scheduled fault is applied -- the harness waits for
each one's precondition under a deadline and fails the run (exit 2, naming the fault and
what did not happen) rather than skip it -- and an op is ``info`` only after an error
documented as outcome unknown (any other error fails the run with its traceback).

The harness runs as its own driver process (one SparkContext per process) and starts and
stops its own Spark cluster: it kills workers, so it must not share the session's cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# A hang guard, not a speed claim: the short mode takes ~2.5 minutes here and its own
# watchdog ends it by budget_s + budget_grace_s (~14.5 min) at the latest, with a report;
# the rest is headroom for shutting the cluster down.
_DEADLINE_S = 1080


def test_short_fault_run_finds_no_violation_and_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyspark_kudu.tools.faults", "--mode", "short", "--seed", "2",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        _, stderr = proc.communicate(timeout=_DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
        stacks = out / "stacks.txt"
        pytest.fail(f"the fault run did not end within {_DEADLINE_S} s (its own watchdog "
                    f"should have ended it); stacks: "
                    f"{stacks.read_text()[-6000:] if stacks.exists() else 'none'}\n"
                    f"{stderr[-4000:]}")
    tail = stderr[-12000:]  # a run that fails logs the replication state near its end
    assert (out / "report.json").exists(), f"no report; exit {proc.returncode}\n{tail}"
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert proc.returncode == 0, (
        f"fault run exited {proc.returncode}; violations {report['checker']['violations']}; "
        f"errors {report.get('errors')}\n{tail}")
    assert report["checker"]["valid"] is True and report["checker"]["violations"] == []
    assert report["seed"] == 2 and report["schedule"], report["schedule"]
    # One record per scheduled fault, every one applied (exit 0 already says so: a fault
    # not applied is an error of the run).
    assert [f["kind"] for f in report["faults"]] == [e["kind"] for e in report["schedule"]]
    assert all(f["start"] is not None for f in report["faults"]), report["faults"]
    # The schedule covers every kind of the short mode, corruption and a pause (a host
    # partitioned from the driver) included.
    kinds = {f["kind"] for f in report["faults"]}
    assert set(report["config"]["kinds"]) <= kinds, (kinds, report["faults"])
    corrupted = next(f for f in report["faults"] if f["kind"] == "corrupt_replica")
    assert "found failed" in corrupted["note"], corrupted
    counts = report["counts"]
    assert counts["acknowledged_writes"] > 0 and counts["by_kind"].get("read"), counts
    # Two SparkSessions, each its own KuduContext (one leads, the other forwards to it):
    # clients c0 and c1 write through different sessions, and both had writes acknowledged.
    assert report["config"]["sessions"] == 2, report["config"]
    invoked: dict[int, tuple[str, str]] = {}
    acked: set[str] = set()
    for line in (out / "history.jsonl").read_text(encoding="utf-8").splitlines():
        ev = json.loads(line)
        if ev.get("type") == "invoke":
            invoked[ev["id"]] = (ev["client"], ev["kind"])
        elif ev.get("type") == "ok" and invoked.get(ev["id"], ("", "read"))[1] != "read":
            acked.add(invoked[ev["id"]][0])
    assert {"c0", "c1"} <= acked, acked
    # The healer brought the cluster back to full replication (a lost host included).
    restored = report["replication"]["time_to_full_replication_s"]
    assert isinstance(restored, float | int), restored
    assert report["replication"]["samples"] > 0
    png = (out / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    schedule = json.loads((out / "schedule.json").read_text(encoding="utf-8"))
    assert schedule["seed"] == 2 and schedule["events"] == report["schedule"]
    assert "--replay" in report["replay"] and "seed 2" in stderr
