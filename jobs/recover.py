"""Recover a tablet that lost a majority of its replicas (UNSAFE: may lose data).

    spark-submit jobs/recover.py --table T --tablet TABLET_ID [--survivor TS_UUID]
                                 --i-understand-data-loss [--master ... | --warehouse DIR]

The Raft config change seed's "unsafe config change": with most of a tablet's voters lost
for good, no write to it can ever commit again. This job reads every reachable replica,
picks the most up-to-date one (highest last log term, then index; or ``--survivor``),
forces a configuration of that replica alone (its whole log counts as committed, including
entries the lost majority may never have agreed on), elects it, and then heals the tablet
back to its replication factor with tablet copies
(:meth:`~pyspark_kudu.spark.api.context.KuduContext.recover_tablet`). Whatever only the lost
replicas had is gone; other surviving replicas are discarded and later deleted.

It refuses while a majority is reachable, and without ``--i-understand-data-loss``.

Exit codes: 0 recovered and healed; 1 recovery or healing failed; 2 usage error.
"""

from __future__ import annotations

import argparse
import json
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

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="recover.py", description=(__doc__ or "").splitlines()[0],
        epilog="Exit codes: 0 recovered, 1 failed, 2 usage error.")
    p.add_argument("--table", required=True)
    p.add_argument("--tablet", required=True, help="the tablet id (see cluster ksck)")
    p.add_argument("--survivor", help="the replica (tablet server UUID) to recover from; "
                                      "default: the most up-to-date reachable one")
    p.add_argument("--i-understand-data-loss", dest="confirmed", action="store_true",
                   help="required: entries only the lost replicas had are lost for good")
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="how long healing back to full replication may take (default 600)")
    add_context_args(p)
    return p


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    args = parse_job_args(build_parser(), argv)
    if isinstance(args, int):
        return args
    if not args.confirmed:
        print("recover.py: error: an unsafe recovery may lose acknowledged writes that only "
              "the lost replicas had; re-run with --i-understand-data-loss if the lost "
              "replicas are gone for good", file=sys.stderr)
        return EXIT_USAGE
    try:
        with (job_session("pyspark-kudu-recover", spark) as session,
              open_context(session, args) as kudu):
            kudu.healer.stop()
            report = kudu.recover_tablet(args.table, args.tablet, args.survivor)
            print("WARNING: UNSAFE recovery done: " + json.dumps(report), file=sys.stderr)
            quiet, done = kudu.healer.until_quiet(args.timeout_s)
    except UsageError as e:
        print(f"recover.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KuduError as e:
        print(f"recover.py: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(dict(report, healed=quiet,
                          actions=[(a.action, a.ts_uuid, a.outcome) for a in done])))
    return EXIT_OK if quiet else EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
