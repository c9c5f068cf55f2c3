"""Three masters in one process talking Raft and client RPC over real Arrow Flight sockets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pyspark_kudu.errors import InvalidArgumentError, NotLeaderError, TimedOutError
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.master.localcluster import free_ports
from pyspark_kudu.master.server import MasterServer, MasterServerConfig

from .conftest import FAST, SCHEMA, wait_until

TOKEN = "t0ps3cret"


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[dict[str, MasterServer]]:
    peers = {f"m{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(free_ports(3))}
    out = {m: MasterServer(MasterServerConfig(m, peers, str(tmp_path / m), token=TOKEN,
                                              replica=FAST)).start()
           for m in peers}
    try:
        yield out
    finally:
        for s in out.values():
            s.stop()


def _addresses(servers: dict[str, MasterServer]) -> str:
    return ",".join(s.config.address for s in servers.values())


def test_masters_elect_a_leader_and_serve_ddl_over_flight(
    servers: dict[str, MasterServer],
) -> None:
    with MasterClient(_addresses(servers), token=TOKEN, timeout_s=20) as c:
        lead = c.leader_address()
        for i in range(3):
            for s in servers.values():
                c.heartbeat_to(s.config.address, TServerMeta(f"ts{i}", "h", 7050, "/d"))
        c.create_table("t", SCHEMA)
        assert c.list_tables() == ["t"]
        for s in servers.values():
            wait_until(lambda s=s: "t" in s.replica.catalog.names, 5,
                       f"{s.config.id} applying CreateTable")
        follower = next(s for s in servers.values() if s.config.address != lead)
        with MasterClient(follower.config.address, token=TOKEN,
                          check_master_count=False) as one:
            with pytest.raises(NotLeaderError) as info:
                one._channel(follower.config.address).call(
                    "delete_table", {"name": "t"}, 5.0)
            assert info.value.leader_hint == lead


def test_a_wrong_token_is_refused_without_retrying(servers: dict[str, MasterServer]) -> None:
    with MasterClient(_addresses(servers), token="wrong", timeout_s=20) as c:
        with pytest.raises(InvalidArgumentError, match="shared-secret token"):
            c.list_tables()


def test_a_client_given_one_master_of_three_names_the_expected_count(
    servers: dict[str, MasterServer],
) -> None:
    one = next(iter(servers.values())).config.address
    with MasterClient(one, token=TOKEN, timeout_s=20) as c:
        with pytest.raises(InvalidArgumentError,
                           match=r"configured with 1 master\(s\).*expects 3 master\(s\)"):
            c.list_tables()


def test_unreachable_masters_end_in_a_timeout_not_a_hang() -> None:
    ports = free_ports(3)
    addrs = ",".join(f"127.0.0.1:{p}" for p in ports)
    import time

    t0 = time.monotonic()
    with MasterClient(addrs, timeout_s=1.5) as c:
        with pytest.raises(TimedOutError, match=r"timed out after 1\.5 s.*unreachable"):
            c.list_tables()
    assert time.monotonic() - t0 < 25  # did not hang
