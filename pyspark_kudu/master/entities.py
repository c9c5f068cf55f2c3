"""The rows of the master catalog and their lifecycles (seed: kudu-multi-master).

Three kinds of rows, each a frozen dataclass that converts to and from plain JSON data:

- :class:`TableMeta`: id, name, schema, partition schema, replication factor, placement
  constraint, state, schema version, its tablets' ids.
- :class:`TabletMeta`: id, table, partition bounds, Raft config (:class:`ReplicaMeta`
  members, VOTER / NON_VOTER, with Kudu's REPLACE mark), the last reported term, leader and
  committed index, and the schema version its replicas reported.
- :class:`TServerMeta`: uuid, host, port, data root, location.

Lifecycles are the two transition tables below and nothing else: :func:`check_table_move`
and :func:`check_tablet_move` are the only way a state changes (STYLE 4). Deleted tables and
tablets are never removed: they stay as ``DELETED`` tombstones, which is the seed's fencing
argument (a replica is deleted only when the master has a record saying it was deleted).

Identifiers (table and column names) are validated by :func:`validate_identifier`.

Thread-safety: every class here is immutable; the functions are pure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from pyspark_kudu.errors import IllegalStateError, InvalidArgumentError
from pyspark_kudu.master.topology import Replica, ReplicaRole, TableConstraint, is_valid_location
from pyspark_kudu.schema import Schema

__all__ = [
    "MAX_IDENTIFIER_BYTES",
    "TABLET_TRANSITIONS",
    "TABLE_TRANSITIONS",
    "ConstraintMeta",
    "MemberType",
    "PartitionMeta",
    "ReplicaMeta",
    "TServerMeta",
    "TableMeta",
    "TableState",
    "TabletMeta",
    "TabletState",
    "check_table_move",
    "check_tablet_move",
    "replicas_from",
    "validate_identifier",
]

MAX_IDENTIFIER_BYTES = 256
"""Kudu's ``--max_identifier_length``."""


def validate_identifier(kind: str, name: object) -> str:
    """Check a table or column name; returns it.

    Rules: a non-empty ``str`` of at most 256 UTF-8 bytes, without control characters, path
    separators (``/``, ``\\``) or ``..`` (names may end up in paths and URLs), and not ``.``.

    Raises:
        InvalidArgumentError: naming the offending identifier and the rule it breaks.
    """
    if not isinstance(name, str):
        raise InvalidArgumentError(f"invalid {kind} name {name!r}: identifier must be a string")
    if not name:
        raise InvalidArgumentError(f"invalid {kind} name: identifier must not be empty")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"invalid {kind} name {name!r}: not valid UTF-8") from e
    if size > MAX_IDENTIFIER_BYTES:
        raise InvalidArgumentError(
            f"invalid {kind} name {name[:40]!r}...: identifier longer than maximum permitted "
            f"length {MAX_IDENTIFIER_BYTES} bytes ({size}); choose a shorter name"
        )
    bad = sorted({c for c in name if ord(c) < 32 or ord(c) == 127})
    if bad:
        raise InvalidArgumentError(
            f"invalid {kind} name {name!r}: identifier contains control characters {bad!r}"
        )
    for sep in ("/", "\\"):
        if sep in name:
            raise InvalidArgumentError(
                f"invalid {kind} name {name!r}: identifier may not contain the path separator "
                f"{sep!r}; use another character such as '_' or '.'"
            )
    if ".." in name or name == ".":
        raise InvalidArgumentError(
            f"invalid {kind} name {name!r}: identifier may not be '.' or contain '..'"
        )
    return name


# == lifecycles =================================================================================


class TableState(str, enum.Enum):
    RUNNING = "RUNNING"
    ALTERING = "ALTERING"  # schema changed; some tablets have not reported the new version
    DELETED = "DELETED"  # tombstone


class TabletState(str, enum.Enum):
    CREATING = "CREATING"  # in the catalog, no replica has reported a leader yet
    RUNNING = "RUNNING"
    DELETED = "DELETED"  # tombstone


TABLE_TRANSITIONS: Mapping[tuple[TableState | None, TableState], str] = MappingProxyType({
    (None, TableState.RUNNING): "CreateTable",
    (TableState.RUNNING, TableState.RUNNING): "AlterTable renaming the table only",
    (TableState.RUNNING, TableState.ALTERING): "AlterTable changing the columns",
    (TableState.ALTERING, TableState.ALTERING): "another AlterTable before tablets caught up",
    (TableState.ALTERING, TableState.RUNNING): "every tablet reported the new schema version",
    (TableState.RUNNING, TableState.DELETED): "DeleteTable",
    (TableState.ALTERING, TableState.DELETED): "DeleteTable",
})
"""Every legal table state change, with the operation that makes it."""

