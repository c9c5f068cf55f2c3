"""``PMap``: an immutable mapping whose updates share structure (cheap copy-on-write).

The catalog is applied by a pure function (STYLE 7): every applied record yields a new
:class:`~pyspark_kudu.master.catalog.Catalog` and the old one stays valid for readers that
hold it. Copying whole dicts would make each write O(catalog size); a ``PMap`` keeps its
items in 64 buckets and an update copies one bucket plus the bucket tuple, so a write costs
O(n / 64 + 64). Iteration order is unspecified (it depends on per-process string hashing):
anything that must be deterministic sorts.

Thread-safety: immutable, safe to share between threads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar, overload

__all__ = ["PMap"]

K = TypeVar("K")
V = TypeVar("V")
_T = TypeVar("_T")

_BUCKETS = 64
_EMPTY: dict[object, object] = {}


class PMap(Mapping[K, V], Generic[K, V]):
    """An immutable mapping; :meth:`set` / :meth:`remove` / :meth:`update` return new maps."""

    __slots__ = ("_buckets", "_len")

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        buckets: list[dict[K, V]] = [{} for _ in range(_BUCKETS)]
        pairs = items.items() if isinstance(items, Mapping) else items
        for k, v in pairs:
            buckets[hash(k) % _BUCKETS][k] = v
        self._buckets: tuple[dict[K, V], ...] = tuple(buckets)
        self._len = sum(len(b) for b in buckets)

    @classmethod
    def _make(cls, buckets: tuple[dict[K, V], ...], length: int) -> PMap[K, V]:
        m: PMap[K, V] = cls.__new__(cls)
        m._buckets = buckets
        m._len = length
        return m

    # -- Mapping ---------------------------------------------------------------------------
    def __getitem__(self, key: K) -> V:
        return self._buckets[hash(key) % _BUCKETS][key]

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: V | _T) -> V | _T: ...

    def get(self, key: K, default: object = None) -> object:
        return self._buckets[hash(key) % _BUCKETS].get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._buckets[hash(key) % _BUCKETS]

    def __iter__(self) -> Iterator[K]:
        for b in self._buckets:
            yield from b

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"PMap({dict(self.items())!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return len(self) == len(other) and all(
            k in other and other[k] == v for k, v in self.items()
        )

    __hash__ = None  # type: ignore[assignment]

    # -- functional updates ----------------------------------------------------------------
    def set(self, key: K, value: V) -> PMap[K, V]:
        return self.update(((key, value),))

    def remove(self, key: K) -> PMap[K, V]:
        """A map without ``key`` (the same map if it is absent)."""
        i = hash(key) % _BUCKETS
        if key not in self._buckets[i]:
            return self
        b = dict(self._buckets[i])
        del b[key]
        buckets = list(self._buckets)
        buckets[i] = b
        return self._make(tuple(buckets), self._len - 1)

    def update(self, items: Mapping[K, V] | Iterable[tuple[K, V]]) -> PMap[K, V]:
        """A map with every ``(key, value)`` of ``items`` set; one copy per touched bucket."""
        pairs = items.items() if isinstance(items, Mapping) else items
        buckets = list(self._buckets)
        copied: set[int] = set()
        length = self._len
        for k, v in pairs:
            i = hash(k) % _BUCKETS
            if i not in copied:
                buckets[i] = dict(buckets[i])
                copied.add(i)
            if k not in buckets[i]:
                length += 1
            buckets[i][k] = v
        if not copied:
            return self
        return self._make(tuple(buckets), length)
