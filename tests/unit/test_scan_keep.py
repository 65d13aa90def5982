"""ScanKeep: a discovery scan's bytes serve the first reads, then drain."""

from __future__ import annotations

from pathlib import Path

import pytest

from zephon.storage.keep import ScanKeep

DATA = bytes(range(256)) * 400  # 102,400 bytes, scanned in 4 chunks


def scanned(capacity: int = 1 << 20, chunk: int = 30_000) -> ScanKeep:
    keep = ScanKeep(capacity)
    for at in range(0, len(DATA), chunk):
        keep.keep("s3://b/a", "v1", at, DATA[at : at + chunk])
    return keep


def test_reads_inside_and_across_chunks_come_from_the_scan() -> None:
    keep = scanned()
    assert keep.take("s3://b/a", "v1", 10, 500) == DATA[10:500]
    assert keep.take("s3://b/a", "v1", 29_000, 61_000) == DATA[29_000:61_000]  # spans three
    assert keep.take("s3://b/a", "v2", 10, 500) is None  # another version: not ours
    assert keep.take("s3://b/other", "v1", 10, 500) is None
    assert keep.served_bytes == 490 + 32_000


def test_chunks_are_let_go_once_read_and_capacity_bounds_what_is_kept() -> None:
    keep = scanned()
    assert keep.held == len(DATA)
    for at in range(0, len(DATA), 1000):  # an epoch reading every byte once
        assert keep.take("s3://b/a", "v1", at, min(at + 1000, len(DATA))) == DATA[at : at + 1000]
    assert keep.held == 0
    assert keep.take("s3://b/a", "v1", 0, 10) is None  # gone: the caller fetches it
    small = scanned(capacity=70_000)  # room for two of the four chunks
    assert small.held == 60_000
    assert small.take("s3://b/a", "v1", 59_000, 61_000) is None  # runs past what was kept
    small.clear()
    assert small.held == 0 and small.take("s3://b/a", "v1", 0, 10) is None


def test_trim_keeps_each_objects_first_chunks_within_the_capacity() -> None:
    keep = scanned()
    keep.trim(65_000)
    assert keep.held == 60_000  # two whole chunks; a chunk is never cut
    assert keep.take("s3://b/a", "v1", 0, 60_000) == DATA[:60_000]
    assert keep.take("s3://b/a", "v1", 60_000, 60_010) is None


def test_past_its_memory_a_keep_spills_to_a_file_and_serves_from_it(tmp_path: Path) -> None:
    keep = ScanKeep(40_000, disk_capacity=1 << 20, disk_dir=str(tmp_path))
    for at in range(0, len(DATA), 30_000):
        keep.keep("s3://b/a", "v1", at, DATA[at : at + 30_000])
    assert keep.held == 30_000 and keep.on_disk == len(DATA) - 30_000  # one chunk in memory
    assert list(tmp_path.iterdir()) == []  # unnamed: nothing to leave behind
    assert keep.take("s3://b/a", "v1", 29_000, 95_000) == DATA[29_000:95_000]  # both kinds
    for at in range(0, len(DATA), 1000):  # the rest of the epoch
        got = keep.take("s3://b/a", "v1", at, min(at + 1000, len(DATA)))
        assert got is None or got == DATA[at : at + 1000]
    assert keep.held == 0 and keep.kept == 0
    keep.clear()
    assert keep.on_disk == 0 and keep.spilled_bytes == len(DATA) - 30_000


def test_trim_moves_what_memory_cannot_hold_to_the_file(tmp_path: Path) -> None:
    keep = ScanKeep(1 << 20, disk_capacity=50_000, disk_dir=str(tmp_path))
    for at in range(0, len(DATA), 30_000):
        keep.keep("s3://b/a", "v1", at, DATA[at : at + 30_000])
    keep.trim(35_000)  # memory for one chunk, the file for what fits; the rest is let go
    assert keep.held == 30_000 and keep.on_disk == 30_000 + 12_400  # the third did not fit
    assert keep.take("s3://b/a", "v1", 0, 60_000) == DATA[:60_000]
    assert keep.take("s3://b/a", "v1", 60_000, 61_000) is None
    assert keep.take("s3://b/a", "v1", 90_000, 92_000) == DATA[90_000:92_000]
    keep.clear()


