"""Ranks: a pipeline's data-parallel coordinates, given or found.

Every process of one data-parallel group (the tensor- and pipeline-parallel peers that train
on the same batch) must read the same samples, so a pipeline is placed by its data-parallel
rank and size, not by the global rank. They come from, in order: ``dp_rank``/``dp_size`` or
``rank``/``world_size`` as given; a torch ``DeviceMesh`` given as ``device_mesh``; the mesh
of an enclosing ``with mesh:`` block; ``torch.distributed``'s rank and world size; ``RANK``
and ``WORLD_SIZE``; ``(0, 1)``. A mesh's data-parallel dimensions are those named ``dp``,
``data_parallel``, or ``dp_replicate`` and ``dp_shard`` (either or both, as torchtitan
names them).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from zephon.errors import ConfigError

__all__ = ["DP_DIMS", "coordinates", "default_rank", "mesh_coordinates"]

DP_DIMS: tuple[tuple[str, ...], ...] = (("dp",), ("data_parallel",), ("dp_replicate", "dp_shard"))


def coordinates(
    rank: int | None,
    world_size: int | None,
    dp_rank: int | None,
    dp_size: int | None,
    device_mesh: Any,
) -> tuple[int, int]:
    """``(rank, world_size)`` of the data-parallel group this process reads for.

    Raises:
        ConfigError: coordinates given twice, or half given, or a mesh without a
            data-parallel dimension.
    """
    if dp_rank is not None or dp_size is not None:
        if dp_rank is None or dp_size is None:
            raise ConfigError("dp_rank and dp_size go together: pass both")
        if (rank is not None and rank != dp_rank) or (
            world_size is not None and world_size != dp_size
        ):
            raise ConfigError(
                f"rank/world_size ({rank}, {world_size}) and dp_rank/dp_size ({dp_rank}, "
                f"{dp_size}) name the same coordinates: pass one pair"
            )
        rank, world_size = dp_rank, dp_size
    if device_mesh is not None:
        if rank is not None or world_size is not None:
            raise ConfigError("device_mesh gives the data-parallel coordinates: pass no rank too")
        return mesh_coordinates(device_mesh)
    if rank is None or world_size is None:
        found_rank, found_world = default_rank()
        rank = found_rank if rank is None else rank
        world_size = found_world if world_size is None else world_size
    return rank, world_size


def mesh_coordinates(mesh: Any) -> tuple[int, int]:
    """``(dp_rank, dp_size)`` of this process in a torch ``DeviceMesh``: its coordinate
    along the data-parallel dimensions (several, as one, outer first).

    Raises:
        ConfigError: the mesh names no data-parallel dimension, or lacks this process.
    """
    names = tuple(mesh.mesh_dim_names or ())
    dims = next((d for d in (tuple(n for n in ds if n in names) for ds in DP_DIMS) if d), ())
    if not dims:
        raise ConfigError(
            f"the device mesh's dimensions {names} name no data-parallel one ('dp', "
            "'data_parallel', 'dp_replicate'/'dp_shard'): name it so, or pass dp_rank= and "
            "dp_size="
        )
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ConfigError("this process is not in the device mesh given")
    rank, size = 0, 1
    for name in dims:
        at = names.index(name)
        rank = rank * int(mesh.shape[at]) + int(coordinate[at])
        size *= int(mesh.shape[at])
    return rank, size


def default_rank() -> tuple[int, int]:
    """``(rank, world_size)`` found: the data-parallel coordinates of the device mesh of an
    enclosing ``with mesh:`` block, else ``torch.distributed``'s if initialised, else
    ``RANK`` and ``WORLD_SIZE`` from the environment, else ``(0, 1)``. torch is asked only if
    the process has imported it already: a process group needs torch imported, and
    importing it here cost a script that never uses torch 3-6 s and ~230 MB."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        mesh = _current_mesh()
        if mesh is not None:
            return mesh_coordinates(mesh)
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _current_mesh() -> Any:
    """The mesh of an enclosing ``with mesh:`` block, if any."""
    module = sys.modules.get("torch.distributed.device_mesh")
    resources = getattr(module, "_mesh_resources", None)
    stack = getattr(resources, "mesh_stack", None)
    return stack[-1] if stack else None
