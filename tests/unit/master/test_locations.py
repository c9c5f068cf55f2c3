"""Location mapping command, cache and client locations (seed: "Node labeling")."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from pyspark_kudu.errors import (
    LocationMappingError,
    LocationMappingTimedOutError,
    RemoteError,
    TimedOutError,
)
from pyspark_kudu.master.locations import LocationCache, is_valid_location, run_location_mapping_cmd

REPO = Path(__file__).resolve().parents[3]


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize("location", ["/a", "/dc1/rack-2", "/A.b_c-d/0/x"])
def test_valid_locations_are_accepted(location: str) -> None:
    assert is_valid_location(location)


@pytest.mark.parametrize(
    "location", ["", "a", "a/b", "/", "//a", "/a//b", "/a/", "/a b", "/a$b", "/é", "/a\n"]
)
def test_invalid_locations_are_rejected_strictly(location: str) -> None:
    assert not is_valid_location(location)


def test_command_is_split_on_spaces_and_gets_the_host_appended(tmp_path: Path) -> None:
    cmd = script(tmp_path, "args.sh", "printf '/%s' \"$@\"; echo\n")
    assert run_location_mapping_cmd(f"{cmd}  dc1   rack2 ", "host-7") == "/dc1/rack2/host-7"


def test_command_runs_without_a_shell(tmp_path: Path) -> None:
    cmd = script(tmp_path, "args.sh", "printf '/%s' \"$@\"; echo\n")
    with pytest.raises(LocationMappingError) as e:
        run_location_mapping_cmd(f"{cmd} $HOME", "h")
    assert str(e.value) == "location mapping command returned invalid location: /$HOME/h"


def test_output_is_stripped(tmp_path: Path) -> None:
    cmd = script(tmp_path, "ws.sh", "printf '  \\t/dc1/r1 \\n\\n'\n")
    assert run_location_mapping_cmd(cmd, "h") == "/dc1/r1"


def test_whitespace_only_command_has_kudus_error() -> None:
    with pytest.raises(LocationMappingError, match=r"^invalid empty location mapping command$"):
        run_location_mapping_cmd("   ", "h")


def test_failing_command_reports_exit_status_and_stderr(tmp_path: Path) -> None:
    cmd = script(tmp_path, "fail.sh", "echo 'no such rack' >&2\nexit 3\n")
    with pytest.raises(LocationMappingError) as e:
        run_location_mapping_cmd(cmd, "h")
    msg = str(e.value)
    assert msg.startswith("failed to run location mapping command: ")
    assert "exit status 3" in msg and "no such rack" in msg
    assert isinstance(e.value, RemoteError) and e.value.status == "RuntimeError"


def test_missing_command_is_a_failure_to_run(tmp_path: Path) -> None:
    with pytest.raises(LocationMappingError, match=r"^failed to run location mapping command: "):
        run_location_mapping_cmd(str(tmp_path / "nope.sh"), "h")


def test_empty_output_has_kudus_error(tmp_path: Path) -> None:
    cmd = script(tmp_path, "empty.sh", "echo '   '\n")
    with pytest.raises(
        LocationMappingError, match=r"^location mapping command returned invalid empty location$"
    ):
        run_location_mapping_cmd(cmd, "h")


def test_invalid_output_is_reported_with_the_output(tmp_path: Path) -> None:
    cmd = script(tmp_path, "bad.sh", "echo 'dc1//rack'\n")
    with pytest.raises(LocationMappingError) as e:
        run_location_mapping_cmd(cmd, "h")
    assert str(e.value) == "location mapping command returned invalid location: dc1//rack"


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def test_timeout_kills_the_command_and_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    cmd = script(tmp_path, "slow.sh", f"sleep 30 &\necho $! > {pidfile}\nwait\n")
    start = time.monotonic()
    with pytest.raises(LocationMappingTimedOutError) as e:
        run_location_mapping_cmd(cmd, "h", timeout=0.5)
    assert time.monotonic() - start < 25  # did not wait for the 30 s sleep
    assert isinstance(e.value, TimedOutError) and isinstance(e.value, LocationMappingError)
    assert "failed to run location mapping command" in str(e.value)
    assert "0.5 s" in str(e.value)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)


def counting_script(tmp_path: Path) -> tuple[str, Path]:
    calls = tmp_path / "calls"
    cmd = script(tmp_path, "count.sh", f"echo \"$1\" >> {calls}\necho \"/loc-$1\"\n")
    return cmd, calls


def test_cache_runs_the_command_once_per_host_and_counts(tmp_path: Path) -> None:
    cmd, calls = counting_script(tmp_path)
    cache = LocationCache(cmd)
    assert cache.get("a") == "/loc-a"
    assert cache.get("a") == "/loc-a"
    assert cache.get("b") == "/loc-b"
    assert calls.read_text().split() == ["a", "b"]
    assert (cache.queries, cache.hits) == (3, 1)


def test_reregistration_resolves_the_location_again(tmp_path: Path) -> None:
    cmd, calls = counting_script(tmp_path)
    cache = LocationCache(cmd)
    cache.get("a")
    cache.get("a", refresh=True)
    assert calls.read_text().split() == ["a", "a"]
    assert (cache.queries, cache.hits) == (2, 0)


def test_failures_are_not_cached(tmp_path: Path) -> None:
    flag = tmp_path / "ready"
    cmd = script(tmp_path, "flaky.sh", f"[ -e {flag} ] || exit 1\necho /ok\n")
    cache = LocationCache(cmd)
    with pytest.raises(LocationMappingError):
        cache.get("a")
    flag.touch()
    assert cache.get("a") == "/ok"
    assert (cache.queries, cache.hits) == (2, 0)


def test_clients_get_a_location_or_none(tmp_path: Path) -> None:
    cmd = script(tmp_path, "client.sh", '[ "$1" = driver ] && echo /dc1/rack1 || exit 1\n')
    cache = LocationCache(cmd)
    assert cache.client_location("driver") == "/dc1/rack1"
    assert cache.client_location("laptop") is None


def test_no_command_means_no_locations() -> None:
    cache = LocationCache(None)
    assert not cache.enabled
    assert cache.get("a") is None and cache.client_location("a") is None
    assert cache.queries == 0


def test_conf_script_maps_hosts_from_the_topology_file() -> None:
    cmd = f"{REPO / 'conf' / 'location_mapping.sh'} {REPO / 'conf' / 'topology.txt'}"
    assert run_location_mapping_cmd(cmd, "ts-dc2-r1-3") == "/dc2/rack1"
    assert run_location_mapping_cmd(cmd, "127.0.0.1") == "/local"
    with pytest.raises(LocationMappingError, match="no location for host unknown-host"):
        run_location_mapping_cmd(cmd, "unknown-host")


def test_conf_script_defaults_to_the_topology_file_next_to_it() -> None:
    assert os.access(REPO / "conf" / "location_mapping.sh", os.X_OK)
    assert run_location_mapping_cmd(str(REPO / "conf" / "location_mapping.sh"), "driver") == (
        "/dc1/rack1"
    )
