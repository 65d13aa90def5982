"""Datasets: discovery of shards and sample counts from metadata only."""

from zephon.dataset.cache import PERSISTENT_INDEX_NAME, IndexCache, PersistentIndex
from zephon.dataset.core import Dataset
from zephon.dataset.discover import FORMATS, DiscoveryStats

__all__ = [
    "FORMATS",
    "PERSISTENT_INDEX_NAME",
    "Dataset",
    "DiscoveryStats",
    "IndexCache",
    "PersistentIndex",
]
