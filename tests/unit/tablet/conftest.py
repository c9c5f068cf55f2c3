"""Fixtures for the tablet tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make fsync free: for tests of logic, not durability (the crash tests keep real fsync).

    This machine's disk takes ~6 ms per fsync and a flush does four of them.
    """
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setattr(os, "fdatasync", lambda fd: None, raising=False)
    yield
