"""Fault schedules are seeded, one fault at a time, and replayable; the report writes a JSON
that parses and a timeline PNG (no Spark: synthetic ops and samples)."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

from pyspark_kudu.tools.faults.checker import check
from pyspark_kudu.tools.faults.history import Op
from pyspark_kudu.tools.faults.inject import FaultEvent, plan_schedule
from pyspark_kudu.tools.faults.report import NOT_RESTORED, write_report

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]


def test_the_same_seed_plans_the_same_schedule_and_it_round_trips() -> None:
    a = plan_schedule(random.Random(5), HOSTS, 60.0, lose_host=True)
    b = plan_schedule(random.Random(5), HOSTS, 60.0, lose_host=True)
    assert a == b and a
    assert [FaultEvent.from_dict(json.loads(json.dumps(e.to_dict()))) for e in a] == a


def test_faults_come_one_at_a_time_and_a_host_is_lost_only_last() -> None:
    for seed in range(20):
        plan = plan_schedule(random.Random(seed), HOSTS, 45.0, lose_host=True)
        for prev, nxt in itertools.pairwise(plan):
            assert prev.at_s + prev.duration_s < nxt.at_s, plan
        assert [e.kind for e in plan].count("lose_host") == 1 and plan[-1].kind == "lose_host"
        assert all(e.at_s + e.duration_s <= 45.0 for e in plan)


def test_a_schedule_starts_with_every_kind_once() -> None:
    kinds = ("kill_executor", "restart_worker", "corrupt_replica", "pause_host")
    for seed in range(20):
        plan = plan_schedule(random.Random(seed), HOSTS, 48.0, kinds=kinds, lose_host=True,
                             down_s=(8.0, 12.0), gap_s=(4.0, 7.0))
        first = [e.kind for e in plan[:len(kinds)]]
        assert sorted(first) == sorted(kinds), (seed, plan)
        paused = [e for e in plan if e.kind == "pause_host"]
        assert all(8.0 <= e.duration_s <= 12.0 for e in paused), paused


def test_no_host_is_lost_when_the_rest_could_not_hold_every_replica() -> None:
    plan = plan_schedule(random.Random(1), HOSTS[:3], 45.0, lose_host=True, rf=3)
    assert "lose_host" not in [e.kind for e in plan]


def test_the_report_writes_json_and_a_timeline(tmp_path: Path) -> None:
    ops = [Op(0, "c0", "upsert", (1,), ("a",), 0.5, 1.0, "ok"),
           Op(1, "c1", "read", (1,), (), 1.5, 2.0, "ok", results={1: "a"}),
           Op(2, "c0", "upsert", (1,), ("b",), 2.5, math.inf, "info")]
    samples = [{"t": float(t), "under_replicated": int(3 <= t < 6), "unavailable": 0,
                "recovering": 0, "live_tservers": 4 - int(3 <= t < 6)} for t in range(9)]
    faults = [{"kind": "restart_worker", "host": "127.0.0.3", "start": 3.0, "end": 6.0},
              {"kind": "lose_host", "host": "127.0.0.4", "start": 7.0, "end": None}]
    path = write_report(tmp_path, config={"mode": "short"}, seed=3, schedule=[], faults=faults,
                        ops=ops, result=check(ops, {1: "a"}), samples=samples,
                        faults_end=7.0, restored_after_s=None, replay="python -m ...")
    report = json.loads(path.read_text(encoding="utf-8"))
    assert report["checker"]["valid"] is True and report["seed"] == 3
    assert report["counts"]["by_kind"]["upsert"] == {"ok": 1, "info": 1}
    assert report["replication"]["time_to_full_replication_s"] == NOT_RESTORED
    assert report["replication"]["max_under_replicated"] == 1
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"
