"""A reader for the Thrift compact protocol, enough to walk a Parquet footer.

Why by hand: pyarrow parses footers well, but reading a column chunk's metadata through its
Python API can end the process on a damaged footer (an exception its binding does not catch),
and no Python code can recover from that. The row groups' offsets are read here instead, where
damage is a ``ValueError`` like any other. The reader is generic: a struct becomes a ``dict``
from field id to value, a list a ``list``, binary ``bytes``; nothing needs the Parquet IDL.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["read_struct"]

_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY = range(9)
_LIST, _SET, _MAP, _STRUCT = 9, 10, 11, 12
_MAX_DEPTH = 32  # Parquet nests structs a few levels deep; damage can claim any depth


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.at = 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise ValueError("thrift: truncated")
        value = self.data[self.at]
        self.at += 1
        return value

    def varint(self) -> int:
        value = shift = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("thrift: varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError("thrift: truncated")
        out = bytes(self.data[self.at : self.at + n])
        self.at += n
        return out

    def value(self, kind: int, depth: int) -> Any:
        if kind in (_TRUE, _FALSE):  # as a field, the type is the value; in a list, a byte
            return kind == _TRUE
        if kind == _BYTE:
            return self.byte()
        if kind in (_I16, _I32, _I64):
            return self.zigzag()
        if kind == _DOUBLE:
            return struct.unpack("<d", self.take(8))[0]
        if kind == _BINARY:
            return self.take(self.varint())
        if depth > _MAX_DEPTH:
            raise ValueError("thrift: nested too deep")
        if kind in (_LIST, _SET):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            if size > len(self.data) - self.at:  # every element takes at least a byte
                raise ValueError("thrift: list longer than the data")
            if elem in (_TRUE, _FALSE):
                return [self.byte() == 1 for _ in range(size)]
            return [self.value(elem, depth + 1) for _ in range(size)]
        if kind == _MAP:
            size = self.varint()
            if size == 0:
                return {}
            if size > len(self.data) - self.at:
                raise ValueError("thrift: map longer than the data")
            types = self.byte()
            return {
                _hashable(self.value(types >> 4, depth + 1)): self.value(types & 0x0F, depth + 1)
                for _ in range(size)
            }
        if kind == _STRUCT:
            return self.struct(depth + 1)
        raise ValueError(f"thrift: unknown type {kind}")

    def struct(self, depth: int) -> dict[int, Any]:
        fields: dict[int, Any] = {}
        last = 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == _STOP:
                return fields
            delta = head >> 4
            last = last + delta if delta else self.zigzag()
            fields[last] = self.value(kind, depth)


def _hashable(key: Any) -> Any:
    if isinstance(key, (list, dict)):
        raise ValueError("thrift: a map keyed by a container")
    return key


def read_struct(data: bytes) -> dict[int, Any]:
    """The struct at the start of ``data``: field id -> value. Raises ``ValueError`` if the
    bytes are not a well-formed compact-protocol struct."""
    return _Reader(data).struct(0)
