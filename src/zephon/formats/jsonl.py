"""JSON Lines: one JSON object per line; plain, or compressed as a whole (gzip, zstd, bz2, xz).

The index of a plain shard holds the byte offset of every non-blank line (blank lines join the
span of the line before them, which ``json.loads`` ignores as whitespace), so any run of lines is
one range read. A compressed shard can only be read from its start: its index holds offsets in
the decompressed stream, and its read unit is the whole shard.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon.errors import FormatError
from zephon.formats.blob import Blob
from zephon.formats.codec import BaseCodec
from zephon.formats.compression import Inflated, StreamDecompressor, stream_kind
from zephon.formats.index import RecordIndex, StreamIndex
from zephon.formats.jsondata import parse_json, parse_lines
from zephon.refs import ShardInfo

__all__ = ["JsonlCodec", "LineIndexer"]

_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[list(b" \t\r\n\f\v")] = True


class LineIndexer:
    """Finds the start of every non-blank line in a stream fed chunk by chunk, in order.

    Work per chunk is a few numpy passes; only a line that starts with whitespace is looked at
    in Python (to tell a blank line from an indented object), and only the unfinished last line
    of a chunk is carried over to the next one.
    """

    def __init__(self) -> None:
        self._carry = b""
        self._carry_at = 0
        self._starts: list[np.ndarray] = []
        self.size = 0

    def feed(self, chunk: bytes) -> None:
        buf = self._carry + chunk if self._carry else chunk
        base = self._carry_at
        self.size += len(chunk)
        arr = np.frombuffer(buf, dtype=np.uint8)
        newlines = np.flatnonzero(arr == 10)
        if len(newlines) == 0:
            self._carry, self._carry_at = buf, base
            return
        starts = np.concatenate(([0], newlines[:-1] + 1))
        self._keep(buf, arr, starts, newlines + 1, base)
        cut = int(newlines[-1]) + 1
        self._carry, self._carry_at = buf[cut:], base + cut

    def _keep(
        self, buf: bytes, arr: np.ndarray, starts: np.ndarray, ends: np.ndarray, base: int
    ) -> None:
        nonempty = starts < ends
        starts, ends = starts[nonempty], ends[nonempty]
        suspect = _WHITESPACE[arr[starts]]
        if suspect.any():
            keep = ~suspect
            for j in np.flatnonzero(suspect):
                keep[j] = bool(buf[int(starts[j]) : int(ends[j])].strip())
            starts = starts[keep]
        self._starts.append(starts.astype(np.int64) + base)

    def finish(self) -> np.ndarray:
        """Offsets (int64, n+1): line starts and the stream's end."""
        if self._carry:
            arr = np.frombuffer(self._carry, dtype=np.uint8)
            self._keep(
                self._carry, arr, np.array([0]), np.array([len(self._carry)]), self._carry_at
            )
            self._carry = b""
        starts = np.concatenate(self._starts) if self._starts else np.zeros(0, np.int64)
        return np.concatenate((starts, [self.size])).astype(np.int64)


class JsonlCodec(BaseCodec):
    """Decodes JSON Lines samples. Each sample is the parsed object (a ``dict``)."""

    format = "jsonl"

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset
        self._inflated = Inflated()

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dataset"])  # type: ignore[misc]

    def _inflate(self, shard: ShardInfo, index: StreamIndex, blob: Blob) -> bytes:
        """The shard decompressed (once for every read that draws from it)."""

        def inflate() -> bytes:
            try:
                declared = int(index.offsets[-1]) if len(index.offsets) else 0
                stream = StreamDecompressor(stream_kind(shard.uri) or "gzip", declared)
                raw = stream.feed(bytes(blob.slice(0, shard.size_bytes)))
                stream.finish()
            except ValueError as exc:
                raise FormatError(str(exc), dataset=self.dataset, uri=shard.uri) from None
            return raw

        raw: bytes = self._inflated.get((shard.uri, shard.version), inflate)
        return raw

    @staticmethod
    def _decode_run(
        blob: Blob, offsets: np.ndarray, samples: Sequence[int]
    ) -> list[dict[str, Any]] | None:
        """A contiguous run of samples (in any order) whose lines are exactly ``{...}\n`` (the
        common case), parsed in one msgspec call with the line checks done in numpy. ``None``
        when not applicable."""
        first, last = min(samples), max(samples)
        if last - first + 1 != len(samples):
            return None
        ordered = all(b - a == 1 for a, b in itertools.pairwise(samples))
        if not ordered and len(set(samples)) != len(samples):
            return None  # not a permutation of a contiguous run
        start, stop = int(offsets[first]), int(offsets[last + 1])
        if not blob.covers(start, stop):
            return None
        data = blob.slice(start, stop)  # not copied
        arr = np.frombuffer(data, dtype=np.uint8)
        heads = offsets[first : last + 1] - start
        ends = offsets[first + 1 : last + 2] - start  # one past each line's newline
        if (
            arr[-1] != 10
            or not (arr[heads] == 123).all()  # "{"
            or not (arr[ends - 1] == 10).all()
            or not (arr[np.maximum(ends - 2, 0)] == 125).all()  # "}" right before "\n"
        ):
            return None
        # A span holding more than its line (or a blank line) parses to more values than
        # samples: refused below, then read line by line.
        values = parse_lines(data)
        if values is None:
            return None
        if len(values) != len(samples) or not all(type(v) is dict for v in values):
            return None
        if ordered:
            return values
        return [values[i - first] for i in samples]

    def use_disk_cache(self, cache: Any) -> None:
        """Keep decompressed shards in ``cache`` (a DiskCache) as well as in memory."""
        self._inflated.disk = cache

    def decode(
        self,
        shard: ShardInfo,
        index: RecordIndex | StreamIndex,
        blob: Blob,
        samples: Sequence[int],
    ) -> list[dict[str, Any]]:
        offsets = index.offsets
        if not isinstance(index, StreamIndex) and len(samples) > 1:
            fast = self._decode_run(blob, offsets, samples)
            if fast is not None:
                return fast
        if isinstance(index, StreamIndex):
            raw = self._inflate(shard, index, blob)
            lines = [raw[offsets[i] : offsets[i + 1]] for i in samples]
        else:
            lines = [blob.bytes(int(offsets[i]), int(offsets[i + 1])) for i in samples]
        # Fast path: all of this read's lines parsed as one JSON array, a single C call
        # instead of one per line. It is taken only if every line is braced like one object
        # and the array has one object per line; anything else (a bad line, a line holding
        # two values) goes line by line, which names the culprit.
        values = None
        if all(x.lstrip()[:1] == b"{" and x.rstrip()[-1:] == b"}" for x in lines):
            try:
                values = parse_json(b"[" + b",".join(lines) + b"]")
            except (ValueError, UnicodeDecodeError):
                values = None
        if (
            values is not None
            and len(values) == len(lines)
            and all(type(v) is dict for v in values)
        ):
            return values  # type: ignore[no-any-return]
        out: list[dict[str, Any]] = []
        for i, line in zip(samples, lines, strict=True):
            try:
                value = parse_json(line)
            except (ValueError, UnicodeDecodeError) as exc:
                raise FormatError(
                    f"line is not valid JSON ({exc})", dataset=self.dataset, uri=shard.uri, sample=i
                ) from None
            if not isinstance(value, dict):
                raise FormatError(
                    f"line is JSON but not an object (got {type(value).__name__})",
                    dataset=self.dataset,
                    uri=shard.uri,
                    sample=i,
                )
            out.append(value)
        return out
