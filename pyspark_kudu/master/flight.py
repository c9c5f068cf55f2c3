"""Arrow Flight between standalone masters (Raft) and from clients (master RPC).

One Flight server per master process serves two kinds of ``do_action`` calls:

- ``raft``: a batch of :class:`~pyspark_kudu.master.raft_transport.Envelope` (JSON) handed to the
  replica without waiting -- Raft messages are one-way; responses travel as their own calls;
- every :class:`~pyspark_kudu.master.master_service.MasterService` method: a JSON body in, one
  result out, ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...}`` carrying the
  error's class name, message and NotLeader hint, rebuilt into the same
  :mod:`pyspark_kudu.errors` class by :class:`FlightChannel`.

An optional shared-secret token authenticates every call with the project's one Flight scheme
(:mod:`pyspark_kudu.rpc.auth`: a mutual HMAC challenge-response per connection, then a
single-use token per call; the token itself never crosses the wire), optionally inside TLS
(:mod:`pyspark_kudu.rpc.tls`: the server's certificate and key, the CA that clients, Raft
peers included, verify it against; from ``PYSPARK_KUDU_TLS_*`` unless given). Transport
failures map to ``NetworkError`` (unreachable, retryable) and ``TimedOutError``; a wrong
token or a failed TLS handshake to ``CredentialError`` (retrying cannot fix it). A server
restarted meanwhile has forgotten the connection's session: the client authenticates again
once and repeats the call.

Outbound Raft traffic (:class:`FlightTransport`) runs one sender thread per peer that
batches whatever queued while the previous call was in flight; when a peer is down the
batch is dropped (Raft retransmits) and the sender backs off briefly. gRPC's reconnect
backoff is capped so a restarted master is reached again within half a second.

Thread-safety: every class here is thread-safe. A :class:`FlightChannel` shares one client
between threads and never closes it under a call (only :meth:`FlightChannel.close` does,
when the channel is done).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from pyspark_kudu import errors
from pyspark_kudu.errors import (
    CredentialError,
    InvalidArgumentError,
    KuduError,
    NetworkError,
    NotLeaderError,
    RemoteError,
    TimedOutError,
    UsageError,
)
from pyspark_kudu.master.raft_transport import Envelope, decode_envelopes, encode_envelopes
from pyspark_kudu.rpc.auth import HmacServerAuthHandler, connect
from pyspark_kudu.rpc.tls import (
    FROM_ENV,
    TlsConfig,
    TlsHandshakeError,
    TlsSetting,
    client_kwargs,
    location,
    plain_hint,
    resolve_tls,
    server_kwargs,
    tls_failure,
)

__all__ = ["FlightChannel", "FlightTransport", "MasterFlightServer", "flight_location"]

_log = logging.getLogger(__name__)
Body = dict[str, Any]
RAFT_ACTION = "raft"
_GRPC_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.use_local_subchannel_pool", 1),
]


def flight_location(address: str, tls: TlsConfig | None = None) -> str:
    return location(address, tls)


def _call_options(timeout: float) -> fl.FlightCallOptions:
    return fl.FlightCallOptions(timeout=timeout)


_WRONG_TOKEN = ("rejected the request: wrong or missing shared-secret token; pass the "
                "cluster's token (--token-file / PYSPARK_KUDU_MASTER_TOKEN)")


def _open(address: str, token: str | None, timeout: float, tls: TlsConfig | None
          ) -> fl.FlightClient:
    """A client of the master at ``address``, authenticated if there is a ``token``, over
    TLS if there is a ``tls`` configuration.

    Raises:
        CredentialError: the master refused the token (or this client refused a
            master that does not know it), or the TLS handshake failed.
        NetworkError: the master is unreachable.
    """
    loc = flight_location(address, tls)
    roots = tls.ca_pem if tls is not None else None
    if not token:
        return fl.FlightClient(loc, generic_options=_GRPC_OPTIONS, **client_kwargs(roots))
    try:
        return connect(loc, token.encode(), timeout_s=timeout, generic_options=_GRPC_OPTIONS,
                       tls_root_certs=roots)
    except TlsHandshakeError as e:
        raise TlsHandshakeError(f"master {address}: {e}") from e
    except CredentialError as e:
        raise CredentialError(f"master {address} {_WRONG_TOKEN} ({e})") from e


def _encode_error(e: KuduError) -> Body:
    return {"type": type(e).__name__, "message": str(e),
            "family": "usage" if isinstance(e, UsageError) else "remote",
            "leader_hint": getattr(e, "leader_hint", None)}


def _decode_error(d: Body, address: str) -> KuduError:
    name, msg = str(d.get("type", "")), str(d.get("message", ""))
    if name == "NotLeaderError":
        return NotLeaderError(msg, d.get("leader_hint") or None)
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, KuduError):
        return cls(msg)
    base: type[KuduError] = InvalidArgumentError if d.get("family") == "usage" else RemoteError
    return base(f"{name} from master {address}: {msg}")


# == client side ================================================================================


class FlightChannel:
    """Request/response calls to one master over Flight (a ``client.Channel``).

    ``tls``: the TLS configuration, by default the environment's (``PYSPARK_KUDU_TLS_*``).

    Raises:
        InvalidArgumentError: (constructor) a bad TLS configuration, naming the setting.
    """

    def __init__(self, address: str, *, token: str | None = None,
                 tls: TlsSetting = FROM_ENV) -> None:
        self.address = address
        self._token = token
        self._tls = resolve_tls(tls)
        self._lock = threading.Lock()
        self._client: fl.FlightClient | None = None

    def _get(self, timeout: float) -> fl.FlightClient:
        with self._lock:
            if self._client is None:
                self._client = _open(self.address, self._token, timeout, self._tls)
            return self._client

    def _forget(self, client: fl.FlightClient) -> None:
        """Stop handing out ``client`` (its session is gone). It is not closed here: other
        threads may be in a call on it (closing it under them crashes the process); it is
        released when the last of them drops it."""
        with self._lock:
            if self._client is client:
                self._client = None

    def call(self, method: str, body: Body, timeout: float) -> Body:
        payload = json.dumps(body, separators=(",", ":")).encode()
        for attempt in range(2):
            client = self._get(timeout)
            try:
                results = list(client.do_action(fl.Action(method, payload),
                                                _call_options(timeout)))
                break
            except fl.FlightUnauthenticatedError as e:
                self._forget(client)
                if attempt == 0 and self._token:
                    continue  # the master restarted and forgot this session: once more
                raise CredentialError(f"master {self.address} {_WRONG_TOKEN}") from e
            except fl.FlightTimedOutError as e:
                raise TimedOutError(f"{method} to master {self.address} timed out after "
                                    f"{timeout:.1f} s") from e
            except (fl.FlightUnavailableError, fl.FlightCancelledError) as e:
                loc = flight_location(self.address, self._tls)
                tls_error = tls_failure(loc, str(e))
                if tls_error is not None:
                    raise TlsHandshakeError(f"master {self.address}: {tls_error}") from e
                raise NetworkError(f"master {self.address} is unreachable: "
                                   f"{e}{plain_hint(loc, str(e))}") from e
            except (fl.FlightError, pa.ArrowException) as e:
                if "Deadline" in str(e):
                    raise TimedOutError(f"{method} to master {self.address} timed out") from e
                raise NetworkError(f"{method} to master {self.address} failed: {e}") from e
        if len(results) != 1:
            raise RemoteError(f"master {self.address} sent {len(results)} results for {method}")
        out = json.loads(results[0].body.to_pybytes())
        if out.get("ok"):
            result: Body = out["result"]
            return result
        raise _decode_error(out.get("error", {}), self.address)

    def close(self) -> None:
        with self._lock:
            c, self._client = self._client, None
        if c is not None:
            c.close()


class _PeerSender:
    """Sends one peer's Raft messages, batching what queued during the previous call."""

    def __init__(self, transport: FlightTransport, peer: str) -> None:
        self._t = transport
        self._peer = peer
        self._cond = threading.Condition()
        self._queue: list[Envelope] = []
        self._closed = False
        self._client: fl.FlightClient | None = None
        self._client_addr = ""
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"raft-send-{transport.node_id}-{peer}")
        self._thread.start()

    def enqueue(self, envs: Sequence[Envelope]) -> None:
        with self._cond:
            self._queue.extend(envs)
            if len(self._queue) > self._t.max_queue:
                del self._queue[: len(self._queue) - self._t.max_queue]
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)
        if self._client is not None:
            self._client.close()

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch, self._queue = self._queue, []
            addr = self._t.address_of(self._peer)
            if addr is None:
                continue
            try:
                if self._client is None or self._client_addr != addr:
                    if self._client is not None:
                        self._client.close()
                    self._client = None
                    self._client = _open(addr, self._t.token, self._t.rpc_timeout_s,
                                         self._t.tls)
                    self._client_addr = addr
                list(self._client.do_action(
                    fl.Action(RAFT_ACTION, encode_envelopes(batch)),
                    _call_options(self._t.rpc_timeout_s)))
                failures = 0
            except (fl.FlightError, pa.ArrowException, OSError, KuduError) as e:
                if isinstance(e, fl.FlightUnauthenticatedError) and self._client is not None:
                    self._client.close()  # the peer restarted: authenticate again next time
                    self._client = None
                failures += 1
                if failures == 1:
                    _log.info("master %s cannot reach %s at %s: %s", self._t.node_id,
                              self._peer, addr, str(e).splitlines()[0])
                with self._cond:
                    self._cond.wait(min(0.02 * 2 ** min(failures, 5), 0.5))


