"""One rank reads, the others receive: a dataset's persistent index over ``torch.distributed``.

When a training job has initialised ``torch.distributed`` (Zephon never initialises it, nor
imports torch for it), a thousand ranks discovering the same dataset would each GET the same
index at the same moment: a herd that object stores answer with throttling. Instead rank 0 of
the default process group reads it and broadcasts the bytes (a status and a length, then the
bytes, as tensors: nothing is pickled), so the job makes one GET instead of one per rank. Every
rank then parses and checks the bytes itself.

The broadcast is a collective: every rank of the group must discover the same datasets in
the same order (as a training script does, ``from_path`` by ``from_path``). A rank that
discovers a dataset alone must pass ``broadcast_index=False``. The payload names the index it
carries; a rank that expected another one (datasets discovered concurrently, finishing in
another order on rank 0) raises :class:`~zephon.errors.ConfigError` instead of using it.
Tensors travel on the CPU where the group's backend takes them (gloo, or a ``cpu:gloo``
part), else on the current CUDA device (NCCL).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from zephon import errors
from zephon.errors import ConfigError, NotFound, StorageError

__all__ = ["group_world", "shared_read"]

_ONE_AT_A_TIME = threading.Lock()  # collectives of one process go out in one order
_BYTES, _NONE, _ERROR = 0, 1, 2  # what rank 0 sends


def group_world() -> tuple[int, int] | None:
    """(rank, world size) of the initialised default process group, or ``None`` (torch not
    imported by the program, not initialised, or a group of one)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    world = dist.get_world_size()
    return (dist.get_rank(), world) if world > 1 else None


async def shared_read(uri: str, read: Callable[[], Awaitable[bytes]]) -> bytes | None:
    """``read()`` on rank 0 of the process group, its bytes on every rank (``None`` where
    rank 0 found nothing: ``NotFound``); a storage error on rank 0 is raised on every rank.
    Without a group of more than one rank, ``read()`` here."""
    where = group_world()
    if where is None:
        try:
            return await read()
        except NotFound:
            return None
    if where[0] != 0:
        return await asyncio.to_thread(_receive, uri)
    try:
        data = await read()
    except NotFound:
        await asyncio.to_thread(_send, uri, _NONE, b"")
        return None
    except StorageError as exc:
        await asyncio.to_thread(_send, uri, _ERROR, _error_payload(exc))
        raise
    except BaseException:
        await asyncio.to_thread(_send, uri, _ERROR, b"{}")
        raise
    await asyncio.to_thread(_send, uri, _BYTES, data)
    return data


def _error_payload(exc: StorageError) -> bytes:
    fields = {"kind": type(exc).__name__, "message": exc.message, "status": exc.status}
    return json.dumps({**fields, "code": exc.code}).encode()


def _device(dist: Any) -> Any:
    import torch

    backend = str(dist.get_backend())
    if "gloo" in backend or backend == "mpi":
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _send(uri: str, status: int, data: bytes) -> None:
    import torch
    import torch.distributed as dist

    name = uri.encode()
    device = _device(dist)
    with _ONE_AT_A_TIME:
        header = torch.tensor([status, len(name), len(data)], dtype=torch.int64, device=device)
        dist.broadcast(header, src=0)
        body = torch.frombuffer(bytearray(name + data), dtype=torch.uint8)
        dist.broadcast(body.to(device), src=0)


def _receive(uri: str) -> bytes | None:
    import torch
    import torch.distributed as dist

    device = _device(dist)
    with _ONE_AT_A_TIME:
        header = torch.zeros(3, dtype=torch.int64, device=device)
        dist.broadcast(header, src=0)
        status, name_length, length = (int(v) for v in header.tolist())
        body = torch.empty(name_length + length, dtype=torch.uint8, device=device)
        dist.broadcast(body, src=0)
    raw = body.cpu().numpy().tobytes()
    sent = raw[:name_length].decode()
    if sent != uri:
        raise ConfigError(
            f"rank 0 broadcast the index {errors.redact_uri(sent)} where this rank expected "
            f"{errors.redact_uri(uri)}: discover datasets in the same order on every rank (one "
            "after another), or pass broadcast_index=False"
        )
    data = raw[name_length:]
    if status == _BYTES:
        return data
    if status == _NONE:
        return None
    raise _rebuilt(json.loads(data or b"{}"), uri)


def _rebuilt(fields: dict[str, Any], uri: str) -> StorageError:
    """The storage error rank 0 met, raised again here (of its class where it is one)."""
    kind = getattr(errors, str(fields.get("kind")), StorageError)
    if not (isinstance(kind, type) and issubclass(kind, StorageError)):
        kind = StorageError
    message = str(fields.get("message") or "rank 0 could not read it")
    status, code = fields.get("status"), fields.get("code")
    return kind(
        f"{message} (read by rank 0 for the process group)",
        uri=uri,
        status=status if isinstance(status, int) else None,
        code=code if isinstance(code, str) else None,
    )
