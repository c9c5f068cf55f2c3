"""The quickstart notebook: the committed ``.ipynb`` is generated from the Databricks source,
and it runs top to bottom in a fresh kernel (its own process, hence its own SparkContext)."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
KERNEL = "pyspark-kudu-test"


def build_ipynb() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_ipynb", NOTEBOOKS / "build_ipynb.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_ipynb_is_what_the_generator_builds_from_the_databricks_source() -> None:
    source = (NOTEBOOKS / "quickstart.py").read_text(encoding="utf-8")
    assert source.startswith("# Databricks notebook source\n")
    built = build_ipynb().render(source)
    assert (NOTEBOOKS / "quickstart.ipynb").read_text(encoding="utf-8") == built, (
        "quickstart.ipynb is stale: run python notebooks/build_ipynb.py")
    kinds = [c.cell_type for c in nbformat.reads(built, as_version=4).cells]
    assert kinds[0] == "markdown" and kinds.count("code") == source.count("# COMMAND") // 2 + 1


def test_quickstart_runs_in_a_fresh_kernel_and_shows_the_rows_and_the_placement_chart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A kernelspec for this interpreter, and every file the kernel, Jupyter, matplotlib and
    # Spark write (connection file, warehouse, chart, shuffle dirs) under tmp_path.
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "pyspark-kudu tests", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    for var, sub in [("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython"),
                     ("MPLCONFIGDIR", "mpl"), ("TMPDIR", "tmp"), ("SPARK_LOCAL_DIRS", "spark")]:
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(var, str(tmp_path / sub))

    nb = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name=KERNEL,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    assert "table weather: 4 tablets x 3 replicas" in text
    assert "WriteSummary(rows_written=50, row_errors=0, tablets=4)" in text
    assert "per-row error: AlreadyPresent for {'id': 7}" in text
    assert "id = 7 scans 1 of 4 tablets" in text
    assert ("id < 5: [(0, 'Lisbon'), (1, 'Oslo'), (2, 'Nairobi'), (3, 'Lima'), (4, 'Osaka')]"
            in text)
    assert "location <none>: 4 tablet servers, 12 replicas, 4 leaders" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    # Kill and heal: the retired server ends with no replica, every row is still there.
    before = re.search(r"before: (\{.*?\}) - retiring (\w+)", text)
    after = re.search(r"after:  (\{.*?\}) - healed", text)
    heal_lines = "\n".join(line for line in text.splitlines()
                           if line.startswith(("before", "after", "  ")))
    assert before and after, f"the kill-and-heal cell did not heal:\n{heal_lines}"
    retired = before.group(2)
    counts = ast.literal_eval(after.group(1))
    assert counts[retired] == 0 and sum(counts.values()) == 12, counts
    assert "rows still there: 50" in text
    assert re.search(r"evicted replicas deleted: \d+", text), text
    assert text.rstrip().endswith("done")
    assert list((tmp_path / "tmp").iterdir()) == []  # the notebook removed its warehouse
