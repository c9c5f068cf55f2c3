"""Heal a pyspark-kudu cluster: carry out the master's re-replication plan with Spark jobs.

    spark-submit jobs/heal.py [--master ADDRESSES | --warehouse DIR] [--timeout-s 600]
                              [--rebalance] [--continuous [--interval-s 5]]

There are no storage daemons: a tablet server's replicas are replaced by a *client* that
runs Spark tasks on the hosts (:mod:`pyspark_kudu.spark.healing.healer`). Every ``KuduContext``
heals in the background while it is open; this job is for a cluster no application is
writing to. The master decides which tablet servers have failed (unheard of for
``follower_unavailable_considered_failed_sec``) and where new replicas go; this job adds
them (tablet copy), promotes them and evicts the failed ones (3-4-3), with ``--rebalance``
also carries out the rebalancer's moves, and finally deletes evicted replicas' files.

Default: passes until the master has nothing left to do, or ``--timeout-s``.
``--continuous``: a long-running healer (stop it with SIGTERM/Ctrl-C).

Exit codes: 0 nothing left to do; 1 still work left at the timeout (or a failure); 2 usage.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from pyspark.sql import SparkSession

from pyspark_kudu.errors import KuduError, UsageError
from pyspark_kudu.spark.api.jobsupport import (
    add_context_args,
    job_session,
    open_context,
    parse_job_args,
)
from pyspark_kudu.spark.healing.healer import HealAction

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="heal.py", description=(__doc__ or "").splitlines()[0],
        epilog="Exit codes: 0 nothing left to do, 1 work left at the timeout, 2 usage error.")
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="give up after this long (default 600; not with --continuous)")
    p.add_argument("--rebalance", action="store_true",
                   help="also carry out the rebalancer's moves once nothing needs healing")
    p.add_argument("--continuous", action="store_true",
                   help="keep healing until stopped (SIGTERM / Ctrl-C)")
    p.add_argument("--interval-s", type=float, default=5.0,
                   help="seconds between passes with --continuous (default 5)")
    p.add_argument("--max-moves", type=int, default=4,
                   help="actions per pass (default 4)")
    add_context_args(p)
    p.add_argument("--format", choices=("text", "json"), default="text")
    return p


def _line(a: HealAction) -> str:
    return (f"{a.action:<16} tablet {a.tablet_id} ({a.table}) server {a.ts_uuid}: "
            f"{a.outcome} in {a.seconds:.1f} s")


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    args = parse_job_args(build_parser(), argv)
    if isinstance(args, int):
        return args
    if args.max_moves < 1 or args.timeout_s <= 0 or args.interval_s <= 0:
        print("heal.py: error: --max-moves, --timeout-s and --interval-s must be positive",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        with (job_session("pyspark-kudu-heal", spark) as session,
              open_context(session, args) as kudu):
            kudu.healer.stop()  # this job drives the passes itself
            kudu.healer.max_moves = args.max_moves
            if args.continuous:
                return _continuous(kudu.healer, args)
            quiet, done = kudu.healer.until_quiet(args.timeout_s, rebalance=args.rebalance)
            swept = kudu.sweep_replicas()
    except UsageError as e:
        print(f"heal.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KuduError as e:
        print(f"heal.py: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAILED
    if args.format == "json":
        print(json.dumps({"quiet": quiet, "swept": swept, "actions": [
            {"action": a.action, "tablet_id": a.tablet_id, "table": a.table,
             "ts_uuid": a.ts_uuid, "outcome": a.outcome, "seconds": round(a.seconds, 3)}
            for a in done]}))
    else:
        for a in done:
            print(_line(a))
        print(f"{len(done)} actions, {sum(a.outcome == 'ok' for a in done)} ok; "
              f"{swept} evicted replicas deleted; "
              + ("nothing left to do" if quiet else f"work left after {args.timeout_s:.0f} s"))
    return EXIT_OK if quiet else EXIT_FAILED


def _continuous(healer: object, args: argparse.Namespace) -> int:
    from pyspark_kudu.spark.healing.healer import Healer

    assert isinstance(healer, Healer)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    while not stop.is_set():
        try:
            for a in healer.heal_once(args.rebalance):
                print(_line(a), flush=True)
        except KuduError as e:
            print(f"heal.py: pass failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        stop.wait(args.interval_s)
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
