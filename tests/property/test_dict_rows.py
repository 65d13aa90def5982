"""Rows built by a constructor made for their field names equal ``dict(zip(names, row))``,
whatever the names (they are data from a dataset's files, never code)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.formats.records import dict_rows

names = st.lists(
    st.one_of(
        st.text(max_size=12),
        st.sampled_from(['"}; import os; {"', "v0", "k1", "__class__", "make", "{k0}", "\\"]),
        st.integers(),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(names, st.integers(0, 20), st.data())
def test_rows_equal_dict_of_zip(keys: list[Any], count: int, data: st.DataObject) -> None:
    columns = [data.draw(st.lists(st.integers(), min_size=count, max_size=count)) for _ in keys]
    expected = [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]
    assert dict_rows(keys, columns) == expected


def test_many_fields_and_unequal_columns_take_the_plain_path() -> None:
    keys = [f"c{i}" for i in range(300)]
    assert dict_rows(keys, [[i] for i in range(300)]) == [{f"c{i}": i for i in range(300)}]
    with pytest.raises(ValueError):
        dict_rows(["a", "b"], [[1, 2], [3]])
