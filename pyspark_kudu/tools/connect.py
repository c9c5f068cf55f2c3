"""What every operator verb shares: where the catalog comes from, output format, exit codes.

Connection (options added by :func:`add_connection_args`):

* ``--master h1:7051,h2:7052,h3:7053`` -- running masters, reached with
  :class:`~pyspark_kudu.master.client.MasterClient` (leader discovery, retries until
  ``--timeout-s``). Default: ``$PYSPARK_KUDU_MASTER``, else the addresses of the default
  master group (``conf/master.conf``: 127.0.0.1:7051-7053).
* ``--token-file FILE`` or ``$PYSPARK_KUDU_MASTER_TOKEN``: the shared-secret token, the same
  convention as ``master run``.
* ``--master-dir DIR`` -- a catalog no process has open, read from disk without starting a
  master (:mod:`pyspark_kudu.tools.offline`). Liveness of tablet servers is then unknown and
  the catalog cannot be changed.

The verbs read a :class:`ClusterState`: the catalog's tables, tablets and tablet servers,
which servers are live (None when unknown), the health of every master and the round-trip
estimates clients reported with their heartbeats (none offline). It becomes the
:class:`~pyspark_kudu.master.topology.ClusterSnapshot` that ksck, the rebalancer and the
listings share (:meth:`ClusterState.snapshot`, which reuses the master's own
:func:`~pyspark_kudu.master.ddl.cluster_snapshot`). From running masters it is assembled from
one ``get_table`` per table, so it is not one atomic catalog version (a table created or
dropped meanwhile may be missed or skipped).

Exit codes (:func:`exit_code_for`): 0 ok; 1 the command ran and found problems or the
named object does not exist; 2 usage error (bad option, value, column, token or
directory); 3 the masters could not be reached (no leader answered within ``--timeout-s``).

Thread-safety: functions and immutable values; a :class:`Source` is used by one thread.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyspark_kudu.errors import (
    InvalidArgumentError,
    KuduError,
    NetworkError,
    NotFoundError,
    NotSupportedError,
    ServiceUnavailableError,
    TimedOutError,
    UsageError,
)
from pyspark_kudu.master.catalog import Catalog
from pyspark_kudu.master.client import MasterClient, TableLocations
from pyspark_kudu.master.ddl import cluster_snapshot
from pyspark_kudu.master.entities import TableMeta, TabletMeta, TServerMeta
from pyspark_kudu.master.pmap import PMap
from pyspark_kudu.master.topology import ClusterSnapshot, Table, Tablet
from pyspark_kudu.tools.cluster import RoundTripStats
from pyspark_kudu.tools.offline import read_catalog_dir
from pyspark_kudu.tools.tabular import FORMATS

__all__ = [
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "MASTER_ENV",
    "TOKEN_ENV",
    "ClusterState",
    "MasterHealth",
    "Source",
    "add_connection_args",
    "add_format_arg",
    "catalog_of",
    "default_masters",
    "exit_code_for",
    "open_source",
    "read_token",
    "verb",
]

TOKEN_ENV = "PYSPARK_KUDU_MASTER_TOKEN"
MASTER_ENV = "PYSPARK_KUDU_MASTER"

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

_UNREACHABLE = (NetworkError, TimedOutError, ServiceUnavailableError)


def exit_code_for(err: KuduError) -> int:
    """The exit code of a verb that failed with ``err`` (see the module docstring)."""
    if isinstance(err, _UNREACHABLE):
        return EXIT_UNREACHABLE
    if isinstance(err, NotFoundError):
        return EXIT_PROBLEMS
    if isinstance(err, UsageError):
        return EXIT_USAGE
    return EXIT_PROBLEMS


def verb(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a verb: a :class:`KuduError` becomes one line on stderr and its exit code."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except KuduError as e:
            print(f"pyspark-kudu: {type(e).__name__}: {e}", file=sys.stderr)
            code = exit_code_for(e)
            if code == EXIT_UNREACHABLE:
                print("pyspark-kudu: cannot reach the master(s); check --master (or "
                      f"${MASTER_ENV}) and that the masters are running", file=sys.stderr)
            return code

    run.__doc__ = func.__doc__
    return run


# == options ====================================================================================


def default_masters() -> str:
    """``$PYSPARK_KUDU_MASTER``, else the default group's addresses (127.0.0.1:7051-7053)."""
    from pyspark_kudu.master.server import DEFAULT_PEERS, parse_peers

    env = os.environ.get(MASTER_ENV, "").strip()
    return env or ",".join(parse_peers(DEFAULT_PEERS).values())


