"""Async storage: one interface over S3, GCS, HTTP, local files and memory.

>>> async with open_storage("s3://bucket/prefix/") as storage:
...     data = await storage.read("s3://bucket/prefix/shard-0.jsonl", 0, 1 << 20)
"""

from zephon.storage.base import Backend, Storage
from zephon.storage.diskcache import DiskCache
from zephon.storage.managed import ManagedStorage
from zephon.storage.memory import MemoryStore
from zephon.storage.policy import RetryPolicy, StorageLimits
from zephon.storage.registry import open_storage, register_backend

__all__ = [
    "Backend",
    "DiskCache",
    "ManagedStorage",
    "MemoryStore",
    "RetryPolicy",
    "Storage",
    "StorageLimits",
    "open_storage",
    "register_backend",
]
