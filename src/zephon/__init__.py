"""Zephon: an asyncio streaming data loader for model training over cloud object storage."""

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
from zephon.refs import ObjectInfo

__version__ = "0.1.0"

__all__ = [
    "AccessDenied",
    "ConfigError",
    "FormatError",
    "NotFound",
    "ObjectChanged",
    "ObjectInfo",
    "StateMismatch",
    "StorageError",
    "WorkerCrashed",
    "ZephonError",
]
