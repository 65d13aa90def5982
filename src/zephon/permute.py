"""Keyed bijective permutations of ``[0, n)``, evaluated at any index in O(1) memory.

A 4-round Feistel network over the smallest even number of bits that covers ``n`` is a
bijection of ``[0, 2**bits)``; *cycle walking* (applying it again to any output ``>= n``)
restricts it to a bijection of ``[0, n)``. Because ``2**bits < 4n``, fewer than four
applications are needed on average. Everything is vectorised over numpy ``uint64`` arrays, so a
chunk of a thousand indices costs a few dozen numpy calls.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

__all__ = ["key_of", "permute", "permute_keyed"]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_ROUNDS = 4


def key_of(*parts: object) -> int:
    """A stable 64-bit key from any printable parts (same on every machine and Python)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


def _feistel(x: np.ndarray, half_bits: int, round_keys: np.ndarray) -> np.ndarray:
    mask = np.uint64((1 << half_bits) - 1)
    shift = np.uint64(half_bits)
    left, right = x >> shift, x & mask
    for k in round_keys:
        left, right = right, left ^ (_mix(right ^ k) & mask)
    return (left << shift) | right


@functools.lru_cache(maxsize=4096)
def _round_keys(key: int) -> np.ndarray:
    # Derived by hashing, not by a numpy generator, whose algorithms may change across releases.
    return np.array([key_of("round", key, r) for r in range(_ROUNDS)], dtype=np.uint64)


def _cycle_walk(indices: np.ndarray, n: int, round_keys: np.ndarray) -> np.ndarray:
    """Images under the Feistel network of ``round_keys`` (one key per round, or per round
    and index), walked back into ``[0, n)``."""
    bits = max(2, int(n - 1).bit_length())
    bits += bits & 1
    half = bits // 2
    out = _feistel(np.asarray(indices, dtype=np.uint64), half, round_keys)
    limit = np.uint64(n)
    outside = out >= limit
    while outside.any():
        keys = round_keys if round_keys.ndim == 1 else round_keys[:, outside]
        out[outside] = _feistel(out[outside], half, keys)
        outside = out >= limit
    return out.astype(np.int64)


def permute(indices: np.ndarray, n: int, key: int) -> np.ndarray:
    """``perm_key(indices)`` for the permutation of ``[0, n)`` selected by ``key``.

    Args:
        indices: int array, every value in ``[0, n)``.
        n: domain size (``>= 1``).
        key: 64-bit key; different keys give independent-looking permutations.

    Returns:
        int64 array of the same shape: the images of ``indices``.
    """
    if n <= 1:
        return np.zeros(np.shape(indices), dtype=np.int64)
    return _cycle_walk(indices, n, _round_keys(key))


def permute_keyed(indices: np.ndarray, n: int, keys: list[int], which: np.ndarray) -> np.ndarray:
    """Many permutations of ``[0, n)`` at once: index ``i`` goes through the permutation of
    ``keys[which[i]]``. The same images as :func:`permute` one key at a time, for the numpy
    calls of one."""
    if n <= 1:
        return np.zeros(np.shape(indices), dtype=np.int64)
    if len(keys) == 1:
        return _cycle_walk(indices, n, _round_keys(keys[0]))
    table = np.stack([_round_keys(k) for k in keys], axis=1)  # (rounds, keys)
    return _cycle_walk(indices, n, table[:, which])
