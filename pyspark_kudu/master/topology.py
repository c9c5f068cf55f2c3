"""Cluster snapshot: the plain data that placement, rebalancing, ksck and the simulator read.

Everything here is a frozen dataclass with no I/O, so the master catalog can build a
:class:`ClusterSnapshot` from its in-memory state cheaply (one object per tablet server,
table, tablet and replica) and hand the same snapshot to the master's placement code and to
the CLI tools. Derived indexes (servers by uuid, replica counts, ...) are computed lazily
once per snapshot.

Location paths (seed: kudu-location-awareness, "Node labeling") are ``/``-separated like a
Unix path. This project is stricter than Kudu: every component must be non-empty and use
only ``[A-Za-z0-9_.-]`` (Kudu accepts ``//a``). A path of depth *d* defines *d* levels; the
level-*i* group of a server is the prefix made of its first *i* components, so ``rack1``
under ``/dc1`` and ``rack1`` under ``/dc2`` are different racks.

Thread-safety: all classes are immutable. The lazily computed indexes of
:class:`ClusterSnapshot` may be computed twice by racing threads, which is harmless
because both computations yield equal values.
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType

__all__ = [
    "NO_LOCATION",
    "ClusterSnapshot",
    "PlacementConfig",
    "Replica",
    "ReplicaRole",
    "Table",
    "TableConstraint",
    "Tablet",
    "TabletServer",
    "is_under",
    "is_valid_location",
    "location_components",
    "location_prefix",
]

#: Group name used for servers without a location (Kudu uses the empty string the same way:
#: valid locations start with ``/`` so they can never collide with it).
NO_LOCATION = ""

_COMPONENT = re.compile(r"[A-Za-z0-9_.\-]+")


def is_valid_location(location: str) -> bool:
    """True if ``location`` is ``/c1/c2/...`` with non-empty ``[A-Za-z0-9_.-]`` components."""
    if not location.startswith("/"):
        return False
    parts = location[1:].split("/")
    return all(_COMPONENT.fullmatch(p) for p in parts)


def location_components(location: str | None) -> tuple[str, ...]:
    """The components of a location path; ``()`` for no location."""
    if not location:
        return ()
    return tuple(location[1:].split("/"))


def location_prefix(location: str | None, depth: int) -> str:
    """The level-``depth`` group of ``location``: its first ``depth`` components as a path.

    A shallower location is its own group at every deeper level.
    """
    comps = location_components(location)
    if not comps:
        return NO_LOCATION
    return "/" + "/".join(comps[:depth])


def is_under(location: str | None, prefix: str) -> bool:
    """True if ``location`` equals ``prefix`` or lies below it, component-wise.

    ``/dc1/r1`` is under ``/dc1`` but ``/dc10`` is not.
    """
    if prefix in ("", "/"):
        return True
    if not location:
        return False
    return location == prefix or location.startswith(prefix.rstrip("/") + "/")


def _frozen_map(mapping: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping))


class ReplicaRole(str, enum.Enum):
    """Raft membership type of a replica (seed: kudu-raft-config-change)."""

    VOTER = "VOTER"
    NON_VOTER = "NON_VOTER"


@dataclass(frozen=True)
class Replica:
    """One member of a tablet's Raft config.

    ``replace`` is Kudu's REPLACE attribute: the replica is slated for replacement and the
    master adds a new replica elsewhere before evicting it (3-4-3).
    """

    ts_uuid: str
    role: ReplicaRole = ReplicaRole.VOTER
    is_leader: bool = False
    replace: bool = False


@dataclass(frozen=True)
class TabletServer:
    """A registered tablet server as the master sees it.

    ``num_live_replicas`` is the count the server reported; ``None`` means "derive it from
    the snapshot's tablets". ``recent_replica_creations`` is Kudu's decaying counter of
    replicas recently assigned but not yet reported. ``tags`` are awareness attributes
    (``zone=...``, ``cluster=...``; seed: KIP-708); see :meth:`ClusterSnapshot.tags_of` for
    the tags derived from the location.
    """

    uuid: str
    host: str
    port: int = 0
    location: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict, hash=False)
    live: bool = True
    num_live_replicas: int | None = None
    recent_replica_creations: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "tags", _frozen_map(self.tags))

    @property
    def rpc_address(self) -> str:
        """``host:port`` of its resident tablet server; ``host:-`` while none is known."""
        return f"{self.host}:{self.port or '-'}"


@dataclass(frozen=True)
class TableConstraint:
    """Pins a table's replicas (seed use cases 3 and 4).

    A server is eligible when its location is under ``location_prefix`` (if set) and, for
    every key in ``tags``, its tag value is one of the allowed values. Placement and the
    rebalancer never put a replica of the table on an ineligible server.
    """

    location_prefix: str | None = None
    tags: Mapping[str, AbstractSet[str]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "tags", MappingProxyType({k: frozenset(v) for k, v in self.tags.items()})
        )

    def key(self) -> tuple[object, ...]:
        """A hashable identity of the constraint (used to share per-domain indexes)."""
        return (self.location_prefix, tuple(sorted(self.tags.items())))

    def allows(self, location: str | None, tags: Mapping[str, str]) -> bool:
        if self.location_prefix is not None and not is_under(location, self.location_prefix):
            return False
        return all(tags.get(k) in allowed for k, allowed in self.tags.items())

    def describe(self) -> str:
        parts = []
        if self.location_prefix is not None:
            parts.append(f"location under {self.location_prefix}")
        parts += [f"{k} in {{{','.join(sorted(v))}}}" for k, v in sorted(self.tags.items())]
        return " and ".join(parts) or "any server"


@dataclass(frozen=True)
class Table:
    """A table: replication factor, optional constraint, optional awareness keys override."""

    table_id: str
    name: str
    replication_factor: int = 3
    constraint: TableConstraint | None = None
    awareness: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Tablet:
    """A tablet and its Raft config (voters, non-voters, leader, REPLACE marks)."""

    tablet_id: str
    table_id: str
    replicas: tuple[Replica, ...] = ()

    @property
    def ts_uuids(self) -> tuple[str, ...]:
        return tuple(r.ts_uuid for r in self.replicas)

    @property
    def voters(self) -> tuple[Replica, ...]:
        return tuple(r for r in self.replicas if r.role is ReplicaRole.VOTER)

    @property
    def leader(self) -> Replica | None:
        return next((r for r in self.replicas if r.is_leader), None)


@dataclass(frozen=True)
class PlacementConfig:
    """Cluster-wide placement settings.

    ``awareness``: ordered awareness keys (KIP-708 ``standby.task.assignment.awareness``,
    Elasticsearch ``awareness.attributes``); empty means "the location levels, top first".
    Placement spreads replicas over the tag keys among them before it looks at load; the
    location levels are left to the placement policy (group limits, then the least-loaded
    location), as in Kudu.
    ``location_levels``: names for the tags derived from location levels (default
    ``level1``, ``level2``, ...). ``forced``: leave a replica missing rather than exceed a
    location's share (Elasticsearch "forced awareness"). ``forced_values``: per tag key, the
    full set of expected values; no value gets more than ``ceil(rf / len(values))`` replicas.
    """

    awareness: tuple[str, ...] = ()
    location_levels: tuple[str, ...] = ()
    forced: bool = False
    forced_values: Mapping[str, AbstractSet[str]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "forced_values",
            MappingProxyType({k: frozenset(v) for k, v in self.forced_values.items()}),
        )

    def level_key(self, depth: int) -> str:
        """Tag name of location level ``depth`` (1-based)."""
        if depth <= len(self.location_levels):
            return self.location_levels[depth - 1]
        return f"level{depth}"


@dataclass(frozen=True)
class ClusterSnapshot:
    """Tablet servers, tables and tablets at one instant, plus the placement settings."""

    tservers: tuple[TabletServer, ...] = ()
    tables: tuple[Table, ...] = ()
    tablets: tuple[Tablet, ...] = ()
    config: PlacementConfig = field(default_factory=PlacementConfig)

    # --- derived indexes (lazy, computed once) -------------------------------------------

    @cached_property
    def tserver_by_uuid(self) -> Mapping[str, TabletServer]:
        return MappingProxyType({ts.uuid: ts for ts in self.tservers})

    @cached_property
    def table_by_id(self) -> Mapping[str, Table]:
        return MappingProxyType({t.table_id: t for t in self.tables})

    @cached_property
    def tablets_by_table(self) -> Mapping[str, tuple[Tablet, ...]]:
        groups: dict[str, list[Tablet]] = {t.table_id: [] for t in self.tables}
        for tablet in self.tablets:
            groups.setdefault(tablet.table_id, []).append(tablet)
        return MappingProxyType({k: tuple(v) for k, v in groups.items()})

    @cached_property
    def replica_counts(self) -> Mapping[str, int]:
        """Replicas per server as listed in the tablets (every role, every state)."""
        counts: Counter[str] = Counter()
        for tablet in self.tablets:
            counts.update(r.ts_uuid for r in tablet.replicas)
        return MappingProxyType({ts.uuid: counts.get(ts.uuid, 0) for ts in self.tservers})

    @cached_property
    def live_tservers(self) -> tuple[TabletServer, ...]:
        return tuple(ts for ts in self.tservers if ts.live)

    @cached_property
    def max_location_depth(self) -> int:
        return max((len(location_components(ts.location)) for ts in self.tservers), default=0)

    def load_of(self, ts: TabletServer) -> float:
        """Kudu's placement load: live replicas (reported or derived) + recent creations."""
        live = ts.num_live_replicas
        if live is None:
            live = self.replica_counts.get(ts.uuid, 0)
        return live + ts.recent_replica_creations

    def tags_of(self, ts: TabletServer) -> Mapping[str, str]:
        """Effective tags: one per location level (value = the level's path prefix), then
        the server's explicit tags, which win on a name clash."""
        tags = {
            self.config.level_key(d): location_prefix(ts.location, d)
            for d in range(1, self.max_location_depth + 1)
        }
        tags.update(ts.tags)
        return tags

    def level_keys(self) -> tuple[str, ...]:
        return tuple(self.config.level_key(d) for d in range(1, self.max_location_depth + 1))

    def awareness_for(self, table: Table) -> tuple[str, ...]:
        """The awareness keys that apply to ``table`` (table override, cluster, levels)."""
        if table.awareness is not None:
            return table.awareness
        return self.config.awareness or self.level_keys()

    # --- functional updates ---------------------------------------------------------------

    def with_tablets(self, tablets: Iterable[Tablet]) -> ClusterSnapshot:
        return replace(self, tablets=tuple(tablets))

    def with_tservers(self, tservers: Iterable[TabletServer]) -> ClusterSnapshot:
        return replace(self, tservers=tuple(tservers))

    def with_tables(self, tables: Iterable[Table]) -> ClusterSnapshot:
        return replace(self, tables=tuple(tables))
