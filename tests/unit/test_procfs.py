"""The /proc readers shared by the samplers and the fault harness (pyspark_kudu.testing.procfs),
on this machine's real process table."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pyspark_kudu.testing import procfs

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
        fields = procfs.stat_fields(child.pid)
        assert fields is not None
        assert int(fields[procfs.PPID]) == os.getpid()
        assert procfs.cmdline(child.pid) == f"{sleeper}\0" "30\0".encode()
    finally:
        child.kill()
        child.wait()
    # Reaped: gone from the table, and every reader says so rather than raising.
    assert child.pid not in procfs.pids()
    assert procfs.stat_fields(child.pid) is None
    assert procfs.cmdline(child.pid) is None
