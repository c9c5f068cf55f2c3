"""Catalog records: what one entry of the master's Raft log says.

Rules (seed: kudu-multi-master, "Ensure each logical operation is replicated as one batch"):

1. One logical operation is ONE record and therefore ONE Raft entry: a :class:`CreateTable`
   carries the table and *all* its tablets with their initial Raft configs; an
   :class:`AlterTable` carries every step of the alter; a heartbeat's tablet report is one
   :class:`UpdateTablets`. There is no "roll forward" of half-written operations because
   there are no half-written operations.
2. Records are frozen values validated on construction where no catalog state is needed
   (identifiers, shapes). Whether a record applies (does the name exist? was the table
   deleted?) is decided by :func:`pyspark_kudu.master.catalog.apply`, deterministically, on
   every replica.
3. The bytes of an entry are :func:`encode_record`: canonical JSON (sorted keys), so equal
   records are equal bytes. :func:`decode_record` rejects anything else.

Thread-safety: every class is immutable; the functions are pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.master.entities import (
    ReplicaMeta,
    TableMeta,
    TabletMeta,
    TServerMeta,
    validate_identifier,
)
from pyspark_kudu.schema import ColumnSchema

__all__ = [
    "AddColumn",
    "AlterStep",
    "AlterTable",
    "CreateTable",
    "DeleteTable",
    "DropColumn",
    "Record",
    "RegisterTServer",
    "RenameColumn",
    "RenameTable",
    "SetReplaceMark",
    "TabletReport",
    "UpdateTablets",
    "decode_record",
    "encode_record",
]


# -- alter steps --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RenameTable:
    new_name: str

    def __post_init__(self) -> None:
        validate_identifier("table", self.new_name)


@dataclass(frozen=True)
class AddColumn:
    column: ColumnSchema

    def __post_init__(self) -> None:
        validate_identifier("column", self.column.name)


@dataclass(frozen=True)
class DropColumn:
    name: str


@dataclass(frozen=True)
class RenameColumn:
    old_name: str
    new_name: str

    def __post_init__(self) -> None:
        validate_identifier("column", self.new_name)


AlterStep = RenameTable | AddColumn | DropColumn | RenameColumn


def _step_to_dict(s: AlterStep) -> dict[str, Any]:
    match s:
        case RenameTable(new_name):
            return {"step": "rename_table", "new_name": new_name}
        case AddColumn(column):
            return {"step": "add_column", "column": column.to_dict()}
        case DropColumn(name):
            return {"step": "drop_column", "name": name}
        case RenameColumn(old, new):
            return {"step": "rename_column", "old_name": old, "new_name": new}


def _step_from_dict(d: Mapping[str, Any]) -> AlterStep:
    match d.get("step"):
        case "rename_table":
            return RenameTable(str(d["new_name"]))
        case "add_column":
            return AddColumn(ColumnSchema.from_dict(d["column"]))
        case "drop_column":
            return DropColumn(str(d["name"]))
        case "rename_column":
            return RenameColumn(str(d["old_name"]), str(d["new_name"]))
        case other:
            raise InvalidArgumentError(
                f"unknown alter step {other!r}: use rename_table, add_column, drop_column or "
                f"rename_column"
            )


# -- records ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateTable:
    """A table with all its tablets (ids, partitions, placed initial Raft configs)."""

    table: TableMeta
    tablets: tuple[TabletMeta, ...]

    def __post_init__(self) -> None:
        validate_identifier("table", self.table.name)
        ids = tuple(t.tablet_id for t in self.tablets)
        if ids != self.table.tablet_ids:
            raise InvalidArgumentError(
                f"CreateTable {self.table.name}: tablets {list(ids)} differ from the table's "
                f"tablet ids {list(self.table.tablet_ids)}"
            )
        if not ids:
            raise InvalidArgumentError(f"CreateTable {self.table.name}: a table needs a tablet")


@dataclass(frozen=True)
class DeleteTable:
    """Tombstone the table and all its tablets."""

    table_id: str


@dataclass(frozen=True)
class AlterTable:
    """Every step applies, in order, or none does."""

    table_id: str
    steps: tuple[AlterStep, ...]

    def __post_init__(self) -> None:
        if not self.steps:
            raise InvalidArgumentError(
                f"AlterTable of table {self.table_id} has no steps: rename the table or add, "
                f"drop or rename a column"
            )


@dataclass(frozen=True)
class RegisterTServer:
    """A tablet server registers (first heartbeat) or re-registers with a changed address."""

    tserver: TServerMeta


@dataclass(frozen=True)
class TabletReport:
    """What one tablet's leader (or a replica) says about the tablet.

    ``replicas`` is the committed config in force at tablet-Raft index ``config_index``
    (the reporting leader's applied index: a leader elected after the change does not know
    the change's own index), or ``None`` when unchanged. ``schema_version`` is the version
    the replicas run, if known.
    """

    tablet_id: str
    term: int
    leader: str = ""
    committed_index: int = 0
    config_index: int = 0
    replicas: tuple[ReplicaMeta, ...] | None = None
    schema_version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "tablet_id": self.tablet_id, "term": self.term, "leader": self.leader,
            "committed_index": self.committed_index, "config_index": self.config_index,
            "replicas": None if self.replicas is None else [r.to_dict() for r in self.replicas],
            "schema_version": self.schema_version,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TabletReport:
        reps = d.get("replicas")
        sv = d.get("schema_version")
        return cls(
            str(d["tablet_id"]), int(d.get("term", 0)), str(d.get("leader", "")),
            int(d.get("committed_index", 0)), int(d.get("config_index", 0)),
            None if reps is None else tuple(ReplicaMeta.from_dict(r) for r in reps),
            None if sv is None else int(sv),
        )


@dataclass(frozen=True)
class UpdateTablets:
    """The changed tablets of one heartbeat from ``ts_uuid``: one entry per heartbeat."""

    ts_uuid: str
    reports: tuple[TabletReport, ...]


@dataclass(frozen=True)
class SetReplaceMark:
    """Mark (or unmark) the replica on ``ts_uuid`` for replacement (Kudu's REPLACE)."""

    tablet_id: str
    ts_uuid: str
    replace: bool = True


Record = (CreateTable | DeleteTable | AlterTable | RegisterTServer | UpdateTablets
          | SetReplaceMark)


def record_to_dict(r: Record) -> dict[str, Any]:
    match r:
        case CreateTable(table, tablets):
            return {"op": "create_table", "table": table.to_dict(),
                    "tablets": [t.to_dict() for t in tablets]}
        case DeleteTable(table_id):
            return {"op": "delete_table", "table_id": table_id}
        case AlterTable(table_id, steps):
            return {"op": "alter_table", "table_id": table_id,
                    "steps": [_step_to_dict(s) for s in steps]}
        case RegisterTServer(ts):
            return {"op": "register_tserver", "tserver": ts.to_dict()}
        case UpdateTablets(ts_uuid, reports):
            return {"op": "update_tablets", "ts_uuid": ts_uuid,
                    "reports": [x.to_dict() for x in reports]}
        case SetReplaceMark(tablet_id, ts_uuid, rep):
            return {"op": "set_replace", "tablet_id": tablet_id, "ts_uuid": ts_uuid,
                    "replace": rep}


def record_from_dict(d: Mapping[str, Any]) -> Record:
    match d.get("op"):
        case "create_table":
            return CreateTable(TableMeta.from_dict(d["table"]),
                               tuple(TabletMeta.from_dict(t) for t in d["tablets"]))
        case "delete_table":
            return DeleteTable(str(d["table_id"]))
        case "alter_table":
            return AlterTable(str(d["table_id"]),
                              tuple(_step_from_dict(s) for s in d["steps"]))
        case "register_tserver":
            return RegisterTServer(TServerMeta.from_dict(d["tserver"]))
        case "update_tablets":
            return UpdateTablets(str(d["ts_uuid"]),
                                 tuple(TabletReport.from_dict(x) for x in d["reports"]))
        case "set_replace":
            return SetReplaceMark(str(d["tablet_id"]), str(d["ts_uuid"]), bool(d["replace"]))
        case other:
            raise InvalidArgumentError(f"unknown catalog record type {other!r}")


def encode_record(r: Record) -> bytes:
    """The bytes of the Raft entry carrying ``r`` (canonical JSON)."""
    return json.dumps(record_to_dict(r), sort_keys=True, separators=(",", ":")).encode()


def decode_record(data: bytes) -> Record:
    """Parse an entry written by :func:`encode_record`.

    Raises:
        InvalidArgumentError: the bytes are not a catalog record.
    """
    try:
        d = json.loads(data)
    except ValueError as e:
        raise InvalidArgumentError(f"malformed catalog record: {e}") from e
    if not isinstance(d, dict):
        raise InvalidArgumentError(f"malformed catalog record: expected an object, got {d!r}")
    try:
        return record_from_dict(d)
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidArgumentError(f"malformed catalog record {d.get('op')!r}: {e!r}") from e
