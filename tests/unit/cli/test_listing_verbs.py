"""``tserver list``, ``table list``, ``table describe`` and ``locations show``."""

from __future__ import annotations

import json
from collections.abc import Callable

from pyspark_kudu.tools.cli_locations import location_report
from tests.unit.master.builders import cluster, servers_in

from .conftest import RACKS, Masters, Run


def test_tserver_list_prints_the_requested_columns(
    healthy: Masters, run: Callable[..., Run],
) -> None:
    r = run("tserver", "list", *healthy.args(), "--columns=UUID,location")
    assert r.code == 0
    assert r.out.splitlines() == [
        " uuid |  location",
        "------+------------",
        *(f" ts{n}  | {RACKS[n]}" for n in range(2, 8)),
    ]


def test_tserver_list_json_has_one_object_per_server(
    healthy: Masters, run: Callable[..., Run],
) -> None:
    r = run("tserver", "list", *healthy.args(), "--columns", "uuid,rpc-addresses,live,replicas",
            "--format", "json")
    rows = json.loads(r.out)
    assert [row["uuid"] for row in rows] == [f"ts{n}" for n in range(2, 8)]
    assert {row["live"] for row in rows} == {"true"}
    assert rows[0]["rpc-addresses"] == "127.0.0.2:7050"
    assert sum(int(row["replicas"]) for row in rows) == 5 * 3  # 5 tablets, RF 3


def test_an_unknown_column_is_a_usage_error(healthy: Masters, run: Callable[..., Run]) -> None:
    r = run("tserver", "list", *healthy.args(), "--columns=uuid,rack")
    assert r.code == 2 and r.out == ""
    assert r.err == "pyspark-kudu: InvalidArgumentError: unknown column (--columns): rack\n"


def test_table_list_shows_each_table_with_its_rf_and_tablets(
    healthy: Masters, run: Callable[..., Run],
) -> None:
    r = run("table", "list", *healthy.args())
    lines = r.out.splitlines()
    assert r.code == 0 and lines[0].split("|")[0].strip() == "Name"
    assert [line.split("|")[0].strip() for line in lines[2:]] == ["events", "metrics"]
    rows = json.loads(run("table", "list", *healthy.args(), "--format", "json").out)
    assert [(t["name"], t["replication_factor"], t["tablets"], t["state"]) for t in rows] == [
        ("events", 3, 4, "RUNNING"), ("metrics", 3, 1, "RUNNING")]


def test_table_describe_shows_schema_partitioning_and_replicas_by_location(
    healthy: Masters, run: Callable[..., Run],
) -> None:
    r = run("table", "describe", "events", *healthy.args())
    assert r.code == 0
    assert r.out.splitlines()[:14] == [
        "TABLE events (",
        "    id INT64 NOT NULL,",
        "    name STRING NULLABLE DEFAULT 'n/a',",
        "    score DOUBLE NULLABLE,",
        "    PRIMARY KEY (id)",
        ")",
        "HASH (id) PARTITIONS 2,",
        "RANGE (id) (",
        "    PARTITION VALUES < 1000,",
        "    PARTITION 1000 <= VALUES",
        ")",
        "REPLICAS 3",
        r.out.splitlines()[12],
        "",
    ]
    assert "HASH (id) PARTITION 1, RANGE (id) PARTITION 1000 <= VALUES" in r.out
    data = json.loads(run("table", "describe", "events", *healthy.args(), "--format",
                          "json").out)
    assert data["primary_key"] == ["id"] and len(data["tablets"]) == 4
    for tablet in data["tablets"]:  # one replica per rack
        assert sorted(rep["location"] for rep in tablet["replicas"]) == [
            "/dc1/rack1", "/dc1/rack2", "/dc1/rack3"]


def test_describing_a_missing_table_exits_1_and_names_it(
    healthy: Masters, run: Callable[..., Run],
) -> None:
    r = run("table", "describe", "nosuch", *healthy.args())
    assert r.code == 1 and r.out == ""
    assert "NotFoundError: the table does not exist: table_name: 'nosuch'" in r.err


def test_locations_show_summarises_every_level_and_what_a_rack_loss_does(
    healthy: Masters, run: Callable[..., Run],
) -> None:
    r = run("locations", "show", *healthy.args())
    assert r.code == 0
    lines = r.out.splitlines()
    at = lines.index("Location Summary")
    assert [line.split("|")[:3] for line in lines[at + 3:at + 7]] == [
        [" /dc1       ", " 1     ", " 6              "],
        [" /dc1/rack1 ", " 2     ", " 2              "],
        [" /dc1/rack2 ", " 2     ", " 2              "],
        [" /dc1/rack3 ", " 2     ", " 2              "],
    ]
    data = json.loads(run("locations", "show", *healthy.args(), "--format", "json").out)
    assert {(t["level"], t["locations"], t["max_replicas_per_location"],
             t["survives_location_loss"]) for t in data["tolerance"]} == {
        (1, 1, 3, False), (2, 3, 1, True)}
    assert sum(loc["replicas"] for loc in data["locations"] if loc["level"] == 2) == 15


def test_location_report_warns_when_only_some_servers_have_a_location() -> None:
    report = location_report(cluster({"/a": 2, "/b": 2, "": 1}))
    assert report["warnings"] == [
        "1 of 5 tablet servers have no location (none-0); placement treats them as one more "
        "location. Make location_mapping_cmd map every host and have those servers "
        "re-register"]
    assert location_report(cluster(servers_in({"": 3})))["warnings"] == []


def test_an_unknown_column_fails_before_contacting_any_master(run: Callable[..., Run]) -> None:
    r = run("tserver", "list", "--master", "127.0.0.1:1", "--columns=uuid,rack")
    assert r.code == 2 and "unknown column (--columns): rack" in r.err
    assert "cannot reach" not in r.err
