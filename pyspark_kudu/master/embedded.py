"""The embedded master: 1 or 3 catalog replicas inside the driver process (the default).

Each replica keeps its durable state (``meta`` + ``wal/``, see
:func:`~pyspark_kudu.master.catalog_replica.open_storage`) under its own directory
``<warehouse_root>/masters/<id>/``; replicas talk over a
:class:`~pyspark_kudu.master.raft_transport.LocalNetwork`. A new driver pointed at the same
warehouse root reopens the same catalog. Clients are ordinary
:class:`~pyspark_kudu.master.client.MasterClient` objects whose channels call the replicas'
:class:`~pyspark_kudu.master.master_service.MasterService` in process, so leader discovery,
NotLeader hints and retries are the standalone code path.

Addresses of embedded masters are ``embedded:1``, ``embedded:2``, ... (ids ``m1``, ``m2``...).

Directories this master creates are private to its user (``0700``, like Kudu's default
``--umask=077``; :func:`~pyspark_kudu.fileio.make_private_dirs`), and so are the catalog
files written through :class:`~pyspark_kudu.fileio.FileIO`.

Thread-safety: thread-safe.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from pyspark_kudu.consensus.raft import Role
from pyspark_kudu.consensus.raft_storage import WritableStorage
from pyspark_kudu.errors import IllegalStateError, InvalidArgumentError, NetworkError
from pyspark_kudu.fileio import make_private_dirs
from pyspark_kudu.master.catalog_replica import (
    MasterReplica,
    ReplicaOptions,
    bootstrap_group,
    is_fresh_storage,
    open_storage,
)
from pyspark_kudu.master.client import Channel, MasterClient
from pyspark_kudu.master.locations import DEFAULT_MAPPING_TIMEOUT_S, LocationCache
from pyspark_kudu.master.master_service import MasterService
from pyspark_kudu.master.raft_transport import LocalNetwork

__all__ = ["MASTERS_DIR", "EmbeddedMaster"]

MASTERS_DIR = "masters"
Body = dict[str, Any]


class EmbeddedMaster:
    """``replicas`` (1 or 3) master replicas under ``warehouse_root``; see the module doc."""

    def __init__(
        self,
        warehouse_root: str,
        replicas: int = 1,
        *,
        options: ReplicaOptions | None = None,
        sync: str = "fdatasync",
        location_mapping_cmd: str | None = None,
        location_mapping_timeout_s: float = DEFAULT_MAPPING_TIMEOUT_S,
        op_timeout_s: float = 10.0,
        tserver_unresponsive_s: float = 30.0,
        follower_unavailable_considered_failed_s: float = 300.0,
        storage_factory: Callable[[str], WritableStorage] | None = None,
    ) -> None:
        if replicas not in (1, 3):
            raise InvalidArgumentError(
                f"an embedded master runs 1 or 3 replicas, not {replicas}; for more, run "
                f"standalone masters (pyspark-kudu master run)")
        self.root = os.path.join(warehouse_root, MASTERS_DIR)
        existing = sorted(d for d in os.listdir(self.root)) if os.path.isdir(self.root) else []
        if existing and len(existing) != replicas:
            raise InvalidArgumentError(
                f"the catalog under {self.root} has {len(existing)} master replica(s) "
                f"({existing}); open it with replicas={len(existing)}")
        self.ids = [f"m{i + 1}" for i in range(replicas)]
        self.addresses = {m: f"embedded:{i + 1}" for i, m in enumerate(self.ids)}
        self._options = options or ReplicaOptions()
        self._sync = sync
        self._factory = storage_factory or (lambda d: open_storage(d, self._sync))
        self._locations = LocationCache(location_mapping_cmd, location_mapping_timeout_s)
        self._op_timeout = op_timeout_s
        self._unresponsive = tserver_unresponsive_s
        self._failed_after = follower_unavailable_considered_failed_s
        self.network = LocalNetwork()
        self._lock = threading.Lock()
        self.replicas: dict[str, MasterReplica] = {}
        self.services: dict[str, MasterService] = {}
        for m in self.ids:
            self.start_replica(m)

    @property
    def master_addresses(self) -> str:
        """The ``kudu.master`` string of this group."""
        return ",".join(self.addresses[m] for m in self.ids)

    def start_replica(self, node_id: str) -> MasterReplica:
        """Open (or reopen after :meth:`stop_replica`) one replica's storage and start it."""
        with self._lock:
            if node_id in self.replicas:
                raise IllegalStateError(f"master replica {node_id} is already running")
            d = os.path.join(self.root, node_id)
            make_private_dirs(d)
            storage = self._factory(d)
            if is_fresh_storage(storage):
                bootstrap_group(storage, self.addresses)
            rep = MasterReplica(node_id, storage, self.network.transport(node_id),
                                self._options)
            svc = MasterService(rep, locations=self._locations, op_timeout_s=self._op_timeout,
                                tserver_unresponsive_s=self._unresponsive,
                                follower_unavailable_considered_failed_s=self._failed_after)
            self.replicas[node_id], self.services[node_id] = rep, svc
            self.network.register(node_id, rep)
            rep.start()
            return rep

    def stop_replica(self, node_id: str) -> None:
        """Stop one replica (its storage is closed; what it persisted survives)."""
        with self._lock:
            rep = self.replicas.pop(node_id, None)
            self.services.pop(node_id, None)
            self.network.unregister(node_id)
        if rep is not None:
            rep.stop()

    def close(self) -> None:
        for m in list(self.replicas):
            self.stop_replica(m)

    def __enter__(self) -> EmbeddedMaster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def leader(self, timeout_s: float = 10.0) -> MasterReplica:
        """The ready leader replica, waiting for an election if needed."""
        end = time.monotonic() + timeout_s
        while True:
            for rep in list(self.replicas.values()):
                st = rep.status()
                if st.role is Role.LEADER and st.leader_ready:
                    return rep
            if time.monotonic() > end:
                raise IllegalStateError(
                    f"no embedded master leader within {timeout_s:.0f} s "
                    f"(running: {sorted(self.replicas)})")
            time.sleep(0.01)

    def client(self, **kwargs: Any) -> MasterClient:
        """A client of this group (in-process channels)."""
        return MasterClient(list(self.addresses.values()), channel_factory=self._channel,
                            **kwargs)

    def _channel(self, address: str) -> Channel:
        by_addr = {a: m for m, a in self.addresses.items()}
        if address not in by_addr:
            raise InvalidArgumentError(f"{address} is not an embedded master address")
        return _LocalChannel(self, address, by_addr[address])


class _LocalChannel:
    """Calls a replica's service in process; JSON round trip keeps wire semantics."""

    def __init__(self, group: EmbeddedMaster, address: str, node_id: str) -> None:
        self.address = address
        self._group = group
        self._id = node_id

    def call(self, method: str, body: Body, timeout: float) -> Body:
        svc = self._group.services.get(self._id)
        if svc is None:
            raise NetworkError(f"embedded master {self._id} ({self.address}) is not running")
        out = svc.handle(method, json.loads(json.dumps(body)))
        result: Body = json.loads(json.dumps(out))
        return result

    def close(self) -> None:
        pass
