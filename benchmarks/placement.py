"""Placement and rebalancing at scale.

Places ``--tablets`` tablets (default 100,000) x RF 3 on ``--servers`` tablet servers
(default 1,000) in ``--locations`` locations (default 50), spread over ``--tables`` tables,
with one :class:`~pyspark_kudu.master.placement.Placer` (as the master does for a batch of
creations). Then plans a rebalance of the resulting cluster and applies it. Then, from that
balanced cluster, times the rebalance of two skewed ones: 10% new empty servers spread over
the existing locations, and one new empty location (``skewed`` in the JSON: plan seconds,
moves, skew before and after, avoidable violations after).

Goals: placement <= 5 s, rebalance plan <= 10 s with final skew <= 1, zero avoidable
policy violations. Prints the figures with their inputs and the goal ratios, and saves
``benchmarks/results/placement.json`` and ``benchmarks/results/placement.png``.

Run: ``.venv/bin/python benchmarks/placement.py`` (``--quick`` for a 10x smaller run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import sys
import time
from collections import Counter
from pathlib import Path

from pyspark_kudu.master.placement import Placer, find_violations
from pyspark_kudu.master.placement_sim import build_servers
from pyspark_kudu.master.rebalancer import apply_moves, plan_rebalance
from pyspark_kudu.master.topology import ClusterSnapshot, Replica, Table, Tablet, TabletServer
from pyspark_kudu.testing.benchdata import commit_id

RESULTS = Path(__file__).resolve().parent / "results"
GOALS = {"placement_s": 5.0, "rebalance_plan_s": 10.0, "final_skew": 1.0}


def per_location(snap: ClusterSnapshot) -> dict[str, int]:
    counts = snap.replica_counts
    out: Counter[str] = Counter()
    for ts in snap.tservers:
        out[ts.location or ""] += counts[ts.uuid]
    # Natural order: /loc2 before /loc10.
    return dict(sorted(out.items(), key=lambda kv: (len(kv[0]), kv[0])))


def plot(path: Path, before: ClusterSnapshot, after: ClusterSnapshot, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12, 8))
    b, a = per_location(before), per_location(after)
    locs = list(b)
    xs = range(len(locs))
    ax1.bar([x - 0.2 for x in xs], [b[k] for k in locs], 0.4, label="after placement")
    ax1.bar([x + 0.2 for x in xs], [a[k] for k in locs], 0.4, label="after rebalance")
    lo, hi = min(min(b.values()), min(a.values())), max(max(b.values()), max(a.values()))
    ax1.set_ylim(lo - max(10, (hi - lo)), hi + max(10, (hi - lo)))
    ax1.set_xticks(list(xs))
    ax1.set_xticklabels(locs, rotation=90, fontsize=6)
    ax1.set_ylabel("replicas per location")
    ax1.set_title(title)
    ax1.legend(fontsize=8)
    cb, ca = list(before.replica_counts.values()), list(after.replica_counts.values())
    bins = range(min(cb + ca), max(cb + ca) + 2)
    ax2.hist(cb, bins=bins, alpha=0.6, label="after placement", align="left")
    ax2.hist(ca, bins=bins, alpha=0.6, label="after rebalance", align="left")
    ax2.set_xlabel("replicas per tablet server")
    ax2.set_ylabel("tablet servers")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _new_servers(n: int, locations: int) -> list[TabletServer]:
    """``n`` empty servers spread round-robin over the existing locations ``/loc0``..."""
    return [TabletServer(f"ts-new-{k}", f"host-new-{k}", location=f"/loc{k % locations}")
            for k in range(n)]


def _new_location(locations: int, per_loc: int) -> list[TabletServer]:
    """One new location ``/loc<locations>`` of ``per_loc`` empty servers."""
    loc = f"/loc{locations}"
    return [TabletServer(f"ts-newloc-{k}", f"host-newloc-{k}", location=loc)
            for k in range(per_loc)]


def _skewed_rebalance(balanced: ClusterSnapshot, extra: list[TabletServer], seed: int
                      ) -> dict[str, object]:
    """Time a rebalance of ``balanced`` after ``extra`` empty servers joined it."""
    snap = ClusterSnapshot(balanced.tservers + tuple(extra), balanced.tables,
                           balanced.tablets, balanced.config)
    start = time.perf_counter()
    plan = plan_rebalance(snap, random.Random(seed))
    plan_s = time.perf_counter() - start
    after = apply_moves(snap, plan.moves)
    counts = after.replica_counts
    new = [counts[ts.uuid] for ts in extra]
    return {"added_servers": len(extra), "plan_s": round(plan_s, 3),
            "moves": len(plan.moves), "skew_before": dict(plan.report.skew_before),
            "skew_after": dict(plan.report.skew_after),
            "replicas_on_new_servers_min_max": [min(new), max(new)],
            "avoidable_violations_after": sum(v.avoidable for v in find_violations(after))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tablets", type=int, default=100_000)
    p.add_argument("--servers", type=int, default=1_000)
    p.add_argument("--locations", type=int, default=50)
    p.add_argument("--tables", type=int, default=100)
    p.add_argument("--rf", type=int, default=3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--quick", action="store_true", help="10x fewer tablets and servers")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.tablets //= 10
        args.servers //= 10
        args.locations = max(3, args.locations // 10)
        args.tables = max(1, args.tables // 10)
    per_loc = args.servers // args.locations
    servers = build_servers((args.locations,), per_loc, ("loc",))
    tables = tuple(Table(f"table{k:03d}", f"table{k:03d}", args.rf) for k in range(args.tables))
    snap = ClusterSnapshot(tuple(servers), tables)
    rng = random.Random(args.seed)
    per_table = [args.tablets // args.tables + (k < args.tablets % args.tables)
                 for k in range(args.tables)]

    start = time.perf_counter()
    placer = Placer(snap, rng)
    placements = [[placer.place_new(t) for _ in range(n)] for t, n in zip(tables, per_table,
                                                                           strict=True)]
    placement_s = time.perf_counter() - start

    tablets = tuple(
        Tablet(f"{t.table_id}-{k}", t.table_id,
               tuple(Replica(u, is_leader=j == 0) for j, u in enumerate(uuids)))
        for t, rows in zip(tables, placements, strict=True)
        for k, uuids in enumerate(rows)
    )
    placed = snap.with_tablets(tablets)
    violations = find_violations(placed)

    start = time.perf_counter()
    plan = plan_rebalance(placed, random.Random(args.seed))
    plan_s = time.perf_counter() - start
    after = apply_moves(placed, plan.moves)
    violations_after = find_violations(after)

    skewed = {name: _skewed_rebalance(after, extra, args.seed)
              for name, extra in (
                  ("new_servers_10pct", _new_servers(args.servers // 10, args.locations)),
                  ("new_location", _new_location(args.locations, per_loc)))}

    rep = plan.report
    result = {
        "commit": commit_id(Path(__file__).resolve().parents[1]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "inputs": {
            "tablets": args.tablets, "replication_factor": args.rf,
            "tablet_servers": len(servers), "locations": args.locations,
            "servers_per_location": per_loc, "tables": args.tables, "seed": args.seed,
            "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "placement_s": round(placement_s, 3),
        "placement_us_per_replica": round(placement_s / (args.tablets * args.rf) * 1e6, 2),
        "violations_after_placement": len(violations),
        "avoidable_violations_after_placement": sum(v.avoidable for v in violations),
        "rebalance_plan_s": round(plan_s, 3),
        "rebalance_moves": len(plan.moves),
        "moves_per_replica": round(len(plan.moves) / (args.tablets * args.rf), 4),
        "moves_by_reason": dict(rep.moves_by_reason),
        "skew_before": dict(rep.skew_before),
        "skew_after": dict(rep.skew_after),
        "avoidable_violations_after_rebalance": sum(v.avoidable for v in violations_after),
        "skewed": skewed,
        "goals": GOALS,
    }
    result["ratios"] = {
        "placement_vs_goal": round(placement_s / GOALS["placement_s"], 3),
        "rebalance_plan_vs_goal": round(plan_s / GOALS["rebalance_plan_s"], 3),
        "final_cluster_skew_vs_goal": rep.skew_after["cluster"] / GOALS["final_skew"],
    }
    result["goals_met"] = {
        "placement": placement_s <= GOALS["placement_s"],
        "rebalance_plan": plan_s <= GOALS["rebalance_plan_s"],
        "final_skew": max(rep.skew_after["cluster"], rep.skew_after["table"])
        <= GOALS["final_skew"],
        "zero_avoidable_violations": result["avoidable_violations_after_placement"] == 0
        and result["avoidable_violations_after_rebalance"] == 0,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = "placement-quick" if args.quick else "placement"
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(args.out / f"{name}.png", placed, after,
         f"{args.tablets:,} tablets x RF{args.rf} on {len(servers):,} servers in "
         f"{args.locations} locations")
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0 if all(result["goals_met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