def add_connection_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("where the catalog is")
    which = g.add_mutually_exclusive_group()
    which.add_argument(
        "--master", metavar="ADDRESSES",
        help=f"running masters as host:port,... (default ${MASTER_ENV}, else "
             f"127.0.0.1:7051,127.0.0.1:7052,127.0.0.1:7053)")
    which.add_argument(
        "--master-dir", metavar="DIR",
        help="read a catalog no process has open, without starting a master: an embedded "
             "master's warehouse (spark.kudu.warehouse) or a stopped master's --data-dir")
    g.add_argument("--token-file", metavar="FILE",
                   help=f"file holding the masters' shared-secret token; or set ${TOKEN_ENV}")
    g.add_argument("--timeout-s", type=float, default=10.0, metavar="SECONDS",
                   help="how long to keep trying to reach the leader master (default 10)")


def add_format_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", default="text", choices=FORMATS,
                   help="text tables (default), json, or json_pretty")


def read_token(token_file: str | None) -> str | None:
    """The token from ``token_file``, else ``$PYSPARK_KUDU_MASTER_TOKEN``, else None.

    A token file that other users can read is used, with a warning naming the fix: the
    token is the only thing between the network and the catalog.
    """
    if token_file:
        try:
            mode = os.stat(token_file).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                logging.getLogger(__name__).warning(
                    "token file %s has mode %04o: other users can read the masters' "
                    "shared secret; run chmod 600 %s", token_file, stat.S_IMODE(mode),
                    token_file)
            with open(token_file, encoding="utf-8") as f:
                return f.read().strip() or None
        except OSError as e:
            raise InvalidArgumentError(
                f"cannot read the token file {token_file}: {e.strerror}; pass the file "
                f"holding the masters' token to --token-file, or set ${TOKEN_ENV}") from e
    return os.environ.get(TOKEN_ENV) or None


# == the cluster as read ========================================================================


@dataclass(frozen=True)
class MasterHealth:
    """One master as ksck reports it."""

    address: str
    id: str
    role: str
    term: int
    status: str  # HEALTHY | UNAVAILABLE | OFFLINE
    detail: str = ""
    commit: int | None = None

    def row(self) -> dict[str, Any]:
        return {"Address": self.address, "Id": self.id or "-", "Role": self.role,
                "Term": self.term, "Commit": "-" if self.commit is None else self.commit,
                "Status": self.status}


@dataclass(frozen=True)
class ClusterState:
    """A catalog as read by a verb; ``live`` is None when liveness is unknown (offline);
    ``round_trips``: per tablet server, the latest round-trip estimate a client reported."""

    catalog: Catalog
    live: frozenset[str] | None
    masters: tuple[MasterHealth, ...]
    source: str
    round_trips: Mapping[str, RoundTripStats] = field(default_factory=dict)

    @property
    def liveness_known(self) -> bool:
        return self.live is not None

    def snapshot(self) -> ClusterSnapshot:
        """Tablet servers, live tables and their tablets for placement, ksck and listings.

        With unknown liveness every server counts as live, so health and placement are
        judged on the Raft configs alone.
        """
        cat = self.catalog
        live = self.live if self.live is not None else frozenset(cat.tservers)
        tables = cat.live_tables()
        snap = cluster_snapshot(cat, live, tuple(
            Table(t.table_id, t.name, t.replication_factor,
                  None if t.constraint is None else t.constraint.to_topology())
            for t in tables))
        return snap.with_tablets(Tablet(tb.tablet_id, tb.table_id, tb.to_topology())
                                 for t in tables for tb in cat.tablets_of(t))


def catalog_of(tables: Mapping[str, TableLocations], tservers: list[dict[str, Any]]) -> Catalog:
    """A :class:`Catalog` holding what the RPCs returned (live tables only)."""
    metas: dict[str, TableMeta] = {}
    tablets: dict[str, TabletMeta] = {}
    for loc in tables.values():
        metas[loc.table.table_id] = loc.table
        tablets.update((tb.tablet_id, tb) for tb in loc.tablets)
    return Catalog(
        tables=PMap(metas),
        names=PMap((t.name, t.table_id) for t in metas.values()),
        tablets=PMap(tablets),
        tservers=PMap((str(d["uuid"]), TServerMeta.from_dict(d)) for d in tservers),
        replica_counts=PMap((str(d["uuid"]), int(d.get("replicas", 0))) for d in tservers),
        index=max((loc.catalog_index for loc in tables.values()), default=0),
    )


