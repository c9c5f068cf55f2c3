"""Plan a rebalance of a pyspark-kudu cluster, as ``kudu cluster rebalance --report_only``.

    spark-submit jobs/rebalance.py [--master h1:7051,h2:7052,h3:7053 | --warehouse DIR]

The job opens a :class:`~pyspark_kudu.KuduContext` (so the tablet servers of this
application register and their liveness is known), plans with the master's rebalancer and
prints the report of ``pyspark-kudu cluster rebalance``
(:func:`~pyspark_kudu.tools.cli_cluster.rebalance_report`): per-location load, placement
policy violations and skew before and after the planned moves.

``--report_only`` is the default. ``--no-report_only`` carries the moves out: each is a
tablet copy onto the target's host (pinned read, shuffle, pinned write) and Raft config
changes, add then remove (3-4-3), at most ``--max_moves`` per pass, pass after pass until
the master plans no more moves (re-replication of failed servers always goes first), or
``--timeout-s``; then it prints the report again.

Exit codes: 0 balanced and compliant (after the moves, if executed); 1 moves planned or
violations remain (or the plan failed); 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pyspark.sql import SparkSession

from pyspark_kudu.errors import KuduError, UsageError
from pyspark_kudu.spark.api.jobsupport import (
    add_context_args,
    job_session,
    open_context,
    parse_job_args,
)
from pyspark_kudu.tools.cli_cluster import rebalance_report
from pyspark_kudu.tools.connect import RemoteSource
from pyspark_kudu.tools.tabular import FORMATS

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rebalance.py", description=(__doc__ or "").splitlines()[0],
        epilog="Exit codes: 0 balanced, 1 moves planned or violations remain, 2 usage error.")
    p.add_argument("--report_only", "--report-only", dest="report_only", default=True,
                   action=argparse.BooleanOptionalAction,
                   help="print the plan's report only (default); --no-report_only "
                        "executes the moves")
    p.add_argument("--max_moves", "--max-moves", dest="max_moves", type=int, metavar="N",
                   help="plan at most N moves (default: as many as needed); when executing: "
                        "moves per pass (default 4)")
    p.add_argument("--timeout-s", type=float, default=1800.0,
                   help="when executing: stop after this long (default 1800)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the planner's random choices (default 0: the same catalog "
                        "gives the same plan)")
    add_context_args(p)
    p.add_argument("--format", choices=FORMATS, default="text",
                   help="text tables (default), json or json_pretty")
    return p


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    """Plan and print; returns the exit code. ``spark`` is used and left running if given,
    else the job starts its own session and stops it at the end."""
    args = parse_job_args(build_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        with (job_session("pyspark-kudu-rebalance", spark) as session,
              open_context(session, args) as kudu):
            if not args.report_only:
                kudu.healer.stop()  # this job drives the passes itself
                kudu.healer.max_moves = args.max_moves or 4
                quiet, done = kudu.healer.until_quiet(args.timeout_s, rebalance=True)
                for a in done:
                    print(f"{a.action} tablet {a.tablet_id} ({a.table}) from {a.ts_uuid}: "
                          f"{a.outcome} in {a.seconds:.1f} s")
                print(f"executed {sum(a.outcome == 'ok' for a in done)} of {len(done)} "
                      f"moves" + ("" if quiet else f"; moves left after {args.timeout_s:.0f} s"))
            balanced, report = rebalance_report(
                RemoteSource(kudu.master).state(), report_only=True, seed=args.seed,
                max_moves=args.max_moves, fmt=args.format)
    except UsageError as e:
        print(f"rebalance.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KuduError as e:
        print(f"rebalance.py: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(report)
    return EXIT_OK if balanced else EXIT_FAILED



if __name__ == "__main__":
    raise SystemExit(main())
