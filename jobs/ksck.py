"""Check a pyspark-kudu cluster from a Spark application, as ``kudu cluster ksck``.

    spark-submit jobs/ksck.py [--master h1:7051,h2:7052,h3:7053 | --warehouse DIR]

The job opens a :class:`~pyspark_kudu.KuduContext`, so the tablet servers of this
application's executors (or the virtual ones of ``local[*]`` mode) register with the master
and their liveness is known, then prints the report of ``pyspark-kudu cluster ksck``
(:func:`~pyspark_kudu.tools.cli_cluster.ksck_report`: masters, tablet servers with their
locations, tablet health per table, placement policy violations).

Exit codes: 0 healthy and compliant; 1 anything needs attention (or the check failed);
2 usage error.
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
from pyspark_kudu.tools.cli_cluster import ksck_report
from pyspark_kudu.tools.connect import RemoteSource
from pyspark_kudu.tools.tabular import FORMATS

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ksck.py", description=(__doc__ or "").splitlines()[0],
        epilog="Exit codes: 0 healthy, 1 issues found or the check failed, 2 usage error.")
    add_context_args(p)
    p.add_argument("--format", choices=FORMATS, default="text",
                   help="text tables (default), json or json_pretty")
    return p


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    """Run the check; returns the exit code. ``spark`` is used and left running if given,
    else the job starts its own session and stops it at the end."""
    args = parse_job_args(build_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        with (job_session("pyspark-kudu-ksck", spark) as session,
              open_context(session, args) as kudu):
            ok, report = ksck_report(RemoteSource(kudu.master).state(masters=True),
                                     args.format)
    except UsageError as e:
        print(f"ksck.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KuduError as e:
        print(f"ksck.py: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(report)
    return EXIT_OK if ok else EXIT_FAILED



if __name__ == "__main__":
    raise SystemExit(main())
