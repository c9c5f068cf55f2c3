"""``tserver list``: the registered tablet servers with selectable columns.

Like ``kudu tserver list --columns=uuid,rpc-addresses,location``: column names are
case-insensitive, a server without a location shows ``<none>``, an unknown name fails with
``unknown column (--columns): NAME``.

Thread-safety: pure functions over a snapshot.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.master.topology import ClusterSnapshot, TabletServer
from pyspark_kudu.tools.tabular import check_format, render_json, render_table

__all__ = ["COLUMNS", "DEFAULT_COLUMNS", "NO_LOCATION_TEXT", "list_tservers", "tserver_rows"]

#: What ``tserver list`` and ``ksck`` print for a server without a location (as Kudu).
NO_LOCATION_TEXT = "<none>"

DEFAULT_COLUMNS = "uuid,rpc-addresses"


def _location(snap: ClusterSnapshot, ts: TabletServer) -> str:
    return ts.location or NO_LOCATION_TEXT


def _tags(snap: ClusterSnapshot, ts: TabletServer) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(ts.tags.items())) or "<none>"


def _replicas(snap: ClusterSnapshot, ts: TabletServer) -> str:
    if ts.num_live_replicas is not None:
        return str(ts.num_live_replicas)
    return str(snap.replica_counts.get(ts.uuid, 0))


COLUMNS: dict[str, Callable[[ClusterSnapshot, TabletServer], str]] = {
    "uuid": lambda snap, ts: ts.uuid,
    "rpc-addresses": lambda snap, ts: ts.rpc_address,
    "location": _location,
    "tags": _tags,
    "live": lambda snap, ts: "true" if ts.live else "false",
    "replicas": _replicas,
}


def _columns(columns: str) -> list[str]:
    names = [c.strip().lower() for c in columns.split(",") if c.strip()]
    for name in names:
        if name not in COLUMNS:
            raise InvalidArgumentError(f"unknown column (--columns): {name}")
    return names


def tserver_rows(snapshot: ClusterSnapshot, columns: str = DEFAULT_COLUMNS) -> list[dict[str, str]]:
    """One ``{column: value}`` per tablet server, sorted by uuid.

    Raises:
        InvalidArgumentError: ``unknown column (--columns): NAME``.
    """
    names = _columns(columns)
    return [
        {n: COLUMNS[n](snapshot, ts) for n in names}
        for ts in sorted(snapshot.tservers, key=lambda t: t.uuid)
    ]


def list_tservers(
    snapshot: ClusterSnapshot, columns: str = DEFAULT_COLUMNS, fmt: str = "text"
) -> str:
    """The output of ``tserver list --columns=... --format=...``."""
    check_format(fmt)
    rows = tserver_rows(snapshot, columns)
    if fmt != "text":
        return render_json(rows, fmt)
    names = _columns(columns)
    return render_table(names, [[r[n] for n in names] for r in rows])
