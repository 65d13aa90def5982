"""Async storage: one interface over S3, GCS, Azure, HTTP, local files and memory.

| module | owns |
| --- | --- |
| ``azure`` | Azure Blob Storage (``az://container/path`` |
| ``base`` | The storage contracts |
| ``diskcache`` | A local disk cache of fetched byte ranges, shared by every process on a node |
| ``gate`` | Counting gates: the bounded-concurrency primitives of the storage layer |
| ``gcs`` | Google Cloud Storage through gcsfs's credentials and session, over the JSON API |
| ``hf`` | Datasets on the Hugging Face Hub (``hf://datasets/org/name[@revision]/path``) |
| ``hedge`` | Hedged reads: a read far slower than this client's recent reads is sent again |
| ``http`` | Plain HTTP(S) objects read with ranged GETs through aiohttp |
| ``http_status`` | Translation of plain HTTP answers |
| ``keep`` | Bytes a discovery scan read |
| ``local`` | Local files |
| ``logsecrets`` | credentials kept out of log records, ours and our clients' |
| ``managed`` | ManagedStorage: bounded, retrying, version-pinned reads on top of one backend |
| ``memory`` | In-memory objects: a process-local object store for tests |
| ``policy`` | Policies of a storage client: how it retries and how far it may run ahead |
| ``registry`` | Which backend serves which URI scheme |
| ``s3`` | Amazon S3 and S3-compatible stores (MinIO, moto, R2...) through aiobotocore |
| ``s3_listing`` | S3 listings (ListObjectsV2) at hand-signed URLs through aiohttp |
| ``s3_errors`` | Translation of S3 failures (botocore's errors, aiohttp's) into Zephon's errors |
| ``s3_presigned`` | S3 ranged reads over presigned URLs: the hot path of the S3 backend |
| ``sigv4`` | Presigned S3 GET URLs (AWS Signature Version 4, query parameters) without botocore |
| ``stats`` | Counters of one storage client, cheap enough to update on every request |
| ``uri`` | Splitting storage URIs |
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
