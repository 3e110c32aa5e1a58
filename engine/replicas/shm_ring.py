"""Shared-memory rings between a gateway and an engine replica: token ids one way, rows the other. A ring
is a file in a memory-backed folder that both processes map; one process writes, the other reads. Space
is handed out first in, first out, and freed when the reader says (in a message on the socket, which
orders it after the reads) how far it has read; a payload that does not fit goes into a file of its own."""

from __future__ import annotations

import mmap
import os
import uuid
from pathlib import Path

import numpy as np

ALIGN = 64


def memory_folder(prefix: str) -> Path:
    """A new folder for rings and sockets: in /dev/shm where there is one (memory, never disk)."""
    import tempfile

    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


class Mapping:
    """A file of `size` bytes mapped read-write; `create` makes it, otherwise it is opened."""

    def __init__(self, path: Path, size: int, create: bool):
        self.path, self.size = path, size
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        descriptor = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(descriptor, size)
            self._map = mmap.mmap(descriptor, size)
        finally:
            os.close(descriptor)
        self.bytes = np.frombuffer(self._map, dtype=np.uint8)

    def touch(self) -> None:
        """Fault every page in now: a ring's first lap otherwise takes a page fault (and on the creating
        side a page allocation) per 4 kB written, on the engine's thread for the reply ring."""
        self.bytes[:: mmap.PAGESIZE] = self.bytes[:: mmap.PAGESIZE]

    def array(self, offset: int, dtype: str, count: int) -> np.ndarray:
        """A view of `count` items at `offset` (no copy: copy before the space is freed)."""
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset)

    def close(self, unlink: bool = False) -> None:
        self.bytes = None  # type: ignore[assignment]
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with it
            pass
        if unlink:
            self.path.unlink(missing_ok=True)


class RingWriter:
    """The writing side's bookkeeping. Positions count bytes written since the start, so `end` values only
    grow; the reader acknowledges the `end` of the last payload it has finished with."""

    def __init__(self, mapping: Mapping):
        self.mapping = mapping
        self.head = 0  # where the next payload goes
        self.tail = 0  # everything before it has been read

    def reserve(self, num_bytes: int) -> tuple[int, int] | None:
        """(offset in the file, end position) of `num_bytes` free bytes, or None when they do not fit."""
        size = self.mapping.size
        num_bytes = -(-max(num_bytes, 1) // ALIGN) * ALIGN
        start = self.head
        if start % size + num_bytes > size:  # never wrap a payload: skip to the ring's start
            start += size - start % size
        end = start + num_bytes
        if end - self.tail > size:
            return None
        self.head = end
        return start % size, end

    def release(self, end: int) -> None:
        """The reader is done with every payload up to `end`."""
        if end > self.tail:
            self.tail = min(end, self.head)


def write_spill(folder: Path, parts: list[np.ndarray]) -> str:
    """A payload too large for the ring, in a file of its own that the reader deletes; its name."""
    name = f"spill-{uuid.uuid4().hex}"
    with open(folder / name, "wb") as file:
        for part in parts:
            file.write(memoryview(np.ascontiguousarray(part)).cast("B"))
    return name


def read_spill(folder: Path, name: str) -> np.ndarray:
    """The bytes of a spilled payload (uint8); the file is gone afterwards."""
    path = folder / name
    try:
        return np.fromfile(path, dtype=np.uint8)
    finally:
        path.unlink(missing_ok=True)
