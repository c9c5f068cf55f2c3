"""The Flight authentication scheme of :mod:`pyspark_kudu.rpc.auth` against real Flight servers.

Every server here is a real ``pyarrow.flight`` server on 127.0.0.1 that counts the calls it
served, so a refused call is checked both ways: the client got the error, and nothing ran.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from pyspark_kudu.errors import InvalidArgumentError, NetworkError
from pyspark_kudu.rpc import (
    SECRET_ENV,
    HmacClientAuthHandler,
    HmacServerAuthHandler,
    check_listen,
    connect,
    is_loopback,
    new_secret,
    secret_from_env,
)
from tests.netcapture import CapturingProxy

pytestmark = pytest.mark.unit

SECRET = b"rpc-auth-test-secret-0123456789abcdef"
OTHER = b"some-other-cluster-secret-fedcba9876"
TABLE = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})


class PingServer(fl.FlightServerBase):  # type: ignore[misc]
    """``do_action`` answers b"pong", ``do_get`` streams TABLE; both count served calls."""

    def __init__(self, auth_handler: fl.ServerAuthHandler) -> None:
        super().__init__("grpc+tcp://127.0.0.1:0", auth_handler=auth_handler)
        self._lock = threading.Lock()
        self.served = 0
        self.peers: list[bytes] = []

    def _count(self, context: fl.ServerCallContext) -> None:
        with self._lock:
            self.served += 1
            self.peers.append(context.peer_identity())

    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> list[bytes]:
        self._count(context)
        return [b"pong"]

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.RecordBatchStream:
        self._count(context)
        return fl.RecordBatchStream(TABLE)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SpyClientAuth(HmacClientAuthHandler):
    """The real client handler, recording every token Flight asked it for."""

    def __init__(self, secret: bytes) -> None:
        super().__init__(secret)
        self.tokens: list[bytes] = []

    def get_token(self) -> bytes:
        token = super().get_token()
        self.tokens.append(token)
        return token


class FixedTokenAuth(fl.ClientAuthHandler):  # type: ignore[misc]
    """An attacker's client: gets through Flight's handshake with a session of its own, then
    sends one fixed (captured) token on every call."""

    def __init__(self, token: bytes) -> None:
        super().__init__()
        self._token = token
        self._inner = HmacClientAuthHandler(SECRET)

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        self._inner.authenticate(outgoing, incoming)

    def get_token(self) -> bytes:
        return self._token


class BlindClientAuth(fl.ClientAuthHandler):  # type: ignore[misc]
    """Speaks the wire format but does not know the secret and does not check the server."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        outgoing.write(b"\x01" + secrets.token_bytes(32))
        assert len(incoming.read()) == 64
        outgoing.write(secrets.token_bytes(32))

    def get_token(self) -> bytes:
        return b""


class RevokingServerAuth(fl.ServerAuthHandler):  # type: ignore[misc]
    """Knows the secret and proves it (an independent implementation of steps 1-3 of the
    documented wire format), checks the client's proof, then refuses it anyway."""

    def __init__(self, secret: bytes) -> None:
        super().__init__()
        self._secret = secret
        self.client_proof_ok: bool | None = None

    def _h(self, *parts: bytes) -> bytes:
        return hmac.new(self._secret, b"".join(parts), hashlib.sha256).digest()

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        hello = incoming.read()
        nc, ns = hello[1:], secrets.token_bytes(32)
        outgoing.write(ns + self._h(b"kudu-server", nc, ns))
        self.client_proof_ok = incoming.read() == self._h(b"kudu-client", nc, ns)
        raise fl.FlightUnauthenticatedError("this client has been revoked")

    def is_valid(self, token: bytes) -> bytes:
        raise fl.FlightUnauthenticatedError("no sessions here")


Start = Callable[..., tuple[PingServer, str]]
Clients = list[fl.FlightClient]


