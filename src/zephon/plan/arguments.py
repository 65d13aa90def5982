"""A work source's arguments, checked and normalised: every invalid one is a ``ConfigError``
naming it, raised when the work source is built."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from zephon.choices import MixtureUnit, choices
from zephon.errors import ConfigError
from zephon.plan.manifest import Manifest
from zephon.plan.mixture import rational_weights
from zephon.plan.order import SHUFFLES
from zephon.plan.schedule import MixtureSchedule, Phase

__all__ = [
    "check_arguments",
    "check_budgets",
    "mixture_phases",
    "mixture_weights",
    "tokens_per_byte_of",
]

_UNITS: tuple[str, ...] = choices(MixtureUnit)


def check_arguments(
    manifests: Sequence[Manifest],
    shuffle: str,
    mixture_unit: str,
    chunk_size: int,
    block_size: int | None,
    run_size: int | None,
    gap: int,
    max_request: int,
) -> None:
    """Raises ``ConfigError`` naming the first invalid argument of a work source."""
    names = [m.name for m in manifests]
    if len(set(names)) != len(names):
        raise ConfigError(f"datasets: names must be distinct, got {names}")
    if shuffle not in SHUFFLES:
        raise ConfigError(f"shuffle must be one of {SHUFFLES}, got {shuffle!r}")
    if mixture_unit not in _UNITS:
        raise ConfigError(f"mixture_unit must be one of {_UNITS}, got {mixture_unit!r}")
    if chunk_size < 1:
        raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
    if block_size is not None and block_size < 1:
        raise ConfigError(f"block_size must be >= 1 or None, got {block_size}")
    if gap < 0 or max_request < 1:
        raise ConfigError("coalesce_gap_bytes must be >= 0 and max_request_bytes >= 1")
    empty = [m.name for m in manifests if m.num_samples == 0]
    if empty:
        raise ConfigError(f"datasets {empty} have no samples")
    if run_size is not None and (run_size < 1 or (chunk_size % run_size and run_size % chunk_size)):
        raise ConfigError(
            f"run_size must divide chunk_size ({chunk_size}) or be a multiple of it, got {run_size}"
        )


def mixture_phases(
    names: Sequence[str],
    sizes: Sequence[int],
    mixture: Mapping[str, float] | MixtureSchedule | None,
) -> list[Phase]:
    """The mixture as phases: a schedule's, or one phase at 0 of static weights."""
    if isinstance(mixture, MixtureSchedule):
        return mixture.bind(names)
    return [Phase(0, tuple(mixture_weights(names, sizes, mixture)))]


def check_budgets(
    names: Sequence[str], max_samples: object, max_tokens: object
) -> tuple[list[int | None] | None, list[int | None] | None]:
    """``max_samples`` and ``max_tokens`` per dataset (``None`` where not capped), or ``None``
    if not given. Raises ``ConfigError`` naming a cap on an unknown dataset or a bad value."""
    out: list[list[int | None] | None] = []
    for arg, given in (("max_samples", max_samples), ("max_tokens", max_tokens)):
        if given is None:
            out.append(None)
            continue
        if not isinstance(given, Mapping):
            raise ConfigError(f"{arg} must map dataset names to counts, got {given!r:.80}")
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ConfigError(f"{arg} names unknown datasets {unknown} (datasets: {list(names)})")
        for name, cap in given.items():
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                raise ConfigError(f"{arg} for {name!r} must be an int >= 1, got {cap!r}")
        out.append([given.get(n) for n in names])
    return out[0], out[1]


def mixture_weights(
    names: Sequence[str], sizes: Sequence[int], mixture: Mapping[str, float] | None
) -> list[Fraction]:
    """Exact weights of the datasets ``names``: by ``mixture``, else by their sizes."""
    if mixture is None:
        return rational_weights(list(sizes))
    if not isinstance(mixture, Mapping):
        example = {n: 1.0 for n in names}
        raise ConfigError(
            f"mixture must map dataset names to weights, e.g. {example}; "
            f"got {type(mixture).__name__}"
        )
    unknown = sorted(set(mixture) - set(names))
    missing = sorted(set(names) - set(mixture))
    if unknown or missing:
        raise ConfigError(
            f"mixture names must match the datasets {names}: unknown {unknown}, missing {missing}"
        )
    bad = {k: v for k, v in mixture.items() if not (isinstance(v, int | float) and v > 0)}
    if bad:
        raise ConfigError(f"mixture weights must be positive numbers, got {bad}")
    return rational_weights([mixture[n] for n in names])


def tokens_per_byte_of(
    names: Sequence[str],
    mixture_unit: str,
    given: Mapping[str, float] | float | None,
    token_budgets: bool = False,
) -> list[float | None] | None:
    """Per dataset, the tokens-per-byte ratio given (``None`` where it will be measured),
    or ``None`` unless the mixture is by tokens or has ``max_tokens`` budgets."""
    if mixture_unit != "tokens" and not token_budgets:
        if given is not None:
            raise ConfigError(
                "tokens_per_byte applies only with mixture_unit='tokens' or max_tokens"
            )
        return None
    if isinstance(given, int | float) and not isinstance(given, bool):
        given = dict.fromkeys(names, float(given))  # one ratio for every dataset
    if given is not None and not isinstance(given, Mapping):
        raise ConfigError(
            f"tokens_per_byte must be a number or a {{dataset: number}} mapping, got {given!r}"
        )
    given = dict(given or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ConfigError(f"tokens_per_byte names unknown datasets {unknown}")
    if any(not v > 0 for v in given.values()):
        raise ConfigError(f"tokens_per_byte must be positive, got {given}")
    # Datasets left out are measured later: see calibrate().
    return [float(given[n]) if n in given else None for n in names]
