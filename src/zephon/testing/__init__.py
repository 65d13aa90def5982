"""Real local servers for tests, benchmarks and the demo: S3 (moto), GCS (fake-gcs-server),
Azure (Azurite), a static HTTP server, a fault-injecting proxy and a local Ray cluster.
Nothing in the library imports this package.

| module | owns |
| --- | --- |
| ``_loop`` | An asyncio event loop on a daemon thread |
| ``_moto_main`` | Child process of :class:`zephon.testing.MotoServer`: binds port 0, prints it |
| ``_proxy_main`` | Child process of :class:`zephon.testing.faults.ProxyProcess`: starts the proxy |
| ``examples`` | ``serve_examples()``: the docs' example data on a local S3 server |
| ``hub`` | A local server of the Hugging Face Hub's dataset-file API |
| ``local`` | ``local_s3``: a local S3 server with a bucket, for examples that run as printed |
| ``faults`` | A fault-injecting HTTP proxy to put in front of a storage server |
| ``ray`` | A local Ray cluster for tests and benchmarks: ``ray start --head --block`` on lo |
| ``servers`` | Local storage servers: moto (S3), fake-gcs-server (GCS), a static HTTP server |
"""

from zephon.testing.examples import serve_examples
from zephon.testing.faults import FaultProxy, Faults, ProxyProcess
from zephon.testing.hub import HubServer
from zephon.testing.local import local_s3
from zephon.testing.servers import (
    Azurite,
    GCSEmulator,
    MotoServer,
    S3Endpoint,
    StaticHTTPServer,
)

__all__ = [
    "Azurite",
    "FaultProxy",
    "Faults",
    "GCSEmulator",
    "HubServer",
    "MotoServer",
    "ProxyProcess",
    "S3Endpoint",
    "StaticHTTPServer",
    "local_s3",
    "serve_examples",
]
