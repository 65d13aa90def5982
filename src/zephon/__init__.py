"""Zephon: an asyncio streaming data loader for model training over cloud object storage.

The names below are imported on first use (PEP 562): a worker process that imports only
``zephon.ops.image`` (say) does not pay for the storage clients, Parquet and the planner
(about 0.3 s of a fresh interpreter's start-up).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from zephon.context import sample_pass
from zephon.errors import (
    AccessDenied,
    ConfigError,
    FormatError,
    NotFound,
    ObjectChanged,
    StateMismatch,
    StorageError,
    WorkerCrashed,
    ZephonError,
)
from zephon.refs import ObjectInfo, ShardInfo

if TYPE_CHECKING:
    from zephon.dataset import Dataset
    from zephon.pipeline import Pipeline
    from zephon.plan import MixtureSchedule, StaticMixtureWorkSource

__version__ = "0.1.0"

_LAZY = {
    "Dataset": "zephon.dataset",
    "MixtureSchedule": "zephon.plan",
    "Pipeline": "zephon.pipeline",
    "StaticMixtureWorkSource": "zephon.plan",
}

__all__ = [
    "AccessDenied",
    "ConfigError",
    "Dataset",
    "FormatError",
    "MixtureSchedule",
    "NotFound",
    "ObjectChanged",
    "ObjectInfo",
    "Pipeline",
    "ShardInfo",
    "StateMismatch",
    "StaticMixtureWorkSource",
    "StorageError",
    "WorkerCrashed",
    "ZephonError",
    "sample_pass",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"zephon.{name}") is not None:
        value = importlib.import_module(f"zephon.{name}")  # a subpackage: zephon.pipeline...
    else:
        raise AttributeError(f"module 'zephon' has no attribute {name!r}")
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
