"""A token mixture's (or ``max_tokens``'s) tokens per byte: given, or measured by the
pipeline's ``tokenize`` step before planning and then frozen into the curriculum (a mixin of
the work source)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zephon.errors import ConfigError
from zephon.plan.runs import probe_sample_bytes

__all__ = ["TokenRatios"]


class TokenRatios:
    """Per dataset, tokens per byte and tokens per sample."""

    names: list[str]
    manifests: list[Any]
    mixture_unit: str
    tokens_per_byte: list[float | None] | None
    max_tokens: list[int | None] | None

    def uncalibrated(self) -> list[str]:
        """Datasets of a token mixture whose tokens-per-byte ratio is not known yet."""
        if self.tokens_per_byte is None:
            return []
        if self.mixture_unit == "samples":  # ratios for max_tokens only
            return [
                n
                for n, r, cap in zip(
                    self.names, self.tokens_per_byte, self.max_tokens or [], strict=False
                )
                if r is None and cap is not None
            ]
        return [n for n, r in zip(self.names, self.tokens_per_byte, strict=True) if r is None]

    def calibrate(self, ratios: Mapping[str, float]) -> None:
        """Set measured tokens-per-byte ratios of the datasets that lack one (given ratios
        stay). Done once, before planning: from then on the ratios are part of the
        curriculum (:meth:`describe`), frozen into every checkpoint."""
        if self.tokens_per_byte is None:
            raise ConfigError("calibrate() applies only with mixture_unit='tokens' or max_tokens")
        bad = {k: v for k, v in ratios.items() if k not in self.names or not v > 0}
        if bad:
            raise ConfigError(f"calibrate(): unknown datasets or non-positive ratios {bad}")
        self.tokens_per_byte = [
            r if r is not None else (float(ratios[n]) if n in ratios else None)
            for n, r in zip(self.names, self.tokens_per_byte, strict=True)
        ]

    def _ratios(self) -> list[float]:
        missing = self.uncalibrated()
        if missing:
            what = "mixture_unit='tokens'" if self.mixture_unit == "tokens" else "max_tokens"
            raise ConfigError(
                f"{what} needs tokens_per_byte for {missing}: pass them, or add "
                "a tokenize() step to the pipeline, which measures them"
            )
        assert self.tokens_per_byte is not None
        return [r if r is not None else 0.0 for r in self.tokens_per_byte]

    def tokens_per_sample(self) -> list[float]:
        """Each dataset's estimated mean tokens per sample (bytes times tokens per byte)."""
        return [
            r * probe_sample_bytes(m) for r, m in zip(self._ratios(), self.manifests, strict=True)
        ]
