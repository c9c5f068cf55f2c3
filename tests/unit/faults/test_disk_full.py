"""The harness's disk_full fault (pyspark_kudu.tools.faults.inject): planned only on the host
with a small disk of its own, and filling / freeing a real tmpfs."""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyspark_kudu.tools.faults.inject import (
    FaultSkipped,
    fill_disk,
    free_disk,
    plan_schedule,
    small_disk,
)

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
KINDS = ("kill_executor", "restart_worker", "corrupt_replica", "disk_full")


def test_disk_full_faults_go_to_the_small_disk_host_and_last_a_while() -> None:
    plan = plan_schedule(random.Random(3), HOSTS, 300.0, kinds=KINDS, disk_host=HOSTS[-1],
                         down_s=(8.0, 12.0))
    full = [e for e in plan if e.kind == "disk_full"]
    assert full, "a 300 s window with four kinds should plan a disk_full"
    assert {e.host for e in full} == {HOSTS[-1]}
    assert all(8.0 <= e.duration_s <= 12.0 for e in full)
    none = plan_schedule(random.Random(3), HOSTS, 300.0, kinds=KINDS, disk_host=None)
    assert not [e for e in none if e.kind == "disk_full"]


class _Roots:
    """The one thing the fault needs from a cluster: each host's data root."""

    def __init__(self, roots: dict[str, Path]) -> None:
        self.roots = roots

    def data_root(self, host: str) -> Path:
        return self.roots[host]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "small"
    where.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs",
                          str(where)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not allowed here ({out.stderr.strip()}); the "
                    f"harness then records disk_full as not planned")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_fill_takes_every_byte_and_free_gives_them_back(tmpfs: Path, tmp_path: Path) -> None:
    cluster = _Roots({"small": tmpfs, "shared": tmp_path / "shared"})
    (tmp_path / "shared").mkdir()
    assert small_disk(cluster, "small") and not small_disk(cluster, "shared")  # type: ignore[arg-type]
    before = _free(tmpfs)
    fill_disk(cluster, "small")  # type: ignore[arg-type]
    assert _free(tmpfs) == 0
    with pytest.raises(OSError) as e:
        (tmpfs / "wal-segment").write_bytes(b"x" * 8192)
    assert e.value.errno == 28  # ENOSPC, what a replica's next durable write meets
    free_disk(cluster, "small")  # type: ignore[arg-type]
    assert _free(tmpfs) >= before - (64 << 10)
    with pytest.raises(FaultSkipped, match="not a file system of its own"):
        fill_disk(cluster, "shared")  # type: ignore[arg-type]
    assert not list((tmp_path / "shared").iterdir()), "a shared disk must never be filled"
