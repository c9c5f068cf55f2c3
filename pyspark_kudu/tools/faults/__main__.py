"""``python -m pyspark_kudu.tools.faults --mode short|long|chaos --seed N --out DIR [--replay F]``

Runs the fault harness (:mod:`pyspark_kudu.tools.faults.harness`) and exits 0 when the
checker found nothing, 1 on a violation (or an inconclusive key), 2 when the run itself
broke (cluster did not start, final read impossible, ...). Prints the seed and the
schedule, and the command that replays it. In chaos mode (:mod:`.chaos`) it also prints the
acknowledged share of the writes against the goal, which never changes the exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pyspark_kudu.tools.faults.harness import MODES, run, with_overrides
from pyspark_kudu.tools.faults.inject import FaultEvent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pyspark_kudu.tools.faults",
                                description="Fault harness: workload + faults + checker.")
    p.add_argument("--mode", choices=sorted(MODES), default="short")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--replay", type=Path, help="schedule.json of an earlier run to replay")
    p.add_argument("--workers", type=int, help="override the mode's number of workers")
    p.add_argument("--clients", type=int, help="override the mode's client threads")
    p.add_argument("--sessions", type=int,
                   help="SparkSessions (each its own KuduContext, an independent writer) the "
                        "client threads are spread over (default 2)")
    p.add_argument("--window-s", type=float, dest="fault_window_s",
                   help="override the mode's fault window (seconds)")
    p.add_argument("--no-lose-host", action="store_true",
                   help="do not lose a host for good at the end of the window")
    p.add_argument("--budget-s", type=float, dest="budget_s",
                   help="override the run's budget (the watchdog ends the run past it)")
    p.add_argument("--writes", type=int, dest="chaos_writes",
                   help="chaos mode: at most this many writes in the window (default 30)")
    p.add_argument("--rows", type=int, dest="chaos_rows",
                   help="chaos mode: rows per write (default 200)")
    p.add_argument("--period-s", type=float, dest="chaos_period_s",
                   help="chaos mode: seconds between executor kills (default 8)")
    args = p.parse_args(argv)
    cfg = with_overrides(MODES[args.mode], seed=args.seed, workers=args.workers,
                         clients=args.clients, sessions=args.sessions,
                         fault_window_s=args.fault_window_s,
                         lose_host=False if args.no_lose_host else None,
                         budget_s=args.budget_s, chaos_writes=args.chaos_writes,
                         chaos_rows=args.chaos_rows, chaos_period_s=args.chaos_period_s)
    schedule = None
    if args.replay is not None:
        saved = json.loads(args.replay.read_text(encoding="utf-8"))
        schedule = [FaultEvent.from_dict(e) for e in saved["events"]]
        cfg = with_overrides(cfg, seed=int(saved.get("seed", cfg.seed)))
    outcome = run(cfg, args.out.resolve(), schedule,
                  log=lambda s: print(s, file=sys.stderr, flush=True))
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
