"""Turning DDL requests into catalog records (the leader's side of one logical operation).

The leader builds the complete record first -- ids, partitions, the placed initial Raft
config of every tablet -- so that the operation is one Raft entry (seed:
kudu-multi-master). Builders read the catalog the leader has applied and fail fast on what
they can see; the final word is :func:`pyspark_kudu.master.catalog.apply` at commit time.

Replica placement is :func:`pyspark_kudu.master.placement.place_tablets` over a
:class:`~pyspark_kudu.master.topology.ClusterSnapshot` built from the catalog and the
leader's tablet-server liveness (heartbeats), with the injected ``random.Random``.

Thread-safety: pure functions apart from consuming ``rng`` and ``new_id``.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence

from pyspark_kudu.errors import AlreadyPresentError, InvalidArgumentError
from pyspark_kudu.master.catalog import Catalog
from pyspark_kudu.master.entities import (
    ConstraintMeta,
    PartitionMeta,
    TableMeta,
    TabletMeta,
    replicas_from,
    validate_identifier,
)
from pyspark_kudu.master.placement import place_tablets, validate_replication_factor
from pyspark_kudu.master.records import (
    AddColumn,
    AlterStep,
    AlterTable,
    CreateTable,
    DeleteTable,
    DropColumn,
    RenameColumn,
    RenameTable,
)
from pyspark_kudu.master.topology import (
    ClusterSnapshot,
    PlacementConfig,
    Table,
    TabletServer,
)
from pyspark_kudu.partitioning import Partitioner, PartitionSchema
from pyspark_kudu.schema import ColumnSchema, Schema, values_to_json

__all__ = [
    "build_alter_table",
    "build_create_table",
    "build_delete_table",
    "cluster_snapshot",
    "new_id",
]


def new_id() -> str:
    """A fresh table or tablet id (32 hex digits, like Kudu's object ids)."""
    return uuid.uuid4().hex


def cluster_snapshot(
    catalog: Catalog,
    live: Collection[str],
    tables: Sequence[Table] = (),
    config: PlacementConfig | None = None,
) -> ClusterSnapshot:
    """Registered tablet servers (``live`` marks the ones heard from recently) for placement.

    Replica counts come from the catalog's ``replica_counts`` so the snapshot needs no
    tablets; it is O(tablet servers), not O(tablets).
    """
    servers = tuple(
        TabletServer(ts.uuid, ts.host, ts.port, ts.location, live=ts.uuid in live,
                     num_live_replicas=catalog.replica_counts.get(ts.uuid, 0))
        for ts in sorted(catalog.tservers.values(), key=lambda t: t.uuid)
    )
    return ClusterSnapshot(tservers=servers, tables=tuple(tables),
                           config=config or PlacementConfig())


def build_create_table(
    catalog: Catalog,
    *,
    name: str,
    schema: Schema,
    partition_schema: PartitionSchema | None,
    replication_factor: int,
    constraint: ConstraintMeta | None,
    live: Collection[str],
    rng: random.Random,
    id_factory: Callable[[], str] = new_id,
    placement_config: PlacementConfig | None = None,
) -> CreateTable:
    """A :class:`CreateTable` with every tablet placed.

    Raises:
        InvalidArgumentError: bad name, column name, partitioning or replication factor.
        AlreadyPresentError: the name is taken.
        NotFoundError: ``not enough tablet servers to satisfy replica placement policy``.
    """
    validate_identifier("table", name)
    for col in schema.columns:
        validate_identifier("column", col.name)
    if name in catalog.names:
        raise AlreadyPresentError(
            f"table {name!r} already exists with id {catalog.names[name]}; choose another "
            f"name or delete the existing table first"
        )
    partitioner = Partitioner(schema, partition_schema or PartitionSchema())
    table_id = id_factory()
    topo_table = Table(table_id, name, replication_factor,
                       None if constraint is None else constraint.to_topology())
    snap = cluster_snapshot(catalog, live, (topo_table,), placement_config)
    eligible = [ts for ts in snap.live_tservers
                if constraint is None or constraint.to_topology().allows(ts.location,
                                                                          snap.tags_of(ts))]
    validate_replication_factor(replication_factor, len(eligible))
    placements = place_tablets(snap, topo_table, partitioner.num_partitions, rng)
    rcols = partitioner.range_columns
    types = [schema.column(c).type for c in rcols]

    def bound(b: tuple[object, ...] | None) -> tuple[object, ...] | None:
        if b is None:
            return None
        return tuple(values_to_json(t, [v])[0] for t, v in zip(types, b, strict=True))

    tablets = tuple(
        TabletMeta(id_factory(), table_id,
                   PartitionMeta(p.hash_buckets, bound(p.range.lower), bound(p.range.upper)),
                   replicas_from(servers))
        for p, servers in zip(partitioner.partitions, placements, strict=True)
    )
    table = TableMeta(
        table_id, name, schema, partitioner.partition_schema.to_dict(schema),
        replication_factor, tuple(t.tablet_id for t in tablets), constraint,
    )
    return CreateTable(table, tablets)


def build_delete_table(catalog: Catalog, name: str) -> DeleteTable:
    """Raises NotFoundError when no live table has that name."""
    return DeleteTable(catalog.table_by_name(name).table_id)


def build_alter_table(
    catalog: Catalog,
    name: str,
    *,
    rename_to: str | None = None,
    add_columns: Sequence[ColumnSchema] = (),
    drop_columns: Sequence[str] = (),
    rename_columns: Mapping[str, str] | None = None,
) -> AlterTable:
    """One :class:`AlterTable` with the steps in Kudu's order: columns, then the table name.

    Raises:
        NotFoundError: no live table ``name``.
        InvalidArgumentError: nothing to alter, or an invalid new name.
    """
    table = catalog.table_by_name(name)
    steps: list[AlterStep] = []
    steps += [DropColumn(c) for c in drop_columns]
    steps += [RenameColumn(o, n) for o, n in (rename_columns or {}).items()]
    steps += [AddColumn(c) for c in add_columns]
    if rename_to is not None:
        steps.append(RenameTable(rename_to))
    if not steps:
        raise InvalidArgumentError(
            f"nothing to alter in table {name!r}: give rename_to, add_columns, drop_columns "
            f"or rename_columns"
        )
    return AlterTable(table.table_id, tuple(steps))
