"""What every spark-submit job in ``jobs/`` shares: its SparkSession and KuduContext options.

Jobs stay thin (parse arguments, call the library, print): the session set-up and the
``--master`` / ``--warehouse`` / ``--local-tablet-servers`` options live here once.

Thread-safety: functions only.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from pyspark.sql import SparkSession

from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.daemon import SESSION_CONF

__all__ = ["USAGE_EXIT", "add_context_args", "job_session", "open_context", "parse_job_args"]


USAGE_EXIT = 2


def parse_job_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None
                   ) -> argparse.Namespace | int:
    """The parsed arguments, or the exit code when parsing ended the job: ``--help`` (0) or
    a usage error (2, already printed by argparse)."""
    try:
        return parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else USAGE_EXIT


def add_context_args(p: argparse.ArgumentParser) -> None:
    """``--master``, ``--warehouse``, ``--local-tablet-servers`` and the embedded master's
    ``--location-mapping-cmd``, ``--location-mapping-timeout-s`` and ``--failed-after-s``."""
    p.add_argument("--master", metavar="ADDRESSES",
                   help="standalone masters host:port,...; default: a master embedded in this "
                        "driver, keeping its catalog under --warehouse")
    p.add_argument("--warehouse", metavar="DIR",
                   help="embedded master's catalog and, in local mode, the virtual tablet "
                        "servers' data (default: spark.kudu.warehouse, else ./kudu-warehouse)")
    p.add_argument("--local-tablet-servers", type=int, default=3, metavar="N",
                   help="virtual tablet servers in local[*] mode (default 3)")
    p.add_argument("--location-mapping-cmd", metavar="CMD",
                   help="embedded master only: the command that maps a tablet server's host "
                        "to its location, e.g. 'conf/location_mapping.sh conf/topology.txt' "
                        "(default spark.kudu.locationMappingCmd, else none: no locations)")
    p.add_argument("--location-mapping-timeout-s", type=float, metavar="S",
                   help="embedded master only: how long the mapping command may run "
                        "(default spark.kudu.locationMappingTimeoutSec, else 10)")
    p.add_argument("--failed-after-s", type=float, metavar="S",
                   help="embedded master only: a tablet server unheard of for S seconds has "
                        "its replicas replaced (follower_unavailable_considered_failed_sec; "
                        "default spark.kudu.followerUnavailableConsideredFailedSec, else 300)")


@contextmanager
def job_session(app_name: str, spark: SparkSession | None = None) -> Iterator[SparkSession]:
    """``spark`` if given (left running), else a new session stopped at the end: under
    spark-submit (which sets ``PYSPARK_GATEWAY_PORT``) with its master, else ``local[2]``."""
    if spark is not None:
        yield spark
        return
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Python workers need this env
    builder = SparkSession.builder.appName(app_name).config(map=dict(SESSION_CONF))
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master("local[2]")
    session = builder.getOrCreate()
    try:
        yield session
    finally:
        session.stop()


def open_context(session: SparkSession, args: argparse.Namespace) -> KuduContext:
    """The KuduContext the options of :func:`add_context_args` describe."""
    return KuduContext(session, args.master, warehouse=args.warehouse,
                       local_tablet_servers=args.local_tablet_servers,
                       location_mapping_cmd=getattr(args, "location_mapping_cmd", None),
                       location_mapping_timeout_s=getattr(args, "location_mapping_timeout_s",
                                                          None),
                       failed_after_s=getattr(args, "failed_after_s", None))
