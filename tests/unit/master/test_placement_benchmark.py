"""benchmarks/placement.py runs end to end (its quick variant) and writes JSON + PNG."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_quick_benchmark_meets_its_goals_and_saves_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main = runpy.run_path(str(REPO / "benchmarks" / "placement.py"))["main"]
    assert main(["--quick", "--tablets", "3000", "--out", str(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((tmp_path / "placement-quick.json").read_text())
    assert printed == saved and saved["inputs"]["tablets"] == 300
    assert all(saved["goals_met"].values())
    assert (tmp_path / "placement-quick.png").read_bytes()[:4] == b"\x89PNG"
