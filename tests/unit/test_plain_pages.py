"""Large arrays Zephon hands to the trainer live on plain pages: never madvised for huge
pages, whose compaction on first touch stalled one batch of images in ten to sixty for
0.15-0.5 s."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from zephon.arrays import empty, stack
from zephon.ops.batch import collate


def _vm_flags(array: np.ndarray) -> list[str]:
    """The VmFlags of the mapping holding ``array``'s middle byte (Linux; numpy madvises
    from the first whole page of its allocation on)."""
    address = array.__array_interface__["data"][0] + array.nbytes // 2
    flags: list[str] | None = None
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, stop = (int(x, 16) for x in head.split("-"))
            inside = start <= address < stop
        elif inside and head == "VmFlags:":
            flags = line.split()[1:]
    assert flags is not None, "no mapping holds the array"
    return flags


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


@linux
def test_large_batches_are_not_madvised_for_huge_pages() -> None:
    images = [np.full((224, 224, 3), i, np.uint8) for i in range(256)]
    batch = collate([{"jpg": x, "id": i} for i, x in enumerate(images)])["jpg"]
    batch[0, 0, 0, 0] = 7  # writable, and the page is touched
    assert "hg" not in _vm_flags(batch)
    assert "hg" not in _vm_flags(empty((64 << 20,), np.uint8))


@linux
def test_numpys_own_allocation_would_be_madvised() -> None:
    """The contrast that makes the test above mean something, where numpy does madvise."""
    from numpy._core.multiarray import _get_madvise_hugepage  # type: ignore[attr-defined]

    if not _get_madvise_hugepage():
        pytest.skip("numpy does not madvise huge pages on this kernel")
    plain = np.empty((64 << 20,), np.uint8)
    plain[0] = 1
    assert "hg" in _vm_flags(plain)


def test_empty_and_stack_are_ordinary_arrays() -> None:
    small = empty((3, 4), np.int32)
    assert small.shape == (3, 4) and small.dtype == np.int32
    values = [np.arange(i, i + 2_000_000, dtype=np.int64).reshape(1000, 2000) for i in range(3)]
    out = stack(values)
    assert out.shape == (3, 1000, 2000) and out.dtype == np.int64 and out.flags.writeable
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, np.stack(values))
    out += 1  # an ordinary writable array
    assert int(out[2, 999, 1999]) == 2 + 1_999_999 + 1


@linux
def test_the_process_engines_arrays_arrive_on_plain_pages() -> None:
    """engine="process": an array copied out of its shared-memory slot in the trainer's
    thread."""
    from zephon.pipeline.slots import Placeholder, join

    source = np.arange(8 << 20, dtype=np.int64).reshape(2048, 4096)
    buf = memoryview(bytearray(64) + source.tobytes())
    item = join({"x": Placeholder(64, source.dtype.str, source.shape), "n": 3}, buf)
    np.testing.assert_array_equal(item["x"], source)
    assert item["n"] == 3 and item["x"].flags.writeable
    assert "hg" not in _vm_flags(item["x"])


def test_arrays_of_objects_stack_as_numpy_would() -> None:
    """Object arrays cannot live in a raw buffer: they take numpy's own allocation."""
    values = [np.array(["a", None, 3] * 200_000, dtype=object) for _ in range(3)]
    out = stack(values)
    assert out.dtype == object and out.shape == (3, 600_000) and out[2, 4] is None


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


@linux
def test_the_pages_of_a_freed_array_serve_the_next_one_of_its_size() -> None:
    """Writing fresh pages costs their faults (a batch of images: 22 ms instead of 5), so a
    gone array's mapping is used again; never while any view of it is alive."""
    shape = (4096 + 1234, 4096)  # a size of its own: no other test's pages are kept for it
    first = empty(shape, np.uint8)
    where = _address(first)
    view = first[10:20].reshape(-1)[5:]  # views of views point at the same memory
    view[:] = 7
    del first
    second = empty(shape, np.uint8)
    assert _address(second) != where  # the view still uses those pages
    second[:] = 1
    assert int(view.min()) == int(view.max()) == 7
    del view
    third = empty(shape, np.uint8)
    assert _address(third) == where  # all gone: the pages serve again, still plain ones
    assert "hg" not in _vm_flags(third)
    torch = pytest.importorskip("torch")
    tensor = torch.from_numpy(third[1])
    del third
    assert _address(empty(shape, np.uint8)) != where  # the tensor still uses them
    assert int(tensor.sum()) >= 0


def test_only_so_many_freed_pages_are_kept_the_oldest_going_first() -> None:
    from zephon.arrays import _REGIONS

    arrays = [empty(((60 << 20) + i * 4096,), np.uint8) for i in range(3)]  # 180 MB
    del arrays
    assert _REGIONS.kept <= _REGIONS.keep_bytes
    late = empty(((20 << 20) + 3 * 4096,), np.uint8)  # a size that came later
    late[:] = 7
    del late  # kept, an older one going
    assert _REGIONS.kept <= _REGIONS.keep_bytes
    again = empty(((20 << 20) + 3 * 4096,), np.uint8)
    assert int(again[0]) == int(again[-1]) == 7  # its pages, not fresh (zeroed) ones


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_process_writes_its_own_copy() -> None:
    """A DataLoader worker forked after batches were made (or freed for reuse) must not
    write into this process's batches: the pages are private (copy on write), as numpy's
    are. Shared anonymous pages let the child's writes through."""
    batch = empty((8 << 20,), np.uint8)
    batch[:] = 1
    spare = empty((8 << 20,), np.uint8)
    del spare  # kept for reuse: the child would take the same pages
    with warnings.catch_warnings():  # fork in a threaded process (3.12+), lance's at-fork hook
        warnings.simplefilter("ignore")
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        batch[:] = 2
        empty((8 << 20,), np.uint8)[:] = 3
        os._exit(0)
    os.waitpid(pid, 0)
    assert int(batch.max()) == 1
    assert int(empty((8 << 20,), np.uint8).max()) != 3
