"""A standalone master process: one replica, its durable storage, Raft and RPC over Flight.

Started by ``pyspark-kudu master run --id m1 --peers m1=127.0.0.1:7051,... --data-dir DIR``.
Layout of ``--data-dir``::

    instance            {"master_id": "m1"}: a data dir serves one master id only
    catalog/meta        consensus metadata (hard state, snapshot = catalog, config)
    catalog/wal/        the Raft log (pyspark_kudu.wal)

Security: the master serves on its peer address (``127.0.0.1`` in :data:`DEFAULT_PEERS`)
unless ``--listen`` says otherwise. With a shared-secret ``token`` every call (client RPC
and Raft alike) must be authenticated with it, by HMAC challenge-response: the token never
crosses the wire (:mod:`~pyspark_kudu.master.flight`); a master refuses to
start on a non-loopback address without a token unless ``allow_unauthenticated`` is set, so
a catalog is never writable from the network by accident. With ``tls`` (``--tls-cert``,
``--tls-key``, ``--tls-ca``, else ``PYSPARK_KUDU_TLS_CERT/_KEY/_CA``; see
:mod:`pyspark_kudu.rpc.tls`) the master serves TLS and verifies its Raft peers' certificates
against the CA; the token still authenticates every call, inside the TLS connection. The
data dir and everything in it is private to the master's user (``0700`` directories,
``0600`` files).

A fresh data dir of a founding master is bootstrapped with the ``--peers`` group (addresses
in the log); with ``--join`` it starts empty and learns the group from the leader once an
operator adds it (``MasterClient.add_master``). A restarted master (after a crash or
SIGKILL) reopens its log and catches up from the leader.

Thread-safety: :class:`MasterServer` methods may be called from any thread.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import threading
from dataclasses import dataclass, field

from pyspark_kudu.errors import IllegalStateError, InvalidArgumentError
from pyspark_kudu.fileio import FILE_MODE, make_private_dirs
from pyspark_kudu.master.catalog_replica import (
    MasterReplica,
    ReplicaOptions,
    bootstrap_group,
    is_fresh_storage,
    open_storage,
)
from pyspark_kudu.master.client import parse_master_addresses
from pyspark_kudu.master.flight import FlightTransport, MasterFlightServer
from pyspark_kudu.master.locations import DEFAULT_MAPPING_TIMEOUT_S, LocationCache
from pyspark_kudu.master.master_service import MasterService
from pyspark_kudu.rpc.tls import TlsConfig, server_kwargs, tls_from_env

__all__ = [
    "DEFAULT_PEERS",
    "MasterServer",
    "MasterServerConfig",
    "is_loopback_address",
    "parse_peers",
]

_log = logging.getLogger(__name__)

DEFAULT_PEERS = "m1=127.0.0.1:7051,m2=127.0.0.1:7052,m3=127.0.0.1:7053"


def parse_peers(spec: str) -> dict[str, str]:
    """``"m1=h:7051,m2=h:7052"`` -> ``{"m1": "h:7051", ...}``; a bare ``h:p`` is its own id.

    Raises:
        InvalidArgumentError: malformed entry or duplicate id.
    """
    out: dict[str, str] = {}
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        node_id, sep, addr = item.partition("=")
        if not sep:
            node_id, addr = item, item
        (addr,) = parse_master_addresses(addr)
        node_id = node_id.strip()
        if not node_id or node_id in out:
            raise InvalidArgumentError(
                f"--peers entry {item!r}: master ids must be unique and non-empty "
                f"(use id=host:port, e.g. {DEFAULT_PEERS})")
        out[node_id] = addr
    if not out:
        raise InvalidArgumentError(f"--peers is empty; e.g. --peers {DEFAULT_PEERS}")
    return out


@dataclass(frozen=True)
class MasterServerConfig:
    """Everything ``master run`` takes. ``listen`` defaults to this master's peer address."""

    id: str
    peers: dict[str, str]
    data_dir: str
    listen: str | None = None
    token: str | None = None
    join: bool = False
    sync: str = "fdatasync"
    location_mapping_cmd: str | None = None
    location_mapping_timeout_s: float = DEFAULT_MAPPING_TIMEOUT_S
    op_timeout_s: float = 10.0
    tserver_unresponsive_s: float = 30.0
    follower_unavailable_considered_failed_s: float = 300.0
    replica: ReplicaOptions = field(default_factory=ReplicaOptions)
    allow_unauthenticated: bool = False
    #: TLS for serving and for Raft peers; by default ``PYSPARK_KUDU_TLS_*`` (None: plain).
    tls: TlsConfig | None = field(default_factory=tls_from_env)

    def __post_init__(self) -> None:
        if self.id not in self.peers and self.listen is None:
            raise InvalidArgumentError(
                f"master id {self.id!r} is not in --peers ({sorted(self.peers)}); add "
                f"{self.id}=host:port to --peers or give --listen host:port")
        if not self.token and not self.allow_unauthenticated and not is_loopback_address(
                self.address):
            raise InvalidArgumentError(
                f"master {self.id} would serve on {self.address}, which is not a loopback "
                f"address, without a shared-secret token: anyone who can reach it could "
                f"change the catalog. Pass --token-file (or set PYSPARK_KUDU_MASTER_TOKEN), "
                f"or listen on 127.0.0.1, or pass --allow-unauthenticated on a trusted network")
        server_kwargs(self.tls, f"master {self.id}")  # a CA alone cannot serve: refuse now

    @property
    def address(self) -> str:
        return self.listen or self.peers[self.id]


