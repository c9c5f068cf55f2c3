"""``pyspark-kudu locations show``: where every tablet server is, and what that layout survives.

Seed: kudu-location-awareness ("CLI tools to observe location labels and policies"). Three
parts:

1. every tablet server with its location, liveness and replica count;
2. a summary per location group at every level of the hierarchy (``/dc1`` at level 1,
   ``/dc1/rack1`` at level 2, ...; a shallower location is its own group at deeper levels,
   as in placement): servers, live servers, replicas and load (replicas per server, the
   seed's "load of a location");
3. for each level and each replication factor in use (3 when there are no tables): the most
   replicas of one tablet the placement policy lets a group hold
   (:func:`~pyspark_kudu.master.placement.max_replicas_per_group`) and whether a tablet
   placed that way keeps a majority when any one whole group is lost. Placement is best
   effort, so this holds for tablets that comply -- ``cluster ksck`` lists those that do not.

Exit code 0, or 1 when some tablet servers have a location and others none (a
half-configured ``location_mapping_cmd``: placement then treats ``<none>`` as one location).

Thread-safety: pure functions; the verb is a CLI entry point.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from pyspark_kudu.master.placement import max_replicas_per_group
from pyspark_kudu.master.topology import ClusterSnapshot, location_prefix
from pyspark_kudu.tools.connect import (
    EXIT_OK,
    EXIT_PROBLEMS,
    ClusterState,
    add_connection_args,
    add_format_arg,
    open_source,
    verb,
)
from pyspark_kudu.tools.tabular import render_json, render_table
from pyspark_kudu.tools.tserver import NO_LOCATION_TEXT

__all__ = ["add_group", "format_locations", "location_report"]


def add_group(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    grp = sub.add_parser("locations", help="tablet server locations",
                         description="Locations of tablet servers (seed: kudu location "
                                     "awareness).")
    verbs = grp.add_subparsers(dest="verb", metavar="VERB", required=True)
    show = verbs.add_parser(
        "show", help="each tablet server's location and a summary per location",
        description="Show each tablet server's location, a summary per location group at "
                    "every level, and whether tablets placed by the policy survive the loss "
                    "of one whole location. Exit code 0, or 1 when only some servers have a "
                    "location.")
    add_connection_args(show)
    add_format_arg(show)
    show.set_defaults(func=verb(_show), verb_parser=show)


def location_report(snap: ClusterSnapshot, *, liveness_known: bool = True) -> dict[str, Any]:
    """The data of ``locations show`` (JSON keys)."""
    counts = snap.replica_counts
    servers = [
        {"uuid": ts.uuid, "address": ts.rpc_address,
         "location": ts.location or NO_LOCATION_TEXT,
         "live": ("true" if ts.live else "false") if liveness_known else "unknown",
         "replicas": counts.get(ts.uuid, 0)}
        for ts in sorted(snap.tservers, key=lambda t: (t.location or "", t.uuid))
    ]
    depth = snap.max_location_depth
    groups: dict[tuple[int, str], list[str]] = {}
    for ts in snap.tservers:
        if not ts.location:
            groups.setdefault((0, NO_LOCATION_TEXT), []).append(ts.uuid)
            continue
        for d in range(1, depth + 1):
            groups.setdefault((d, location_prefix(ts.location, d)), []).append(ts.uuid)
    by_uuid = snap.tserver_by_uuid
    summary = []
    for (level, name), uuids in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        replicas = sum(counts.get(u, 0) for u in uuids)
        summary.append({
            "location": name, "level": level, "tservers": len(uuids),
            "live": sum(by_uuid[u].live for u in uuids) if liveness_known else None,
            "replicas": replicas, "load": round(replicas / len(uuids), 3),
        })
    rfs = sorted({t.replication_factor for t in snap.tables}) or [3]
    per_level = Counter(level for level, _ in groups if level > 0)
    tolerance = []
    for level in sorted(per_level):
        n = per_level[level] + (1 if (0, NO_LOCATION_TEXT) in groups else 0)
        for rf in rfs:
            most = max_replicas_per_group(rf, n)
            tolerance.append({"level": level, "locations": n, "replication_factor": rf,
                              "max_replicas_per_location": most,
                              # A compliant layout exists and losing a full location
                              # leaves a majority (RF 4 over 3 locations has no such layout).
                              "survives_location_loss": most * n >= rf
                              and rf - most >= rf // 2 + 1})
    warnings = []
    unlocated = [ts.uuid for ts in snap.tservers if not ts.location]
    if unlocated and len(unlocated) < len(snap.tservers):
        warnings.append(
            f"{len(unlocated)} of {len(snap.tservers)} tablet servers have no location "
            f"({', '.join(sorted(unlocated)[:5])}{', ...' if len(unlocated) > 5 else ''}); "
            f"placement treats them as one more location. Make location_mapping_cmd map "
            f"every host and have those servers re-register")
    return {"tservers": servers, "locations": summary, "tolerance": tolerance,
            "warnings": warnings}


def format_locations(report: dict[str, Any]) -> str:
    """The text of ``locations show``."""
    srv_heads = ["UUID", "Address", "Location", "Live", "Replicas"]
    srv_keys = ["uuid", "address", "location", "live", "replicas"]
    parts = ["Tablet Server Locations",
             render_table(srv_heads, [[r[k] for k in srv_keys] for r in report["tservers"]])
             if report["tservers"] else "  none", "", "Location Summary"]
    sum_heads = ["Location", "Level", "Tablet Servers", "Live", "Replicas", "Load"]
    parts.append(render_table(sum_heads, [
        [r["location"], r["level"], r["tservers"], "-" if r["live"] is None else r["live"],
         r["replicas"], f"{r['load']:.3f}"] for r in report["locations"]])
        if report["locations"] else "  none")
    parts += ["", "Loss of one whole location (tablets that comply with the placement policy)"]
    if report["tolerance"]:
        heads = ["Level", "Locations", "RF", "Max replicas per location",
                 "Survives loss of one location"]
        parts.append(render_table(heads, [
            [r["level"], r["locations"], r["replication_factor"],
             r["max_replicas_per_location"], "yes" if r["survives_location_loss"] else "no"]
            for r in report["tolerance"]]))
    else:
        parts.append("  no tablet server has a location: placement ignores locations (see "
                     "docs/locations.md to label servers)")
    parts += [f"WARNING: {w}" for w in report["warnings"]]
    return "\n".join(parts)


def _show(args: argparse.Namespace) -> int:
    src = open_source(args)
    try:
        state: ClusterState = src.state()
    finally:
        src.close()
    report = location_report(state.snapshot(), liveness_known=state.liveness_known)
    if args.format == "text":
        print(f"Source: {state.source}\n\n{format_locations(report)}")
    else:
        print(render_json({"source": state.source, **report}, args.format))
    return EXIT_PROBLEMS if report["warnings"] else EXIT_OK
