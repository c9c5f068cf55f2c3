"""Fixtures for the CLI tests: real masters in process (Arrow Flight on 127.0.0.1), tablet
servers registered by heartbeat (locations from conf/location_mapping.sh + conf/topology.txt),
and a runner that calls ``main([...])`` and captures what it prints."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pyspark_kudu.master.catalog_replica import ReplicaOptions
from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.master.localcluster import free_ports
from pyspark_kudu.master.server import MasterServer, MasterServerConfig
from pyspark_kudu.partitioning import HashDimension, PartitionSchema, RangePartition
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.tools.cli import main

ROOT = Path(__file__).resolve().parents[3]
FAST = ReplicaOptions(tick_interval_s=0.02, election_ticks=15, heartbeat_ticks=2)
TOKEN = "cli-test-secret"
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False),
                 ColumnSchema("name", "string", default="n/a"),
                 ColumnSchema("score", "double")), ("id",))
EVENTS_PARTITIONING = PartitionSchema(
    (HashDimension(("id",), 2),), ("id",),
    (RangePartition(None, (1000,)), RangePartition((1000,), None)))
RACKS = {2: "/dc1/rack1", 3: "/dc1/rack1", 4: "/dc1/rack2", 5: "/dc1/rack2",
         6: "/dc1/rack3", 7: "/dc1/rack3"}  # conf/topology.txt for 127.0.0.2-7


def mapping_cmd(tmp: Path) -> str:
    script = ROOT / "conf" / "location_mapping.sh"
    topology = ROOT / "conf" / "topology.txt"
    if os.access(script, os.X_OK):
        return f"{script} {topology}"
    wrapper = tmp / "map.sh"  # pragma: no cover - a checkout without the exec bit
    wrapper.write_text(f"#!/bin/sh\nexec sh {script} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return f"{wrapper} {topology}"


@dataclass
class Masters:
    """Standalone masters in this process, reachable over Flight with ``TOKEN``."""

    root: Path
    servers: dict[str, MasterServer] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return ",".join(s.config.address for s in self.servers.values())

    def args(self) -> list[str]:
        token = self.root / "token"
        token.write_text(TOKEN)
        return ["--master", self.address, "--token-file", str(token)]

    def client(self) -> MasterClient:
        return MasterClient(self.address, token=TOKEN, timeout_s=20)

    def register(self, hosts: Sequence[int]) -> None:
        """Heartbeat tablet servers ``ts<N>`` at 127.0.0.<N> to every master."""
        with self.client() as c:
            c.leader_address()
            for n in hosts:
                meta = TServerMeta(f"ts{n}", f"127.0.0.{n}", 7050, f"/data/ts{n}")
                for s in self.servers.values():
                    c.heartbeat_to(s.config.address, meta)

    def stop(self) -> None:
        for s in self.servers.values():
            s.stop()


def start_masters(root: Path, n: int = 1) -> Masters:
    peers = {f"m{i + 1}": f"127.0.0.1:{p}" for i, p in enumerate(free_ports(n))}
    cmd = mapping_cmd(root)
    m = Masters(root)
    for node in peers:
        m.servers[node] = MasterServer(MasterServerConfig(
            node, peers, str(root / node), token=TOKEN, replica=FAST,
            location_mapping_cmd=cmd)).start()
    return m


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Masters]:
    """6 tablet servers in 3 racks, then tables: every tablet has one replica per rack."""
    m = start_masters(tmp_path_factory.mktemp("healthy"))
    try:
        m.register(range(2, 8))
        with m.client() as c:
            c.create_table("events", SCHEMA, EVENTS_PARTITIONING)
            c.create_table("metrics", SCHEMA)
        yield m
    finally:
        m.stop()


@pytest.fixture(scope="module")
def rack_added(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Masters]:
    """A table placed over 2 racks, then a third rack joins: every tablet now has 2 replicas
    in one of 3 racks, a placement policy violation the rebalancer can fix."""
    m = start_masters(tmp_path_factory.mktemp("rack_added"))
    try:
        m.register(range(2, 6))
        with m.client() as c:
            c.create_table("orders", SCHEMA, PartitionSchema((HashDimension(("id",), 3),)))
        m.register((6, 7))
        yield m
    finally:
        m.stop()


@pytest.fixture
def masters_factory(tmp_path: Path) -> Iterator[Callable[..., Masters]]:
    started: list[Masters] = []

    def make(n: int = 1) -> Masters:
        m = start_masters(tmp_path / f"group{len(started)}", n)
        started.append(m)
        return m

    yield make
    for m in started:
        m.stop()


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    """``run("cluster", "ksck", *args)``: ``main`` in process, its exit code and output."""

    def call(*argv: str) -> Run:
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return call
