"""``cluster ksck`` and ``cluster rebalance``: library functions over a cluster snapshot.

* :func:`ksck` checks the cluster like ``kudu cluster ksck``: tablet server summary
  (``UUID | Address | Status | Location``), location summary, tablet health per table,
  placement policy violations (``Location | Number of non-complying tables | Number of
  non-complying tablets``, at warning level as the seed asks) and a warning for every pair
  of locations whose measured link is slow or unreliable (seed, "Requirements").
  With the clients' round-trip estimates (``round_trips``, reported with their heartbeats,
  :mod:`pyspark_kudu.spark.replication.latency`) it adds the round trip to every server's
  host and between locations, and warns about every tablet whose replicas sit in two
  locations whose round trip exceeds ``max_round_trip_ms`` (see :func:`location_round_trips`).
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
    "DEFAULT_MAX_ROUND_TRIP_MS",
    "HEALTHY",
    "MIN_ROUND_TRIP_SAMPLES",
    "RECOVERING",
    "UNAVAILABLE",
    "UNDER_REPLICATED",
    "UNKNOWN",
    "KsckResult",
    "LinkStats",
    "RoundTripStats",
    "format_ksck",
    "format_rebalance",
    "ksck",
    "location_round_trips",
    "rebalance",
    "tablet_health",
]

HEALTHY = "HEALTHY"
RECOVERING = "RECOVERING"
UNDER_REPLICATED = "UNDER_REPLICATED"
UNAVAILABLE = "UNAVAILABLE"
UNKNOWN = "UNKNOWN"

#: Round trip (ms) between two locations above which ksck warns about the tablets with
#: replicas in both (``cluster ksck --max_round_trip_ms``). Replicas of a tablet commit
#: together, so their locations should be a few milliseconds apart (zones of one region,
#: docs/locations.md); the estimates also carry Spark's own task scheduling (3-7 ms per
#: host measured on loopback with 2 busy cores), hence the margin.
DEFAULT_MAX_ROUND_TRIP_MS = 50.0
#: Samples a server's estimate needs before it counts for its location: the first tasks on
#: an executor are slow to launch (class loading, 200 ms measured).
MIN_ROUND_TRIP_SAMPLES = 5


@dataclass(frozen=True)
class LinkStats:
    """Measured round trips between two locations (e.g. from pinned probe tasks)."""

    mean_ms: float
    loss: float = 0.0
    samples: int = 1


@dataclass(frozen=True)
class RoundTripStats:
    """A client's estimate of its round trip to a tablet server's host, from its replication
    rounds (the lowest recent sample, ms), with the samples taken and its age (seconds)."""

    ms: float
    samples: int
    age_s: float = 0.0


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
    round_trips: list[dict[str, Any]] = field(default_factory=list)
    location_round_trips: list[dict[str, Any]] = field(default_factory=list)
    slow_tablets: list[dict[str, Any]] = field(default_factory=list)
    max_round_trip_ms: float = DEFAULT_MAX_ROUND_TRIP_MS

    @property
    def ok(self) -> bool:
        return (
            not self.unhealthy_tablets
            and not self.violations
            and not self.link_warnings
            # Slow location pairs are advisory: the estimate includes Spark's scheduling,
            # which load raises on every host alike (30 ms per loopback host was measured
            # on a busy 2-core machine), so it warns but does not fail the check.
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


def location_round_trips(
    snapshot: ClusterSnapshot, round_trips: Mapping[str, RoundTripStats]
) -> dict[tuple[str, str], float]:
    """Round trip (ms) between every two locations, through the driver.

    Raft traffic here never goes from one replica's host to another's: the leader runs in
    the client's driver, which exchanges every round with each host. So a location's
    estimate is its slowest server's (those with :data:`MIN_ROUND_TRIP_SAMPLES` or more),
    and two locations' round trip is the sum of theirs: an upper bound of the path from
    one through the driver to the other and back. Locations without an estimate are left
    out; the keys are sorted pairs of location names (``<none>`` for servers without one).
    """
    per_location: dict[str, float] = {}
    for ts in snapshot.tservers:
        est = round_trips.get(ts.uuid)
        if est is None or est.samples < MIN_ROUND_TRIP_SAMPLES:
            continue
        loc = ts.location or NO_LOCATION_TEXT
        per_location[loc] = max(per_location.get(loc, 0.0), est.ms)
    locs = sorted(per_location)
    return {(a, b): per_location[a] + per_location[b]
            for i, a in enumerate(locs) for b in locs[i + 1:]}


def _slow_tablets(snapshot: ClusterSnapshot, pairs: Mapping[tuple[str, str], float],
                  max_ms: float) -> list[dict[str, Any]]:
    """Tablets with replicas in two locations farther apart than ``max_ms``: the worst pair."""
    by_uuid = snapshot.tserver_by_uuid
    out = []
    for table in sorted(snapshot.tables, key=lambda t: t.name):
        for tablet in snapshot.tablets_by_table.get(table.table_id, ()):
            locs = sorted({(ts.location or NO_LOCATION_TEXT) for r in tablet.replicas
                           if (ts := by_uuid.get(r.ts_uuid)) is not None})
            spans = [(pairs[(a, b)], a, b) for i, a in enumerate(locs) for b in locs[i + 1:]
                     if (a, b) in pairs]
            worst = max(spans, default=None)
            if worst is not None and worst[0] > max_ms:
                ms, a, b = worst
                out.append({"Tablet": tablet.tablet_id, "Table": table.name,
                            "Locations": f"{a}, {b}", "Round trip (ms)": round(ms, 1)})
    return out


def ksck(
    snapshot: ClusterSnapshot,
    *,
    links: Mapping[tuple[str, str], LinkStats] | None = None,
    max_latency_ms: float = 5.0,
    max_loss: float = 0.01,
    liveness_known: bool = True,
    round_trips: Mapping[str, RoundTripStats] | None = None,
    max_round_trip_ms: float = DEFAULT_MAX_ROUND_TRIP_MS,
) -> KsckResult:
    """Check the cluster. ``links`` maps a pair of locations to its measured link;
    ``liveness_known=False`` reports servers as UNKNOWN (see the module docstring);
    ``round_trips`` maps tablet servers to their clients' round-trip estimates, and tablets
    with replicas in two locations more than ``max_round_trip_ms`` apart are warned about
    (:func:`location_round_trips`)."""
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
    rtts = round_trips or {}
    rtt_rows = [
        {
            "UUID": ts.uuid,
            "Location": ts.location or NO_LOCATION_TEXT,
            "Round trip (ms)": round(est.ms, 1),
            "Samples": est.samples,
            "Age (s)": round(est.age_s, 1),
        }
        for ts in sorted(snapshot.tservers, key=lambda t: t.uuid)
        if (est := rtts.get(ts.uuid)) is not None
    ]
    pairs = location_round_trips(snapshot, rtts)
    pair_rows = [{"Location A": a, "Location B": b, "Round trip (ms)": round(ms, 1)}
                 for (a, b), ms in sorted(pairs.items())]
    return KsckResult(servers, locations, tables, unhealthy, find_violations(snapshot), warnings,
                      liveness_known, rtt_rows, pair_rows,
                      _slow_tablets(snapshot, pairs, max_round_trip_ms), max_round_trip_ms)


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
                "round_trips": result.round_trips,
                "location_round_trips": result.location_round_trips,
                "max_round_trip_ms": result.max_round_trip_ms,
                "slow_tablets": result.slow_tablets,
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
        "",
        "Round trips from the driver (replication rounds)",
        _table(result.round_trips) if result.round_trips else "  none reported",
    ]
    if result.location_round_trips:
        parts += ["", "Round trips between locations (through the driver)",
                  _table(result.location_round_trips)]
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
    if result.slow_tablets:
        parts += ["", f"WARNING: {len(result.slow_tablets)} tablet(s) have replicas in "
                      f"locations whose round trip exceeds {result.max_round_trip_ms:g} ms "
                      f"(advisory: the estimates include Spark's scheduling delay):",
                  _table(result.slow_tablets)]
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
