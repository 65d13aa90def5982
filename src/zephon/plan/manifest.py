"""What the planner knows of a dataset: shard sizes and where samples lie. No I/O.

A :class:`Manifest` is built from a discovered :class:`~zephon.dataset.Dataset` or, for
benchmarks and tests, synthesised (:meth:`Manifest.uniform`) without materialising anything per
sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from zephon.arrays import distinct
from zephon.formats.index import (
    FragmentIndex,
    RecordIndex,
    RowGroupIndex,
    StreamIndex,
    WholeIndex,
)

__all__ = ["Layout", "Manifest", "UniformRecords"]


@dataclass(frozen=True, eq=False)
class UniformRecords:
    """``n`` samples of ``sample_bytes`` each, back to back: a record layout with no arrays."""

    n: int
    sample_bytes: int

    @property
    def num_samples(self) -> int:
        return self.n

    def starts(self, samples: np.ndarray) -> np.ndarray:
        return samples.astype(np.int64) * self.sample_bytes

    def stops(self, samples: np.ndarray) -> np.ndarray:
        return (samples.astype(np.int64) + 1) * self.sample_bytes


class _Records:
    """Adapter giving a :class:`RecordIndex` the vectorised span interface."""

    __slots__ = ("offsets",)

    def __init__(self, index: RecordIndex) -> None:
        self.offsets = index.offsets

    def starts(self, samples: np.ndarray) -> np.ndarray:
        return self.offsets[samples]  # type: ignore[no-any-return]

    def stops(self, samples: np.ndarray) -> np.ndarray:
        return self.offsets[samples + 1]  # type: ignore[no-any-return]


class Layout(Protocol):
    def starts(self, samples: np.ndarray) -> np.ndarray: ...
    def stops(self, samples: np.ndarray) -> np.ndarray: ...


class Manifest:
    """One dataset as the planner sees it.

    Attributes:
        name: dataset name (keys the permutations, so renaming reshuffles).
        fingerprint: digest of the shard list; a checkpoint records it.
        shard_samples: samples per shard (int64).
        uris, versions: per shard.
        layouts: per shard, a record layout, a :class:`RowGroupIndex` or a
            :class:`StreamIndex`.
    """

    def __init__(
        self,
        name: str,
        fingerprint: str,
        shard_samples: np.ndarray,
        uris: Sequence[str],
        versions: Sequence[str],
        layouts: Sequence[Any],
        selection: Any = None,
        stored: np.ndarray | None = None,
    ) -> None:
        self.name = name
        # take/skip/split/exclude (zephon.dataset.selection): the planner plans positions
        # among the kept samples of each shard, and reads the samples they are
        self.selection = selection
        self.fingerprint = fingerprint
        self.shard_samples = shard_samples
        self.uris = uris
        self.versions = versions
        self.layouts = layouts
        self._uniform = isinstance(layouts, _Repeat)
        sample = layouts[:1] if self._uniform else layouts
        self._all_records = all(isinstance(x, _Records | UniformRecords) for x in sample)
        self._flat = np.zeros(0, np.int64)
        self._base = np.zeros(0, np.int64)
        if not self._uniform and self._all_records and len(layouts):
            # Record shards' offsets, flattened once, so a chunk's spans are one gather.
            self._flat = np.concatenate([x.offsets for x in layouts])
            sizes = np.array([len(x.offsets) for x in layouts], dtype=np.int64)
            self._base = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        self._all_groups = (
            bool(len(layouts))
            and not self._uniform
            and all(isinstance(x, RowGroupIndex) for x in layouts)
        )
        if self._all_groups:
            # Every row group's first row as a dataset-wide row number, so the row groups of a
            # chunk's samples are one search however many shards they come from.
            rows = shard_samples if stored is None else stored  # what each shard holds
            firsts = np.concatenate(([0], np.cumsum(rows)[:-1]))
            self._group_rows = np.concatenate(
                [first + x.row_starts[:-1] for first, x in zip(firsts, layouts, strict=True)]
            )
            counts = np.array([len(x.row_starts) - 1 for x in layouts], dtype=np.int64)
            self._group_base = np.concatenate(([0], np.cumsum(counts)[:-1]))
            self._first_row = firsts

    @property
    def num_samples(self) -> int:
        return int(self.shard_samples.sum())

    @property
    def num_shards(self) -> int:
        return len(self.shard_samples)

    @property
    def all_records(self) -> bool:
        """Every shard is a record layout: spans come from :meth:`spans`."""
        return self._all_records

    def spans(self, shards: np.ndarray, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Byte spans ``(starts, stops)`` of record samples, vectorised over shards."""
        if self._uniform:
            layout = self.layouts[0]
            return layout.starts(samples), layout.stops(samples)
        at = self._base[shards] + samples
        flat = self._flat
        return flat[at], flat[at + 1]

    @property
    def all_row_groups(self) -> bool:
        """Every shard is Parquet-like: :meth:`row_groups` finds the read units."""
        return self._all_groups

    def row_groups(self, shards: np.ndarray, samples: np.ndarray) -> np.ndarray:
        """The row group (within its shard) holding each ``(shard, sample)``, vectorised."""
        rows = self._first_row[shards] + samples
        found = np.searchsorted(self._group_rows, rows, side="right") - 1
        out: np.ndarray = found - self._group_base[shards]
        return out

    @classmethod
    def from_dataset(cls, dataset: Any) -> Manifest:
        """From a discovered :class:`~zephon.dataset.Dataset`."""
        layouts = [
            _Records(idx) if isinstance(idx, RecordIndex) else idx for idx in dataset.indexes
        ]
        selection = getattr(dataset, "selection", None)
        counts = np.array([s.num_samples for s in dataset.shards], dtype=np.int64)
        return cls(
            dataset.name,
            dataset.fingerprint(),
            counts if selection is None else selection.counts.copy(),
            [s.uri for s in dataset.shards],
            [s.version for s in dataset.shards],
            layouts,
            selection,
            counts,
        )

    def kept(self, shards: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The samples (within their shards) of kept ``positions``: themselves unless the
        dataset selects some of its samples."""
        if self.selection is None or not len(shards):
            return positions
        out = np.empty(len(positions), np.int64)
        for shard in distinct(shards):
            mask = shards == shard
            out[mask] = self.selection.samples(int(shard), positions[mask])
        return out

    @classmethod
    def uniform(
        cls, name: str, num_shards: int, samples_per_shard: int, sample_bytes: int = 512
    ) -> Manifest:
        """A synthetic dataset of equal shards of equal samples (planner benchmarks, tests)."""
        layout = UniformRecords(samples_per_shard, sample_bytes)
        return cls(
            name,
            f"uniform-{num_shards}-{samples_per_shard}-{sample_bytes}",
            np.full(num_shards, samples_per_shard, dtype=np.int64),
            [f"memory://synthetic/{name}/shard-{i:07d}" for i in range(num_shards)],
            ["1"] * num_shards,
            _Repeat(layout, num_shards),
        )

    def sample_nbytes(self, shards: np.ndarray, samples: np.ndarray) -> np.ndarray:
        """Byte length of each ``(shard, sample)``: exact for records, estimated for rows."""
        out = np.empty(len(shards), dtype=np.float64)
        for shard in distinct(shards):
            mask = shards == shard
            layout = self.layouts[int(shard)]
            picked = samples[mask]
            if isinstance(layout, RowGroupIndex | StreamIndex | WholeIndex | FragmentIndex):
                out[mask] = layout.sample_nbytes(picked)
            else:
                out[mask] = layout.stops(picked) - layout.starts(picked)
        return out


class _Repeat(Sequence[Any]):
    def __init__(self, item: Any, n: int) -> None:
        self._item, self._n = item, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._item] * len(range(*i.indices(self._n)))
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._item
