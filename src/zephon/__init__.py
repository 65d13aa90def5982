"""Zephon: an asyncio streaming data loader for model training over cloud object storage."""

from zephon.dataset import Dataset
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
from zephon.pipeline import Pipeline
from zephon.plan import StaticMixtureWorkSource
from zephon.refs import ObjectInfo, ShardInfo

__version__ = "0.1.0"

__all__ = [
    "AccessDenied",
    "ConfigError",
    "Dataset",
    "FormatError",
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
]