TABLET_TRANSITIONS: Mapping[tuple[TabletState | None, TabletState], str] = MappingProxyType({
    (None, TabletState.CREATING): "CreateTable",
    (TabletState.CREATING, TabletState.CREATING): "a report without a leader",
    (TabletState.CREATING, TabletState.RUNNING): "first report naming a leader",
    (TabletState.RUNNING, TabletState.RUNNING): "a tablet report",
    (TabletState.CREATING, TabletState.DELETED): "DeleteTable",
    (TabletState.RUNNING, TabletState.DELETED): "DeleteTable",
})
"""Every legal tablet state change, with the operation that makes it."""


def check_table_move(table: str, old: TableState | None, new: TableState) -> TableState:
    if (old, new) not in TABLE_TRANSITIONS:
        raise IllegalStateError(
            f"table {table}: illegal state change {old.value if old else 'absent'} -> "
            f"{new.value}" + ("; the table was deleted" if old is TableState.DELETED else "")
        )
    return new


def check_tablet_move(tablet: str, old: TabletState | None, new: TabletState) -> TabletState:
    if (old, new) not in TABLET_TRANSITIONS:
        raise IllegalStateError(
            f"tablet {tablet}: illegal state change {old.value if old else 'absent'} -> "
            f"{new.value}" + ("; the tablet was deleted" if old is TabletState.DELETED else "")
        )
    return new


# == rows =======================================================================================


class MemberType(str, enum.Enum):
    """Raft membership of a tablet replica (Kudu's ``RaftPeerPB.MemberType``)."""

    VOTER = "VOTER"
    NON_VOTER = "NON_VOTER"


@dataclass(frozen=True)
class ReplicaMeta:
    """One member of a tablet's Raft config; ``replace`` is Kudu's REPLACE attribute."""

    ts_uuid: str
    member_type: MemberType = MemberType.VOTER
    replace: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts_uuid, "type": self.member_type.value, "replace": self.replace}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReplicaMeta:
        return cls(str(d["ts"]), MemberType(d.get("type", "VOTER")), bool(d.get("replace")))


