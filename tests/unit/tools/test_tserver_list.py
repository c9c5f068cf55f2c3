"""``tserver list --columns=...`` (DESIGN §6: verbs and texts follow the kudu tool)."""

from __future__ import annotations

import json

import pytest

from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.master.topology import ClusterSnapshot, TabletServer
from pyspark_kudu.tools.tabular import render_table
from pyspark_kudu.tools.tserver import list_tservers

SNAP = ClusterSnapshot(
    (
        TabletServer("b-uuid", "host-b", 7051, "/dc1/rack2", {"zone": "z1"}),
        TabletServer("a-uuid", "host-a", 7050),
        TabletServer("c-uuid", "host-c", 7050, "/dc2/rack1", live=False, num_live_replicas=4),
    )
)


def test_table_layout_matches_the_kudu_tool() -> None:
    assert render_table(["uuid", "location"], [["abc", "/L0"], ["d", "<none>"]]).splitlines() == [
        " uuid | location",
        "------+----------",
        " abc  | /L0",
        " d    | <none>",
    ]


def test_default_columns_are_uuid_and_rpc_addresses() -> None:
    assert list_tservers(SNAP).splitlines() == [
        "  uuid  | rpc-addresses",
        "--------+---------------",
        " a-uuid | host-a:7050",
        " b-uuid | host-b:7051",
        " c-uuid | host-c:7050",
    ]


def test_location_column_shows_none_for_servers_without_location() -> None:
    rows = json.loads(list_tservers(SNAP, "uuid,location", "json"))
    assert rows == [
        {"uuid": "a-uuid", "location": "<none>"},
        {"uuid": "b-uuid", "location": "/dc1/rack2"},
        {"uuid": "c-uuid", "location": "/dc2/rack1"},
    ]


def test_column_names_are_case_insensitive_and_extra_columns_exist() -> None:
    rows = json.loads(list_tservers(SNAP, "UUID, Tags,live,replicas", "json_pretty"))
    assert rows[1] == {"uuid": "b-uuid", "tags": "zone=z1", "live": "true", "replicas": "0"}
    assert rows[2]["live"] == "false" and rows[2]["replicas"] == "4"


def test_unknown_column_is_rejected_with_kudus_text() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^unknown column \(--columns\): bogus$"):
        list_tservers(SNAP, "uuid,bogus")


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown format"):
        list_tservers(SNAP, fmt="yaml")
