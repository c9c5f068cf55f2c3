"""Options shared by every verb, help texts, and the exit codes scripts rely on."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pyspark_kudu.master.localcluster import free_ports
from pyspark_kudu.tools import cli

from .conftest import TOKEN, Masters, Run

VERBS = [("cluster", "ksck"), ("cluster", "rebalance"), ("tserver", "list"),
         ("table", "list"), ("table", "describe"), ("table", "delete"), ("locations", "show"),
         ("master", "run")]


def test_every_group_and_verb_has_help_text() -> None:
    parser = cli.build_parser()
    groups = parser._subparsers._group_actions[0]  # type: ignore[union-attr]
    assert isinstance(groups, argparse._SubParsersAction)
    helps = {a.dest: a.help for a in groups._choices_actions}
    assert set(helps) == {g for g, _ in VERBS} and all(helps.values())
    for group, verb in VERBS:
        verbs = groups.choices[group]._subparsers._group_actions[0]
        action = next(a for a in verbs._choices_actions if a.dest == verb)
        assert action.help, f"{group} {verb} has no help"
        assert verbs.choices[verb].description, f"{group} {verb} has no description"


@pytest.mark.parametrize(("group", "verb"), VERBS)
def test_help_exits_0_and_names_the_verb(group: str, verb: str,
                                         run: Callable[..., Run]) -> None:
    r = run(group, verb, "--help")
    assert r.code == 0 and f"usage: pyspark-kudu {group} {verb}" in r.out


@pytest.mark.parametrize("argv", [
    ["table"],                                              # no verb
    ["cluster", "ksck", "--format", "xml"],                  # bad choice
    ["tserver", "list", "--master", "a:1", "--master-dir", "/x"],  # exclusive options
    ["cluster", "rebalance", "--max_moves", "many"],         # bad type
])
def test_command_line_errors_exit_2(argv: list[str], run: Callable[..., Run]) -> None:
    r = run(*argv)
    assert r.code == 2 and "usage: pyspark-kudu" in r.err and r.out == ""


def test_unreachable_masters_exit_3_within_the_timeout(run: Callable[..., Run]) -> None:
    (port,) = free_ports(1)
    start = time.monotonic()
    r = run("cluster", "ksck", "--master", f"127.0.0.1:{port}", "--timeout-s", "0.5")
    assert r.code == 3 and r.out == ""
    assert time.monotonic() - start < 25  # did not hang
    assert "TimedOutError" in r.err and f"127.0.0.1:{port}" in r.err
    assert "cannot reach the master(s)" in r.err


def test_a_wrong_token_is_a_usage_error(
    healthy: Masters, run: Callable[..., Run], tmp_path: Path,
) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token")
    r = run("table", "list", "--master", healthy.address, "--token-file", str(wrong))
    assert r.code == 2 and "shared-secret token" in r.err
    missing = run("table", "list", "--master", healthy.address,
                  "--token-file", str(tmp_path / "absent"))
    assert missing.code == 2 and "cannot read the token file" in missing.err


def test_masters_and_token_come_from_the_environment_like_master_run(
    healthy: Masters, run: Callable[..., Run], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYSPARK_KUDU_MASTER", healthy.address)
    monkeypatch.setenv("PYSPARK_KUDU_MASTER_TOKEN", TOKEN)
    r = run("table", "list")
    assert r.code == 0 and " events " in r.out
