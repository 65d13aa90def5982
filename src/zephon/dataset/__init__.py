"""Datasets: discovery of shards and sample counts from metadata only.

| module | owns |
| --- | --- |
| ``builders`` | Per-format index building: the only place where discovery reads shard bytes |
| ``cache`` | Where shard indexes are kept between runs |
| ``construct`` | How a Dataset is made: discovered from a path, or from in-memory records |
| ``core`` | The Dataset: a named, ordered collection of shards with known sample counts |
| ``discover`` | Discovery: from a path to a :class:`~zephon.dataset.core.Dataset` |
| ``locate`` | Where a dataset is: the objects a path names |
| ``records`` | in-memory records as JSONL shards in the memory store (``from_records``) |
| ``share`` | A persistent index read by one rank and broadcast to its process group |
| ``selecting`` | the Dataset's take, skip, split and exclude (a mixin) |
| ``selection`` | take, skip, split and exclude: the samples of each shard a dataset keeps |
| ``sync`` | discovery and reads from synchronous code, in a notebook too |
| ``where`` | ``where=``: the rows a predicate keeps, found once at discovery and cached |
| ``names`` | What object names say: the format an extension implies, shard order |
| ``registry`` | the formats Zephon reads, in one table: extensions, index builders, codecs |
"""

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
