"""The Dataset's selection methods (a mixin): take, skip, split and exclude, and
``exclude=``/``where=`` applied at discovery. What a selection is lives in
:mod:`zephon.dataset.selection`, ``where=`` in :mod:`zephon.dataset.where`."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from zephon.dataset.selection import (
    Everything,
    Excluded,
    Range,
    Selection,
    SplitPart,
    exclusions,
    split_bounds,
)
from zephon.dataset.where import referenced, rejected_rows
from zephon.errors import ConfigError
from zephon.refs import ShardInfo

__all__ = ["Selecting"]


def _count_arg(name: str, n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"{name}(n): n must be an int >= 0, got {n!r}")


class Selecting:
    """Selecting a dataset's samples from metadata; each method returns a new dataset."""

    name: str
    root: str
    shards: tuple[ShardInfo, ...]
    selection: Selection | None

    if TYPE_CHECKING:  # the Dataset's own

        @property
        def num_samples(self) -> int: ...

        async def ahead(self, n: int = 5) -> list[Any]: ...

    def _all(self) -> Selection:
        if self.selection is not None:
            return self.selection
        return Everything(np.array([s.num_samples for s in self.shards], dtype=np.int64))

    def _selected(self, selection: Selection) -> Self:
        out = copy.copy(self)
        out.selection = selection
        return out

    def take(self, n: int) -> Self:
        """The first ``n`` samples (in storage order), as a dataset of its own."""
        _count_arg("take", n)
        return self._selected(Range(self._all(), 0, n))

    def skip(self, n: int) -> Self:
        """All but the first ``n`` samples (in storage order)."""
        _count_arg("skip", n)
        return self._selected(Range(self._all(), n, self.num_samples))

    def split(self, fractions: Mapping[str, float], *, seed: int = 0) -> dict[str, Self]:
        """Deterministic parts, e.g. ``{"train": 0.99, "val": 0.01}``: disjoint, covering
        the dataset when the fractions sum to 1, exact in size (largest remainders), and the
        same whatever the lanes, ranks or shard layout (a sample's part depends on its
        number in storage order and ``seed`` only). Finding each part's count reads no data:
        one pass over the sample numbers.

        Raises:
            ConfigError: a fraction outside (0, 1], or fractions summing past 1.
        """
        bounds = split_bounds(fractions, self.num_samples)
        base = self._all()
        return {
            p: self._selected(SplitPart(base, seed, p, lo, hi)) for p, (lo, hi) in bounds.items()
        }

    def exclude(self, items: Iterable[Any] | str) -> Self:
        """The dataset without some samples (a dedup pass's output): sample numbers in
        storage order, ``(shard, index)`` pairs (a shard by number, URI or path under the
        root), or the path of a local file of them, one JSON value per line. Planning keeps
        them in O(excluded) memory.

        Raises:
            ConfigError: a sample or shard that does not exist (naming it), or an exclusion
                after take/skip/split (exclude first).
        """
        if self.selection is not None:
            raise ConfigError(
                f"dataset {self.name!r}: exclude before take, skip or split (samples are "
                "named by their place in the whole dataset)"
            )
        counts = np.array([s.num_samples for s in self.shards], dtype=np.int64)
        given = items if isinstance(items, str) else list(items)
        gone = exclusions(self.name, given, [s.uri for s in self.shards], self.root, counts)
        digest = hashlib.sha256(
            b"".join(np.int64(s).tobytes() + v.tobytes() for s, v in sorted(gone.items()))
        ).hexdigest()[:16]
        return self._selected(Excluded(Everything(counts), gone, digest))

    async def _aselected(
        self,
        exclude: Iterable[Any] | str | None,
        where: Any,
        projected: Callable[[list[str]], Awaitable[Any]],
        cache: Path | None,
    ) -> Self:
        """This dataset without ``exclude`` and the rows ``where`` rejects (its columns read
        from ``projected(columns)``, a rediscovery reading them alone where it can)."""
        counts = np.array([s.num_samples for s in self.shards], dtype=np.int64)
        gone: dict[int, np.ndarray] = {}
        if exclude is not None:
            given = exclude if isinstance(exclude, str) else list(exclude)
            gone = exclusions(self.name, given, [s.uri for s in self.shards], self.root, counts)
        if where is not None:
            first = await self.ahead(1)
            keys = list(first[0]) if first and isinstance(first[0], dict) else []
            names = referenced(where, keys)
            if not names:
                raise ConfigError(f"dataset {self.name!r}: where {where} names none of its columns")
            rows = await rejected_rows(await projected(names), where, cache)
            for shard, rejected in rows.items():
                gone[shard] = np.union1d(gone.get(shard, np.zeros(0, np.int64)), rejected)
        digest = hashlib.sha256(
            f"{where}".encode()
            + b"".join(np.int64(s).tobytes() + v.tobytes() for s, v in sorted(gone.items()))
        ).hexdigest()[:16]
        return self._selected(Excluded(Everything(counts), gone, digest))