@pytest.fixture
def start_server() -> Iterator[Start]:
    servers: list[PingServer] = []

    def start(auth: fl.ServerAuthHandler) -> tuple[PingServer, str]:
        server = PingServer(auth)
        servers.append(server)
        return server, f"grpc+tcp://127.0.0.1:{server.port}"

    yield start
    for server in servers:
        server.shutdown()


@pytest.fixture
def clients() -> Iterator[list[fl.FlightClient]]:
    opened: list[fl.FlightClient] = []
    yield opened
    for client in opened:
        client.close()


def ping(client: fl.FlightClient, body: bytes = b"ping") -> bytes:
    results = list(client.do_action(fl.Action("ping", body)))
    return b"".join(r.body.to_pybytes() for r in results)


def tamper(token: bytes) -> bytes:
    return token[:-1] + (b"0" if token[-1:] != b"0" else b"1")


# -- 1. the right secret ------------------------------------------------------------------


def test_correct_secret_serves_actions_and_streams(start_server: Start, clients: Clients) -> None:
    server, loc = start_server(HmacServerAuthHandler(SECRET))
    client = connect(loc, SECRET)
    clients.append(client)
    assert ping(client) == b"pong"
    assert client.do_get(fl.Ticket(b"t")).read_all().equals(TABLE)
    assert server.served == 2
    assert server.peers[0].startswith(b"kudu:") and server.peers[0] == server.peers[1]


def test_get_token_is_called_for_every_call(start_server: Start, clients: Clients) -> None:
    server, loc = start_server(HmacServerAuthHandler(SECRET))
    client = fl.FlightClient(loc)
    clients.append(client)
    handler = SpyClientAuth(SECRET)
    client.authenticate(handler)
    assert handler.tokens == []  # the handshake itself carries no token
    assert ping(client) == b"pong" and ping(client) == b"pong"
    assert len(handler.tokens) == 2 and handler.tokens[0] != handler.tokens[1]
    sid = handler.tokens[0].split(b".")[0]
    assert server.peers == [b"kudu:" + sid] * 2


def test_concurrent_calls_from_many_threads(start_server: Start, clients: Clients) -> None:
    server, loc = start_server(HmacServerAuthHandler(SECRET))
    client = connect(loc, SECRET)
    clients.append(client)

    def work(i: int) -> bool:
        if i % 4 == 0:
            return bool(client.do_get(fl.Ticket(b"t")).read_all().equals(TABLE))
        return ping(client) == b"pong"

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, range(200)))
    assert all(results)
    assert server.served == 200


# -- 2. a wrong or missing credential -----------------------------------------------------


def test_wrong_secret_is_refused_by_connect(start_server: Start) -> None:
    server, loc = start_server(HmacServerAuthHandler(SECRET))
    with pytest.raises(InvalidArgumentError, match=SECRET_ENV):
        connect(loc, OTHER)
    assert server.served == 0


def test_unauthenticated_client_is_served_nothing(start_server: Start, clients: Clients) -> None:
    server, loc = start_server(HmacServerAuthHandler(SECRET))
    client = fl.FlightClient(loc)
    clients.append(client)
    with pytest.raises(fl.FlightUnauthenticatedError):
        ping(client)
    with pytest.raises(fl.FlightUnauthenticatedError):
        client.do_get(fl.Ticket(b"t")).read_all()
    assert server.served == 0


def test_unreachable_server_is_a_network_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed again on exit: nobody listens there
    loc = f"grpc+tcp://127.0.0.1:{port}"
    with pytest.raises(NetworkError, match=f"127.0.0.1:{port}"):
        connect(loc, SECRET, timeout_s=5)


# -- 3. mutual: each side refuses a peer without the secret ---------------------------------


def test_client_refuses_server_without_the_secret(start_server: Start, clients: Clients) -> None:
    server, loc = start_server(HmacServerAuthHandler(OTHER))
    client = fl.FlightClient(loc)
    clients.append(client)
    handler = HmacClientAuthHandler(SECRET)
    with pytest.raises(fl.FlightUnauthenticatedError, match="server failed to prove"):
        client.authenticate(handler)
    assert handler.server_refused  # the client refused, before sending its own proof
    with pytest.raises(InvalidArgumentError, match=f"this client refused server.*{SECRET_ENV}"):
        connect(loc, SECRET)
    assert server.served == 0


