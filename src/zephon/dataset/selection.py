"""Selecting a dataset's samples from metadata: take, skip, split, exclude.

A selection sees the dataset as its selected samples only, numbered in storage order
(*positions*), shard by shard: how many each shard keeps (``counts``) and, for positions in a
shard, the samples they are (:meth:`Selection.samples`). The planner plans over positions and
reads the samples they map to. Selections stack (``ds.skip(10).split(...)["val"].take(5)``),
each over the one before; the first is over the whole dataset.

Memory is O(shards + excluded): a range keeps two numbers, an exclusion its sorted samples,
a split part its per-shard counts (found once by one pass over the dataset's positions) and
the members of the shards read lately.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Protocol

import numpy as np

from zephon.errors import ConfigError
from zephon.permute import key_of, permute

__all__ = ["Everything", "Excluded", "Range", "Selection", "SplitPart", "split_bounds"]

_SCAN = 1 << 20  # positions per numpy pass when a split counts its members
_CACHED_SHARDS = 64


class Selection(Protocol):
    """Which samples of each shard a dataset keeps."""

    counts: np.ndarray  # per shard, samples kept

    def samples(self, shard: int, positions: np.ndarray) -> np.ndarray:
        """The samples (indices within the shard) of a shard's kept ``positions``."""
        ...

    def describe(self) -> list[object]:
        """What was selected, as JSON (part of the dataset's fingerprint)."""
        ...


class Everything:
    """Every sample of shards of ``counts`` samples."""

    def __init__(self, counts: np.ndarray) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)

    def samples(self, shard: int, positions: np.ndarray) -> np.ndarray:
        return positions

    def describe(self) -> list[object]:
        return []


