"""``pyspark-kudu tserver list [--columns=uuid,rpc-addresses,location,...]``.

The listing is :func:`pyspark_kudu.tools.tserver.tserver_rows` (Kudu's column names,
case-insensitive, ``unknown column (--columns): NAME`` for a bad one, exit code 2). Over a
catalog read offline the ``live`` column says ``unknown``. Exit code 0 otherwise.

Thread-safety: not applicable (CLI verb).
"""

from __future__ import annotations

import argparse

from pyspark_kudu.master.topology import ClusterSnapshot
from pyspark_kudu.tools.connect import (
    EXIT_OK,
    add_connection_args,
    add_format_arg,
    open_source,
    verb,
)
from pyspark_kudu.tools.tabular import render_json, render_table
from pyspark_kudu.tools.tserver import COLUMNS, DEFAULT_COLUMNS, tserver_rows

__all__ = ["add_group"]


def add_group(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    grp = sub.add_parser("tserver", help="tablet server operations",
                         description="Tablet server operations, as the kudu tool's 'tserver'.")
    verbs = grp.add_subparsers(dest="verb", metavar="VERB", required=True)
    ls = verbs.add_parser(
        "list", help="list the registered tablet servers",
        description="List the tablet servers registered with the master. Exit code 0, or 2 "
                    "for an unknown column, 3 when no master can be reached.")
    add_connection_args(ls)
    add_format_arg(ls)
    ls.add_argument("--columns", default=DEFAULT_COLUMNS,
                    help=f"comma-separated columns among {', '.join(COLUMNS)} "
                         f"(default {DEFAULT_COLUMNS})")
    ls.set_defaults(func=verb(_list), verb_parser=ls)


def _list(args: argparse.Namespace) -> int:
    tserver_rows(ClusterSnapshot(), args.columns)  # a bad column fails before any RPC
    src = open_source(args)
    try:
        state = src.state()
    finally:
        src.close()
    rows = tserver_rows(state.snapshot(), args.columns)
    names = [c.strip().lower() for c in str(args.columns).split(",") if c.strip()]
    if not state.liveness_known:
        for r in rows:
            if "live" in r:
                r["live"] = "unknown"
    if args.format == "text":
        print(render_table(names, [[r[n] for n in names] for r in rows]))
    else:
        print(render_json(rows, args.format))
    return EXIT_OK
