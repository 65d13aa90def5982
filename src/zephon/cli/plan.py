"""``zephon plan CONFIG``: the plan of a curriculum before the run (see
:meth:`zephon.StaticMixtureWorkSource.report`).

``CONFIG`` is a TOML or JSON file, or ``module:function`` naming a Python function that
returns a work source. A file lists the datasets, the mixture (static weights or a
schedule) and the work source's other arguments::

    [[datasets]]
    name = "web"
    path = "s3://bucket/web/"          # format, storage_options, take, skip, exclude: optional

    [[datasets]]
    name = "code"
    path = "s3://bucket/code/"

    [schedule]                         # or [mixture] with name = weight
    unit = "samples"                   # or "tokens"
    phases = [
        { position = 0, weights = { web = 0.7, code = 0.3 } },
        { position = 100000, weights = { web = 0.5, code = 0.5 } },
    ]

    [source]                           # any StaticMixtureWorkSource keyword argument
    shuffle = "block"
    stop_after_passes = 1
"""

from __future__ import annotations

import importlib
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

from zephon.errors import ConfigError, ZephonError

__all__ = ["load_work_source", "run_plan"]

_DATASET_KEYS = {"name", "path", "format", "storage_options", "take", "skip", "exclude", "columns"}


def load_work_source(config: str) -> Any:
    """The work source a config file or ``module:function`` describes.

    Raises:
        ConfigError: the file cannot be read or says something invalid (naming it).
    """
    from zephon import Dataset, MixtureSchedule, StaticMixtureWorkSource

    if ":" in config and not Path(config).exists():
        module, _, function = config.partition(":")
        sys.path.insert(0, str(Path.cwd()))
        try:
            made = getattr(importlib.import_module(module), function)()
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"plan: cannot load {config!r}: {exc}") from None
        if not isinstance(made, StaticMixtureWorkSource):
            raise ConfigError(f"plan: {config!r} returned {type(made).__name__}, not a work source")
        return made
    path = Path(config)
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except OSError as exc:
        raise ConfigError(f"plan: cannot read {config!r}: {exc.strerror}") from None
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"plan: {config!r} is not valid {path.suffix or 'TOML'}: {exc}") from None
    entries = data.get("datasets")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"plan: {config!r} lists no [[datasets]]")
    datasets = []
    for i, entry in enumerate(entries):
        unknown = sorted(set(entry) - _DATASET_KEYS) if isinstance(entry, dict) else None
        if unknown is None or "name" not in entry or "path" not in entry or unknown:
            raise ConfigError(
                f"plan: dataset {i} of {config!r} needs a name and a path (and knows only "
                f"{sorted(_DATASET_KEYS)}; got {entry!r:.120})"
            )
        ds = Dataset.from_path(
            entry["name"],
            entry["path"],
            format=entry.get("format"),
            storage_options=entry.get("storage_options"),
            columns=entry.get("columns"),
            exclude=entry.get("exclude"),
        )
        if "skip" in entry:
            ds = ds.skip(entry["skip"])
        if "take" in entry:
            ds = ds.take(entry["take"])
        datasets.append(ds)
    mixture: Any = data.get("mixture")
    if "schedule" in data:
        schedule = data["schedule"]
        phases = [(p["position"], p["weights"]) for p in schedule.get("phases", [])]
        mixture = MixtureSchedule(
            phases,
            unit=schedule.get("unit", "samples"),
            interpolate=schedule.get("interpolate", "step"),
        )
    source = dict(data.get("source", {}))
    try:
        return StaticMixtureWorkSource(datasets, mixture, **source)
    except TypeError as exc:
        raise ConfigError(f"plan: [source] of {config!r}: {exc}") from None


def run_plan(
    config: str,
    lanes: int,
    samples: int | None,
    get_price: float,
    egress_price: float,
    as_json: bool,
    plot: str | None,
) -> int:
    try:
        ws = load_work_source(config)
        report = ws.report(
            lanes, samples=samples, get_price_per_1000=get_price, egress_price_per_gib=egress_price
        )
        if plot:
            report.plot(plot)
    except ZephonError as exc:
        print(f"zephon: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if as_json else report.text())
    if plot:
        print(f"plot: {plot}", file=sys.stderr)
    return 0
