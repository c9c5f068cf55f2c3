"""``pyspark-kudu table list | describe NAME | delete NAME``.

* ``table list``: one row per live table (name, id, replication factor, tablets, state).
* ``table describe NAME``: the schema and partitioning in the layout of ``kudu table
  describe`` (``TABLE name ( ... PRIMARY KEY (...) )``, ``HASH (...) PARTITIONS n``,
  ``RANGE (...)``, ``REPLICAS n``), the placement constraint, then every tablet with its
  partition, state, leader and replicas (uuid, location, membership, REPLACE mark).
* ``table delete NAME``: drops the table through the leader master (the catalog keeps a
  tombstone; the replicas are removed as tablet servers report them). Not possible on a
  catalog read offline.

Exit codes: 0 ok; 1 the table does not exist; 2 usage error; 3 no master reachable.

Thread-safety: pure formatting functions; the verbs are CLI entry points.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark_kudu.master.client import TableLocations
from pyspark_kudu.master.entities import MemberType, PartitionMeta, TableMeta, TabletMeta
from pyspark_kudu.partitioning import RangePartition
from pyspark_kudu.schema import type_to_str, values_to_json
from pyspark_kudu.tools.connect import (
    EXIT_OK,
    add_connection_args,
    add_format_arg,
    open_source,
    verb,
)
from pyspark_kudu.tools.tabular import render_json, render_table
from pyspark_kudu.tools.tserver import NO_LOCATION_TEXT

__all__ = ["add_group", "describe_table", "format_describe", "table_rows"]


def add_group(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    grp = sub.add_parser("table", help="table operations",
                         description="Table operations, as the kudu tool's 'table'.")
    verbs = grp.add_subparsers(dest="verb", metavar="VERB", required=True)
    ls = verbs.add_parser("list", help="list the tables",
                          description="List the live tables with their replication factor "
                                      "and number of tablets.")
    d = verbs.add_parser("describe", help="show a table's schema, partitioning and tablets",
                         description="Describe a table: schema, partitioning, replication "
                                     "factor, placement constraint, and each tablet's "
                                     "replicas with their locations. Exit code 1 if the "
                                     "table does not exist.")
    d.add_argument("name", help="the table's name")
    rm = verbs.add_parser("delete", help="delete a table",
                          description="Delete a table (through the leader master). Exit "
                                      "code 1 if the table does not exist.")
    rm.add_argument("name", help="the table's name")
    for p, f in ((ls, _list), (d, _describe), (rm, _delete)):
        add_connection_args(p)
        add_format_arg(p)
        p.set_defaults(func=verb(f), verb_parser=p)


# == formatting =================================================================================


def table_rows(tables: Sequence[TableMeta]) -> list[dict[str, Any]]:
    """``table list`` rows (JSON keys) for the given catalog tables, sorted by name."""
    return [
        {"name": t.name, "id": t.table_id, "replication_factor": t.replication_factor,
         "tablets": len(t.tablet_ids), "state": t.state.value}
        for t in sorted(tables, key=lambda t: t.name)
    ]


_LIST_HEADS = {"name": "Name", "id": "Id", "replication_factor": "RF", "tablets": "Tablets",
               "state": "State"}


def _partition_text(ps: Mapping[str, Any], part: PartitionMeta) -> str:
    out = [f"HASH ({', '.join(h['columns'])}) PARTITION {b}"
           for h, b in zip(ps.get("hash", ()), part.hash_buckets, strict=False)]
    if ps.get("range_columns"):
        rng = RangePartition(part.range_lower, part.range_upper)
        out.append(f"RANGE ({', '.join(ps['range_columns'])}) PARTITION {rng.describe()}")
    return ", ".join(out) or "UNBOUNDED"


def _replica_json(loc: TableLocations, tb: TabletMeta) -> list[dict[str, Any]]:
    out = []
    for r in tb.replicas:
        ts = loc.tservers.get(r.ts_uuid)
        out.append({"uuid": r.ts_uuid,
                    "address": f"{ts.host}:{ts.port or '-'}" if ts else "",
                    "location": (ts.location if ts else None) or NO_LOCATION_TEXT,
                    "member_type": r.member_type.value, "replace": r.replace,
                    "leader": r.ts_uuid == tb.leader})
    return out


def _replica_text(r: Mapping[str, Any]) -> str:
    marks = [r["location"]]
    if r["leader"]:
        marks.append("LEADER")
    if r["member_type"] != MemberType.VOTER.value:
        marks.append(r["member_type"])
    if r["replace"]:
        marks.append("REPLACE")
    return f"{r['uuid']} ({', '.join(marks)})"


def describe_table(loc: TableLocations) -> dict[str, Any]:
    """Everything ``table describe`` shows, as JSON-able data."""
    t = loc.table
    ps = dict(t.partition_schema)
    cols = []
    for c in t.schema.columns:
        col: dict[str, Any] = {"name": c.name, "type": type_to_str(c.type),
                               "nullable": c.nullable,
                               "primary_key": c.name in t.schema.primary_key}
        if c.default is not None:
            col["default"] = values_to_json(c.type, [c.default])[0]
        cols.append(col)
    return {
        "name": t.name, "id": t.table_id, "state": t.state.value,
        "schema_version": t.schema_version, "replication_factor": t.replication_factor,
        "constraint": None if t.constraint is None else t.constraint.to_dict(),
        "columns": cols, "primary_key": list(t.schema.primary_key), "partition_schema": ps,
        "tablets": [
            {"tablet_id": tb.tablet_id, "partition": _partition_text(ps, tb.partition),
             "state": tb.state.value, "leader": tb.leader or None,
             "replicas": _replica_json(loc, tb)}
            for tb in loc.tablets
        ],
    }


def format_describe(data: Mapping[str, Any]) -> str:
    """The text of ``table describe`` (Kudu's layout, then the tablets)."""
    lines = [f"TABLE {data['name']} ("]
    for c in data["columns"]:
        null = "NULLABLE" if c["nullable"] else "NOT NULL"
        default = f" DEFAULT {c['default']!r}" if "default" in c else ""
        lines.append(f"    {c['name']} {c['type'].upper()} {null}{default},")
    lines += [f"    PRIMARY KEY ({', '.join(data['primary_key'])})", ")"]
    ps = data["partition_schema"]
    parts = [f"HASH ({', '.join(h['columns'])}) PARTITIONS {h['buckets']}"
             for h in ps.get("hash", ())]
    if ps.get("range_columns"):
        ranges = [RangePartition(None if r["lower"] is None else tuple(r["lower"]),
                                 None if r["upper"] is None else tuple(r["upper"])).describe()
                  for r in ps.get("ranges", ())] or ["UNBOUNDED"]
        parts.append(f"RANGE ({', '.join(ps['range_columns'])}) (\n"
                     + ",\n".join(f"    PARTITION {r}" for r in ranges) + "\n)")
    if parts:
        lines.append(",\n".join(parts))
    lines.append(f"REPLICAS {data['replication_factor']}")
    c = data["constraint"]
    if c is not None:
        what = ([f"location under {c['location_prefix']}"] if c["location_prefix"] else []) + [
            f"{k} in {{{','.join(v)}}}" for k, v in sorted(c["tags"].items())]
        lines.append(f"PLACEMENT {' and '.join(what) or 'any server'}")
    lines += [f"Table id: {data['id']}; state {data['state']}, schema version "
              f"{data['schema_version']}", "", f"Tablets ({len(data['tablets'])})"]
    heads = ["Tablet", "Partition", "State", "Leader", "Replicas"]
    lines.append(render_table(heads, [
        [tb["tablet_id"], tb["partition"], tb["state"], tb["leader"] or "-",
         ", ".join(_replica_text(r) for r in tb["replicas"])]
        for tb in data["tablets"]]))
    return "\n".join(lines)


# == verbs ======================================================================================


def _list(args: argparse.Namespace) -> int:
    src = open_source(args)
    try:
        catalog = src.state().catalog
    finally:
        src.close()
    rows = table_rows(catalog.live_tables())
    if args.format == "text":
        heads = list(_LIST_HEADS)
        print(render_table([_LIST_HEADS[h] for h in heads], [[r[h] for h in heads] for r in rows]))
    else:
        print(render_json(rows, args.format))
    return EXIT_OK


def _describe(args: argparse.Namespace) -> int:
    src = open_source(args)
    try:
        data = describe_table(src.table(args.name))
    finally:
        src.close()
    print(format_describe(data) if args.format == "text" else render_json(data, args.format))
    return EXIT_OK


def _delete(args: argparse.Namespace) -> int:
    src = open_source(args)
    try:
        src.delete_table(args.name)
    finally:
        src.close()
    if args.format == "text":
        print(f"Deleted table {args.name}")
    else:
        print(render_json({"deleted": args.name}, args.format))
    return EXIT_OK