class FlightTransport:
    """Outbound Raft messages of one master over Flight (a ``transport.Transport``)."""

    def __init__(self, node_id: str, address_of: Callable[[str], str | None], *,
                 token: str | None = None, rpc_timeout_s: float = 2.0,
                 max_queue: int = 10_000, tls: TlsSetting = FROM_ENV) -> None:
        self.node_id = node_id
        self.address_of = address_of
        self.token = token
        self.tls = resolve_tls(tls)
        self.rpc_timeout_s = rpc_timeout_s
        self.max_queue = max_queue
        self._lock = threading.Lock()
        self._senders: dict[str, _PeerSender] = {}
        self._closed = False

    def send(self, envelopes: Sequence[Envelope]) -> None:
        by_peer: dict[str, list[Envelope]] = {}
        for env in envelopes:
            by_peer.setdefault(env.msg.to, []).append(env)
        for peer, envs in by_peer.items():
            with self._lock:
                if self._closed:
                    return
                s = self._senders.get(peer)
                if s is None:
                    s = self._senders[peer] = _PeerSender(self, peer)
            s.enqueue(envs)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            senders, self._senders = list(self._senders.values()), {}
        for s in senders:
            s.close()


# == server side ================================================================================


class MasterFlightServer(fl.FlightServerBase):  # type: ignore[misc]
    """Serves ``raft`` and the master service methods; starts listening when constructed.

    ``tls``: serve TLS with this configuration (by default the environment's,
    ``PYSPARK_KUDU_TLS_*``); None serves plain ``grpc+tcp``.

    Raises:
        InvalidArgumentError: a bad TLS configuration, or one without certificate and key.
    """

    def __init__(self, address: str, *, deliver: Callable[[list[Envelope]], None],
                 handle: Callable[[str, Body], Body], token: str | None = None,
                 tls: TlsSetting = FROM_ENV) -> None:
        auth = HmacServerAuthHandler(token.encode()) if token else None
        cfg = resolve_tls(tls)
        super().__init__(flight_location(address, cfg), auth_handler=auth,
                         **server_kwargs(cfg, f"master {address}"))
        self.tls = cfg
        self._deliver = deliver
        self._handle = handle

    def do_action(self, context: Any, action: fl.Action) -> Iterator[fl.Result]:
        kind = action.type
        body = action.body.to_pybytes() if action.body is not None else b""
        if kind == RAFT_ACTION:
            self._deliver(decode_envelopes(body))
            return iter(())
        try:
            result = self._handle(kind, json.loads(body) if body else {})
            out: Body = {"ok": True, "result": result}
        except KuduError as e:
            out = {"ok": False, "error": _encode_error(e)}
        except Exception as e:  # a bug: report it to the caller instead of an opaque gRPC error
            _log.exception("master RPC %s failed", kind)
            out = {"ok": False, "error": {"type": type(e).__name__, "message": str(e),
                                          "family": "remote"}}
        return iter([fl.Result(json.dumps(out, separators=(",", ":")).encode())])

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [(RAFT_ACTION, "Raft messages between masters"), ("status", "master status")]
