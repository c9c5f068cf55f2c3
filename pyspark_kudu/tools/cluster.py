"""``cluster ksck`` and ``cluster rebalance``: library functions over a cluster snapshot.

* :func:`ksck` checks the cluster like ``kudu cluster ksck``: tablet server summary
  (``UUID | Address | Status | Location``), location summary, tablet health per table,
  placement policy violations (``Location | Number of non-complying tables | Number of
  non-complying tablets``, at warning level as the seed asks) and a warning for every pair
  of locations whose measured link is slow or unreliable (seed, "Requirements").
* :func:`rebalance` plans with :func:`~pyspark_kudu.master.rebalancer.plan_rebalance` and
  reports per-location load, violations and skew before and after, as
  ``kudu cluster rebalance --report_only``; without ``report_only`` it lists the moves.

Both render ``text`` (Kudu's tables) or ``json`` / ``json_pretty``.

``ksck(..., liveness_known=False)`` is for a catalog read offline (``--master-dir``): no
heartbeats were heard, so every tablet server's status is ``UNKNOWN`` (not a problem in
itself) and tablet health is judged on the Raft configs as if every server were up.

Thread-safety: pure functions over a snapshot (the rebalancer consumes the given rng).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark_kudu.master.placement import Violation, find_violations
from pyspark_kudu.master.rebalancer import RebalancePlan, plan_rebalance, violation_summary
from pyspark_kudu.master.topology import ClusterSnapshot, ReplicaRole, Tablet
from pyspark_kudu.tools.tabular import check_format, render_json, render_table
from pyspark_kudu.tools.tserver import NO_LOCATION_TEXT

__all__ = [
    "HEALTHY",
    "RECOVERING",
    "UNAVAILABLE",
    "UNDER_REPLICATED",
    "UNKNOWN",
    "KsckResult",
    "LinkStats",
    "format_ksck",
    "format_rebalance",
    "ksck",
    "rebalance",
    "tablet_health",
]

HEALTHY = "HEALTHY"
RECOVERING = "RECOVERING"
UNDER_REPLICATED = "UNDER_REPLICATED"
UNAVAILABLE = "UNAVAILABLE"
UNKNOWN = "UNKNOWN"


@dataclass(frozen=True)
class LinkStats:
    """Measured round trips between two locations (e.g. from pinned probe tasks)."""

    mean_ms: float
    loss: float = 0.0
    samples: int = 1


@dataclass(frozen=True)
class KsckResult:
    """Everything ksck found; ``ok`` is False when anything needs attention."""

    tservers: list[dict[str, str]]
    locations: list[dict[str, Any]]
    tables: list[dict[str, Any]]
    unhealthy_tablets: list[dict[str, str]]
    violations: list[Violation]
    link_warnings: list[str] = field(default_factory=list)
    liveness_known: bool = True

    @property
    def ok(self) -> bool:
        return (
            not self.unhealthy_tablets
            and not self.violations
            and not self.link_warnings
            and all(t["Status"] in (HEALTHY, UNKNOWN) for t in self.tservers)
        )


def tablet_health(snapshot: ClusterSnapshot, tablet: Tablet) -> str:
    """Kudu's tablet health: UNAVAILABLE without a live majority of voters,
    UNDER_REPLICATED with fewer live voters than the replication factor, RECOVERING while a
    config change is under way (a non-voter or a REPLACE mark), else HEALTHY."""
    table = snapshot.table_by_id.get(tablet.table_id)
    rf = table.replication_factor if table else len(tablet.voters)
    by_uuid = snapshot.tserver_by_uuid
    voters = tablet.voters
    live = [r for r in voters if (ts := by_uuid.get(r.ts_uuid)) is not None and ts.live]
    if len(live) < len(voters) // 2 + 1 or not voters:
        return UNAVAILABLE
    if len(live) < rf:
        return UNDER_REPLICATED
    if any(r.replace or r.role is ReplicaRole.NON_VOTER for r in tablet.replicas):
        return RECOVERING
    return HEALTHY


def ksck(
    snapshot: ClusterSnapshot,
    *,
    links: Mapping[tuple[str, str], LinkStats] | None = None,
    max_latency_ms: float = 5.0,
    max_loss: float = 0.01,
    liveness_known: bool = True,
) -> KsckResult:
    """Check the cluster. ``links`` maps a pair of locations to its measured link;
    ``liveness_known=False`` reports servers as UNKNOWN (see the module docstring)."""
    servers = [
        {
            "UUID": ts.uuid,
            "Address": ts.rpc_address,
            "Status": (HEALTHY if ts.live else UNAVAILABLE) if liveness_known else UNKNOWN,
            "Location": ts.location or NO_LOCATION_TEXT,
        }
        for ts in sorted(snapshot.tservers, key=lambda t: t.uuid)
    ]
    loc_counts = Counter(ts.location or NO_LOCATION_TEXT for ts in snapshot.tservers)
    locations = [{"Location": k, "Count": v} for k, v in sorted(loc_counts.items())]
    tables = []
    unhealthy = []
    for table in sorted(snapshot.tables, key=lambda t: t.name):
        health: Counter[str] = Counter()
        for tablet in snapshot.tablets_by_table.get(table.table_id, ()):
            h = tablet_health(snapshot, tablet)
            health[h] += 1
            if h != HEALTHY:
                unhealthy.append({"Tablet": tablet.tablet_id, "Table": table.name, "Status": h})
        worst = next((h for h in (UNAVAILABLE, UNDER_REPLICATED, RECOVERING) if health[h]),
                     HEALTHY)
        tables.append(
            {
                "Name": table.name,
                "RF": table.replication_factor,
                "Status": worst,
                "Total Tablets": sum(health.values()),
                "Healthy": health[HEALTHY],
                "Recovering": health[RECOVERING],
                "Under-replicated": health[UNDER_REPLICATED],
                "Unavailable": health[UNAVAILABLE],
            }
        )
    warnings = []
    for (a, b), st in sorted((links or {}).items()):
        if st.samples <= 0:
            warnings.append(f"no latency measurements between locations {a} and {b}")
            continue
        if st.mean_ms > max_latency_ms:
            warnings.append(
                f"high latency between locations {a} and {b}: {st.mean_ms:.1f} ms "
                f"(threshold {max_latency_ms:.1f} ms)"
            )
        if st.loss > max_loss:
            warnings.append(
                f"unreliable connection between locations {a} and {b}: {st.loss:.1%} of "
                f"probes lost (threshold {max_loss:.1%})"
            )
    return KsckResult(servers, locations, tables, unhealthy, find_violations(snapshot), warnings,
                      liveness_known)


def _violation_rows(violations: Sequence[Violation]) -> list[dict[str, Any]]:
    return [
        {
            "Location": loc or NO_LOCATION_TEXT,
            "Number of non-complying tables": tables,
            "Number of non-complying tablets": tablets,
        }
        for loc, tables, tablets in violation_summary(violations)
    ]


def _table(rows: Sequence[Mapping[str, Any]], headers: Sequence[str] | None = None) -> str:
    if not rows:
        return "  none"
    heads = list(headers or rows[0].keys())
    return render_table(heads, [[r[h] for h in heads] for r in rows])


def format_ksck(result: KsckResult, fmt: str = "text") -> str:
    """ksck output as text or JSON."""
    check_format(fmt)
    if fmt != "text":
        return render_json(
            {
                "tservers": result.tservers,
                "locations": result.locations,
                "tables": result.tables,
                "unhealthy_tablets": result.unhealthy_tablets,
                "placement_policy_violations": _violation_rows(result.violations),
                "violating_tablets": sorted({v.tablet_id for v in result.violations}),
                "warnings": result.link_warnings,
                "liveness_known": result.liveness_known,
                "ok": result.ok,
            },
            fmt,
        )
    parts = [
        "Tablet Server Summary",
        _table(result.tservers, ["UUID", "Address", "Status", "Location"]),
        "",
        "Tablet Server Location Summary",
        _table(result.locations),
        "",
        "Summary by table",
        _table(result.tables),
    ]
    if result.unhealthy_tablets:
        parts += ["", "Unhealthy tablets", _table(result.unhealthy_tablets)]
    if result.violations:
        parts += ["", "WARNING: Placement policy violations:",
                  _table(_violation_rows(result.violations))]
        for v in result.violations:
            what = (
                f"replica on {v.ts_uuid} is outside the table's constraint"
                if v.kind == "constraint"
                else f"{v.count} replicas in {v.location or NO_LOCATION_TEXT} (at most {v.limit})"
            )
            fix = "" if v.avoidable else " (cannot be fixed with the live tablet servers)"
            parts.append(f"  tablet {v.tablet_id}: {what}{fix}")
    for w in result.link_warnings:
        parts.append(f"WARNING: {w}")
    if not result.liveness_known:
        parts += ["", "NOTE: tablet server liveness is unknown (catalog read offline); tablet "
                      "health assumes every tablet server is up"]
    banner = "=" * 18
    parts += ["", "OK" if result.ok else f"{banner}\nksck found issues\n{banner}"]
    return "\n".join(parts)


def rebalance(
    snapshot: ClusterSnapshot,
    rng: random.Random,
    *,
    report_only: bool = True,
    max_moves: int | None = None,
    fmt: str = "text",
) -> tuple[RebalancePlan, str]:
    """Plan a rebalance and render its report (and, unless ``report_only``, its moves)."""
    check_format(fmt)
    plan = plan_rebalance(snapshot, rng, max_moves=max_moves)
    return plan, format_rebalance(plan, report_only=report_only, fmt=fmt)


def format_rebalance(plan: RebalancePlan, *, report_only: bool = True, fmt: str = "text") -> str:
    check_format(fmt)
    rep = plan.report
    after = {ll.location: ll for ll in rep.loads_after}
    loads = [
        {
            "Location": ll.location or NO_LOCATION_TEXT,
            "Tablet Servers": ll.servers,
            "Replicas (before)": ll.replicas,
            "Load (before)": f"{ll.load:.3f}",
            "Replicas (after)": after[ll.location].replicas,
            "Load (after)": f"{after[ll.location].load:.3f}",
        }
        for ll in rep.loads_before
    ]
    skew = [
        {"Skew": k, "Before": f"{rep.skew_before[k]:g}", "After": f"{rep.skew_after[k]:g}"}
        for k in rep.skew_before
    ]
    moves = [
        {"Tablet": m.tablet_id, "From": m.from_uuid, "To": m.to_uuid, "Reason": m.reason}
        for m in plan.moves
    ]
    if fmt != "text":
        data: dict[str, Any] = {
            "locations": loads,
            "violations_before": _violation_rows(rep.violations_before),
            "violations_after": _violation_rows(rep.violations_after),
            "skew": skew,
            "moves_by_reason": dict(rep.moves_by_reason),
            "planned_moves": len(plan.moves),
        }
        if not report_only:
            data["moves"] = moves
        return render_json(data, fmt)
    parts = [
        "Per-location replica distribution",
        _table(loads),
        "",
        "Placement policy violations (before):",
        _table(_violation_rows(rep.violations_before)),
        "",
        "Placement policy violations (after):",
        _table(_violation_rows(rep.violations_after)),
        "",
        "Skew (cluster: replicas per server; table: worst table; location: replicas per "
        "server between locations)",
        _table(skew),
        "",
        f"Planned moves: {len(plan.moves)}"
        + "".join(f"\n  {reason}: {n}" for reason, n in sorted(rep.moves_by_reason.items())),
    ]
    if not report_only and moves:
        parts += ["", _table(moves)]
    return "\n".join(parts)
