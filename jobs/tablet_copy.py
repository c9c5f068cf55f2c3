"""Move one replica of a tablet to another tablet server (tablet copy, then eviction).

    spark-submit jobs/tablet_copy.py --table T --tablet TABLET_ID --from TS_UUID --to TS_UUID
                                     [--master ADDRESSES | --warehouse DIR]

Kudu's ``tablet_copy`` / ``change_config move_replica`` for pyspark-kudu: the tablet's
leader (this job elects itself for the tablet if needed) adds ``--to`` as a NON_VOTER,
copies the tablet to it (a pinned read on the leader's host, a Spark shuffle, a pinned
write on the target's host), promotes it once caught up and evicts ``--from`` (3-4-3).
The evicted replica's files are deleted by the next sweep (``jobs/heal.py`` runs one).

Exit codes: 0 moved; 1 the move failed; 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from pyspark.sql import SparkSession

from pyspark_kudu.errors import KuduError, NotFoundError, UsageError
from pyspark_kudu.spark.api.jobsupport import (
    add_context_args,
    job_session,
    open_context,
    parse_job_args,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tablet_copy.py", description=(__doc__ or "").splitlines()[0],
        epilog="Exit codes: 0 moved, 1 failed, 2 usage error.")
    p.add_argument("--table", required=True)
    p.add_argument("--tablet", required=True)
    p.add_argument("--from", dest="src", required=True, help="tablet server UUID to leave")
    p.add_argument("--to", dest="dst", required=True, help="tablet server UUID to copy to")
    add_context_args(p)
    return p


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    args = parse_job_args(build_parser(), argv)
    if isinstance(args, int):
        return args
    if args.src == args.dst:
        print("tablet_copy.py: error: --from and --to name the same tablet server",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        with (job_session("pyspark-kudu-tablet-copy", spark) as session,
              open_context(session, args) as kudu):
            locs = kudu.master.get_table(args.table)
            tablet = next((t for t in locs.tablets if t.tablet_id == args.tablet), None)
            if tablet is None:
                raise NotFoundError(f"table {args.table} has no tablet {args.tablet}")
            if args.src not in tablet.voters:
                raise NotFoundError(f"tablet {args.tablet} has no voter on {args.src} "
                                    f"(voters: {list(tablet.voters)})")
            if tablet.replica(args.dst) is not None:
                raise UsageError(f"tablet {args.tablet} already has a replica on {args.dst}")
            t0 = time.monotonic()
            kudu.execute_replication_action({
                "action": "move_replica", "tablet_id": args.tablet, "table_name": args.table,
                "ts_uuid": args.src, "to_uuid": args.dst,
                "cas_config_index": tablet.config_index})
            after = next(t for t in kudu.master.get_table(args.table).tablets
                         if t.tablet_id == args.tablet)
    except UsageError as e:
        print(f"tablet_copy.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KuduError as e:
        print(f"tablet_copy.py: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
    if args.dst not in after.voters or args.src in after.voters:
        print(f"tablet_copy.py: failed: the tablet's voters are now {list(after.voters)} "
              f"(it changed meanwhile?)", file=sys.stderr)
        return EXIT_FAILED
    print(f"moved tablet {args.tablet} of {args.table} from {args.src} to {args.dst} in "
          f"{time.monotonic() - t0:.1f} s; voters now {list(after.voters)}")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
