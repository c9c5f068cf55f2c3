"""Export a pyspark-kudu table as a Delta table (written with ``deltalake``).

    spark-submit jobs/export_delta.py --table events --dest /data/events_delta \\
        [--snapshot INDEX] [--mode overwrite|append|error]

The table is read once through :meth:`~pyspark_kudu.KuduContext.read_table` (scans of
committed data, one scan per tablet) and handed to ``deltalake.write_deltalake`` as one Arrow
table: delta-spark's jars are not reachable here (DESIGN §4). The rows are collected on the
driver, so the table must fit in the driver's memory.

``--snapshot`` is an MVCC snapshot as ``read_table`` takes it: a tablet log index, every
tablet read as of that index (default: each tablet's latest committed state). Indexes are per
tablet, so it is not a cluster-wide point in time.

Exit codes: 0 exported; 1 the scan or the Delta write failed (e.g. ``--mode error`` and a
table exists at ``--dest``, or an append whose schema differs); 2 usage error (bad option, no
such table).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from pyspark.sql import SparkSession

from pyspark_kudu.errors import KuduError, UsageError
from pyspark_kudu.spark.api.jobsupport import (
    add_context_args,
    job_session,
    open_context,
    parse_job_args,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="export_delta.py", description=(__doc__ or "").splitlines()[0],
        epilog="Exit codes: 0 exported, 1 scan or Delta write failed, 2 usage error.")
    p.add_argument("--table", required=True, metavar="NAME", help="pyspark-kudu table to read")
    p.add_argument("--dest", required=True, metavar="PATH",
                   help="Delta table directory or URL to write (created if missing)")
    p.add_argument("--snapshot", type=int, metavar="INDEX",
                   help="read every tablet as of this log index (default: latest committed)")
    p.add_argument("--mode", choices=("overwrite", "append", "error"), default="overwrite",
                   help="what to do when a Delta table exists at --dest: overwrite it "
                        "(default, a new version), append to it, or fail")
    add_context_args(p)
    return p


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    """Export; returns the exit code. ``spark`` is used and left running if given, else the
    job starts its own session and stops it at the end."""
    from deltalake import DeltaTable, write_deltalake
    from deltalake.exceptions import DeltaError

    args = parse_job_args(build_parser(), argv)
    if isinstance(args, int):
        return args
    start = time.monotonic()
    try:
        with (job_session("pyspark-kudu-export-delta", spark) as session,
              open_context(session, args) as kudu):
            session.sparkContext.setJobDescription(f"export_delta: scan {args.table}")
            try:
                rows = kudu.read_table(args.table, snapshot=args.snapshot).toArrow()
            finally:
                session.sparkContext.setLocalProperty(  # None removes the description
                    "spark.job.description", None)  # type: ignore[arg-type]
        write_deltalake(args.dest, rows, mode=args.mode)
        version = DeltaTable(args.dest).version()
    except UsageError as e:
        print(f"export_delta.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (KuduError, DeltaError) as e:
        print(f"export_delta.py: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"exported {rows.num_rows} rows of table {args.table} to {args.dest} (Delta version "
          f"{version}, mode {args.mode}) in {time.monotonic() - start:.1f} s")
    return EXIT_OK



if __name__ == "__main__":
    raise SystemExit(main())
