"""The optional TLS layer (:mod:`pyspark_kudu.rpc.tls`) of the three Flight services.

Real servers on loopback, certificates made here with the ``openssl`` command line (a
throwaway CA, a server certificate for ``IP:127.0.0.1, DNS:localhost``):

* through a byte-recording TCP proxy, calls to a standalone ``master run`` process, a resident
  tablet server and a driver's session service succeed over TLS, and the bytes on the wire
  hold neither the secret, nor a per-call HMAC token, nor the payload; the same capture
  without TLS does show the payload (the capture works);
* mismatches fail fast with a clear error: a TLS client facing a plain server, a plain client
  facing a TLS server, a client with another CA (or none);
* a bad configuration is refused before anything starts, naming the setting.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow.flight as fl
import pytest

from pyspark_kudu.errors import (
    CredentialError,
    InvalidArgumentError,
    NetworkError,
    SessionUnreachableError,
)
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.master.flight import FlightChannel, flight_location
from pyspark_kudu.master.localcluster import MasterProcessCluster
from pyspark_kudu.master.server import MasterServerConfig
from pyspark_kudu.rpc import auth
from pyspark_kudu.rpc.auth import SECRET_ENV, connect
from pyspark_kudu.rpc.tls import (
    CA_ENV,
    CERT_ENV,
    KEY_ENV,
    TlsConfig,
    TlsHandshakeError,
    load_tls,
    server_kwargs,
    tls_from_env,
)
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.spark.api.session_service import SessionService
from pyspark_kudu.spark.host import tserver_client
from pyspark_kudu.spark.host.identity import ensure_instance
from pyspark_kudu.spark.host.tablet_server import _make_server, start_resident
from pyspark_kudu.spark.host.tserver_protocol import FileRequest
from pyspark_kudu.spark.replication.session_client import (
    SessionAddress,
    SessionClient,
    TableInfo,
)
from tests.netcapture import CapturingProxy
from tests.waiting import wait_until

pytestmark = pytest.mark.unit

TOKEN = "tls-master-token-0123456789abcdef"
SECRET = b"tls-test-secret-0123456789abcdef-xyz"
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))
REPO = Path(__file__).resolve().parents[2]
TLS_ENVS = (CERT_ENV, KEY_ENV, CA_ENV)

_OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[v3_server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
[v3_elsewhere]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:elsewhere.invalid
"""


@dataclasses.dataclass(frozen=True)
class Pki:
    """Paths of the test certificates and the configurations made of them."""

    dir: Path
    ca: str  # the CA that signed cert (and elsewhere_cert)
    cert: str  # server certificate: IP:127.0.0.1, DNS:localhost
    key: str
    other_ca: str  # an unrelated CA
    elsewhere_cert: str  # signed by ca, but for DNS:elsewhere.invalid only
    elsewhere_key: str
    encrypted_key: str

    server = property(lambda self: tls(self.cert, self.key, self.ca))
    client = property(lambda self: tls(None, None, self.ca))  # a CA alone: connect only
    other_client = property(lambda self: tls(None, None, self.other_ca))

    def env(self) -> dict[str, str]:
        return {CERT_ENV: self.cert, KEY_ENV: self.key, CA_ENV: self.ca}


def tls(cert: str | None, key: str | None, ca: str) -> TlsConfig:
    cfg = load_tls(cert, key, ca)
    assert cfg is not None
    return cfg


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"openssl {' '.join(args)} failed: {proc.stderr}"


def _new_ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-new", "-config", "openssl.cnf", "-extensions", "v3_ca",
             "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
             "-subj", f"/CN=pyspark-kudu test {name}", cwd=d)


