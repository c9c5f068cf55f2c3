"""The Raft wire codec and the CLI's option handling."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyspark_kudu.consensus.messages import (
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    Snapshot,
    SnapshotMetadata,
)
from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.master.raft_transport import Envelope, decode_envelopes, encode_envelopes
from pyspark_kudu.master.server import parse_peers
from pyspark_kudu.tools import cli


def test_every_message_field_survives_the_wire() -> None:
    envs = [
        Envelope(Message(MessageType.APP, "m2", "m1", 3, 2, 10,
                         (Entry(3, 11, EntryType.NORMAL, b'{"op":1}'),
                          Entry(3, 12, EntryType.CONF_CHANGE, b"\x00\xff")), 9), 9),
        Envelope(Message(MessageType.APP_RESP, "m1", "m2", 3, 1, 4, reject=True,
                         reject_hint=2)),
        Envelope(Message(MessageType.SNAP, "m3", "m1", 4, snapshot=Snapshot(
            SnapshotMetadata(50, 4, ConfState.of(["m1", "m2"], ["m3"])), b"catalog")), 50),
        Envelope(Message(MessageType.VOTE, "m2", "m3", 5, 4, 51, context=b"CampaignTransfer")),
    ]
    assert decode_envelopes(encode_envelopes(envs)) == envs


def test_garbage_is_rejected_as_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError, match="malformed Raft message batch"):
        decode_envelopes(b'[[{"t":"nope"},0]]')


def test_peers_accept_ids_or_bare_addresses() -> None:
    assert parse_peers("m1=127.0.0.1:7051, m2=127.0.0.1:7052") == {
        "m1": "127.0.0.1:7051", "m2": "127.0.0.1:7052"}
    assert parse_peers("h:7051") == {"h:7051": "h:7051"}
    with pytest.raises(InvalidArgumentError, match="unique"):
        parse_peers("m1=h:1,m1=h:2")


def test_conf_file_values_are_defaults_that_the_command_line_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    conf = tmp_path / "master.conf"
    conf.write_text("# comment\npeers = a=127.0.0.1:1,b=127.0.0.1:2\ntick-ms = 20\n"
                    "join = true\nfsync = none\n")
    seen = {}

    def fake_run(args: object) -> int:
        seen.update(vars(args))
        return 0

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: _patched(parser, fake_run))
    assert cli.main(["master", "run", "--conf", str(conf), "--id", "a", "--data-dir", "/x",
                     "--fsync", "fsync"]) == 0
    assert seen["peers"] == "a=127.0.0.1:1,b=127.0.0.1:2" and seen["tick_ms"] == 20.0
    assert seen["join"] is True and seen["fsync"] == "fsync"


def _patched(parser: object, func: object) -> object:
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    sub = parser._subparsers._group_actions[0]  # type: ignore[union-attr]
    master = sub.choices["master"]
    run = master._subparsers._group_actions[0].choices["run"]
    run.set_defaults(func=func)
    return parser


def test_the_cli_needs_an_id_and_a_data_dir() -> None:
    with pytest.raises(SystemExit, match="needs --id and --data-dir"):
        cli.main(["master", "run"])
