"""``cluster rebalance --report_only``: load, violations and skew before/after."""

from __future__ import annotations

import json
import random

from pyspark_kudu.master.topology import ClusterSnapshot
from pyspark_kudu.tools.cluster import rebalance
from tests.unit.master.builders import cluster, tablet


def skewed() -> ClusterSnapshot:
    tabs = [tablet(f"x{k}", ["a-0", "a-1", "b-0"]) for k in range(2)]
    tabs += [tablet(f"y{k}", ["a-0", "b-0", "c-0"]) for k in range(4)]
    return cluster({"/a": 2, "/b": 2, "/c": 2}, tablets=tabs)


def test_report_only_shows_violations_and_skew_before_and_after() -> None:
    plan, text = rebalance(skewed(), random.Random(0))
    lines = text.splitlines()
    before = lines.index("Placement policy violations (before):")
    assert lines[before + 3].startswith(" /a ")
    after = lines.index("Placement policy violations (after):")
    assert lines[after + 1] == "  none"
    assert f"Planned moves: {len(plan.moves)}" in text
    assert " From " not in text  # report only: no move list


def test_move_list_and_json_report() -> None:
    plan, text = rebalance(skewed(), random.Random(0), report_only=False, fmt="json")
    data = json.loads(text)
    assert data["planned_moves"] == len(data["moves"]) == len(plan.moves) > 0
    assert data["violations_before"][0]["Location"] == "/a"
    assert data["violations_after"] == []
    skew = {row["Skew"]: (float(row["Before"]), float(row["After"])) for row in data["skew"]}
    assert skew["cluster"][1] <= skew["cluster"][0]
    assert data["moves"][0]["Reason"] == "placement policy"


def test_max_moves_limits_the_plan() -> None:
    plan, _ = rebalance(skewed(), random.Random(0), max_moves=1)
    assert len(plan.moves) == 1
