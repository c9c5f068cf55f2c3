"""``pyspark-kudu cluster ksck`` and ``pyspark-kudu cluster rebalance [--report_only]``.

The checks and the plan are the library's (:mod:`pyspark_kudu.tools.cluster`, the master's
rebalancer); this module reads the catalog (:mod:`pyspark_kudu.tools.connect`), adds the
master summary Kudu's ksck starts with, and turns the outcome into an exit code:

* ``cluster ksck``: 0 when everything is healthy and complies with the placement policy;
  1 when anything needs attention (a master or tablet server down, an unhealthy tablet,
  a placement policy violation). A tablet whose replicas' locations are farther apart than
  ``--max_round_trip_ms`` is warned about without changing the exit code (the estimate
  includes Spark's scheduling delay, which load raises everywhere).
* ``cluster rebalance``: 0 when no move is needed and no violation remains; 1 when moves
  are planned or violations remain. The CLI **plans only**: executing a move is a pinned
  tablet copy onto the target's host plus Raft config changes (add the target as
  NON_VOTER, promote it, remove the source: seed kudu-raft-config-change, 3-4-3), which
  needs the Spark runtime; without ``--report_only`` the moves are listed and the output
  says that none was executed.

Thread-safety: not applicable (CLI verbs).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import replace
from typing import Any

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.master.rebalancer import plan_rebalance
from pyspark_kudu.tools.cluster import (
    DEFAULT_MAX_ROUND_TRIP_MS,
    format_ksck,
    format_rebalance,
    ksck,
)
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

__all__ = ["NOT_EXECUTED_NOTE", "add_group", "ksck_report", "rebalance_report"]

NOT_EXECUTED_NOTE = (
    "no move was executed: moving a replica needs the Spark runtime (a pinned tablet copy "
    "onto the target's host, then add as NON_VOTER, promote, remove the source); this "
    "command only plans. Run with --report_only for the report alone")


def add_group(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    grp = sub.add_parser("cluster", help="cluster-wide checks and rebalancing",
                         description="Cluster-wide operations, as the kudu tool's 'cluster'.")
    verbs = grp.add_subparsers(dest="verb", metavar="VERB", required=True)
    k = verbs.add_parser(
        "ksck", help="check masters, tablet servers, tablets and the placement policy",
        description="Check the health of the cluster: masters, tablet servers (with their "
                    "locations), tablet health per table, placement policy violations and "
                    "the round trips clients measured to each server's host. "
                    "Exit code 0 when all is well, 1 when anything needs attention, 2 on a "
                    "usage error, 3 when no master can be reached.")
    add_connection_args(k)
    add_format_arg(k)
    k.add_argument("--max_round_trip_ms", "--max-round-trip-ms", dest="max_round_trip_ms",
                   type=float, default=DEFAULT_MAX_ROUND_TRIP_MS, metavar="MS",
                   help="warn about tablets with replicas in two locations whose round trip "
                        "through the client's driver exceeds MS milliseconds (default "
                        f"{DEFAULT_MAX_ROUND_TRIP_MS:g}; advisory, the exit code is unchanged)")
    k.set_defaults(func=verb(_ksck), verb_parser=k)
    r = verbs.add_parser(
        "rebalance", help="plan replica moves that restore the placement policy and balance",
        description="Plan replica moves (stage 1: fix placement policy violations; stage 2: "
                    "balance tables and the cluster across locations, then within them) and "
                    "report loads, violations and skew before and after. The CLI only plans: "
                    "executing moves needs the Spark runtime. Exit code 0 when nothing needs "
                    "moving, 1 when moves are planned or violations remain.")
    add_connection_args(r)
    add_format_arg(r)
    r.add_argument("--report_only", "--report-only", dest="report_only", action="store_true",
                   help="print the report only, not the list of moves")
    r.add_argument("--max_moves", "--max-moves", dest="max_moves", type=int, default=None,
                   metavar="N", help="plan at most N moves (default: as many as needed)")
    r.add_argument("--seed", type=int, default=0,
                   help="seed of the planner's random choices (default 0: the same catalog "
                        "gives the same plan)")
    r.set_defaults(func=verb(_rebalance), verb_parser=r)


def ksck_report(state: ClusterState, fmt: str = "text", *,
                max_round_trip_ms: float = DEFAULT_MAX_ROUND_TRIP_MS) -> tuple[bool, str]:
    """``(ok, output)`` of ksck over ``state``: masters first, then the library's checks.

    Raises:
        InvalidArgumentError: ``max_round_trip_ms`` is not a positive, finite number.
    """
    _check_round_trip_ms(max_round_trip_ms)
    result = ksck(state.snapshot(), liveness_known=state.liveness_known,
                  round_trips=state.round_trips, max_round_trip_ms=max_round_trip_ms)
    bad = [m for m in state.masters if m.status == "UNAVAILABLE"]
    if bad:
        # Reported through the library's warnings so the verdict and banner include them.
        result = replace(result, link_warnings=[
            f"master {m.address} is UNAVAILABLE: {m.detail}" for m in bad
        ] + result.link_warnings)
    rows = [m.row() for m in state.masters]
    if fmt != "text":
        data = json.loads(format_ksck(result, "json"))
        masters = [dict(r, Detail=m.detail) for r, m in zip(rows, state.masters, strict=True)]
        out: dict[str, Any] = {"source": state.source, "masters": masters, **data}
        return result.ok, render_json(out, fmt)
    heads = ["Address", "Id", "Role", "Term", "Commit", "Status"]
    parts = [f"Source: {state.source}", "", "Master Summary",
             render_table(heads, [[r[h] for h in heads] for r in rows]) if rows else "  none"]
    parts += [f"  {m.id}: {m.detail}" for m in state.masters if m.status == "OFFLINE"]
    parts += ["", format_ksck(result)]
    return result.ok, "\n".join(parts)


def _check_round_trip_ms(ms: float) -> None:
    if not (math.isfinite(ms) and ms > 0):
        raise InvalidArgumentError(
            f"--max_round_trip_ms must be a positive number of milliseconds, got {ms!r}")


def rebalance_report(state: ClusterState, *, report_only: bool, seed: int = 0,
                     max_moves: int | None = None, fmt: str = "text") -> tuple[bool, str]:
    """``(balanced, output)``: balanced means no move planned and no violation left."""
    plan = plan_rebalance(state.snapshot(), random.Random(seed), max_moves=max_moves)
    balanced = not plan.moves and not plan.report.violations_after
    notes = []
    if not state.liveness_known:
        notes.append("tablet server liveness is unknown (catalog read offline): the plan "
                     "assumes every tablet server is up")
    if plan.moves and not report_only:
        notes.append(NOT_EXECUTED_NOTE)
    if fmt != "text":
        data = json.loads(format_rebalance(plan, report_only=report_only, fmt="json"))
        out = {"source": state.source, **data, "executed_moves": 0, "notes": notes}
        return balanced, render_json(out, fmt)
    parts = [f"Source: {state.source}", "", format_rebalance(plan, report_only=report_only)]
    parts += ["", "The cluster is balanced and complies with the placement policy."
              if balanced else
              f"{len(plan.moves)} move(s) would be needed; "
              f"{len(plan.report.violations_after)} violation(s) would remain."]
    parts += [f"NOTE: {n}" for n in notes]
    return balanced, "\n".join(parts)


def _ksck(args: argparse.Namespace) -> int:
    _check_round_trip_ms(float(args.max_round_trip_ms))  # before reaching any master
    src = open_source(args)
    try:
        ok, out = ksck_report(src.state(masters=True), args.format,
                              max_round_trip_ms=float(args.max_round_trip_ms))
    finally:
        src.close()
    print(out)
    return EXIT_OK if ok else EXIT_PROBLEMS


def _rebalance(args: argparse.Namespace) -> int:
    src = open_source(args)
    try:
        balanced, out = rebalance_report(src.state(), report_only=bool(args.report_only),
                                         seed=int(args.seed), max_moves=args.max_moves,
                                         fmt=args.format)
    finally:
        src.close()
    print(out)
    return EXIT_OK if balanced else EXIT_PROBLEMS
