"""Security properties (issue 8): no shell, private files, an authenticated master on loopback.

* The location mapping command is an argv list (``shlex.split``), never a shell command
  line: shell syntax in the command or in a registering host's name is inert text.
* Everything the storage layers create on local disk is private to the user (``0700``
  directories, ``0600`` files), whatever the umask; a data root that another user owns or
  that everyone may write to is refused.
* The standalone master serves on loopback unless told otherwise, refuses a non-loopback
  address without a token, and refuses calls (client RPC and Raft) without the right token.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.master.catalog_replica import ReplicaOptions
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.embedded import EmbeddedMaster
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.master.flight import RAFT_ACTION, flight_location
from pyspark_kudu.master.localcluster import MasterProcessCluster, free_ports
from pyspark_kudu.master.locations import run_location_mapping_cmd
from pyspark_kudu.master.server import MasterServer, MasterServerConfig, is_loopback_address
from pyspark_kudu.rpc.auth import connect
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.spark.host.identity import ensure_instance
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.tablet import OpType, Tablet, encode_write_batch
from pyspark_kudu.tools.connect import read_token
from pyspark_kudu.wal import WalOptions
from tests.netcapture import CapturingProxy

FAST = ReplicaOptions(tick_interval_s=0.02, election_ticks=15, heartbeat_ticks=2)
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))
TOKEN = "s3cr3t-token"
REPO = Path(__file__).resolve().parents[2]


# -- the location mapping command never runs through a shell -----------------------------------


def args_recorder(tmp_path: Path) -> tuple[str, Path]:
    """A mapping command that writes its argv, one per line, and prints a valid location."""
    d = tmp_path / "dir with space"
    d.mkdir()
    record = tmp_path / "argv.txt"
    path = d / "map.sh"
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > '{record}'\necho /dc1/rack1\n")
    path.chmod(0o700)
    return str(path), record


def test_shell_syntax_in_the_command_is_passed_as_literal_arguments(tmp_path: Path) -> None:
    exe, record = args_recorder(tmp_path)
    m = [tmp_path / f"pwned{i}" for i in range(4)]
    cmd = (f"'{exe}' arg1 ;touch {m[0]} && $(touch {m[1]}) `touch {m[2]}` | tee {m[3]} "
           f"$HOME")
    assert run_location_mapping_cmd(cmd, "host-1") == "/dc1/rack1"
    assert not any(p.exists() for p in m), "a shell ran the command"
    assert record.read_text().splitlines() == [
        "arg1", ";touch", str(m[0]), "&&", "$(touch", f"{m[1]})", "`touch", f"{m[2]}`",
        "|", "tee", str(m[3]), "$HOME", "host-1"]


def test_a_hostile_host_name_reaches_the_command_as_one_argument(tmp_path: Path) -> None:
    exe, record = args_recorder(tmp_path)
    marker = tmp_path / "pwned"
    host = f"h; touch {marker}; $(touch {marker})"
    with EmbeddedMaster(str(tmp_path / "wh"), 1, options=FAST,
                        location_mapping_cmd=f"'{exe}'") as g, g.client() as c:
        g.leader()
        c.heartbeat_to(g.addresses["m1"], TServerMeta("ts0", host, 7050, "/d"))
        assert [t["location"] for t in c.list_tservers()] == ["/dc1/rack1"]
    assert not marker.exists()
    assert record.read_text().splitlines() == [host]


# -- files and directories are private ---------------------------------------------------------


@contextmanager
def umask(mask: int) -> Iterator[None]:
    """Run with a permissive umask, so only explicit modes keep files private."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """Permission bits of everything under ``root`` (root included), by relative path."""
    out = {".": stat.S_IMODE(root.lstat().st_mode)}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(dirpath, n)
            out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


def not_private(root: Path) -> dict[str, str]:
    """Entries that a user other than the owner could read, write or enter."""
    return {p: f"{m:04o}" for p, m in modes(root).items() if m & 0o077}


def writable_by_others(root: Path) -> list[str]:
    """Entries another user could modify: world-writable with every directory on the way
    from ``root`` enterable by others."""
    ms = modes(root)

    def reachable(rel: str) -> bool:
        parts = Path(rel).parts
        return all(ms[str(Path(*parts[:i])) if i else "."] & 0o001 for i in range(len(parts)))

    return [p for p, m in ms.items() if m & 0o002 and reachable(p)]


def test_file_io_creates_private_directories_and_files_under_any_umask(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with umask(0):
        io = FileIO(str(root))
        io.makedirs("a", "b", "c")
        with io.open("a/b/c/f", mode="wb") as f:
            f.write(b"x")
        with io.open("a/g", mode="ab") as f:
            f.write(b"y")
        io.atomic_write(b"z", "d/e/meta")
    assert not_private(root) == {}
    assert len(modes(root)) == 9  # root, a, b, c, f, g, d, e, meta


def test_existing_files_and_directories_keep_their_modes(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o750)
    shared.chmod(0o750)
    (shared / "f").write_bytes(b"x")
    (shared / "f").chmod(0o640)
    io = FileIO(str(shared))
    io.makedirs()
    with io.open("f", mode="wb") as f:
        f.write(b"y")
    assert modes(shared) == {".": 0o750, "f": 0o640}


def test_a_tablet_with_rowsets_superblock_and_instance_is_private(tmp_path: Path) -> None:
    root = tmp_path / "ts"
    with umask(0):
        tablet = Tablet.create(str(root), "t1", SCHEMA)
        tablet.apply(1, encode_write_batch(SCHEMA, OpType.INSERT, pa.table(
            {"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})))
        tablet.flush()
        assert ensure_instance(str(root)).data_root == str(root)
    assert {"instance", "tablets/t1/superblock"} <= set(modes(root))
    assert any(p.endswith(".parquet") for p in modes(root)), modes(root)
    assert not_private(root) == {}


def test_the_master_catalog_and_data_dirs_are_private(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    data = tmp_path / "standalone"
    (port,) = free_ports(1)
    with umask(0):
        with EmbeddedMaster(str(wh), 1, options=FAST) as g, g.client() as c:
            g.leader()
            for i in range(3):
                c.heartbeat_to(g.addresses["m1"], TServerMeta(f"ts{i}", "h", 7050, "/d"))
            c.create_table("t", SCHEMA, replication_factor=3)
        server = MasterServer(MasterServerConfig("m1", {"m1": f"127.0.0.1:{port}"},
                                                 str(data), replica=FAST)).start()
        server.stop()
    assert any("wal" in p for p in modes(wh)) and "instance" in modes(data)
    assert not_private(wh) == {}
    assert not_private(data) == {}


def test_replica_files_written_by_replication_rounds_cannot_be_changed_by_others(
    tmp_path: Path,
) -> None:
    ts = ("a", "b", "c")
    with umask(0):
        t = DirectTransport({x: str(tmp_path / x) for x in ts}, WalOptions(preallocate=False))
        TabletLeader(TabletReplicas("t1", ts), "a", t).create()
        lead = TabletLeader(TabletReplicas("t1", ts), "a", t)
        lead.elect()
        lead.propose([b"x"])
    for x in ts:
        root = tmp_path / x
        assert "tablets/t1/wal" in modes(root)
        # Every directory is private, so nothing below can be reached by another user.
        dirs = {p: m for p, m in modes(root).items() if (root / p).is_dir()}
        assert all(m & 0o077 == 0 for m in dirs.values()), dirs
        assert writable_by_others(root) == []


def test_every_replica_file_is_private_even_under_a_permissive_umask(tmp_path: Path) -> None:
    ts = ("a", "b", "c")
    with umask(0):
        t = DirectTransport({x: str(tmp_path / x) for x in ts}, WalOptions(preallocate=False))
        TabletLeader(TabletReplicas("t1", ts), "a", t).create()
        lead = TabletLeader(TabletReplicas("t1", ts), "a", t)
        lead.elect()
        lead.propose([b"x"])
    assert not_private(tmp_path / "a") == {}


def test_a_world_writable_data_root_is_refused_and_left_untouched(tmp_path: Path) -> None:
    root = tmp_path / "open"
    root.mkdir()
    root.chmod(0o777)
    with pytest.raises(InvalidArgumentError, match=r"has mode 0777: every user may write"):
        ensure_instance(str(root))
    assert list(root.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory away")
def test_a_data_root_owned_by_another_user_is_refused_and_left_untouched(
    tmp_path: Path,
) -> None:
    root = tmp_path / "theirs"
    root.mkdir()
    os.chown(root, 65534, 65534)
    with pytest.raises(InvalidArgumentError, match=r"belongs to uid 65534"):
        ensure_instance(str(root))
    assert list(root.iterdir()) == []


# -- the standalone master: loopback and token -------------------------------------------------


@pytest.fixture(scope="module")
def master_process(tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[MasterProcessCluster]:
    """One real ``pyspark-kudu master run`` process with a token file."""
    group = MasterProcessCluster(str(tmp_path_factory.mktemp("secure")), 1, token=TOKEN)
    try:
        group.start()
        group.wait_for_leader(60)
        yield group
    finally:
        group.stop()


@pytest.mark.parametrize("token", [None, "", "wrong", TOKEN + "x", TOKEN[:-1]])
def test_the_master_refuses_calls_without_the_right_token(
    master_process: MasterProcessCluster, token: str | None,
) -> None:
    with MasterClient(master_process.master_addresses, token=token, timeout_s=10) as c:
        with pytest.raises(InvalidArgumentError, match="wrong or missing shared-secret token"):
            c.list_tables()
        with pytest.raises(InvalidArgumentError, match="shared-secret token"):
            c.create_table("intruder", SCHEMA, replication_factor=1)
    with master_process.client() as ok:
        assert "intruder" not in ok.list_tables()


def test_the_master_answers_calls_with_the_right_token(
    master_process: MasterProcessCluster,
) -> None:
    with MasterClient(master_process.master_addresses, token=TOKEN, timeout_s=10) as c:
        assert c.list_tables() == []
        assert c.call("status")["role"] == "leader"


def test_raft_messages_without_the_token_are_refused(
    master_process: MasterProcessCluster,
) -> None:
    (addr,) = master_process.peers.values()
    client = fl.FlightClient(flight_location(addr))  # never authenticated
    try:
        with pytest.raises(fl.FlightUnauthenticatedError):
            list(client.do_action(fl.Action(RAFT_ACTION, b"[]"),
                                  fl.FlightCallOptions(timeout=5)))
    finally:
        client.close()
    with pytest.raises(InvalidArgumentError, match="secret"):
        connect(flight_location(addr), b"wrong", timeout_s=5)
    good = connect(flight_location(addr), TOKEN.encode(), timeout_s=5)
    try:
        assert list(good.do_action(fl.Action(RAFT_ACTION, b"[]"),
                                   fl.FlightCallOptions(timeout=5))) == []
    finally:
        good.close()


def test_the_masters_token_never_crosses_the_wire(
    master_process: MasterProcessCluster,
) -> None:
    (addr,) = master_process.peers.values()
    proxy = CapturingProxy(int(addr.rpartition(":")[2]))
    try:
        with MasterClient(f"127.0.0.1:{proxy.port}", token=TOKEN, timeout_s=10,
                          check_master_count=False) as c:
            assert c.call("status", any_master=True)["role"] == "leader"
    finally:
        proxy.close()
    wire = proxy.captured()
    assert b"status" in wire, "the capture must have seen the call"
    assert TOKEN.encode() not in wire and base64.b64encode(TOKEN.encode()) not in wire


def _non_loopback_ip() -> str | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.254", 9))  # no packet is sent: this only picks the route
        ip = str(s.getsockname()[0])
    except OSError:
        return None
    finally:
        s.close()
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


def test_the_master_listens_on_loopback_only_by_default(
    master_process: MasterProcessCluster,
) -> None:
    (addr,) = master_process.peers.values()
    host, port = addr.rsplit(":", 1)
    assert host == "127.0.0.1"
    with socket.create_connection((host, int(port)), timeout=5):
        pass
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((ip, int(port)), timeout=5).close()


@pytest.mark.parametrize(("address", "loopback"), [
    ("127.0.0.1:7051", True), ("127.0.0.5:7051", True), ("localhost:7051", True),
    ("[::1]:7051", True), ("0.0.0.0:7051", False), ("192.0.2.2:7051", False),
    ("[::]:7051", False), ("no-such-host.invalid:7051", False),
])
def test_loopback_addresses_are_recognised(address: str, loopback: bool) -> None:
    assert is_loopback_address(address) is loopback


def test_a_non_loopback_master_without_a_token_is_refused(tmp_path: Path) -> None:
    peers = {"m1": "0.0.0.0:7051"}
    with pytest.raises(InvalidArgumentError, match="not a loopback address, without a "
                                                   "shared-secret token"):
        MasterServerConfig("m1", peers, str(tmp_path / "m1"))
    MasterServerConfig("m1", peers, str(tmp_path / "m1"), token=TOKEN)
    MasterServerConfig("m1", peers, str(tmp_path / "m1"), allow_unauthenticated=True)
    assert not (tmp_path / "m1").exists()


def test_master_run_on_a_public_address_without_a_token_exits_with_the_reason(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_KUDU_MASTER_TOKEN"}
    proc = subprocess.run(
        [sys.executable, "-m", "pyspark_kudu.tools.cli", "master", "run", "--id", "m1",
         "--peers", "m1=0.0.0.0:7051", "--data-dir", str(tmp_path / "m1")],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "without a shared-secret token" in proc.stderr
    assert not (tmp_path / "m1").exists()


def test_a_token_file_readable_by_others_is_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    with caplog.at_level(logging.WARNING):
        assert read_token(str(path)) == TOKEN
    assert caplog.records == []
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        assert read_token(str(path)) == TOKEN
    assert "mode 0644" in caplog.text and f"chmod 600 {path}" in caplog.text
