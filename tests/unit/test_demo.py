"""The README's demo tells a true story: every replica ends with the same 8 writes."""

from __future__ import annotations

from pyspark_kudu.consensus.demo import run_demo


def test_demo_survives_leader_loss_and_replicas_converge() -> None:
    lines: list[str] = []
    applied = run_demo(seed=7, say=lines.append)
    want = [f"row-{i}".encode() for i in range(8)]
    assert {k: v for k, v in applied.items()} == {k: want for k in applied}
    assert lines[-1].endswith("yes")
    assert sum("elected" in line for line in lines) == 2