class MasterServer:
    """One standalone master: start it, then :meth:`wait` or :meth:`stop`."""

    def __init__(self, config: MasterServerConfig) -> None:
        self.config = config
        self._stopped = threading.Event()
        self._replica: MasterReplica | None = None
        self._server: MasterFlightServer | None = None

    @property
    def replica(self) -> MasterReplica:
        if self._replica is None:
            raise IllegalStateError(f"master {self.config.id} is not started")
        return self._replica

    def start(self) -> MasterServer:
        cfg = self.config
        make_private_dirs(cfg.data_dir)
        _check_instance(cfg.data_dir, cfg.id)
        storage = open_storage(os.path.join(cfg.data_dir, "catalog"), cfg.sync)
        if is_fresh_storage(storage) and not cfg.join:
            bootstrap_group(storage, cfg.peers)
        holder: list[MasterReplica] = []

        def address_of(node_id: str) -> str | None:
            known = holder[0].catalog.masters.get(node_id) if holder else None
            return known or cfg.peers.get(node_id)

        transport = FlightTransport(cfg.id, address_of, token=cfg.token, tls=cfg.tls)
        replica = MasterReplica(cfg.id, storage, transport, cfg.replica)
        holder.append(replica)
        locations = LocationCache(cfg.location_mapping_cmd, cfg.location_mapping_timeout_s)
        service = MasterService(replica, locations=locations,
                                op_timeout_s=cfg.op_timeout_s,
                                tserver_unresponsive_s=cfg.tserver_unresponsive_s,
                                follower_unavailable_considered_failed_s=(
                                    cfg.follower_unavailable_considered_failed_s))
        self._replica = replica
        replica.start()
        try:
            self._server = MasterFlightServer(cfg.address, deliver=replica.deliver,
                                              handle=service.handle, token=cfg.token,
                                              tls=cfg.tls)
        except Exception:
            replica.stop()
            raise
        _log.info("master %s serving on %s%s (data dir %s, peers %s)", cfg.id, cfg.address,
                  " with TLS" if cfg.tls is not None else "", cfg.data_dir, cfg.peers)
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :meth:`stop` was called (True) or ``timeout`` passed (False)."""
        return self._stopped.wait(timeout)

    def stop(self) -> None:
        """Stop the replica (failing waiting requests), then the Flight server. Idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._replica is not None:
            self._replica.stop()
        if self._server is not None:
            self._server.shutdown()


def is_loopback_address(address: str) -> bool:
    """True if ``host:port`` names only loopback interfaces (``127.0.0.0/8``, ``::1``,
    ``localhost``); a host name counts only if every address it resolves to is loopback."""
    host = address.rpartition(":")[0] if ":" in address else address
    host = host.strip("[]")
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {str(i[4][0]).split("%", 1)[0] for i in infos}
    return bool(addrs) and all(ipaddress.ip_address(a).is_loopback for a in addrs)


def _check_instance(data_dir: str, master_id: str) -> None:
    path = os.path.join(data_dir, "instance")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            owner = json.load(f).get("master_id")
        if owner != master_id:
            raise InvalidArgumentError(
                f"data dir {data_dir} belongs to master {owner!r}, not {master_id!r}; pass "
                f"--id {owner} or another --data-dir")
        return
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with open(fd, "w", encoding="utf-8") as f:
        json.dump({"master_id": master_id}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
