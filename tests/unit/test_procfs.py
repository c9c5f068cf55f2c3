"""The /proc readers shared by the samplers and the fault harness (pyspark_kudu.testing.procfs),
on this machine's real process table."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pyspark_kudu.testing import procfs
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"),
                                reason="no /proc on this platform (Linux only)")


def test_this_process_is_listed_with_its_parent_and_group() -> None:
    me = os.getpid()
    assert me in procfs.pids()
    fields = procfs.stat_fields(me)
    assert fields is not None
    assert int(fields[procfs.PPID]) == os.getppid()
    assert int(fields[procfs.PGRP]) == os.getpgrp()
    assert fields[procfs.STATE] in (b"R", b"S")
    assert int(fields[procfs.UTIME]) + int(fields[procfs.STIME]) >= 0


def test_a_command_name_with_spaces_and_parentheses_is_read_past(tmp_path: Path) -> None:
    sleeper = tmp_path / "odd ) name ("
    shutil.copy(shutil.which("sleep") or "/bin/sleep", sleeper)
    child = subprocess.Popen([str(sleeper), "30"])
    try:
        # Popen may return while the exec is still under way (the command line reads
        # empty, the name is still ours): wait for the child's own.
        want = os.fsencode(f"{sleeper}\x0030\x00")
        wait_until(lambda: procfs.cmdline(child.pid) == want, 30,
                   f"the child's command line reading {want!r}")
        fields = procfs.stat_fields(child.pid)
        assert fields is not None
        assert int(fields[procfs.PPID]) == os.getpid()
    finally:
        child.kill()
        child.wait()
    # Reaped: gone from the table, and every reader says so rather than raising.
    assert child.pid not in procfs.pids()
    assert procfs.stat_fields(child.pid) is None
    assert procfs.cmdline(child.pid) is None
