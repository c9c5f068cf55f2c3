"""Suite-wide pytest configuration.

Tests are marked by the directory they live in, so ``pytest -m unit`` selects the pure-Python
tests, ``-m spark`` the local-mode Spark tests and ``-m cluster`` the standalone-cluster ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_MARK_BY_DIR = {"unit": "unit", "spark": "spark", "cluster": "cluster"}
_ORDER = {"unit": 0, "spark": 1, "cluster": 2}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent

    def first_dir(item: pytest.Item) -> str:
        try:
            return Path(str(item.fspath)).relative_to(root).parts[0]
        except ValueError:
            return ""

    for item in items:
        mark = _MARK_BY_DIR.get(first_dir(item))
        if mark is not None:
            item.add_marker(getattr(pytest.mark, mark))
    # unit, then local-mode Spark, then the cluster: one SparkSession kind at a time (a JVM
    # has one active SparkContext; see stop_other_sessions).
    items.sort(key=lambda it: _ORDER.get(first_dir(it), 3))


def stop_other_sessions(master: str) -> None:
    """Stop the active SparkSession if it runs against another master than ``master``.

    ``SparkSession.builder.getOrCreate()`` would otherwise silently return it, and tests
    meant for local mode would run on the cluster (or the reverse).
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and active.sparkContext.master != master:
        active.stop()