def _new_server(d: Path, name: str, ca: str, section: str, serial: int) -> None:
    _openssl("req", "-new", "-config", "openssl.cnf", "-newkey", "ec",
             "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", "/CN=127.0.0.1", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-set_serial", str(serial), "-days", "2", "-extfile", "openssl.cnf",
             "-extensions", section, "-out", f"{name}.pem", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throwaway CA and certificates, made with the openssl command line."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line tool is not installed: it makes the test "
                    "certificates (apt-get install openssl)")
    d = tmp_path_factory.mktemp("pki")
    (d / "openssl.cnf").write_text(_OPENSSL_CNF)
    _new_ca(d, "ca")
    _new_ca(d, "other-ca")
    _new_server(d, "server", "ca", "v3_server", 1)
    _new_server(d, "elsewhere", "ca", "v3_elsewhere", 2)
    _openssl("pkey", "-in", "server.key", "-aes256", "-passout", "pass:secret",
             "-out", "encrypted.key", cwd=d)
    for key in d.glob("*.key"):
        key.chmod(0o600)
    return Pki(d, str(d / "ca.pem"), str(d / "server.pem"), str(d / "server.key"),
               str(d / "other-ca.pem"), str(d / "elsewhere.pem"), str(d / "elsewhere.key"),
               str(d / "encrypted.key"))


@pytest.fixture(autouse=True)
def no_tls_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts without TLS settings in the environment, and sets what it needs."""
    for name in TLS_ENVS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def tokens(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every per-call HMAC token the clients of this process send during the test."""
    sent: list[bytes] = []
    real = auth.HmacClientAuthHandler.get_token

    def spy(self: auth.HmacClientAuthHandler) -> bytes:
        token = real(self)
        sent.append(token)
        return token

    monkeypatch.setattr(auth.HmacClientAuthHandler, "get_token", spy)
    return sent


def forms(value: bytes) -> list[bytes]:
    """Encodings under which ``value`` could appear on the wire."""
    return [value, value.hex().encode(), base64.b64encode(value),
            base64.b64encode(value).rstrip(b"="), base64.urlsafe_b64encode(value)]


def assert_opaque(wire: bytes, hidden: Sequence[bytes], tokens: Sequence[bytes]) -> None:
    """``wire`` is TLS (starts with a handshake record) and shows none of ``hidden``
    (secrets and payloads) nor any call token."""
    assert len(wire) > 1000, "the capture must have seen the connection"
    assert wire[:2] == b"\x16\x03", "the first bytes on the wire are not a TLS handshake"
    assert tokens, "the HMAC handshake must have run (and signed calls) inside TLS"
    for value in [*hidden, *tokens]:
        for form in forms(value):
            assert form not in wire, f"{value!r} crossed the wire readable"


def through_proxy(port: int, work: Callable[[int], Any],
                  diagnose: Callable[[], str] | None = None) -> tuple[Any, bytes]:
    """Run ``work(proxy_port)`` through a recording proxy to ``port``; its result and the
    bytes seen in both directions. If ``work`` fails, the failure says what the proxy met
    forwarding, and ``diagnose()`` (the state of the server behind it)."""
    proxy = CapturingProxy(port)
    try:
        out = work(proxy.port)
    except Exception as e:
        raise AssertionError(
            f"{type(e).__name__}: {e}\nthrough a proxy to port {port} (it forwarded "
            f"{len(proxy.captured())} bytes; its errors: {proxy.errors or 'none'})"
            + (f"\n{diagnose()}" if diagnose is not None else "")) from e
    finally:
        proxy.close()
    return out, proxy.captured()


# -- the standalone master process ---------------------------------------------------------


@dataclasses.dataclass
class Masters:
    tls: MasterProcessCluster
    plain: MasterProcessCluster

    @staticmethod
    def port(group: MasterProcessCluster) -> int:
        (addr,) = group.peers.values()
        return int(addr.rpartition(":")[2])

    @staticmethod
    def state(group: MasterProcessCluster) -> str:
        """Whether the group's process runs (its exit code if not) and its log's end."""
        (node,) = group.peers
        proc = group.procs.get(node)
        code = None if proc is None else proc.poll()
        return (f"master {node} at {group.peers[node]}: "
                f"{'running' if proc is not None and code is None else f'exited {code}'}; "
                f"its log ends:\n{group.log_tail(node)}")