@dataclass(frozen=True)
class PartitionMeta:
    """A tablet's slice: one bucket per hash dimension plus range bounds (JSON key values)."""

    hash_buckets: tuple[int, ...] = ()
    range_lower: tuple[Any, ...] | None = None
    range_upper: tuple[Any, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "hash_buckets": list(self.hash_buckets),
            "lower": None if self.range_lower is None else list(self.range_lower),
            "upper": None if self.range_upper is None else list(self.range_upper),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PartitionMeta:
        lo, hi = d.get("lower"), d.get("upper")
        return cls(tuple(int(b) for b in d.get("hash_buckets", ())),
                   None if lo is None else tuple(lo), None if hi is None else tuple(hi))


@dataclass(frozen=True)
class TabletMeta:
    """A tablet row. ``config_index`` is a tablet-Raft index at which ``replicas`` is the
    configuration in force (the change's own index or a later applied one); reports with a
    lower one are older and ignored (fencing)."""

    tablet_id: str
    table_id: str
    partition: PartitionMeta
    replicas: tuple[ReplicaMeta, ...]
    state: TabletState = TabletState.CREATING
    config_index: int = 0
    reported_term: int = 0
    leader: str = ""
    committed_index: int = 0
    schema_version: int = 0

    @property
    def voters(self) -> tuple[str, ...]:
        return tuple(r.ts_uuid for r in self.replicas if r.member_type is MemberType.VOTER)

    def replica(self, ts_uuid: str) -> ReplicaMeta | None:
        return next((r for r in self.replicas if r.ts_uuid == ts_uuid), None)

    def to_topology(self) -> tuple[Replica, ...]:
        """The replicas as :mod:`~pyspark_kudu.master.topology` sees them (for placement)."""
        return tuple(
            Replica(r.ts_uuid,
                    ReplicaRole.VOTER if r.member_type is MemberType.VOTER
                    else ReplicaRole.NON_VOTER,
                    r.ts_uuid == self.leader, r.replace)
            for r in self.replicas
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "tablet_id": self.tablet_id, "table_id": self.table_id,
            "partition": self.partition.to_dict(),
            "replicas": [r.to_dict() for r in self.replicas],
            "state": self.state.value, "config_index": self.config_index,
            "reported_term": self.reported_term, "leader": self.leader,
            "committed_index": self.committed_index, "schema_version": self.schema_version,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TabletMeta:
        return cls(
            str(d["tablet_id"]), str(d["table_id"]), PartitionMeta.from_dict(d["partition"]),
            tuple(ReplicaMeta.from_dict(r) for r in d["replicas"]),
            TabletState(d.get("state", "CREATING")), int(d.get("config_index", 0)),
            int(d.get("reported_term", 0)), str(d.get("leader", "")),
            int(d.get("committed_index", 0)), int(d.get("schema_version", 0)),
        )


@dataclass(frozen=True)
class ConstraintMeta:
    """A table's placement constraint (see :class:`.topology.TableConstraint`)."""

    location_prefix: str | None = None
    tags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.location_prefix is not None and not is_valid_location(self.location_prefix):
            raise InvalidArgumentError(
                f"placement constraint location prefix {self.location_prefix!r} is not a "
                f"location path; use /component[/component...] with [A-Za-z0-9_.-]"
            )
        object.__setattr__(self, "tags", MappingProxyType(
            {str(k): tuple(sorted(str(x) for x in v)) for k, v in self.tags.items()}))

    def to_topology(self) -> TableConstraint:
        return TableConstraint(self.location_prefix,
                               {k: frozenset(v) for k, v in self.tags.items()})

    def to_dict(self) -> dict[str, Any]:
        return {"location_prefix": self.location_prefix,
                "tags": {k: list(v) for k, v in sorted(self.tags.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ConstraintMeta:
        return cls(d.get("location_prefix"),
                   {k: tuple(v) for k, v in (d.get("tags") or {}).items()})


@dataclass(frozen=True)
class TableMeta:
    """A table row. ``partition_schema`` is :meth:`PartitionSchema.to_dict` data."""

    table_id: str
    name: str
    schema: Schema
    partition_schema: Mapping[str, Any]
    replication_factor: int
    tablet_ids: tuple[str, ...]
    constraint: ConstraintMeta | None = None
    state: TableState = TableState.RUNNING
    schema_version: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "table_id": self.table_id, "name": self.name, "schema": self.schema.to_dict(),
            "partition_schema": dict(self.partition_schema),
            "replication_factor": self.replication_factor,
            "tablet_ids": list(self.tablet_ids),
            "constraint": None if self.constraint is None else self.constraint.to_dict(),
            "state": self.state.value, "schema_version": self.schema_version,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TableMeta:
        c = d.get("constraint")
        return cls(
            str(d["table_id"]), str(d["name"]), Schema.from_dict(d["schema"]),
            dict(d.get("partition_schema") or {}), int(d["replication_factor"]),
            tuple(str(t) for t in d.get("tablet_ids", ())),
            None if c is None else ConstraintMeta.from_dict(c),
            TableState(d.get("state", "RUNNING")), int(d.get("schema_version", 0)),
        )

    def with_(self, **changes: Any) -> TableMeta:
        return replace(self, **changes)


@dataclass(frozen=True)
class TServerMeta:
    """A registered tablet server (registration happens on its first heartbeat).

    ``port``: where its host's resident tablet server listens (reads and file streams from
    other hosts, DESIGN §1); 0 when none runs. A heartbeat with a new port (the executor was
    replaced) registers the server again."""

    uuid: str
    host: str
    port: int = 0
    data_root: str = ""
    location: str | None = None

    def __post_init__(self) -> None:
        if not self.uuid:
            raise InvalidArgumentError("a tablet server needs a non-empty uuid")
        if self.location is not None and not is_valid_location(self.location):
            raise InvalidArgumentError(
                f"tablet server {self.uuid}: location {self.location!r} is not a location path"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "host": self.host, "port": self.port,
                "data_root": self.data_root, "location": self.location}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TServerMeta:
        return cls(str(d["uuid"]), str(d.get("host", "")), int(d.get("port", 0)),
                   str(d.get("data_root", "")), d.get("location"))


def replicas_from(voters: Sequence[str]) -> tuple[ReplicaMeta, ...]:
    """An initial config: every server a VOTER."""
    return tuple(ReplicaMeta(u) for u in voters)
