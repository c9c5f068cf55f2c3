"""PMap: updates return new maps and never disturb the old ones."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pyspark_kudu.master.pmap import PMap

ops = st.lists(st.tuples(st.booleans(), st.integers(0, 200), st.integers()), max_size=300)


@given(ops)
def test_pmap_behaves_like_a_dict_and_keeps_old_versions(
    steps: list[tuple[bool, int, int]],
) -> None:
    m: PMap[int, int] = PMap()
    ref: dict[int, int] = {}
    for is_set, k, v in steps:
        before, before_ref = m, dict(ref)
        if is_set:
            m = m.set(k, v)
            ref[k] = v
        else:
            m = m.remove(k)
            ref.pop(k, None)
        assert dict(before.items()) == before_ref
    assert dict(m.items()) == ref and len(m) == len(ref)
    assert m == ref and PMap(ref) == m


def test_batch_update_and_get_default() -> None:
    m = PMap({"a": 1}).update({"b": 2, "a": 3})
    assert m["a"] == 3 and m.get("zz", 0) == 0 and "b" in m and len(m) == 2
