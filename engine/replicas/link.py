"""ReplicaLink: a gateway's connection to one engine replica on its event loop: a non-blocking Unix
stream socket that the loop reads as frames arrive (no thread, no task), the request ring this gateway
writes token ids into and the reply ring the replica writes rows into (engine/replicas/shm_ring.py)."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from engine.inline_images import images_of
from engine.outputs import ALL_ROWS, RowRequest
from engine.replicas.protocol import FrameReader, Freed, Hello, Result, Run, encoder, frame, gateway_decoder
from engine.replicas.shm_ring import Mapping, RingWriter, read_spill, write_spill

REQUEST_RING_BYTES = 8 << 20  # about 2M tokens in flight; more go through spill files
REPLY_RING_BYTES = 16 << 20  # rows on their way to the gateway, which copies them out on arrival
RECEIVE_BYTES = 1 << 16

OnMessage = Callable[[int, object, "np.ndarray | None"], None]


class ReplicaLink:
    def __init__(
        self,
        index: int,
        endpoint: str,
        loop: asyncio.AbstractEventLoop,
        on_message: OnMessage,
        on_closed: Callable[[int, ReplicaLink], None],
    ):
        self.index, self.loop = index, loop
        self._on_message, self._on_closed = on_message, on_closed
        self.folder = Path(endpoint).parent
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(endpoint)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        name = f"ring-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.requests = RingWriter(Mapping(self.folder / f"{name}-requests", REQUEST_RING_BYTES, create=True))
        self.replies = Mapping(self.folder / f"{name}-replies", REPLY_RING_BYTES, create=True)
        self.requests.mapping.touch()
        self.replies.touch()
        self.replies_read = 0  # how far this gateway has copied rows out of the reply ring
        self._replies_told = 0  # ... and what the replica has heard of it
        self._encode = encoder()
        self._reader = FrameReader(gateway_decoder())
        self._unsent = bytearray()
        self.closed = False
        loop.add_reader(self.sock.fileno(), self._readable)
        self.send(
            Hello(
                self.requests.mapping.path.name, REQUEST_RING_BYTES, self.replies.path.name, REPLY_RING_BYTES
            )
        )

    def send_run(
        self,
        run_id: int,
        token_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int] | None] | None,
        num_tokens: int,
        deadline: float | None,
        rows: RowRequest = ALL_ROWS,
    ) -> None:
        """Write the chunk's lengths, ids (and types, and its RowRequest's prefix, spans and images) into the
        request ring and send its Run; `num_tokens`: its sequences' tokens."""
        prefix, spans = rows.prefix, rows.spans
        num_seqs = len(token_ids)
        lengths = np.fromiter(map(len, token_ids), dtype="<i4", count=num_seqs)
        ids = _flat(token_ids, num_tokens)
        types = None
        if token_type_ids is not None and any(types is not None for types in token_type_ids):
            types = _flat(
                [t if t is not None else [0] * len(i) for t, i in zip(token_type_ids, token_ids)], num_tokens
            )
        parts = [lengths, ids] if types is None else [lengths, ids, types]
        if prefix is not None:
            parts.append(np.asarray(prefix, dtype="<i4"))
        span_words = 0
        if spans is not None:
            counts = [-1 if boundaries is None else len(boundaries) for boundaries in spans]
            boundaries = [offset for offsets in spans for offset in offsets or ()]
            parts += [np.asarray(counts, dtype="<i4"), np.asarray(boundaries, dtype="<i4")]
            span_words = len(counts) + len(boundaries)
        image_words, patch_dim = 0, 0
        if rows.images is not None:
            entries = [images_of(entry) for entry in rows.images]
            # each image once where several sequences hold it (a ranker's image query, in each pair): each
            # sequence's images as indexes of the distinct ones, which the replica's sequences then share
            distinct: dict[int, int] = {}
            given, held = [], []
            for image in (image for images in entries for image in images):
                if id(image) not in distinct:
                    distinct[id(image)] = len(given)
                    given.append(image)
                held.append(distinct[id(image)])
            counts = np.fromiter(map(len, entries), dtype="<i4", count=num_seqs)
            grids = np.asarray([image.shape[:2] for image in given], dtype="<i4").reshape(-1)
            patch_dim = given[0].shape[-1] if given else 0
            size = sum(image.size for image in given)
            # one copy, zeros after to whole int32 words
            flat = [image.ravel() for image in given]
            padded = np.concatenate([*flat, np.zeros(-size % 4, np.uint8)]).astype(np.uint8, copy=False)
            parts += [counts, np.asarray(held, dtype="<i4"), grids, padded.view("<i4")]
            image_words = num_seqs + len(held) + grids.size + padded.size // 4
        words = sum(part.size for part in parts)
        spot = self.requests.reserve(4 * words)
        if spot is None:
            offset, end, spill = 0, 0, write_spill(self.folder, parts)
        else:
            (offset, end), spill = spot, None
            target = self.requests.mapping.array(offset, "<i4", words)
            start = 0
            for part in parts:
                target[start : start + part.size] = part
                start += part.size
        self._replies_told = self.replies_read
        self.send(
            Run(
                run_id,
                num_seqs,
                num_tokens,
                types is not None,
                offset,
                end,
                spill,
                deadline,
                self.replies_read,
                0 if prefix is None else len(prefix),
                span_words,
                rows.first_rows,
                rows.columns,
                image_words,
                patch_dim,
            )
        )

    def send(self, message) -> None:
        if self.closed:
            return
        data = frame(self._encode, message)
        if self._unsent:
            self._unsent += data
            return
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._lost()
            return
        if sent < len(data):
            self._unsent += data[sent:]
            self.loop.add_writer(self.sock.fileno(), self._writable)

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self._unsent)
        except BlockingIOError:
            return
        except OSError:
            self._lost()
            return
        del self._unsent[:sent]
        if not self._unsent:
            self.loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        try:
            data = self.sock.recv(RECEIVE_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._lost()
            return
        for message in self._reader.feed(data):
            self.requests.release(message.requests_read)
            rows = self._rows(message) if isinstance(message, Result) else None
            self._on_message(self.index, message, rows)
        if self.replies_read - self._replies_told > REPLY_RING_BYTES // 4:
            self._replies_told = self.replies_read
            self.send(Freed(self.replies_read))

    def _rows(self, result: Result) -> np.ndarray:
        """The Result's rows, copied out of the ring (or its spill file)."""
        count = result.num_rows * result.dim
        if result.spill is not None:
            rows = read_spill(self.folder, result.spill).view("<f4")
        else:
            rows = self.replies.array(result.offset, "<f4", count).copy()
            self.replies_read = max(self.replies_read, result.end)
        return rows.reshape(result.num_rows, result.dim)

    def _lost(self) -> None:
        if not self.closed:
            self.close()
            self._on_closed(self.index, self)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.loop.is_closed():
            self.loop.remove_reader(self.sock.fileno())
            self.loop.remove_writer(self.sock.fileno())
        self.sock.close()
        self.requests.mapping.close(unlink=True)
        self.replies.close(unlink=True)


def _flat(sequences: Sequence[Sequence[int]], num_tokens: int) -> np.ndarray:
    if num_tokens and isinstance(sequences[0], np.ndarray):
        return np.concatenate(sequences).astype("<i4", copy=False)
    return np.fromiter(itertools.chain.from_iterable(sequences), dtype="<i4", count=num_tokens)