@pytest.fixture(scope="module")
def masters(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Masters]:
    """Two real ``pyspark-kudu master run`` processes with a token: one started with
    ``--tls-cert/--tls-key/--tls-ca``, one without TLS (the control)."""
    tls = MasterProcessCluster(str(tmp_path_factory.mktemp("tls-master")), 1, token=TOKEN,
                               extra_args=["--tls-cert", pki.cert, "--tls-key", pki.key,
                                           "--tls-ca", pki.ca])
    plain = MasterProcessCluster(str(tmp_path_factory.mktemp("plain-master")), 1, token=TOKEN)
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name in TLS_ENVS:  # the processes inherit this environment
                mp.delenv(name, raising=False)
            tls.start()
            plain.start()
            plain.wait_for_leader(90)
            mp.setenv(CA_ENV, pki.ca)  # wait_for_leader's own client: over TLS
            tls.wait_for_leader(90)
        yield Masters(tls, plain)
    finally:
        tls.stop()
        plain.stop()


def _master_calls(port: int, tls: TlsConfig | None, marker: str) -> tuple[list[str], list[Any]]:
    """Register a tablet server and create a table named ``marker`` at the master behind
    ``port``; the tables and tablet servers it then lists."""
    addr = f"127.0.0.1:{port}"
    with MasterClient(addr, token=TOKEN, timeout_s=60, check_master_count=False,
                      channel_factory=lambda a: FlightChannel(a, token=TOKEN, tls=tls)) as c:
        c.heartbeat_to(addr, TServerMeta(f"ts-{marker}", f"host-{marker}", 7050, "/d"),
                       timeout_s=30)
        c.create_table(marker, SCHEMA, replication_factor=1)
        return c.list_tables(), c.list_tservers()


def test_master_process_over_tls_shows_no_token_and_no_payload(
    masters: Masters, pki: Pki, tokens: list[bytes],
) -> None:
    marker = "tls_table_7f3a9c"
    (tables, tservers), wire = through_proxy(
        Masters.port(masters.tls), lambda p: _master_calls(p, pki.client, marker),
        lambda: Masters.state(masters.tls))
    assert marker in tables
    assert f"host-{marker}" in [t["host"] for t in tservers]
    assert_opaque(wire, [TOKEN.encode(), marker.encode(), f"host-{marker}".encode()], tokens)


def test_master_process_without_tls_shows_the_payload_but_not_the_token(
    masters: Masters, tokens: list[bytes],
) -> None:
    marker = "plain_table_2b8e1d"
    (tables, _), wire = through_proxy(
        Masters.port(masters.plain), lambda p: _master_calls(p, None, marker),
        lambda: Masters.state(masters.plain))
    assert marker in tables
    assert marker.encode() in wire and f"host-{marker}".encode() in wire  # capture works
    assert wire[:2] != b"\x16\x03"
    assert tokens
    for form in forms(TOKEN.encode()):
        assert form not in wire


def status(addr: str, token: str | None, tls: TlsConfig | None) -> Any:
    """One ``status`` call to the master at ``addr`` through a fresh channel."""
    ch = FlightChannel(addr, token=token, tls=tls)
    try:
        return ch.call("status", {}, 30)
    finally:
        ch.close()


