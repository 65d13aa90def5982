"""Real local servers for tests, benchmarks and the demo: S3 (moto), GCS (fake-gcs-server),
a static HTTP server and a fault-injecting proxy. Nothing in the library imports this package."""

from zephon.testing.faults import FaultProxy, Faults, ProxyProcess
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
    "MotoServer",
    "ProxyProcess",
    "S3Endpoint",
    "StaticHTTPServer",
]
