"""Small files that cost a reader far more than their size: decompression bombs of each kind
the readers meet, built by hand (no encoder writes them)."""

from __future__ import annotations

import struct


def _segment(marker: int, body: bytes) -> bytes:
    return struct.pack(">HH", 0xFF00 | marker, len(body) + 2) + body


class _Bits:
    """An entropy-coded segment: bits in, bytes out with 0xFF stuffed."""

    def __init__(self) -> None:
        self.out, self.acc, self.n = bytearray(), 0, 0

    def put(self, value: int, length: int) -> None:
        self.acc = (self.acc << length) | value
        self.n += length
        while self.n >= 8:
            self.n -= 8
            byte = (self.acc >> self.n) & 0xFF
            self.out.append(byte)
            if byte == 0xFF:
                self.out.append(0)
        self.acc &= (1 << self.n) - 1

    def end(self) -> bytes:
        if self.n:
            self.put((1 << (8 - self.n)) - 1, 8 - self.n)
        return bytes(self.out)


def jpeg_scan_bomb(width: int, height: int, bands: int = 63, bits: int = 10) -> bytes:
    """A valid progressive greyscale JPEG of ``width`` x ``height`` (flat grey) with
    ``1 + bands * (bits + 1)`` scans: each AC coefficient in a band of its own, sent at
    ``bits`` of successive approximation. Every scan is a few runs of empty blocks (a few
    bytes), yet a decoder goes over the whole image for each: 9,000 x 9,000 with the
    defaults is 694 scans in 260 KB."""
    blocks = -(-width // 8) * -(-height // 8)
    out = bytearray(b"\xff\xd8")
    out += _segment(0xDB, b"\x00" + b"\x01" * 64)
    out += _segment(0xC2, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
    out += _segment(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x00")  # DC: difference 0 = "0"
    eob_runs = bytes(r << 4 for r in range(15))  # EOBr: 2**r + r extra bits, 4-bit codes
    out += _segment(0xC4, b"\x10" + bytes([0, 0, 0, 15] + [0] * 12) + eob_runs)

    def scan(first: int, last: int, high: int, low: int, data: bytes) -> bytes:
        return _segment(0xDA, bytes([1, 1, 0x00, first, last, high << 4 | low])) + data

    dc = _Bits()
    for _ in range(blocks):
        dc.put(0, 1)
    out += scan(0, 0, 0, 0, dc.end())
    runs, left = _Bits(), blocks
    while left:
        run = min(left, 32767)
        r = run.bit_length() - 1
        runs.put(r, 4)
        runs.put(run - (1 << r), r)
        left -= run
    empty = runs.end()
    for k in range(1, bands + 1):
        out += scan(k, k, 0, bits, empty)
        for a in range(bits, 0, -1):
            out += scan(k, k, a, a - 1, empty)
    return bytes(out + b"\xff\xd9")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def parquet_claiming_rows(real: bytes, rows: int, claimed: int) -> bytes:
    """A Parquet file of one row group of ``rows`` rows whose footer claims ``claimed`` rows,
    in the file's count and the row group's. In the footer's Thrift both are i64 fields 3
    written right after a field 2, so ``0x16`` then the zigzag varint of ``rows``: the first
    such (the file's) and the last (the row group's, after its columns, whose value counts
    look the same)."""
    footer_len = int.from_bytes(real[-8:-4], "little")
    body, footer = real[: -8 - footer_len], real[-8 - footer_len : -8]
    old, new = b"\x16" + _varint(2 * rows), b"\x16" + _varint(2 * claimed)
    first, last = footer.find(old), footer.rfind(old)
    assert 0 <= first < last, "the row counts are not where a writer puts them"
    footer = (
        footer[:first] + new + footer[first + len(old) : last] + new + footer[last + len(old) :]
    )
    return body + footer + len(footer).to_bytes(4, "little") + b"PAR1"
