"""Suite-wide pytest configuration.

Tests are marked by the directory they live in, so ``pytest -m unit`` selects the pure-Python
tests, ``-m spark`` the local-mode Spark tests and ``-m cluster`` the standalone-cluster ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_MARK_BY_DIR = {"unit": "unit", "spark": "spark", "cluster": "cluster"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        try:
            first = Path(str(item.fspath)).relative_to(root).parts[0]
        except ValueError:
            continue
        mark = _MARK_BY_DIR.get(first)
        if mark is not None:
            item.add_marker(getattr(pytest.mark, mark))
