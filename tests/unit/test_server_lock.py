"""The one-server-per-executor lock (pyspark_kudu.spark.host.server_lock) between real
processes: the address hand-over, no lock files left behind, never two holders."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
from pathlib import Path

from pyspark_kudu.spark.host import server_lock
from tests.waiting import wait_until

_HOLD = """
import sys, time
from pyspark_kudu.spark.host import server_lock
fd = server_lock.take(sys.argv[1], 5)
assert isinstance(fd, int), fd
server_lock.publish(sys.argv[1], "127.0.0.9:1234 127.0.0.9:5678")
print("held", flush=True)
time.sleep(600)
"""


def _holder(path: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_a_second_daemon_gets_the_address_and_a_released_lock_leaves_no_file(
        tmp_path: Path) -> None:
    path = tmp_path / "pyspark-kudu-tserver-a.lock"
    fd = server_lock.take(str(path), 5)
    assert isinstance(fd, int)
    server_lock.publish(str(path), "127.0.0.2:1 127.0.0.2:2")
    other = subprocess.run(
        [sys.executable, "-c", "import sys; from pyspark_kudu.spark.host import server_lock;"
         " print(server_lock.take(sys.argv[1], 5))", str(path)],
        capture_output=True, text=True, check=True)
    assert other.stdout.strip() == "127.0.0.2:1 127.0.0.2:2"
    server_lock.release(str(path), fd)
    assert sorted(os.listdir(tmp_path)) == []
    again = server_lock.take(str(path), 5)  # the next server starts at once
    assert isinstance(again, int)
    server_lock.release(str(path), again)


def test_the_files_of_killed_servers_are_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    live = tmp_path / "pyspark-kudu-tserver-live.lock"
    dead = tmp_path / "pyspark-kudu-tserver-dead.lock"
    keeper, victim = _holder(live), _holder(dead)
    try:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        assert (tmp_path / "pyspark-kudu-tserver-dead.lock.address").exists()  # left behind
        mine = tmp_path / "pyspark-kudu-tserver-new.lock"
        fd = server_lock.take(str(mine), 5)  # taking a lock sweeps
        assert isinstance(fd, int)
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "pyspark-kudu-tserver-live.lock", "pyspark-kudu-tserver-live.lock.address",
            "pyspark-kudu-tserver-new.lock"]
        assert server_lock.sweep(str(tmp_path), keep=str(mine)) == 0
        # the live server's address still answers a daemon of its executor
        assert server_lock.take(str(live), 1) == "127.0.0.9:1234 127.0.0.9:5678"
        server_lock.release(str(mine), fd)
    finally:
        keeper.kill()
        keeper.wait()
        victim.kill()
    assert server_lock.sweep(str(tmp_path)) == 1
    assert list(tmp_path.iterdir()) == []


def _contend(path: str, rounds: int, marker: str, errors: mp.Queue) -> None:  # type: ignore[type-arg]
    for _ in range(rounds):
        got = server_lock.take(path, 0)
        if not isinstance(got, int):
            continue
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            errors.put(f"pid {os.getpid()} holds the lock while another holder does")
        else:
            os.close(fd)
            os.unlink(marker)
        server_lock.release(path, got)


def test_takers_releasers_and_sweepers_never_hold_the_lock_together(tmp_path: Path) -> None:
    path = str(tmp_path / "pyspark-kudu-tserver-x.lock")
    marker = str(tmp_path / "holder")
    ctx = mp.get_context("fork")
    errors: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_contend, args=(path, 400, marker, errors)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert not found, found[:3]
    wait_until(lambda: not os.path.exists(path), 5, "the lock file removed by its last holder")