def test_a_keep_without_disk_room_keeps_only_what_memory_holds() -> None:
    keep = ScanKeep(40_000)
    for at in range(0, len(DATA), 30_000):
        keep.keep("s3://b/a", "v1", at, DATA[at : at + 30_000])
    assert keep.held == keep.kept == 30_000 and keep.on_disk == 0


# Lance, when an earlier test imported it, warns at every fork; this child only runs Python.
@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
def test_a_forked_process_never_appends_to_the_file_it_shares(tmp_path: Path) -> None:
    """A DataLoader worker forked after discovery shares the keep's file: its own spills
    would land where the parent's (or another worker's) did. There it serves what it
    inherited and lets go of what memory cannot hold; the parent's bytes stay intact."""
    import os

    keep = ScanKeep(30_000, disk_capacity=1 << 20, disk_dir=str(tmp_path))
    keep.keep("s3://b/a", "v1", 0, DATA[:30_000])  # in memory
    keep.keep("s3://b/c", "v1", 0, DATA[30_000:60_000])  # past memory: the file's start
    assert keep.held == 30_000 and keep.on_disk == 30_000
    # taken by a pipeline (never idle): a fork leaves it as it is
    pid = os.fork()
    if pid == 0:  # the worker: memory for nothing, and no appending
        ok = False
        try:
            keep.trim(0)
            ok = keep.on_disk == 30_000 and keep.take("s3://b/a", "v1", 0, 10) is None
            ok = ok and keep.take("s3://b/c", "v1", 0, 30_000) == DATA[30_000:60_000]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    keep.trim(0)  # the parent still appends, after what it wrote
    assert keep.on_disk == 60_000
    assert keep.take("s3://b/c", "v1", 0, 30_000) == DATA[30_000:60_000]
    assert keep.take("s3://b/a", "v1", 0, 30_000) == DATA[:30_000]
    keep.clear()


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
def test_a_fork_moves_what_an_idle_keep_holds_in_memory_to_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DataLoader forks its workers after discovery and before any pipeline takes the
    keep: the parent's memory is copied into each child, so the keep first moves its bytes
    to the file, which the children share, and the child (never the parent) hands back the
    free heap it inherited. Parent and child both still read every byte."""
    import os

    from zephon.storage import keep as keep_module

    trimmed = tmp_path / "trimmed"
    monkeypatch.setattr(
        keep_module, "_return_free_heap", lambda: trimmed.write_text(f"{os.getpid()}")
    )
    keep = ScanKeep(40_000, disk_capacity=1 << 20, disk_dir=str(tmp_path))
    keep.keep("s3://b/a", "v1", 0, DATA[:30_000])  # in memory
    keep.keep("s3://b/c", "v1", 0, DATA[30_000:60_000])  # past memory: in the file
    assert keep.held == 30_000 and keep.on_disk == 30_000
    keep.idle = True  # as a dataset holds it once discovery finished
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            ok = keep.held == 0 and keep.take("s3://b/a", "v1", 0, 30_000) == DATA[:30_000]
            ok = ok and keep.take("s3://b/c", "v1", 0, 30_000) == DATA[30_000:60_000]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert trimmed.read_text() == str(pid)  # in the child
    assert keep.held == 0 and keep.on_disk == 60_000  # moved in the parent, before the fork
    assert keep.take("s3://b/a", "v1", 0, 30_000) == DATA[:30_000]
    assert keep.take("s3://b/c", "v1", 0, 30_000) == DATA[30_000:60_000]
    keep.clear()


def test_a_spill_the_disk_refused_reads_as_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spills are written on a thread of their own; one that fails (a full disk) is found
    when its bytes are read: they read as missing (the store is asked again), never as
    whatever the file holds there, and the bytes written before it still read back."""
    import errno

    from zephon.storage import keep as keep_module

    keep = ScanKeep(0, disk_capacity=1 << 20, disk_dir=str(tmp_path))
    keep.keep("s3://b/a", "v1", 0, DATA[:20_000])
    real = keep_module._write_all

    def full(fd: int, data: bytes, at: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(keep_module, "_write_all", full)
    keep.keep("s3://b/a", "v1", 20_000, DATA[20_000:40_000])
    monkeypatch.setattr(keep_module, "_write_all", real)
    assert keep.take("s3://b/a", "v1", 20_000, 30_000) is None
    assert keep.take("s3://b/a", "v1", 0, 20_000) == DATA[:20_000]
    keep.clear()