def test_server_refuses_client_without_the_secret(start_server: Start, clients: Clients) -> None:
    auth = HmacServerAuthHandler(SECRET)
    server, loc = start_server(auth)
    client = fl.FlightClient(loc)
    clients.append(client)
    with pytest.raises(fl.FlightUnauthenticatedError, match="client does not hold"):
        client.authenticate(BlindClientAuth())
    assert auth.session_count() == 0
    with pytest.raises(fl.FlightUnauthenticatedError):
        ping(client)
    assert server.served == 0


def test_connect_reports_a_server_side_refusal(start_server: Start) -> None:
    auth = RevokingServerAuth(SECRET)
    server, loc = start_server(auth)
    with pytest.raises(InvalidArgumentError, match=f"credential refused by server.*{SECRET_ENV}"):
        connect(loc, SECRET)
    assert auth.client_proof_ok is True  # the documented wire format, checked independently
    assert server.served == 0


# -- 4. nothing reusable on the wire --------------------------------------------------------


def test_secret_never_crosses_the_wire(start_server: Start, clients: Clients) -> None:
    secret = b"wire-" + secrets.token_hex(16).encode()
    server, _ = start_server(HmacServerAuthHandler(secret))
    proxy = CapturingProxy(server.port)
    try:
        client = connect(f"grpc+tcp://127.0.0.1:{proxy.port}", secret)
        clients.append(client)
        for _ in range(3):
            assert ping(client) == b"pong"
        assert client.do_get(fl.Ticket(b"t")).read_all().equals(TABLE)
        wire = proxy.captured()
    finally:
        proxy.close()
    assert b"ping" in wire and b"pong" in wire  # the capture does see the calls
    for form in (secret, secret.hex().encode(), base64.b64encode(secret),
                 base64.urlsafe_b64encode(secret), base64.b64encode(secret).rstrip(b"=")):
        assert form not in wire


# -- 5. replayed, forged, unknown and expired tokens ----------------------------------------


def test_captured_token_is_accepted_at_most_once(start_server: Start, clients: Clients) -> None:
    server, loc = start_server(HmacServerAuthHandler(SECRET))
    victim = fl.FlightClient(loc)
    clients.append(victim)
    handler = SpyClientAuth(SECRET)
    victim.authenticate(handler)
    unused = handler.get_token()
    handler.get_token()
    assert ping(victim) == b"pong"
    used = handler.tokens[-1]  # what a wire observer saw on the victim's last call

    attacker = fl.FlightClient(loc)
    clients.append(attacker)
    attacker.authenticate(FixedTokenAuth(used))
    with pytest.raises(fl.FlightUnauthenticatedError, match="replayed"):
        ping(attacker)
    attacker.authenticate(FixedTokenAuth(unused))
    assert ping(attacker) == b"pong"  # first use of a never-sent token may pass ...
    with pytest.raises(fl.FlightUnauthenticatedError, match="replayed"):
        ping(attacker)  # ... a second never does
    assert server.served == 2
    assert ping(victim) == b"pong"  # the victim's session is unharmed


def test_tampered_and_unknown_tokens_are_refused(start_server: Start) -> None:
    auth = HmacServerAuthHandler(SECRET)
    _, loc = start_server(auth)
    client = fl.FlightClient(loc)
    handler = HmacClientAuthHandler(SECRET)
    client.authenticate(handler)
    try:
        token = handler.get_token()
        with pytest.raises(fl.FlightUnauthenticatedError, match="MAC"):
            auth.is_valid(tamper(token))
        assert auth.is_valid(token).startswith(b"kudu:")  # the forgery consumed nothing
        unknown = secrets.token_hex(16).encode() + b"." + token.split(b".", 1)[1]
        for bad in (unknown, b"", b"garbage", b"a.b.c", token + b".1", token.replace(b".", b"|")):
            with pytest.raises(fl.FlightUnauthenticatedError):
                auth.is_valid(bad)
    finally:
        client.close()


