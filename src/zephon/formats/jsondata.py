"""JSON read from data files (records, ``index.json`` files, metadata embedded in shards).

The bytes are untrusted, so parsing refuses what would otherwise escape as another exception
type: nesting too deep for the parser (``RecursionError``), and a number used as a count that
is not one (``Infinity`` would be an ``OverflowError`` at ``int()``, ``2.5`` silently 2). Every
refusal is a ``ValueError``, which the formats turn into a ``FormatError`` naming the file.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["count", "parse_json", "parse_lines"]

try:  # a core dependency; json alone still works without it
    import msgspec

    _FAST: Any = msgspec.json.Decoder().decode
    _LINES: Any = msgspec.json.Decoder().decode_lines
    _REFUSED: tuple[type[Exception], ...] = (msgspec.MsgspecError,)
except ImportError:  # pragma: no cover - msgspec is installed with zephon
    _FAST, _LINES, _REFUSED = None, None, ()


def parse_json(data: bytes | str) -> Any:
    """``json.loads(data)``, parsed by msgspec when it can: it gives the same values for every
    document it accepts and refuses the rest (``NaN``, numbers out of a double's range, lone
    surrogates, invalid UTF-8), which ``json`` then parses or rejects as it always has.

    Raises:
        ValueError: not JSON, or nested deeper than the parser's recursion limit.
    """
    try:
        if _FAST is not None:
            try:
                return _FAST(data)
            except _REFUSED:
                pass
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None


def parse_lines(data: bytes | memoryview) -> list[Any] | None:
    """Each line of ``data`` (newline-delimited JSON) parsed by msgspec in one call, without
    building a JSON array of them first (about three times faster); ``None`` if msgspec
    refuses any line, which the caller then parses one by one with :func:`parse_json`."""
    if _LINES is None:
        return None
    refused: tuple[type[BaseException], ...] = (*_REFUSED, RecursionError)
    try:
        return _LINES(data)  # type: ignore[no-any-return]
    except refused:
        return None


def count(value: Any, field: str) -> int:
    """``value`` as a count (a non-negative integer) read from a JSON ``field``.

    Accepts an integer, a float with an integral value, or a string of digits (writers differ);
    refuses booleans, fractions, negatives, ``Infinity`` and ``NaN``.

    Raises:
        ValueError: naming ``field`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{field} must be a count, got {type(value).__name__}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"{field} must be a whole count, got {value!r}")
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{field} must be a count, got {str(value)[:40]!r}") from None
    if n < 0:
        raise ValueError(f"{field} must not be negative, got {n}")
    return n
