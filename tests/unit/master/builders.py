"""Cluster builders shared by the placement, rebalancer and simulator tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from pyspark_kudu.master.topology import (
    ClusterSnapshot,
    PlacementConfig,
    Replica,
    Table,
    Tablet,
    TabletServer,
)


def servers_in(layout: Mapping[str, int], *, dead: Iterable[str] = ()) -> list[TabletServer]:
    """``{"/L0": 3, "/L1": 2}`` -> servers ``L0-0, L0-1, L0-2, L1-0, L1-1``."""
    gone = set(dead)
    out = []
    for loc, n in layout.items():
        name = loc.strip("/").replace("/", "-") or "none"
        for k in range(n):
            uuid = f"{name}-{k}"
            out.append(
                TabletServer(uuid, f"host-{uuid}", location=loc or None, live=uuid not in gone)
            )
    return out


def cluster(
    layout: Mapping[str, int] | Sequence[TabletServer],
    tables: Sequence[Table] = (Table("t", "t"),),
    tablets: Sequence[Tablet] = (),
    config: PlacementConfig | None = None,
) -> ClusterSnapshot:
    servers = servers_in(layout) if isinstance(layout, Mapping) else list(layout)
    return ClusterSnapshot(
        tuple(servers), tuple(tables), tuple(tablets), config or PlacementConfig()
    )


def tablet(tablet_id: str, uuids: Sequence[str], table_id: str = "t", leader: int = 0) -> Tablet:
    return Tablet(
        tablet_id, table_id, tuple(Replica(u, is_leader=k == leader) for k, u in enumerate(uuids))
    )


def per_location(snapshot: ClusterSnapshot, uuids: Iterable[str]) -> list[int]:
    """Sorted (descending) replica counts per location for one tablet."""
    by = snapshot.tserver_by_uuid
    return sorted(Counter(by[u].location for u in uuids).values(), reverse=True)
