"""The master catalog: an immutable :class:`Catalog` and the pure function that applies records.

Rules (seed: kudu-multi-master):

1. ``apply(catalog, record, index)`` is pure and deterministic: the same log gives the same
   catalog on every replica. It either returns the next catalog or raises a
   :class:`~pyspark_kudu.errors.KuduError` and changes nothing (the entry then applies as a
   no-op, and the error is what the proposer's caller gets).
2. Readers only ever see catalogs produced by committed entries: a replica swaps its
   reference after applying, so no client sees a half-created table (the seed's "caches are
   only updated after a metadata change is successfully replicated").
3. Deleted tables and tablets stay as tombstones; a deleted table's name becomes free again
   (seed: "map of table name to table instance. Deleted tables are omitted").
4. Tablet reports are fenced by term: a report from an older tablet term than the one
   recorded changes nothing; a config is taken only if its tablet-Raft index is not older.
   Reports about tablets without a record (true orphans) are ignored, never acted on.
5. ``masters`` (master id -> address) follows the master group's own configuration changes,
   whose ``context`` carries the new member's address (:func:`apply_conf_change`).

Thread-safety: :class:`Catalog` is immutable; every function here is pure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark_kudu.consensus.messages import ConfChange, ConfChangeType
from pyspark_kudu.errors import (
    AlreadyPresentError,
    InvalidArgumentError,
    KuduError,
    NotFoundError,
)
from pyspark_kudu.master.entities import (
    ReplicaMeta,
    TableMeta,
    TableState,
    TabletMeta,
    TabletState,
    TServerMeta,
    check_table_move,
    check_tablet_move,
)
from pyspark_kudu.master.pmap import PMap
from pyspark_kudu.master.records import (
    AddColumn,
    AlterStep,
    AlterTable,
    CreateTable,
    DeleteTable,
    DropColumn,
    Record,
    RegisterTServer,
    RenameColumn,
    RenameTable,
    SetReplaceMark,
    TabletReport,
    UpdateTablets,
    decode_record,
)
from pyspark_kudu.schema import Schema

__all__ = ["Catalog", "apply", "apply_conf_change", "apply_entry"]


@dataclass(frozen=True)
class Catalog:
    """Tables, tablets, tablet servers and masters as of Raft index ``index``.

    ``tables``/``tablets`` include tombstones; ``names`` maps live table names to ids;
    ``replica_counts`` is the number of live-tablet replicas per tablet server.
    """

    tables: PMap[str, TableMeta] = field(default_factory=PMap)
    names: PMap[str, str] = field(default_factory=PMap)
    tablets: PMap[str, TabletMeta] = field(default_factory=PMap)
    tservers: PMap[str, TServerMeta] = field(default_factory=PMap)
    replica_counts: PMap[str, int] = field(default_factory=PMap)
    masters: PMap[str, str] = field(default_factory=PMap)
    index: int = 0

    # -- lookups ---------------------------------------------------------------------------
    def table_by_name(self, name: str) -> TableMeta:
        tid = self.names.get(name)
        if tid is None:
            raise NotFoundError(
                f"the table does not exist: table_name: {name!r}; list tables to see the "
                f"names that exist"
            )
        return self.tables[tid]

    def live_table(self, table_id: str) -> TableMeta:
        t = self.tables.get(table_id)
        if t is None:
            raise NotFoundError(f"table id {table_id} does not exist")
        if t.state is TableState.DELETED:
            raise NotFoundError(f"table {t.name!r} (id {table_id}) was deleted")
        return t

    def live_tables(self) -> list[TableMeta]:
        return sorted((self.tables[i] for i in self.names.values()), key=lambda t: t.name)

    def tablets_of(self, table: TableMeta) -> list[TabletMeta]:
        return [self.tablets[i] for i in table.tablet_ids]

    # -- snapshots -------------------------------------------------------------------------
    def to_snapshot(self) -> bytes:
        """Canonical JSON of the whole catalog (the Raft snapshot's data)."""
        return json.dumps({
            "index": self.index,
            "tables": [self.tables[k].to_dict() for k in sorted(self.tables)],
            "tablets": [self.tablets[k].to_dict() for k in sorted(self.tablets)],
            "tservers": [self.tservers[k].to_dict() for k in sorted(self.tservers)],
            "masters": dict(sorted(self.masters.items())),
        }, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_snapshot(cls, data: bytes) -> Catalog:
        """Rebuild a catalog (derived indexes included) from :meth:`to_snapshot` bytes."""
        if not data:
            return cls()
        try:
            d = json.loads(data)
            tables = [TableMeta.from_dict(t) for t in d["tables"]]
            tablets = [TabletMeta.from_dict(t) for t in d["tablets"]]
            tservers = [TServerMeta.from_dict(t) for t in d["tservers"]]
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidArgumentError(f"malformed catalog snapshot: {e!r}") from e
        counts: dict[str, int] = {}
        for tb in tablets:
            if tb.state is not TabletState.DELETED:
                for r in tb.replicas:
                    counts[r.ts_uuid] = counts.get(r.ts_uuid, 0) + 1
        return cls(
            tables=PMap((t.table_id, t) for t in tables),
            names=PMap((t.name, t.table_id) for t in tables if t.state is not TableState.DELETED),
            tablets=PMap((t.tablet_id, t) for t in tablets),
            tservers=PMap((t.uuid, t) for t in tservers),
            replica_counts=PMap(counts),
            masters=PMap(d.get("masters", {})),
            index=int(d.get("index", 0)),
        )


# == applying records ===========================================================================


def apply(catalog: Catalog, record: Record, index: int) -> Catalog:
    """The catalog after ``record`` (the entry at Raft ``index``); see the module rules.

    Raises:
        KuduError: the record does not apply (``AlreadyPresentError``, ``NotFoundError``,
            ``InvalidArgumentError``, ``IllegalStateError``); ``catalog`` is unchanged.
    """
    match record:
        case CreateTable():
            out = _create_table(catalog, record)
        case DeleteTable():
            out = _delete_table(catalog, record)
        case AlterTable():
            out = _alter_table(catalog, record)
        case RegisterTServer(ts):
            out = replace(catalog, tservers=catalog.tservers.set(ts.uuid, ts))
        case UpdateTablets():
            out = _update_tablets(catalog, record)
        case SetReplaceMark():
            out = _set_replace(catalog, record)
    return replace(out, index=index)


def apply_entry(catalog: Catalog, data: bytes, index: int) -> tuple[Catalog, KuduError | None]:
    """Apply a committed entry's bytes; an entry that does not apply is a no-op.

    Returns the next catalog (its ``index`` is ``index`` either way) and the error, if any,
    for the proposer. An empty entry (a new leader's no-op) only advances the index.
    """
    if not data:
        return replace(catalog, index=index), None
    try:
        return apply(catalog, decode_record(data), index), None
    except KuduError as e:
        return replace(catalog, index=index), e


def apply_conf_change(catalog: Catalog, cc: ConfChange, index: int) -> Catalog:
    """Track master addresses through the master group's own membership changes."""
    masters = catalog.masters
    if cc.type is ConfChangeType.REMOVE:
        masters = masters.remove(cc.node_id)
    elif cc.context:
        masters = masters.set(cc.node_id, cc.context.decode())
    return replace(catalog, masters=masters, index=index)


def _bump(counts: PMap[str, int], uuids: Iterable[str], delta: int) -> PMap[str, int]:
    changes: dict[str, int] = {}
    for u in uuids:
        changes[u] = changes.get(u, counts.get(u, 0)) + delta
    return counts.update(changes)


def _create_table(c: Catalog, r: CreateTable) -> Catalog:
    t = r.table
    if t.table_id in c.tables:
        raise AlreadyPresentError(f"table id {t.table_id} is already used; retry with a new id")
    if t.name in c.names:
        raise AlreadyPresentError(
            f"table {t.name!r} already exists with id {c.names[t.name]}; choose another name "
            f"or delete the existing table first"
        )
    check_table_move(t.name, None, t.state)
    members: list[str] = []
    for tb in r.tablets:
        if tb.tablet_id in c.tablets:
            raise AlreadyPresentError(f"tablet id {tb.tablet_id} is already used")
        if tb.table_id != t.table_id:
            raise InvalidArgumentError(
                f"tablet {tb.tablet_id} names table {tb.table_id}, not {t.table_id}")
        check_tablet_move(tb.tablet_id, None, tb.state)
        for rep in tb.replicas:
            if rep.ts_uuid not in c.tservers:
                raise NotFoundError(
                    f"tablet {tb.tablet_id}: tablet server {rep.ts_uuid} is not registered")
            members.append(rep.ts_uuid)
    return replace(
        c,
        tables=c.tables.set(t.table_id, t),
        names=c.names.set(t.name, t.table_id),
        tablets=c.tablets.update((tb.tablet_id, tb) for tb in r.tablets),
        replica_counts=_bump(c.replica_counts, members, +1),
    )


def _delete_table(c: Catalog, r: DeleteTable) -> Catalog:
    t = c.live_table(r.table_id)
    gone: list[str] = []
    tablets: dict[str, TabletMeta] = {}
    for tb in c.tablets_of(t):
        if tb.state is TabletState.DELETED:
            continue
        check_tablet_move(tb.tablet_id, tb.state, TabletState.DELETED)
        tablets[tb.tablet_id] = replace(tb, state=TabletState.DELETED)
        gone.extend(rep.ts_uuid for rep in tb.replicas)
    dead = t.with_(state=check_table_move(t.name, t.state, TableState.DELETED))
    return replace(
        c,
        tables=c.tables.set(t.table_id, dead),
        names=c.names.remove(t.name),
        tablets=c.tablets.update(tablets),
        replica_counts=_bump(c.replica_counts, gone, -1),
    )


def _alter_table(c: Catalog, r: AlterTable) -> Catalog:
    t = c.live_table(r.table_id)
    name, schema, pschema = t.name, t.schema, dict(t.partition_schema)
    columns_changed = False
    for step in r.steps:
        if isinstance(step, RenameTable):
            if step.new_name in c.names and c.names[step.new_name] != t.table_id:
                raise AlreadyPresentError(
                    f"cannot rename table {name!r} to {step.new_name!r}: a table with that name "
                    f"already exists; choose another name"
                )
            name = step.new_name
        else:
            schema, pschema = _alter_columns(t.name, schema, pschema, step)
            columns_changed = True
    state = t.state
    if columns_changed:
        state = check_table_move(name, t.state, TableState.ALTERING)
    else:
        check_table_move(name, t.state, t.state)
    new = t.with_(name=name, schema=schema, partition_schema=pschema, state=state,
                  schema_version=t.schema_version + (1 if columns_changed else 0))
    names = c.names
    if name != t.name:
        names = names.remove(t.name).set(name, t.table_id)
    return replace(c, tables=c.tables.set(t.table_id, new), names=names)


def _alter_columns(table: str, schema: Schema, pschema: dict[str, Any],
                   step: AlterStep) -> tuple[Schema, dict[str, Any]]:
    cols, key = list(schema.columns), list(schema.primary_key)
    match step:
        case AddColumn(col):
            if schema.has_column(col.name):
                raise AlreadyPresentError(
                    f"table {table!r}: column {col.name!r} already exists; pick a new name")
            if not col.nullable and not col.has_default:
                raise InvalidArgumentError(
                    f"table {table!r}: column {col.name!r}: NOT NULL columns must have a "
                    f"default; make it nullable or give it a default")
            cols.append(col)
        case DropColumn(col_name):
            schema.column(col_name)  # NotFoundError naming the columns
            if schema.is_key(col_name):
                raise InvalidArgumentError(
                    f"table {table!r}: cannot remove a key column: {col_name}")
            cols = [x for x in cols if x.name != col_name]
        case RenameColumn(old, new):
            old_col = schema.column(old)
            if schema.has_column(new):
                raise AlreadyPresentError(
                    f"table {table!r}: cannot rename column {old!r} to {new!r}: a column with "
                    f"that name already exists")
            cols = [replace(x, name=new) if x.name == old else x for x in cols]
            key = [new if k == old else k for k in key]
            if schema.is_key(old_col.name):
                pschema = _rename_partition_column(pschema, old, new)
        case _:  # RenameTable is handled by the caller
            raise InvalidArgumentError(f"unexpected alter step {step!r}")
    return Schema(tuple(cols), tuple(key)), pschema


def _rename_partition_column(ps: Mapping[str, Any], old: str, new: str) -> dict[str, Any]:
    def ren(names: Iterable[str]) -> list[str]:
        return [new if n == old else n for n in names]

    out = dict(ps)
    out["hash"] = [dict(h, columns=ren(h["columns"])) for h in ps.get("hash", ())]
    out["range_columns"] = ren(ps.get("range_columns", ()))
    return out


def _update_tablets(c: Catalog, r: UpdateTablets) -> Catalog:
    changed: dict[str, TabletMeta] = {}
    counts = c.replica_counts
    for rep in r.reports:
        old = changed.get(rep.tablet_id) or c.tablets.get(rep.tablet_id)
        if old is None or old.state is TabletState.DELETED:
            continue  # orphan or tombstone: never resurrected, never acted on (rule 4)
        new = _merge_report(old, rep)
        if new is None:
            continue
        if new.replicas != old.replicas:
            counts = _bump(counts, (x.ts_uuid for x in old.replicas), -1)
            counts = _bump(counts, (x.ts_uuid for x in new.replicas), +1)
        changed[new.tablet_id] = new
    if not changed:
        return c
    tablets = c.tablets.update(changed)
    tables: dict[str, TableMeta] = {}
    for tid in {tb.table_id for tb in changed.values()}:
        t = c.tables[tid]
        if t.state is TableState.ALTERING and all(
            tablets[x].schema_version >= t.schema_version
            for x in t.tablet_ids if tablets[x].state is not TabletState.DELETED
        ):
            tables[tid] = t.with_(state=check_table_move(t.name, t.state, TableState.RUNNING))
    return replace(c, tablets=tablets, tables=c.tables.update(tables), replica_counts=counts)


def _merge_report(old: TabletMeta, rep: TabletReport) -> TabletMeta | None:
    """``old`` updated by ``rep``, or ``None`` if the report is stale or changes nothing."""
    if rep.term < old.reported_term:
        return None  # a deposed tablet leader's view (fencing, rule 4)
    leader = rep.leader if (rep.leader or rep.term > old.reported_term) else old.leader
    replicas, config_index = old.replicas, old.config_index
    if rep.replicas is not None and rep.config_index >= old.config_index:
        marked = {x.ts_uuid for x in old.replicas if x.replace}
        replicas = tuple(
            ReplicaMeta(x.ts_uuid, x.member_type, x.replace or x.ts_uuid in marked)
            for x in rep.replicas
        )
        config_index = rep.config_index
    state = old.state
    if leader and state is TabletState.CREATING:
        state = check_tablet_move(old.tablet_id, state, TabletState.RUNNING)
    sv = old.schema_version if rep.schema_version is None else max(
        old.schema_version, rep.schema_version)
    new = replace(old, replicas=replicas, config_index=config_index, state=state,
                  reported_term=rep.term, leader=leader, schema_version=sv,
                  committed_index=max(old.committed_index, rep.committed_index))
    return None if new == old else new


def _set_replace(c: Catalog, r: SetReplaceMark) -> Catalog:
    tb = c.tablets.get(r.tablet_id)
    if tb is None or tb.state is TabletState.DELETED:
        raise NotFoundError(f"tablet {r.tablet_id} does not exist or was deleted")
    if tb.replica(r.ts_uuid) is None:
        raise NotFoundError(
            f"tablet {r.tablet_id} has no replica on tablet server {r.ts_uuid} "
            f"(replicas: {[x.ts_uuid for x in tb.replicas]})")
    reps = tuple(replace(x, replace=r.replace) if x.ts_uuid == r.ts_uuid else x
                 for x in tb.replicas)
    return replace(c, tablets=c.tablets.set(tb.tablet_id, replace(tb, replicas=reps)))