def _starts(counts: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


class Range:
    """Positions ``[lo, hi)`` of ``parent`` (take and skip)."""

    def __init__(self, parent: Selection, lo: int, hi: int) -> None:
        self.parent = parent
        self.lo, self.hi = lo, hi
        starts = _starts(parent.counts)
        first = np.clip(lo, starts[:-1], starts[1:])
        last = np.clip(hi, starts[:-1], starts[1:])
        self.counts = np.maximum(0, last - first)
        self._skip = first - starts[:-1]  # per shard, parent positions before the kept ones

    def samples(self, shard: int, positions: np.ndarray) -> np.ndarray:
        return self.parent.samples(shard, positions + int(self._skip[shard]))

    def describe(self) -> list[object]:
        return [*self.parent.describe(), ["range", self.lo, self.hi]]


class Excluded:
    """``parent`` without some of its positions: per shard, sorted and distinct."""

    def __init__(self, parent: Selection, excluded: Mapping[int, np.ndarray], digest: str) -> None:
        self.parent = parent
        self._gone = {s: np.asarray(v, dtype=np.int64) for s, v in excluded.items() if len(v)}
        self._digest = digest
        self.counts = parent.counts.copy()
        for shard, gone in self._gone.items():
            self.counts[shard] -= len(gone)
        # the k-th kept position of a shard is k plus the excluded ones at or before it
        self._shifted = {s: g - np.arange(len(g)) for s, g in self._gone.items()}

    def samples(self, shard: int, positions: np.ndarray) -> np.ndarray:
        shifted = self._shifted.get(shard)
        if shifted is not None:
            positions = positions + np.searchsorted(shifted, positions, side="right")
        return self.parent.samples(shard, positions)

    def describe(self) -> list[object]:
        return [
            *self.parent.describe(),
            ["exclude", sum(map(len, self._gone.values())), self._digest],
        ]


def split_bounds(fractions: Mapping[str, float], n: int) -> dict[str, tuple[int, int]]:
    """Each part's ``[lo, hi)`` of ``n`` permuted positions: sizes by largest remainders of
    ``n * fraction`` (fractions summing to 1 cover everything, less leave the rest out).

    Raises:
        ConfigError: no parts, a fraction not in (0, 1], or fractions summing past 1.
    """
    if not isinstance(fractions, Mapping) or not fractions:
        raise ConfigError(f"split needs {{part: fraction}}, got {fractions!r:.80}")
    exact: dict[str, Fraction] = {}
    for part, f in fractions.items():
        ok = isinstance(f, int | float | Fraction) and not isinstance(f, bool)
        if not isinstance(part, str) or not ok or not 0 < f <= 1:
            raise ConfigError(f"split fraction of {part!r} must be in (0, 1], got {f!r}")
        exact[part] = Fraction(f).limit_denominator(1_000_000)
    total = sum(exact.values(), Fraction(0))
    if total > 1:
        raise ConfigError(
            f"split fractions sum to {float(total):g}, more than 1: {dict(fractions)}"
        )
    sizes = {p: int(f * n) for p, f in exact.items()}
    # largest remainders, up to the whole when the fractions sum to 1
    want = int(total * n) if total < 1 else n
    order = sorted(exact, key=lambda p: (-(exact[p] * n - sizes[p]), list(exact).index(p)))
    for part in order[: max(0, want - sum(sizes.values()))]:
        sizes[part] += 1
    out, lo = {}, 0
    for part in exact:
        out[part] = (lo, lo + sizes[part])
        lo += sizes[part]
    return out


class SplitPart:
    """The positions of ``parent`` whose image under a keyed permutation of all of them lies
    in ``[lo, hi)``: disjoint parts that cover it, independent of lanes, ranks and how the
    samples are sharded (a position's part depends on its number and the seed only)."""

    def __init__(self, parent: Selection, seed: int, part: str, lo: int, hi: int) -> None:
        self.parent = parent
        self.seed, self.part, self.lo, self.hi = seed, part, lo, hi
        self._starts = _starts(parent.counts)
        self._n = int(self._starts[-1])
        self._key = key_of("split", seed)
        counts = np.zeros(len(parent.counts), np.int64)
        for a in range(0, self._n, _SCAN):
            g = np.arange(a, min(self._n, a + _SCAN), dtype=np.int64)
            inside = self._member(g)
            shard = np.searchsorted(self._starts, g[inside], side="right") - 1
            counts += np.bincount(shard, minlength=len(counts))
        self.counts = counts
        self._members: OrderedDict[int, np.ndarray] = OrderedDict()

    def _member(self, g: np.ndarray) -> np.ndarray:
        image = permute(g, self._n, self._key) if self._n > 1 else np.zeros(len(g), np.int64)
        inside: np.ndarray = (image >= self.lo) & (image < self.hi)
        return inside

    def _of(self, shard: int) -> np.ndarray:
        found = self._members.get(shard)
        if found is None:
            g = np.arange(self._starts[shard], self._starts[shard + 1], dtype=np.int64)
            found = np.flatnonzero(self._member(g)).astype(np.int64)
            self._members[shard] = found
            if len(self._members) > _CACHED_SHARDS:
                self._members.popitem(last=False)
        else:
            self._members.move_to_end(shard)
        return found

    def samples(self, shard: int, positions: np.ndarray) -> np.ndarray:
        return self.parent.samples(shard, self._of(shard)[positions])

    def describe(self) -> list[object]:
        return [*self.parent.describe(), ["split", self.seed, self.part, self.lo, self.hi]]


def per_shard(pairs: Sequence[tuple[int, int]], counts: np.ndarray) -> dict[int, np.ndarray]:
    """``(shard, position)`` pairs grouped by shard, sorted and distinct."""
    out: dict[int, list[int]] = {}
    for shard, position in pairs:
        out.setdefault(shard, []).append(position)
    return {s: np.unique(np.array(v, dtype=np.int64)) for s, v in out.items()}


def exclusions(
    name: str,
    items: object,
    shard_uris: Sequence[str],
    root: str,
    counts: np.ndarray,
) -> dict[int, np.ndarray]:
    """Samples to exclude, per shard: from sample numbers (storage order), ``(shard, index)``
    pairs (a shard by number, URI or path under the root), or a file of them (one JSON value
    per line: a number or a pair).

    Raises:
        ConfigError: an item that is neither, or names a shard or sample that does not exist
            (naming the dataset, shard and sample).
    """
    if isinstance(items, str):
        items = _read_list(name, items)
    if not isinstance(items, Sequence | set | frozenset | np.ndarray):
        raise ConfigError(f"dataset {name!r}: exclude must be a list or a file, got {items!r:.80}")
    starts = _starts(counts)
    total = int(starts[-1])
    by_path = {uri: i for i, uri in enumerate(shard_uris)}
    by_path.update(
        {uri[len(root) :]: i for i, uri in enumerate(shard_uris) if uri.startswith(root)}
    )
    pairs: list[tuple[int, int]] = []
    for item in items:
        if isinstance(item, int | np.integer) and not isinstance(item, bool):
            if not 0 <= int(item) < total:
                raise ConfigError(
                    f"dataset {name!r}: exclude names sample {int(item)}, and it has {total}"
                )
            shard = int(np.searchsorted(starts, int(item), side="right")) - 1
            pairs.append((shard, int(item) - int(starts[shard])))
            continue
        if not (isinstance(item, Sequence) and not isinstance(item, str) and len(item) == 2):
            raise ConfigError(
                f"dataset {name!r}: exclude items are sample numbers or (shard, index) pairs, "
                f"got {item!r:.80}"
            )
        shard_, index = item
        if isinstance(shard_, str):
            if shard_ not in by_path:
                raise ConfigError(
                    f"dataset {name!r}: exclude names shard {shard_!r}, not one of its"
                )
            shard = by_path[shard_]
        elif isinstance(shard_, int) and not isinstance(shard_, bool) and 0 <= shard_ < len(counts):
            shard = shard_
        else:
            raise ConfigError(f"dataset {name!r}: exclude names shard {shard_!r}: no such shard")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < counts[shard]:
            raise ConfigError(
                f"dataset {name!r}: exclude names sample {index!r} of shard "
                f"{shard_uris[shard]!r}, which has {int(counts[shard])}"
            )
        pairs.append((shard, index))
    return per_shard(pairs, counts)


def _read_list(name: str, path: str) -> list[object]:
    """A local file of exclusions: one JSON number or pair per line (blank lines skipped)."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            lines = [(i, line.strip()) for i, line in enumerate(f, 1)]
    except OSError as exc:
        raise ConfigError(f"dataset {name!r}: exclude file {path!r}: {exc.strerror}") from None
    out = []
    for i, line in lines:
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            raise ConfigError(
                f"dataset {name!r}: exclude file {path!r} line {i}: not a number or a pair"
            ) from None
    return out
