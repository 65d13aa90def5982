"""What an image's header may declare before a decoder is let at it: bounds on pixels and
on JPEG scans, checked from the header alone (a decompression bomb is a few kilobytes that
declare or cost gigabytes or minutes)."""

from __future__ import annotations

from zephon.errors import FormatError

__all__ = ["MAX_PIXELS", "MAX_SCANS", "SCAN_PIXELS", "check_pixels", "check_scans"]

# Pillow's own warning threshold (``PIL.Image.MAX_IMAGE_PIXELS``): ~9,500 px square
MAX_PIXELS = 89_478_485


def check_pixels(width: int, height: int, max_pixels: int | None) -> None:
    """Refuse an image whose header declares more than ``max_pixels`` before a decoder
    allocates it (a damaged header, or a decompression bomb: a few KB declaring 30,000 x
    30,000 pixels would have libjpeg-turbo allocate 30,000 x 30,000 x 3 bytes, 2.7 GB)."""
    if max_pixels is not None and width * height > max_pixels:
        raise FormatError(
            f"image of {width} x {height} = {width * height:,} pixels is over "
            f"max_pixels={max_pixels:,} (a damaged header or a decompression "
            "bomb; if the image is real, raise max_pixels)"
        )


# A progressive JPEG is decoded again for every scan: ~700 scans of 9,000 x 9,000 pixels (a
# valid 250 KB file) kept a decoder busy for 9-30 s. Encoders write 10 (libjpeg's progressive
# script for colour) to a few tens. Allowed: MAX_SCANS, fewer for large images so that scans
# x pixels stays under SCAN_PIXELS (30 scans of 9,000 x 9,000, about a second).
MAX_SCANS = 100
SCAN_PIXELS = 2_500_000_000
_SOS = b"\xff\xda"


def check_scans(data: bytes, width: int, height: int, max_pixels: int | None) -> None:
    """Refuse a JPEG with more scans than its size allows (a scan bomb), before decoding.
    Scans are counted from the first: markers before it are walked (an EXIF thumbnail or an
    ICC profile may hold the bytes of a scan marker), entropy-coded data cannot hold one."""
    if max_pixels is None:
        return  # no limits asked for
    first = _first_scan(data)
    if first < 0:
        return  # no scan: the decoder reports the damage
    scans = 1 + data.count(_SOS, first + 2)
    limit = min(MAX_SCANS, max(16, SCAN_PIXELS // max(1, width * height)))
    if scans > limit:
        raise FormatError(
            f"JPEG of {width} x {height} pixels with {scans} scans, over the {limit} allowed "
            "for its size (a scan bomb: each scan is decoded over the whole image; with "
            "max_pixels=None nothing is checked)"
        )


def _first_scan(data: bytes) -> int:
    """Offset of the first start-of-scan marker of a JPEG, -1 if there is none."""
    at, end = 2, len(data)
    while at + 4 <= end:
        if data[at] != 0xFF:
            return -1
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker == 0xDA:
            return at
        if marker == 0xD9:
            return -1
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return -1