def test_out_of_order_within_window_ok_older_refused(start_server: Start) -> None:
    auth = HmacServerAuthHandler(SECRET)
    _, loc = start_server(auth)
    client = fl.FlightClient(loc)
    handler = HmacClientAuthHandler(SECRET)
    client.authenticate(handler)
    try:
        tokens = [handler.get_token() for _ in range(5000)]  # seq 1..5000
        auth.is_valid(tokens[4999])
        auth.is_valid(tokens[4998])
        auth.is_valid(tokens[5000 - 4096])  # seq 905: 4095 below the high-water mark
        with pytest.raises(fl.FlightUnauthenticatedError, match="replayed or too old"):
            auth.is_valid(tokens[5000 - 4097])  # seq 904: outside the window
        with pytest.raises(fl.FlightUnauthenticatedError, match="replayed"):
            auth.is_valid(tokens[4998])
    finally:
        client.close()


def test_idle_session_expires_after_ttl(start_server: Start, clients: Clients) -> None:
    clock = FakeClock()
    auth = HmacServerAuthHandler(SECRET, session_ttl_s=60.0, clock=clock)
    server, loc = start_server(auth)
    client = connect(loc, SECRET)
    clients.append(client)
    clock.now += 40
    assert ping(client) == b"pong"
    clock.now += 40  # 80 s since the handshake, 40 s idle: the TTL counts idle time
    assert ping(client) == b"pong"
    clock.now += 60.5
    with pytest.raises(fl.FlightUnauthenticatedError, match="expired"):
        ping(client)
    assert auth.session_count() == 0 and server.served == 2


def test_session_table_is_bounded(start_server: Start, clients: Clients) -> None:
    auth = HmacServerAuthHandler(SECRET, max_sessions=2)
    _, loc = start_server(auth)
    first, second, third = (connect(loc, SECRET) for _ in range(3))
    clients.extend([first, second, third])
    assert auth.session_count() == 2
    with pytest.raises(fl.FlightUnauthenticatedError, match="unknown"):
        ping(first)  # the oldest session was evicted
    assert ping(second) == b"pong" and ping(third) == b"pong"


# -- 6. configuration helpers -----------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "10.1.2.3"])
@pytest.mark.parametrize("secret", [None, b"", b"x" * 15])
def test_check_listen_refuses_missing_or_short_secret(host: str, secret: bytes | None) -> None:
    with pytest.raises(InvalidArgumentError, match=SECRET_ENV):
        check_listen(host, secret)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_check_listen_accepts_16_bytes(host: str) -> None:
    check_listen(host, b"x" * 16)
    check_listen(host, new_secret().encode())


def test_secret_from_env() -> None:
    assert secret_from_env({}) is None
    assert secret_from_env({SECRET_ENV: ""}) is None
    assert secret_from_env({SECRET_ENV: "s3cret"}) == b"s3cret"
    assert secret_from_env({SECRET_ENV: "clé"}) == "clé".encode()
    assert secret_from_env({"OTHER": "x"}) is None


def test_new_secret_is_fresh_hex() -> None:
    a, b = new_secret(), new_secret()
    assert a != b and len(a) == 64 and bytes.fromhex(a)


@pytest.mark.parametrize(("host", "expected"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("LocalHost", True), ("0.0.0.0", False), ("10.0.0.1", False),
    ("::", False), ("example.com", False), ("", False)])
def test_is_loopback(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected


def test_handlers_refuse_an_empty_secret() -> None:
    with pytest.raises(InvalidArgumentError):
        HmacServerAuthHandler(b"")
    with pytest.raises(InvalidArgumentError):
        HmacClientAuthHandler(b"")