def test_a_master_group_configured_by_environment_runs_raft_over_tls(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in pki.env().items():  # inherited by the processes, used by clients
        monkeypatch.setenv(name, value)
    with MasterProcessCluster(str(tmp_path / "group"), 3, token=TOKEN) as group:
        group.start()
        leader = group.wait_for_leader(90)  # elected over TLS between the processes
        with group.client(timeout_s=60) as c:  # a client configured by the environment
            c.heartbeat_to(group.peers[leader], TServerMeta("ts-g", "h", 7050, "/d"),
                           timeout_s=30)
            c.create_table("over_tls", SCHEMA, replication_factor=1, timeout_s=60)
            commit = c.call("status")["commit"]

            def replicated() -> bool:  # every follower got the entry over TLS Raft
                sts = c.statuses(timeout=5).values()
                return all(isinstance(s, dict) and s["applied"] >= commit for s in sts)

            wait_until(replicated, 60, "replication of the create_table to every master")
        with pytest.raises(NetworkError, match=f"uses TLS, set {CA_ENV}"):
            status(group.peers[leader], TOKEN, None)
    addr = group.peers[leader]
    assert flight_location(addr, tls_from_env()) == f"grpc+tls://{addr}"
    assert flight_location(addr) == f"grpc+tcp://{addr}"


def test_master_mismatches_fail_clearly(masters: Masters, pki: Pki) -> None:
    (tls_addr,) = masters.tls.peers.values()
    (plain_addr,) = masters.plain.peers.values()
    for token in (TOKEN, None):  # with or without the HMAC handshake first
        with pytest.raises(TlsHandshakeError, match=f"{plain_addr} does not speak TLS"):
            status(plain_addr, token, pki.client)
    with pytest.raises(NetworkError, match=f"uses TLS, set {CA_ENV}"):
        status(tls_addr, TOKEN, None)
    with pytest.raises(TlsHandshakeError, match=f"not signed by the CA in {CA_ENV}"):
        status(tls_addr, TOKEN, pki.other_client)
    with pytest.raises(TlsHandshakeError):  # no CA: the system's roots do not know ours
        connect(f"grpc+tls://{tls_addr}", TOKEN.encode(), timeout_s=30)
    assert status(tls_addr, TOKEN, pki.client)["role"] == "leader"


def test_hmac_still_authenticates_inside_tls(masters: Masters, pki: Pki) -> None:
    (addr,) = masters.tls.peers.values()
    with pytest.raises(CredentialError, match="wrong or missing shared-secret token"):
        status(addr, "not-the-token", pki.client)
    unauthenticated = fl.FlightClient(f"grpc+tls://{addr}", tls_root_certs=pki.client.ca_pem)
    try:
        with pytest.raises(fl.FlightUnauthenticatedError):
            list(unauthenticated.do_action(fl.Action("status", b"{}"),
                                           fl.FlightCallOptions(timeout=30)))
    finally:
        unauthenticated.close()


# -- the resident tablet server -------------------------------------------------------------

BLOB = b"tablet-server-file-bytes-d41d8cd9-" * 64


@pytest.fixture
def data_root(tmp_path: Path) -> tuple[str, str]:
    """A tablet server data root holding tablet t1's file ``blob``: (root, server uuid)."""
    root = tmp_path / "ts"
    info = ensure_instance(str(root))
    (root / "tablets" / "t1").mkdir(parents=True)
    (root / "tablets" / "t1" / "blob").write_bytes(BLOB)
    return str(root), info.uuid


@pytest.fixture
def tserver_factory() -> Iterator[Callable[[TlsConfig | None], Any]]:
    servers: list[Any] = []

    def make(tls: TlsConfig | None) -> Any:
        servers.append(_make_server("127.0.0.1", SECRET, tls))
        return servers[-1]

    yield make
    for s in servers:
        s.shutdown()


@pytest.mark.parametrize("use_tls", [True, False], ids=["tls", "plain"])
def test_tablet_server_wire(
    use_tls: bool, pki: Pki, data_root: tuple[str, str], tokens: list[bytes],
    tserver_factory: Callable[[TlsConfig | None], Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, uuid = data_root
    server = tserver_factory(pki.server if use_tls else None)
    if use_tls:
        monkeypatch.setenv(CA_ENV, pki.ca)  # how executors' clients get it

    def work(port: int) -> tuple[bytes, dict[str, Any]]:
        req = FileRequest(uuid, "t1", "blob", root=root)
        data = b"".join(tserver_client.fetch_file(f"127.0.0.1:{port}", SECRET, req))
        return data, tserver_client.ping(f"127.0.0.1:{port}", SECRET, timeout_s=30)

    (data, info), wire = through_proxy(server.port, work)
    assert data == BLOB and info["pid"] > 0
    # Raw file streams are not encrypted: a TLS server runs none (copies stay on Flight).
    assert (info["stream_address"] == "") == use_tls
    if use_tls:
        assert_opaque(wire, [SECRET, BLOB[:40], b"rounds_served"], tokens)
    else:
        assert BLOB[:40] in wire and b"rounds_served" in wire  # the capture works
        assert all(form not in wire for form in forms(SECRET))


def test_tablet_server_mismatches_fail_clearly(
    pki: Pki, tserver_factory: Callable[[TlsConfig | None], Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tls_addr = f"127.0.0.1:{tserver_factory(pki.server).port}"
    plain_addr = f"127.0.0.1:{tserver_factory(None).port}"
    with pytest.raises(NetworkError, match=f"uses TLS, set {CA_ENV}"):
        tserver_client.ping(tls_addr, SECRET, timeout_s=30)
    monkeypatch.setenv(CA_ENV, pki.ca)
    assert tserver_client.ping(tls_addr, SECRET, timeout_s=30)["pid"] > 0
    with pytest.raises(TlsHandshakeError, match=f"tablet server {plain_addr}.*does not "
                                                f"speak TLS"):
        tserver_client.ping(plain_addr, SECRET, timeout_s=30)
    monkeypatch.setenv(CA_ENV, pki.other_ca)
    with pytest.raises(TlsHandshakeError, match="not signed by the CA"):
        tserver_client.ping(tls_addr, SECRET, timeout_s=30)


def test_a_certificate_for_another_name_is_refused(
    pki: Pki, tserver_factory: Callable[[TlsConfig | None], Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = load_tls(pki.elsewhere_cert, pki.elsewhere_key, pki.ca)
    addr = f"127.0.0.1:{tserver_factory(cfg).port}"
    monkeypatch.setenv(CA_ENV, pki.ca)
    with pytest.raises(TlsHandshakeError, match="does not name that address"):
        tserver_client.ping(addr, SECRET, timeout_s=30)


def test_a_resident_tablet_server_with_bad_tls_settings_does_not_start(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    env = {SECRET_ENV: SECRET.decode(), CERT_ENV: str(tmp_path / "missing.pem"),
           KEY_ENV: pki.key, CA_ENV: pki.ca}
    assert start_resident(env) is None  # checked before forking: nothing started
    assert f"{CERT_ENV}={tmp_path / 'missing.pem'}: cannot read it" in capsys.readouterr().err
    assert start_resident({SECRET_ENV: SECRET.decode(), CA_ENV: pki.ca}) is None
    assert f"{CERT_ENV} and {KEY_ENV} are not" in capsys.readouterr().err


# -- the session service --------------------------------------------------------------------

SESSION_TABLE = "session_table_c0ffee42"


class Backend:
    """The smallest :class:`SessionBackend`: describes any table, does nothing else."""

    def __init__(self, warehouse: str) -> None:
        self._warehouse = warehouse

    @property
    def warehouse(self) -> str:
        return self._warehouse

    @property
    def master_addresses(self) -> tuple[str, ...]:
        return ("127.0.0.1:7051",)

    def describe(self, table: str) -> TableInfo:
        return TableInfo(table, SCHEMA, {"hash": []}, (), {}, None, None, False)

    def expect_write(self) -> None:
        pass

    expected_write_ended = expect_write

    def _unused(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    commit_staged = discard_staged = read_points = execute_replication_actions = _unused


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[Callable[[TlsConfig | None], SessionService]]:
    services: list[SessionService] = []

    def make(tls: TlsConfig | None) -> SessionService:
        services.append(SessionService(Backend(str(tmp_path / "wh")),
                                       secret=SECRET.decode(), tls=tls))
        return services[-1]

    yield make
    for s in services:
        s.close()


@pytest.mark.parametrize("use_tls", [True, False], ids=["tls", "plain"])
def test_session_service_wire(
    use_tls: bool, pki: Pki, tokens: list[bytes],
    service_factory: Callable[[TlsConfig | None], SessionService],
) -> None:
    service = service_factory(pki.server if use_tls else None)
    address = service.address
    assert address.tls is use_tls and (address.tls_ca != "") is use_tls

    def work(port: int) -> TableInfo:
        # No TLS setting in this process: the address itself carries the CA, as it does
        # into the data source's workers.
        return SessionClient(dataclasses.replace(address, port=port)).describe(SESSION_TABLE)

    info, wire = through_proxy(address.port, work)
    assert info.table == SESSION_TABLE
    if use_tls:
        assert_opaque(wire, [SECRET, SESSION_TABLE.encode()], tokens)
    else:
        assert SESSION_TABLE.encode() in wire  # the capture works
        assert all(form not in wire for form in forms(SECRET))


def test_session_addresses_say_tls_and_keep_the_ca_out_of_the_lease_table(
    pki: Pki, service_factory: Callable[[TlsConfig | None], SessionService],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    address = service_factory(pki.server).address
    assert SessionAddress.from_dict(address.to_dict()) == address
    public = address.public_dict()
    assert public["tls"] is True and "tls_ca" not in public and "secret" not in public
    # Another client learns the endpoint from the master: it verifies with its own CA.
    forwarded = SessionAddress.from_dict({**public, "secret": SECRET.decode()})
    with pytest.raises(CredentialError, match=f"serves TLS.*set {CA_ENV}"):
        SessionClient(forwarded).describe(SESSION_TABLE)
    monkeypatch.setenv(CA_ENV, pki.ca)
    assert SessionClient(forwarded).describe(SESSION_TABLE).table == SESSION_TABLE


def test_session_service_mismatches_fail_clearly(
    pki: Pki, service_factory: Callable[[TlsConfig | None], SessionService],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tls_address = service_factory(pki.server).address
    plain_address = service_factory(None).address
    as_plain = dataclasses.replace(tls_address, tls=False, tls_ca="")
    with pytest.raises(SessionUnreachableError, match=f"uses TLS, set {CA_ENV}"):
        SessionClient(as_plain).describe(SESSION_TABLE)
    wrong_ca = dataclasses.replace(tls_address, tls_ca=pki.other_client.ca_pem.decode())
    with pytest.raises(TlsHandshakeError, match="not signed by the CA"):
        SessionClient(wrong_ca).describe(SESSION_TABLE)
    # A client configured with TLS never talks in clear, whatever the address says.
    monkeypatch.setenv(CA_ENV, pki.ca)
    with pytest.raises(TlsHandshakeError, match="does not speak TLS"):
        SessionClient(plain_address).describe(SESSION_TABLE)


# -- configuration errors name the setting --------------------------------------------------


def _bad_configs(pki: Pki, tmp: Path) -> list[tuple[tuple[str | None, ...], str]]:
    garbage = tmp / "garbage.pem"
    garbage.write_text("not a certificate\n")
    bogus = tmp / "bogus.pem"
    bogus.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    missing = str(tmp / "missing.pem")
    return [
        ((pki.cert, None, pki.ca), f"{CERT_ENV} is set but {KEY_ENV} is not"),
        ((None, pki.key, pki.ca), f"{KEY_ENV} is set but {CERT_ENV} is not"),
        ((pki.cert, pki.key, None), f"{CA_ENV} is not"),
        ((pki.cert, pki.key, missing), f"{CA_ENV}={missing}: cannot read it"),
        ((missing, pki.key, pki.ca), f"{CERT_ENV}={missing}: cannot read it"),
        ((pki.cert, missing, pki.ca), f"{KEY_ENV}={missing}: cannot read it"),
        ((None, None, str(garbage)), f"{CA_ENV}={garbage} holds no PEM certificate"),
        ((None, None, str(bogus)), f"{CA_ENV}={bogus} is not a valid PEM"),
        ((str(garbage), pki.key, pki.ca), f"{CERT_ENV}={garbage} holds no PEM certificate"),
        ((pki.cert, pki.cert, pki.ca), f"{KEY_ENV}={pki.cert} holds no PEM private key"),
        ((pki.cert, pki.encrypted_key, pki.ca),
         f"{KEY_ENV}={pki.encrypted_key} is an encrypted private key"),
        ((pki.cert, pki.elsewhere_key, pki.ca),
         f"{CERT_ENV}={pki.cert} and {KEY_ENV}={pki.elsewhere_key} do not make a usable"),
    ]


def test_bad_settings_are_refused_naming_the_setting(pki: Pki, tmp_path: Path) -> None:
    for (cert, key, ca), message in _bad_configs(pki, tmp_path):
        env = {n: v for n, v in zip(TLS_ENVS, (cert, key, ca), strict=True) if v is not None}
        with pytest.raises(InvalidArgumentError) as e:
            tls_from_env(env)
        assert message in str(e.value), (env, str(e.value))


def test_settings_from_the_environment(pki: Pki) -> None:
    assert tls_from_env({}) is None
    assert tls_from_env(dict.fromkeys(TLS_ENVS, "")) is None  # empty means unset
    client = tls_from_env({CA_ENV: pki.ca})
    assert client is not None and not client.can_serve and client.ca_pem.startswith(b"-----")
    full = tls_from_env(pki.env())
    assert full is not None and full.can_serve and full == pki.server
    assert "PRIVATE" not in repr(full) and full.key == pki.key
    assert tls_from_env(pki.env()) is full  # loaded once while the files do not change


def test_servers_refuse_a_ca_without_certificate_and_key(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    service_factory: Callable[[TlsConfig | None], SessionService],
) -> None:
    message = f"{CA_ENV} is set, so clients expect TLS, but {CERT_ENV} and {KEY_ENV} are not"
    with pytest.raises(InvalidArgumentError, match=message):
        server_kwargs(pki.client, "a server")
    with pytest.raises(InvalidArgumentError, match=message):
        _make_server("127.0.0.1", SECRET, pki.client)
    with pytest.raises(InvalidArgumentError, match=message):
        service_factory(pki.client)
    with pytest.raises(InvalidArgumentError, match=message):
        MasterServerConfig("m1", {"m1": "127.0.0.1:7051"}, str(tmp_path / "m1"),
                           tls=pki.client)
    monkeypatch.setenv(CA_ENV, pki.ca)  # the default: the environment's settings
    with pytest.raises(InvalidArgumentError, match=message):
        MasterServerConfig("m1", {"m1": "127.0.0.1:7051"}, str(tmp_path / "m1"))
    monkeypatch.setenv(CERT_ENV, pki.cert)
    with pytest.raises(InvalidArgumentError, match=f"{CERT_ENV} is set but {KEY_ENV}"):
        SessionService(Backend(str(tmp_path / "wh")), secret=SECRET.decode())
    monkeypatch.setenv(KEY_ENV, pki.key)
    assert MasterServerConfig("m1", {"m1": "127.0.0.1:7051"}, str(tmp_path / "m1")).tls \
        == pki.server
    assert not (tmp_path / "m1").exists()


@pytest.mark.parametrize(("flags", "named"), [
    (["--tls-cert", "{missing}", "--tls-key", "{key}", "--tls-ca", "{ca}"],
     "--tls-cert (PYSPARK_KUDU_TLS_CERT)={missing}: cannot read it"),
    (["--tls-cert", "{cert}", "--tls-ca", "{ca}"],
     "--tls-cert (PYSPARK_KUDU_TLS_CERT) is set but --tls-key (PYSPARK_KUDU_TLS_KEY) is not"),
], ids=["missing-file", "cert-without-key"])
def test_master_run_with_bad_tls_flags_exits_naming_the_flag(
    pki: Pki, tmp_path: Path, flags: list[str], named: str,
) -> None:
    values = {"missing": str(tmp_path / "missing.pem"), "key": pki.key, "ca": pki.ca,
              "cert": pki.cert}
    argv = [f.format(**values) for f in flags]
    env = {k: v for k, v in os.environ.items() if k not in TLS_ENVS}
    proc = subprocess.run(
        [sys.executable, "-m", "pyspark_kudu.tools.cli", "master", "run", "--id", "m1",
         "--peers", "m1=127.0.0.1:7051", "--data-dir", str(tmp_path / "m1"), *argv],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=env,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stderr
    assert named.format(**values) in proc.stderr
    assert not (tmp_path / "m1").exists()
