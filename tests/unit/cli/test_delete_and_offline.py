"""``table delete``, and reading a stopped catalog with ``--master-dir`` (never changing it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pyspark_kudu.master.embedded import EmbeddedMaster
from pyspark_kudu.master.entities import TServerMeta

from .conftest import FAST, SCHEMA, Masters, Run


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_table_delete_drops_the_table_and_a_second_delete_exits_1(
    masters_factory: Callable[..., Masters], run: Callable[..., Run],
) -> None:
    group = masters_factory()
    group.register(range(2, 5))
    with group.client() as c:
        c.create_table("gone", SCHEMA)
        c.create_table("kept", SCHEMA)
    r = run("table", "delete", "gone", *group.args())
    assert (r.code, r.out) == (0, "Deleted table gone\n")
    with group.client() as c:
        assert c.list_tables() == ["kept"]
    again = run("table", "delete", "gone", *group.args(), "--format", "json")
    assert again.code == 1 and "NotFoundError" in again.err and "'gone'" in again.err


def test_a_stopped_masters_data_dir_is_read_without_changing_a_byte(
    masters_factory: Callable[..., Masters], run: Callable[..., Run],
) -> None:
    group = masters_factory()
    group.register(range(2, 8))
    with group.client() as c:
        c.create_table("t1", SCHEMA)
        c.create_table("t2", SCHEMA, replication_factor=1)
        c.delete_table("t2")
        c.create_table("t3", SCHEMA)
    group.stop()
    data_dir = group.root / "m1"
    before = _files(data_dir)
    tables = json.loads(run("table", "list", "--master-dir", str(data_dir), "--format",
                            "json").out)
    assert [t["name"] for t in tables] == ["t1", "t3"]
    servers = run("tserver", "list", "--master-dir", str(data_dir), "--columns=uuid,live")
    assert servers.out.splitlines()[2] == " ts2  | unknown"
    ksck = run("cluster", "ksck", "--master-dir", str(data_dir), "--format", "json")
    data = json.loads(ksck.out)
    assert ksck.code == 0 and data["ok"] is True and data["liveness_known"] is False
    assert {s["Status"] for s in data["tservers"]} == {"UNKNOWN"}
    assert data["masters"][0]["Status"] == "OFFLINE"
    assert data["masters"][0]["Detail"].startswith("commit index ")
    text = run("cluster", "ksck", "--master-dir", str(data_dir)).out.splitlines()
    assert text[6].startswith("  m1: commit index ") and "last log index" in text[6]
    refused = run("table", "delete", "t1", "--master-dir", str(data_dir))
    assert refused.code == 2 and "--master-dir reads a catalog offline" in refused.err
    assert _files(data_dir) == before


@pytest.mark.parametrize("replicas", [1, 3])
def test_an_embedded_masters_warehouse_is_read_from_its_most_advanced_replica(
    tmp_path: Path, replicas: int, run: Callable[..., Run],
) -> None:
    warehouse = tmp_path / "wh"
    with EmbeddedMaster(str(warehouse), replicas, options=FAST) as g, g.client() as c:
        g.leader()
        for n in range(3):
            for addr in g.addresses.values():
                c.heartbeat_to(addr, TServerMeta(f"ts{n}", f"h{n}", 7050, f"/d{n}"))
        c.create_table("events", SCHEMA)
        c.create_table("metrics", SCHEMA)
    r = run("table", "list", "--master-dir", str(warehouse))
    assert r.code == 0
    assert [line.split("|")[0].strip() for line in r.out.splitlines()[2:]] == [
        "events", "metrics"]
    described = json.loads(run("table", "describe", "events", "--master-dir", str(warehouse),
                               "--format", "json").out)
    assert {rep["uuid"] for rep in described["tablets"][0]["replicas"]} == {"ts0", "ts1", "ts2"}


def test_a_directory_without_a_catalog_is_a_usage_error_and_stays_empty(
    tmp_path: Path, run: Callable[..., Run],
) -> None:
    r = run("cluster", "ksck", "--master-dir", str(tmp_path))
    assert r.code == 2 and f"no master catalog under {tmp_path}" in r.err
    assert list(tmp_path.iterdir()) == []
