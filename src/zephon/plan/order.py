"""The order of one dataset's samples in one pass: the four shuffle modes.

Each maps a rank ``k`` in ``[0, N)`` to ``(shard, sample)`` for pass ``p``, vectorised:

- ``none``: storage order.
- ``shards``: shards in a permuted order, samples in order within each.
- ``block``: the ``shards`` order, cut into blocks of ``block_size`` ranks (a few shards).
  Within a block, *runs* of ``run_size`` consecutive ranks are permuted; each window of
  ``chunk_size`` ranks then takes its runs round-robin, in a keyed order. A chunk is thus an
  interleave of whole runs from random places in its block, and any stretch of consecutive
  ranks (a chunk cut short by the mixture, say) takes a contiguous piece of each run: reads
  stay dense. If ``run_size`` does not divide ``chunk_size``, ranks are permuted freely
  within each window instead.
- ``global``: a full bijective permutation of ``[0, N)``, then storage order.

Every permutation is keyed by (seed, dataset name, pass[, block]); memory is O(shards) (the
cumulative sizes of the pass's shard order), never O(samples).
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from typing import Any

import numpy as np

from zephon.arrays import distinct, per_distinct
from zephon.choices import ShuffleMode, choices
from zephon.permute import key_of, permute, permute_keyed
from zephon.plan.manifest import Manifest

__all__ = ["SHUFFLES", "DatasetOrder"]

SHUFFLES: tuple[str, ...] = choices(ShuffleMode)
_PASS_CACHE = 2  # a lane straddles at most two passes at once


class DatasetOrder:
    """Rank -> (shard, sample) of one dataset, per pass."""

    def __init__(
        self,
        manifest: Manifest,
        shuffle: str,
        seed: int,
        block_size: int,
        window: int = 1024,
        run_size: int = 64,
    ) -> None:
        self.manifest = manifest
        self.shuffle = shuffle
        self.seed = seed
        self.block_size = block_size
        self.window = window
        self.run_size = run_size
        self.n = manifest.num_samples
        self._storage_cum = np.concatenate(([0], np.cumsum(manifest.shard_samples)))
        self._passes: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def _shard_order(self, pass_: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard permutation, cumulative sizes in that order) of a pass."""
        cached = self._passes.get(pass_)
        if cached is not None:
            self._passes.move_to_end(pass_)
            return cached
        shards = self.manifest.num_shards
        key = key_of("shards", self.seed, self.manifest.name, pass_)
        perm = permute(np.arange(shards, dtype=np.int64), shards, key)
        cum = np.concatenate(([0], np.cumsum(self.manifest.shard_samples[perm])))
        self._passes[pass_] = (perm, cum)
        if len(self._passes) > _PASS_CACHE:
            self._passes.popitem(last=False)
        return perm, cum

    def locate(self, pass_: int, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shards, samples)`` of ``ranks`` (int64 array within ``[0, N)``) in pass ``pass_``."""
        if self.shuffle == "none":
            return self._split(ranks, None, self._storage_cum)
        if self.shuffle == "global":
            key = key_of("global", self.seed, self.manifest.name, pass_)
            return self._split(permute(ranks, self.n, key), None, self._storage_cum)
        perm, cum = self._shard_order(pass_)
        if self.shuffle == "block":
            ranks = self._within_blocks(pass_, ranks)
        return self._split(ranks, perm, cum)

    def locate_passes(
        self, passes: list[int], which: np.ndarray, ranks: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`locate` of rank ``ranks[i]`` in pass ``passes[which[i]]``, for many passes
        at once: a lane's chunk spans many passes of a dataset smaller than the chunk (25
        of 40 samples in a chunk of 1,000), and each pass's permutations cost a few dozen
        numpy calls however few ranks it has. A dataset of one window and one block gets
        every pass's permutations from the same few calls (keyed per rank); the same
        positions as pass by pass."""
        if self.shuffle == "none":
            return self._split(ranks, None, self._storage_cum)
        small = self.n < self.window and self.n <= self.block_size  # one block, one window
        if len(passes) < 4 or (self.shuffle == "block" and not small):
            shards = np.empty(len(ranks), np.int64)
            samples = np.empty(len(ranks), np.int64)
            for i, pass_ in enumerate(passes):
                mask = which == i
                shards[mask], samples[mask] = self.locate(pass_, ranks[mask])
            return shards, samples
        name = self.manifest.name
        if self.shuffle == "global":
            keys = [key_of("global", self.seed, name, q) for q in passes]
            return self._split(permute_keyed(ranks, self.n, keys, which), None, self._storage_cum)
        # Each pass's shard order and cumulative sizes as rows; every row lifted by
        # ``pass * n`` makes one sorted array, so one search places every rank in its row.
        count, width = len(passes), self.manifest.num_shards
        keys = [key_of("shards", self.seed, name, q) for q in passes]
        rows = np.repeat(np.arange(count, dtype=np.int64), width)
        perms = permute_keyed(
            np.tile(np.arange(width, dtype=np.int64), count), width, keys, rows
        ).reshape(count, width)
        cum = np.zeros((count, width + 1), np.int64)
        np.cumsum(self.manifest.shard_samples[perms], axis=1, out=cum[:, 1:])
        if self.shuffle == "block":
            ranks = self._small_block(passes, which, ranks)
        lifted = (cum + np.arange(count, dtype=np.int64)[:, None] * self.n).ravel()
        at = np.searchsorted(lifted, ranks + which * self.n, side="right") - 1
        row, slot = np.divmod(at, width + 1)
        return perms[row, slot].astype(np.int64), (ranks - cum[row, slot]).astype(np.int64)

    def _small_block(self, passes: list[int], which: np.ndarray, p: np.ndarray) -> np.ndarray:
        """:meth:`_within_blocks` of a dataset shorter than a window (so one block, one
        short window per pass), for ranks of many passes at once."""
        run, n, seed, name = self.run_size, self.n, self.seed, self.manifest.name
        per = n // run
        p = p.astype(np.int64, copy=True)
        if per < 2:
            keys = [key_of("window", seed, name, q, 0, 0) for q in passes]
            p = permute_keyed(p, n, keys, which)
        else:
            inside = p < per * run
            t, slot = np.divmod(p[inside], per)
            keys = [key_of("slots", seed, name, q, 0, 0) for q in passes]
            p[inside] = permute_keyed(slot, per, keys, which[inside]) * run + t
        runs = n // run
        whole = p < runs * run
        if runs > 1 and whole.any():
            keys = [key_of("runs", seed, name, q, 0) for q in passes]
            moved = permute_keyed(p[whole] // run, runs, keys, which[whole])
            p[whole] = moved * run + p[whole] % run
        return p

    def _within_blocks(self, pass_: int, ranks: np.ndarray) -> np.ndarray:
        size, window, run = self.block_size, self.window, self.run_size
        interleave = window % run == 0 and window > run
        blocks = ranks // size
        out = np.empty_like(ranks)
        name = self.manifest.name
        for block in distinct(blocks):
            mask = blocks == block
            base = block * size
            domain = min(size, self.n - base)
            pos = ranks[mask] - base
            windows = pos // window
            p = pos - windows * window
            full = windows < domain // window  # full windows: all permuted in one go
            if full.any():
                ids = windows[full]
                which = distinct(ids)
                at = np.searchsorted(which, ids) if len(which) > 1 else ids * 0
                if interleave:
                    # Round-robin over the window's runs, in a keyed order, each run in file
                    # order: any stretch of consecutive ranks takes a contiguous piece of
                    # every run, so reads stay dense. (A rotation of each run would add
                    # little randomness and split pieces that the gap rule then merges.)
                    per = window // run
                    keys = [key_of("slots", self.seed, name, pass_, block, w) for w in which]
                    t, slot = np.divmod(p[full], per)
                    if per * len(which) * 4 <= len(slot):  # many ranks per slot: each once
                        pair = np.asarray(at) * per + slot

                        def slot_images(u: np.ndarray, n: int = per, k: list[int] = keys) -> Any:
                            return permute_keyed(u % n, n, k, u // n)

                        images = per_distinct(pair, slot_images)
                        p[full] = images * run + t
                    else:
                        p[full] = permute_keyed(slot, per, keys, at) * run + t
                else:
                    keys = [key_of("window", self.seed, name, pass_, block, w) for w in which]
                    p[full] = permute_keyed(p[full], window, keys, at)
            if not full.all():  # the block's last, short window
                w = domain // window
                p[~full] = self._short_window(p[~full], domain - w * window, block, w, pass_)
            pos = windows * window + p
            runs = domain // run  # whole runs moved around the block; a short tail stays put
            whole = pos < runs * run
            if runs > 1 and whole.any():
                # A chunk's ranks lie in a few runs: permute each run once, not each rank.
                key = key_of("runs", self.seed, name, pass_, block)
                moved = per_distinct(pos[whole] // run, partial(permute, n=runs, key=key))
                pos[whole] = moved * run + pos[whole] % run
            out[mask] = base + pos
        return out

    def _short_window(self, p: np.ndarray, width: int, block: int, w: int, pass_: int) -> Any:
        """Positions ``p`` of a window cut short (the pass's last) of ``width`` ranks: its
        whole runs taken round-robin in a keyed order like a full window's (reads stay
        dense), the short rest in file order; freely permuted if it holds under two runs."""
        run, name = self.run_size, self.manifest.name
        per = width // run
        if per < 2:
            return permute(p, width, key_of("window", self.seed, name, pass_, block, w))
        inside = p < per * run
        t, slot = np.divmod(p[inside], per)
        key = key_of("slots", self.seed, name, pass_, block, w)
        out = p.copy()
        out[inside] = permute(slot, per, key) * run + t
        return out

    @staticmethod
    def _split(
        ranks: np.ndarray, perm: np.ndarray | None, cum: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        slot = np.searchsorted(cum, ranks, side="right") - 1
        samples = ranks - cum[slot]
        shards = slot if perm is None else perm[slot]
        return shards.astype(np.int64), samples.astype(np.int64)
