"""Builders shared by the catalog tests: a schema, tablet servers, a catalog with a table."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from pyspark_kudu.master.catalog import Catalog, apply
from pyspark_kudu.master.ddl import build_create_table
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.master.records import CreateTable, RegisterTServer
from pyspark_kudu.partitioning import HashDimension, PartitionSchema, RangePartition
from pyspark_kudu.schema import ColumnSchema, Schema

SCHEMA = Schema(
    (ColumnSchema("id", "int64", nullable=False), ColumnSchema("ts", "int64", nullable=False),
     ColumnSchema("v", "string")),
    ("id", "ts"),
)
HASH2_RANGE2 = PartitionSchema(
    (HashDimension(("id",), 2),), ("ts",),
    (RangePartition((0,), (100,)), RangePartition((100,), (200,))),
)


def id_factory(prefix: str = "id") -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: f"{prefix}{next(counter):04d}"


def with_tservers(n: int = 3, catalog: Catalog | None = None, start_index: int = 1) -> Catalog:
    c = catalog or Catalog()
    for i in range(n):
        c = apply(c, RegisterTServer(TServerMeta(f"ts{i}", f"127.0.0.{i + 2}", 7050,
                                                 f"/data/ts{i}", f"/rack{i % 3}")),
                  start_index + i)
    return c


def create(catalog: Catalog, name: str = "t1", rf: int = 3,
           partition_schema: PartitionSchema | None = None, seed: int = 0,
           prefix: str = "id") -> CreateTable:
    return build_create_table(
        catalog, name=name, schema=SCHEMA, partition_schema=partition_schema,
        replication_factor=rf, constraint=None, live=set(catalog.tservers),
        rng=random.Random(seed), id_factory=id_factory(prefix),
    )