class Source(Protocol):
    """Where a verb reads (and, for running masters, changes) the catalog."""

    def describe(self) -> str: ...

    def state(self, *, masters: bool = False) -> ClusterState: ...

    def table(self, name: str) -> TableLocations: ...

    def delete_table(self, name: str) -> None: ...

    def close(self) -> None: ...


class RemoteSource:
    def __init__(self, client: MasterClient) -> None:
        self.client = client

    def describe(self) -> str:
        return "masters " + ",".join(self.client.addresses)

    def state(self, *, masters: bool = False) -> ClusterState:
        health = self._masters() if masters else ()
        tservers = self.client.list_tservers()
        tables: dict[str, TableLocations] = {}
        for name in self.client.list_tables():
            try:
                tables[name] = self.client.get_table(name)
            except NotFoundError:
                continue  # dropped since it was listed
        live = frozenset(str(d["uuid"]) for d in tservers if d.get("live"))
        rtts = {str(d["uuid"]): RoundTripStats(float(d["round_trip_ms"]),
                                               int(d.get("round_trip_samples", 0)),
                                               float(d.get("round_trip_age_s", 0.0)))
                for d in tservers if d.get("round_trip_ms") is not None}
        return ClusterState(catalog_of(tables, tservers), live, health, self.describe(), rtts)

    def _masters(self) -> tuple[MasterHealth, ...]:
        out = []
        for addr, st in self.client.statuses(min(self.client.timeout_s, 5.0)).items():
            if isinstance(st, KuduError):
                out.append(MasterHealth(addr, "", "-", 0, "UNAVAILABLE", str(st)))
                continue
            failed = str(st.get("failed") or "")
            out.append(MasterHealth(addr, str(st["id"]), str(st["role"]), int(st["term"]),
                                    "UNAVAILABLE" if failed else "HEALTHY", failed,
                                    int(st.get("commit", 0))))
        return tuple(out)

    def table(self, name: str) -> TableLocations:
        return self.client.get_table(name)

    def delete_table(self, name: str) -> None:
        self.client.delete_table(name)

    def close(self) -> None:
        self.client.close()


class _OfflineSource:
    def __init__(self, directory: str) -> None:
        self.found = read_catalog_dir(directory)

    def describe(self) -> str:
        f = self.found
        return (f"catalog directory {f.directory} (read offline from replica {f.chosen} at "
                f"index {f.catalog.index}; tablet server liveness unknown)")

    def state(self, *, masters: bool = False) -> ClusterState:
        health = tuple(
            MasterHealth(r.directory, r.id, "offline", r.term, "OFFLINE",
                         f"commit index {r.commit}, last log index {r.last_index}, catalog "
                         f"index {r.catalog_index}", r.commit)
            for r in self.found.replicas)
        return ClusterState(self.found.catalog, None, health, self.describe())

    def table(self, name: str) -> TableLocations:
        cat = self.found.catalog
        meta = cat.table_by_name(name)
        tablets = tuple(cat.tablets_of(meta))
        uuids = {r.ts_uuid for tb in tablets for r in tb.replicas}
        return TableLocations(meta, tablets, {u: cat.tservers[u] for u in sorted(uuids)
                                              if u in cat.tservers}, cat.index)

    def delete_table(self, name: str) -> None:
        raise NotSupportedError(
            f"cannot delete table {name!r} from {self.found.directory}: --master-dir reads a "
            f"catalog offline and never changes it; start the master (or the driver that "
            f"embeds it) and use --master")

    def close(self) -> None:
        pass


def open_source(args: argparse.Namespace) -> Source:
    """The catalog the verb's options name (``--master-dir`` or ``--master``)."""
    if getattr(args, "master_dir", None):
        return _OfflineSource(args.master_dir)
    masters = args.master or default_masters()
    return RemoteSource(MasterClient(masters, token=read_token(args.token_file),
                                      timeout_s=float(args.timeout_s),
                                      rpc_timeout_s=min(float(args.timeout_s), 10.0)))
