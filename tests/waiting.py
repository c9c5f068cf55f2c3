"""Waiting on conditions with deadlines (DEVELOPERS.md: never bare sleeps in distributed tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(cond: Callable[[], T], timeout: float, what: str, poll_s: float = 0.01) -> T:
    """Poll ``cond`` until it returns something truthy and return that; fail saying ``what``
    did not happen within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"{what} did not happen within {timeout:.1f} s")
        time.sleep(poll_s)
