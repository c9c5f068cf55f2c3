"""The fault harness in short mode (issue 8, "Proof"): its own standalone cluster, an RF=3
table, a workload under killed executors, a restarted worker, a paused host, a corrupted WAL
and a lost host; the checker finds no violation, the healer restores full replication, and
the report files exist and parse.

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
# The short mode takes ~2.5 minutes here; its watchdog ends it by budget_s + budget_grace_s
# (~11.5 min) at the latest. The rest is headroom for shutting the cluster down.
_DEADLINE_S = 900


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
    tail = stderr[-4000:]
    assert (out / "report.json").exists(), f"no report; exit {proc.returncode}\n{tail}"
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert proc.returncode == 0, (
        f"fault run exited {proc.returncode}; violations {report['checker']['violations']}; "
        f"errors {report.get('errors')}\n{tail}")
    assert report["checker"]["valid"] is True and report["checker"]["violations"] == []
    assert report["seed"] == 2 and report["schedule"], report["schedule"]
    assert any(f["start"] is not None for f in report["faults"]), report["faults"]
    # The schedule covers every kind of the short mode; corruption and a pause (a host
    # partitioned from the driver) must have been applied, not skipped.
    for kind in ("corrupt_replica", "pause_host"):
        applied = [f for f in report["faults"] if f["kind"] == kind]
        assert applied and applied[0]["start"] is not None, (kind, report["faults"])
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
