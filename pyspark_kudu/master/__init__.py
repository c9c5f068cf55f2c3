"""The master: Raft-replicated catalog, placement and rebalancing (DESIGN §2).

Entry points (imported lazily, so that importing e.g. ``master.placement`` on an executor
does not pull in Arrow Flight):

- :class:`~pyspark_kudu.master.embedded.EmbeddedMaster`: 1 or 3 replicas in this process.
- :class:`~pyspark_kudu.master.server.MasterServer` / ``MasterServerConfig``: a standalone
  master process (``pyspark-kudu master run``).
- :class:`~pyspark_kudu.master.client.MasterClient`: leader discovery, retries, DDL, reads.
- :class:`~pyspark_kudu.master.catalog.Catalog`: the catalog state machine.
- :class:`~pyspark_kudu.master.heartbeater.TabletServerHeartbeater`.
- Placement and rebalancing: :mod:`~pyspark_kudu.master.placement`,
  :mod:`~pyspark_kudu.master.rebalancer`, over :mod:`~pyspark_kudu.master.topology`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Catalog",
    "EmbeddedMaster",
    "MasterClient",
    "MasterServer",
    "MasterServerConfig",
    "TabletServerHeartbeater",
]

_WHERE = {
    "Catalog": "catalog",
    "EmbeddedMaster": "embedded",
    "MasterClient": "client",
    "MasterServer": "server",
    "MasterServerConfig": "server",
    "TabletServerHeartbeater": "heartbeater",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
