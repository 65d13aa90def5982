"""When a curriculum ends: per-dataset exhaustion policies turned into global draw counts.

The curriculum is defined globally: the datasets are mixed by weight over one stream, and it
ends at the first of

- every dataset has completed ``stop_after_passes`` passes (datasets that complete theirs
  earlier keep repeating until then: ``repeat``);
- a dataset whose policy is ``stop`` completes ``stop_after_passes`` passes (one if ``None``);
- a dataset with ``max_repeats=N`` would start pass ``2 + N``.

If none of these can happen (``repeat`` everywhere, no ``max_repeats``, ``stop_after_passes
=None``) the curriculum is infinite. Otherwise dataset ``d`` is drawn exactly ``c_d`` times in
all, split fairly among lanes (:class:`~zephon.plan.lanes.LaneSplit`), which is what makes
one pass deliver every sample exactly once for any number of lanes.

``c_d`` is computed in exact rational arithmetic from the weights: the stream ends at
``T = limit_e / w_e`` of the dataset ``e`` that ends it, and every other dataset has drawn
``round(T * w_d)`` (half up). With weights proportional to the datasets' sizes every
dataset ends its passes together: ``c_d = passes * n_d``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from zephon.choices import ExhaustedPolicy, choices
from zephon.errors import ConfigError

__all__ = ["POLICIES", "Exhaustion", "per_dataset"]

POLICIES: tuple[str, ...] = choices(ExhaustedPolicy)


def per_dataset(arg: str, value: Any, names: Sequence[str], default: Any) -> list[Any]:
    """One value per dataset from a scalar or a ``{name: value}`` mapping (datasets the
    mapping leaves out take ``default``).

    Raises:
        ConfigError: the mapping names an unknown dataset.
    """
    if not isinstance(value, Mapping):
        return [value] * len(names)
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ConfigError(f"{arg} names unknown datasets {unknown} (datasets: {list(names)})")
    return [value.get(n, default) for n in names]


# Hugging Face's stopping strategies, as this library names them
_THEIRS = {
    "first_exhausted": " (Hugging Face's 'first_exhausted' is exhausted_policy='stop')",
    "all_exhausted": (
        " (Hugging Face's 'all_exhausted' is exhausted_policy='repeat' with stop_after_passes=1)"
    ),
    "all_exhausted_without_replacement": (
        " (Hugging Face's 'all_exhausted_without_replacement' is exhausted_policy='drop')"
    ),
}


@dataclass(frozen=True)
class Exhaustion:
    """Per-dataset exhaustion settings, validated."""

    names: tuple[str, ...]
    policies: tuple[str, ...]
    max_repeats: tuple[int | None, ...]
    reshuffle: tuple[bool, ...]
    passes: int | None

    @classmethod
    def of(
        cls,
        names: Sequence[str],
        policy: Any,
        max_repeats: Any,
        reshuffle: Any,
        passes: int | None,
    ) -> Exhaustion:
        """Raises ``ConfigError`` naming the argument (and dataset) at fault."""
        if passes is not None and (not isinstance(passes, int) or passes < 1):
            raise ConfigError(f"stop_after_passes must be an int >= 1 or None, got {passes!r}")
        policies = per_dataset("exhausted_policy", policy, names, "repeat")
        repeats = per_dataset("max_repeats", max_repeats, names, None)
        shuffles = per_dataset("reshuffle_on_repeat", reshuffle, names, True)
        for name, p, m, s in zip(names, policies, repeats, shuffles, strict=True):
            if p not in POLICIES:
                hint = _THEIRS.get(p, "") if isinstance(p, str) else ""
                raise ConfigError(
                    f"exhausted_policy for {name!r} must be one of {POLICIES}, got {p!r}{hint}"
                )
            if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 0):
                raise ConfigError(f"max_repeats for {name!r} must be an int >= 0, got {m!r}")
            if m is not None and p in ("stop", "drop"):
                raise ConfigError(
                    f"max_repeats={m} for {name!r} conflicts with exhausted_policy={p!r}: "
                    f"a dataset that {p}s never repeats; use exhausted_policy='repeat'"
                )
            if not isinstance(s, bool):
                raise ConfigError(f"reshuffle_on_repeat for {name!r} must be a bool, got {s!r}")
        return cls(tuple(names), tuple(policies), tuple(repeats), tuple(shuffles), passes)

    def describe(self) -> dict[str, Any]:
        """The settings as JSON (part of a curriculum's identity)."""
        return {
            "exhausted_policy": list(self.policies),
            "max_repeats": list(self.max_repeats),
            "reshuffle_on_repeat": list(self.reshuffle),
            "stop_after_passes": self.passes,
        }

    def pass_key(self, d: int, p: int) -> int:
        """The permutation pass ``p`` of dataset ``d`` uses: its own, or pass 0's if the
        dataset keeps its order across repeats."""
        return p if self.reshuffle[d] else 0

    def end_counts(self, weights: Sequence[Fraction], sizes: Sequence[int]) -> list[int] | None:
        """Draws of every dataset in the whole curriculum, or ``None`` if it is infinite."""
        ends: list[Fraction] = []  # stream lengths at which one condition ends it
        limits: list[int | None] = []  # per dataset, the draws it can never exceed
        for d, (w, n) in enumerate(zip(weights, sizes, strict=True)):
            limit = None
            if self.policies[d] == "stop":
                limit = (self.passes or 1) * n
            elif self.max_repeats[d] is not None:
                limit = (1 + self.max_repeats[d]) * n  # type: ignore[operator]
            limits.append(limit)
            if limit is not None:
                ends.append(limit / w)
        if self.passes is not None:  # every dataset completed its passes
            ends.append(max(self.passes * n / w for w, n in zip(weights, sizes, strict=True)))
        if not ends:
            return None
        end = min(ends)
        counts = []
        for w, limit in zip(weights, limits, strict=True):
            c = int(end * w + Fraction(1, 2))  # round half up, exactly
            counts.append(c if limit is None else min(c, limit))
        return counts
