"""The demo's rack part tells the truth (issue: "the demo shows the project's point"): run as a
user runs it (``python jobs/demo.py --racks-only``), it starts its own standalone cluster on
loopback, its tablet servers sit in the three racks of ``conf/topology.txt`` through
``spark.kudu.locationMappingCmd``, no tablet has a majority of its replicas in one rack, ksck
says OK with 0 violations, the rows come back, a PNG is drawn, and Spark's INFO log stays
out of the output (``conf/log4j2.properties``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import matplotlib.image

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "jobs" / "demo.py"
RACKS = {"/dc1/rack1", "/dc1/rack2", "/dc1/rack3"}
_DEADLINE_S = 600.0  # ~90 s alone on a 2-core machine; more beside the suite's cluster
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run_demo(png: Path, report: Path) -> subprocess.CompletedProcess[str]:
    """``jobs/demo.py --racks-only``; on the deadline it is interrupted (SIGINT), so its
    ``finally`` stops the cluster it started, and the test fails."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.Popen(
        [sys.executable, str(DEMO), "--racks-only", "--png", str(png), "--json", str(report)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        out, err = proc.communicate(timeout=_DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(
            f"demo still running after {_DEADLINE_S:.0f} s:\n{out}\n{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_rack_demo_places_one_replica_per_rack_and_ksck_agrees(tmp_path: Path) -> None:
    png, report_path = tmp_path / "racks.png", tmp_path / "racks.json"
    run = _run_demo(png, report_path)
    output = f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    assert run.returncode == 0, output
    report = json.loads(report_path.read_text(encoding="utf-8"))

    # Every tablet server is in one of the three racks, and each rack holds servers.
    servers = report["servers"]
    assert len(servers) == 6, servers
    assert {s["location"] for s in servers} <= RACKS, servers
    per_rack = Counter(s["location"] for s in servers)
    assert set(per_rack) == RACKS and min(per_rack.values()) >= 1, per_rack
    for s in servers:
        assert f"{s['host']:<10} {s['location']}" in run.stdout, output

    # No tablet has a majority of its replicas in one location.
    assert len(report["tablets"]) == 6
    for t in report["tablets"]:
        by_loc = t["by_location"]
        assert sum(by_loc.values()) == 3 and set(by_loc) <= RACKS, t
        assert max(by_loc.values()) < report["majority"] == 2, t

    # ksck: the three racks in its location summary, OK, no violation.
    assert report["ksck_ok"] is True and report["ksck_violations"] == [], report
    assert {r["Location"]: r["Count"] for r in report["ksck_locations"]} == dict(per_rack)
    assert "ksck verdict: OK, 0 placement policy violations" in run.stdout, output
    assert "Tablet Server Location Summary" in run.stdout, output

    # The rows read back are the rows written.
    assert report["rows_equal"] is True, report
    assert report["rows_read"] == report["rows_written"] == 1000, report

    # A real PNG of a useful size, at the path asked for (and printed).
    assert report["png"] == str(png) and f"replicas per location: {png}" in run.stdout
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000, len(data)
    height, width = matplotlib.image.imread(str(png)).shape[:2]
    assert width >= 800 and height >= 400, (width, height)

    # The project's lines, not Spark's INFO log; the cluster was stopped.
    assert " INFO " not in run.stdout + run.stderr, output
    assert "cluster stopped" in run.stdout, output
