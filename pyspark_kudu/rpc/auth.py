"""Mutual HMAC-SHA256 challenge-response authentication for every Arrow Flight service.

K is the cluster's shared secret (``PYSPARK_KUDU_SECRET``), H(k, m) is HMAC-SHA256 and ``|``
is concatenation. The handshake runs over Flight's ``Handshake`` stream, fixed binary layout:

1. client -> server, 33 bytes: ``0x01`` (protocol version) | Nc (32 random bytes).
2. server -> client, 64 bytes: Ns (32 random bytes) | proof_s, where
   proof_s = H(K, b"kudu-server" | Nc | Ns). The client checks proof_s and aborts if it is
   wrong, so a server that does not know K is refused too (mutual authentication).
3. client -> server, 32 bytes: proof_c = H(K, b"kudu-client" | Nc | Ns). The server checks
   it in constant time and fails the handshake with ``FlightUnauthenticatedError`` if wrong.
   The labels differ so neither side's proof can be reflected back as the other's.
4. Both derive the session key Ks = H(K, b"kudu-session" | Nc | Ns) and the session id
   sid = hex of the first 16 bytes of SHA-256(Ns).
5. Every later call carries (Flight's ``auth-token-bin`` header, filled by
   :meth:`HmacClientAuthHandler.get_token`, which Flight calls once per RPC) the ASCII token
   ``<sid>.<seq>.<mac>``: seq is a per-session counter (decimal, from 1, incremented for
   every call) and mac = hex H(Ks, b"<sid>.<seq>"). The server accepts each (sid, seq) once:
   seq above the session's high-water mark, or less than 4096 below it and not seen yet
   (calls from several threads may arrive out of order); anything older is refused.
6. A session idle for longer than the TTL (default 1 h) is forgotten, and at most 10,000
   are kept (the least recently used is evicted first); its client must connect again.

Threat model: a passive observer of the connection learns neither K nor Ks (only nonces,
HMAC outputs and per-call tokens cross the wire), and a captured call token replayed on
another call is refused. The proofs would allow an offline guessing attack on a weak K,
hence random secrets of at least 16 bytes (:func:`new_secret`, :func:`check_listen`). This
authenticates peers; it does not encrypt the data, nor bind a token to its call's content,
so an active man-in-the-middle could still read, alter or hijack calls in flight. The
optional TLS layer of :mod:`pyspark_kudu.rpc.tls` (``PYSPARK_KUDU_TLS_CERT/_KEY/_CA``) adds
confidentiality and integrity and verifies the server's certificate; this handshake then
runs inside the TLS connection and remains the authentication.

Thread-safety: :class:`HmacServerAuthHandler` is thread-safe (gRPC runs handshakes and
calls on many threads; one lock guards the session table). In
:class:`HmacClientAuthHandler`, ``get_token`` is thread-safe (the counter is taken under a
lock); ``authenticate`` must not run concurrently with calls on the same client, which
:func:`connect` guarantees by authenticating before it returns the client.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from pyspark_kudu.errors import CredentialError, InvalidArgumentError, NetworkError
from pyspark_kudu.rpc.tls import client_kwargs, plain_hint, tls_failure

__all__ = ["SECRET_ENV", "HmacClientAuthHandler", "HmacServerAuthHandler", "check_listen",
           "connect", "is_loopback", "new_secret", "secret_from_env"]

SECRET_ENV = "PYSPARK_KUDU_SECRET"
MIN_SECRET_BYTES = 16
NONCE_BYTES = 32
REPLAY_WINDOW = 4096
MAX_SESSIONS = 10_000
_VERSION = b"\x01"
_MAC_BYTES = 32
_WINDOW_MASK = (1 << REPLAY_WINDOW) - 1
_MAX_SEQ_DIGITS = 19  # keeps seq within int64 and parsing cheap on hostile input
_Unauth = fl.FlightUnauthenticatedError


def _h(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _session_id(ns: bytes) -> str:
    return hashlib.sha256(ns).digest()[:16].hex()


def _token_mac(ks: bytes, sid: str, seq: int) -> str:
    return hmac.new(ks, f"{sid}.{seq}".encode("ascii"), hashlib.sha256).hexdigest()


def _read(incoming: Any, size: int, what: str) -> bytes:
    """Read one handshake message of exactly ``size`` bytes, else FlightUnauthenticatedError."""
    try:
        msg = bytes(incoming.read())
    except pa.ArrowException as e:
        raise _Unauth(f"handshake aborted while reading {what}") from e
    if len(msg) != size:
        raise _Unauth(f"malformed handshake: {what} must be {size} bytes")
    return msg


@dataclass
class _Session:
    key: bytes
    last_used: float
    hwm: int = 0
    seen: int = 0  # bit i set <=> seq (hwm - i) was accepted (the IPsec anti-replay window)

    def accept(self, seq: int) -> bool:
        if seq > self.hwm:
            shift = seq - self.hwm
            # Shifting by a huge jump would build a huge int; past the window nothing survives.
            self.seen = ((self.seen << shift) | 1) & _WINDOW_MASK if shift < REPLAY_WINDOW else 1
            self.hwm = seq
            return True
        offset = self.hwm - seq
        if offset >= REPLAY_WINDOW or (self.seen >> offset) & 1:
            return False
        self.seen |= 1 << offset
        return True


class HmacServerAuthHandler(fl.ServerAuthHandler):  # type: ignore[misc]
    """Server side: runs the handshake and checks every call's token (see module doc).

    Only Flight errors leave its methods: pyarrow would send the Python traceback of any
    other exception to the peer.
    """

    def __init__(self, secret: bytes, *, session_ttl_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic,
                 max_sessions: int = MAX_SESSIONS) -> None:
        """Raises:
            InvalidArgumentError: empty ``secret``, or a limit that is not positive.
        """
        super().__init__()
        if not secret or session_ttl_s <= 0 or max_sessions <= 0:
            raise InvalidArgumentError(f"HmacServerAuthHandler needs a non-empty secret "
                                       f"({SECRET_ENV}) and positive limits")
        self._secret, self._ttl, self._max = bytes(secret), session_ttl_s, max_sessions
        self._clock = clock
        self._lock = threading.Lock()
        # Ordered by last use, oldest first: expiry and eviction pop from the front.
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        """Run steps 1-4 of the handshake and remember the new session.

        Raises:
            FlightUnauthenticatedError: broken stream, malformed messages or wrong proof.
        """
        hello = _read(incoming, 1 + NONCE_BYTES, "the client hello")
        if hello[:1] != _VERSION:
            raise _Unauth("unsupported authentication protocol version")
        nc, ns = hello[1:], secrets.token_bytes(NONCE_BYTES)
        try:
            outgoing.write(ns + _h(self._secret, b"kudu-server", nc, ns))
        except pa.ArrowException as e:
            raise _Unauth("handshake aborted by the client") from e
        proof_c = _read(incoming, _MAC_BYTES, "the client proof")
        if not hmac.compare_digest(proof_c, _h(self._secret, b"kudu-client", nc, ns)):
            raise _Unauth(f"authentication failed: the client does not hold this cluster's "
                          f"{SECRET_ENV}")
        session = _Session(_h(self._secret, b"kudu-session", nc, ns), self._clock())
        with self._lock:
            self._expire_locked(session.last_used)
            self._sessions[_session_id(ns)] = session
            while len(self._sessions) > self._max:
                self._sessions.popitem(last=False)

    def is_valid(self, token: bytes) -> bytes:
        """Check one call's token and return the peer identity ``b"kudu:" + sid``.

        Raises:
            FlightUnauthenticatedError: malformed token, unknown or expired session, wrong
                MAC, or a sequence number already used (replay) or too old.
        """
        parts = bytes(token).split(b".")
        if (len(parts) != 3 or not parts[0].isascii() or not parts[1].isdigit()
                or len(parts[1]) > _MAX_SEQ_DIGITS or len(parts[2]) != 2 * _MAC_BYTES):
            raise _Unauth("missing or malformed session token; authenticate first")
        sid, seq, mac = parts[0].decode("ascii"), int(parts[1]), parts[2]
        with self._lock:
            now = self._clock()
            self._expire_locked(now)
            session = self._sessions.get(sid)
            if session is None:
                raise _Unauth("unknown or expired session; authenticate again")
            if not hmac.compare_digest(mac, _token_mac(session.key, sid, seq).encode("ascii")):
                raise _Unauth("bad session token MAC")
            if seq < 1 or not session.accept(seq):
                raise _Unauth("session token replayed or too old")
            session.last_used = now
            self._sessions.move_to_end(sid)
        return b"kudu:" + sid.encode("ascii")

    def session_count(self) -> int:
        """Number of sessions currently remembered (for monitoring and tests)."""
        with self._lock:
            return len(self._sessions)

    def _expire_locked(self, now: float) -> None:
        while self._sessions and now - next(iter(self._sessions.values())).last_used > self._ttl:
            self._sessions.popitem(last=False)


class HmacClientAuthHandler(fl.ClientAuthHandler):  # type: ignore[misc]
    """Client side: runs the handshake, then signs a fresh token for every call.

    ``server_refused`` is True after a handshake in which the server failed its proof.
    """

    def __init__(self, secret: bytes) -> None:
        """Raises:
            InvalidArgumentError: ``secret`` is empty.
        """
        super().__init__()
        if not secret:
            raise InvalidArgumentError(f"no secret to authenticate with; set {SECRET_ENV}")
        self._secret = bytes(secret)
        self._lock = threading.Lock()
        self._session: tuple[str, bytes] | None = None
        self._seq = 0
        self.server_refused = False

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        """Run steps 1-4 of the handshake.

        Raises:
            FlightUnauthenticatedError: the server's reply is malformed or its proof is wrong.
        """
        with self._lock:
            self._session, self._seq, self.server_refused = None, 0, False
        nc = secrets.token_bytes(NONCE_BYTES)
        outgoing.write(_VERSION + nc)
        reply = _read(incoming, NONCE_BYTES + _MAC_BYTES, "the server challenge")
        ns, proof_s = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
        if not hmac.compare_digest(proof_s, _h(self._secret, b"kudu-server", nc, ns)):
            self.server_refused = True
            raise _Unauth(f"the server failed to prove it holds this cluster's {SECRET_ENV}")
        outgoing.write(_h(self._secret, b"kudu-client", nc, ns))
        with self._lock:
            self._session = (_session_id(ns), _h(self._secret, b"kudu-session", nc, ns))

    def get_token(self) -> bytes:
        """Return the next call's token ``<sid>.<seq>.<mac>``; Flight calls this per RPC.

        Raises:
            FlightUnauthenticatedError: no successful handshake yet.
        """
        with self._lock:
            if self._session is None:
                raise _Unauth("not authenticated: no completed handshake")
            self._seq += 1
            (sid, ks), seq = self._session, self._seq
        return f"{sid}.{seq}.{_token_mac(ks, sid, seq)}".encode("ascii")


def connect(location: str, secret: bytes, *, timeout_s: float = 10.0,
            generic_options: Sequence[tuple[str, Any]] | None = None,
            tls_root_certs: bytes | None = None) -> fl.FlightClient:
    """Open a Flight client to ``location`` and authenticate it with ``secret``.

    A ``grpc+tls://`` location is verified against ``tls_root_certs`` (PEM; see
    :mod:`pyspark_kudu.rpc.tls`), then authenticated inside the TLS connection.

    Raises:
        CredentialError: either side refused the credential (the secrets differ), or the
            TLS handshake failed (a plain server, or a certificate the CA did not sign).
        NetworkError: the server is unreachable or did not answer within ``timeout_s``.
    """
    handler = HmacClientAuthHandler(secret)
    client = fl.FlightClient(location, generic_options=list(generic_options or []),
                             **client_kwargs(tls_root_certs))
    try:
        client.authenticate(handler, options=fl.FlightCallOptions(timeout=timeout_s))
    except fl.FlightUnauthenticatedError as e:
        client.close()
        who = "this client refused" if handler.server_refused else "credential refused by"
        raise CredentialError(f"{who} server {location}: the shared secrets differ; "
                                   f"give both sides the cluster's {SECRET_ENV}") from e
    except pa.ArrowException as e:
        client.close()
        tls_error = tls_failure(location, str(e))
        if tls_error is not None:
            raise tls_error from e
        raise NetworkError(f"Flight server {location} is unreachable or did not answer "
                           f"within {timeout_s:.1f} s: {e}{plain_hint(location, str(e))}"
                           ) from e
    return client


def is_loopback(host: str) -> bool:
    """True if ``host`` is a loopback address or ``localhost``; False for other names."""
    try:
        return host.lower() == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(host: str, secret: bytes | None) -> None:
    """Refuse to start a service on ``host`` without a usable secret (loopback included).

    Raises:
        InvalidArgumentError: ``secret`` is missing, empty or shorter than 16 bytes.
    """
    if not secret:
        raise InvalidArgumentError(f"refusing to listen on {host} without a credential: set "
                                   f"{SECRET_ENV} (e.g. to `secrets.token_hex(32)`)")
    if len(secret) < MIN_SECRET_BYTES:
        raise InvalidArgumentError(f"{SECRET_ENV} is {len(secret)} bytes; at least "
                                   f"{MIN_SECRET_BYTES} are required to listen on {host}")


def secret_from_env(env: Mapping[str, str] = os.environ) -> bytes | None:
    """The secret from ``PYSPARK_KUDU_SECRET`` (UTF-8), or None if unset or empty."""
    value = env.get(SECRET_ENV)
    return value.encode("utf-8") if value else None


def new_secret() -> str:
    """A fresh random secret (64 hex characters) suitable for ``PYSPARK_KUDU_SECRET``."""
    return secrets.token_hex(32)
