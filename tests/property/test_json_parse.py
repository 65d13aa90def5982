"""JSONL's fast parser gives exactly what ``json.loads`` gives, for any document."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.formats.jsondata import parse_json

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()  # lone surrogates included: json escapes and reads them back
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(VALUES, st.booleans())
def test_the_fast_parser_agrees_with_json(value: Any, ascii_only: bool) -> None:
    data = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    try:
        expected = repr(json.loads(data))
    except ValueError as exc:  # e.g. a raw lone surrogate is not UTF-8
        expected = f"error {type(exc).__name__}"
    try:
        got = repr(parse_json(data))
    except ValueError as exc:
        got = f"error {type(exc).__name__}"
    assert got == expected


def test_what_the_fast_parser_refuses_json_still_reads() -> None:
    for text in [b"NaN", b"[1e400, -Infinity]", b'"\\ud800"', b"123456789012345678901234567890"]:
        assert repr(parse_json(text)) == repr(json.loads(text))
