"""ReplicaPool: the gateway's side of the engine replicas, with Engine's `run` interface. A request's
sequences are cut into chunks of at most `chunk_tokens` tokens, each chunk goes to the live replica with
the fewest outstanding tokens (those this gateway has sent it, plus the queue it last reported), and the
rows come back in input order. A chunk whose replica dies is sent once more to another; losing it twice
fails the request with EngineStopped (503). Overloaded replicas answer at once (429)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.errors import EngineError, EngineStopped, Overloaded, SequenceTooLong
from engine.replica_protocol import Cancel, Failure, Run, encoder, gateway_decoder

logger = logging.getLogger(__name__)
MAX_ATTEMPTS = 2  # a chunk is sent at most twice: its first replica, and one other if that one dies


class ReplicaOverloaded(Overloaded):
    def __init__(self, message: str, retry_after_s: float):
        EngineError.__init__(self, message)
        self.retry_after_s = max(1, round(retry_after_s))


@dataclass(slots=True)
class _Chunk:
    token_ids: list[list[int]]
    token_type_ids: list[list[int] | None] | None
    num_tokens: int
    future: asyncio.Future
    replica: int = -1
    attempts: int = 0
    id: int = -1  # of its latest Run: a chunk sent again gets a new one


def split_by_tokens(lengths: Sequence[int], chunk_tokens: int) -> list[tuple[int, int]]:
    """[start, end) ranges of consecutive sequences, each range at most `chunk_tokens` tokens unless one
    sequence alone is longer."""
    ranges, start, total = [], 0, 0
    for index, length in enumerate(lengths):
        if total and total + length > chunk_tokens:
            ranges.append((start, index))
            start, total = index, 0
        total += length
    ranges.append((start, len(lengths)))
    return ranges


class ReplicaPool:
    def __init__(self, endpoints: Sequence[str], chunk_tokens: int, max_sequence_tokens: int):
        self.endpoints = list(endpoints)
        self.chunk_tokens = chunk_tokens
        self.max_sequence_tokens = max_sequence_tokens
        self.description: dict[str, str] = {}  # how the replicas run, as their engines describe it
        num_replicas = len(self.endpoints)
        self.outstanding = [0] * num_replicas  # tokens this gateway has in flight on each replica
        self.reported = [0] * num_replicas  # queued tokens each replica last reported
        self.alive = [True] * num_replicas
        self.chunks_sent = [0] * num_replicas
        self._pending: dict[int, _Chunk] = {}
        self._ids = itertools.count()
        self._encode, self._decode = encoder(), gateway_decoder()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sockets: list = []
        self._receivers: list[asyncio.Task] = []
        self._stopped = False

    @property
    def queued_tokens(self) -> int:
        return sum(self.reported)

    def describe(self) -> dict[str, str]:
        return {**self.description, "replicas": str(len(self.endpoints))}

    async def run(
        self,
        token_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int] | None] | None = None,
    ) -> np.ndarray:
        """One row per sequence ([num_seqs, out_dim] float32), in the order given."""
        lengths = [len(ids) for ids in token_ids]
        if not lengths or min(lengths) == 0:
            raise ValueError("the engine needs at least one sequence and no empty sequence")
        if max(lengths) > self.max_sequence_tokens:
            raise SequenceTooLong(
                f"a sequence of {max(lengths)} tokens exceeds max_batch_tokens ({self.max_sequence_tokens})"
            )
        if self._stopped:
            raise EngineStopped("the engine is not running")
        self._connect()
        chunks = []
        for start, end in split_by_tokens(lengths, self.chunk_tokens):
            # slices, not copies of every sequence: msgpack encodes any sequence of ints as an array
            ids = list(token_ids[start:end])
            types = None if token_type_ids is None else list(token_type_ids[start:end])
            chunks.append(_Chunk(ids, types, sum(lengths[start:end]), self._loop.create_future()))
        for chunk in chunks:
            self._send(chunk)
        try:
            parts = await asyncio.gather(*(chunk.future for chunk in chunks))
        except BaseException:
            # the rest of the request is not wanted any more (gather has cancelled the futures already)
            for chunk in chunks:
                chunk.future.cancel()
                if self._pending.get(chunk.id) is chunk:
                    self._forget(chunk.id, cancel=True)
            raise
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def replica_died(self, index: int) -> None:
        """From any thread: the replica's process is gone; its chunks go elsewhere once."""
        if not self._call_in_loop(self._fail_over, index):
            self.alive[index] = False

    def replica_back(self, index: int) -> None:
        """From any thread: a restarted replica is warm again."""
        if not self._call_in_loop(self._revive, index):
            self.alive[index] = True

    def stop(self) -> None:
        self._stopped = True
        if not self._call_in_loop(self._close):
            self._close()  # no loop runs any more: nothing else touches the sockets

    def _call_in_loop(self, function, *args) -> bool:
        """Run `function` in the pool's event loop; False where there is none (any more)."""
        if self._loop is None or self._loop.is_closed():
            return False
        try:
            self._loop.call_soon_threadsafe(function, *args)
        except RuntimeError:  # the loop closed meanwhile
            return False
        return True

    # the event loop's side

    def _connect(self) -> None:
        """Sockets on the running loop; a new loop (a test's, a restarted server's) gets new ones."""
        loop = asyncio.get_running_loop()
        if self._sockets and loop is self._loop:
            return
        import zmq
        import zmq.asyncio

        if self._sockets:
            self._close()
            self._sockets, self._receivers = [], []
            self.outstanding = [0] * len(self.endpoints)
        self._loop = loop
        self._context = zmq.asyncio.Context()
        for index, endpoint in enumerate(self.endpoints):
            socket = self._context.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(endpoint)
            self._sockets.append(socket)
            self._receivers.append(self._loop.create_task(self._receive(index, socket)))

    def _send(self, chunk: _Chunk) -> None:
        live = [index for index, alive in enumerate(self.alive) if alive]
        if not live:
            chunk.future.set_exception(EngineStopped("no engine replica is running"))
            return
        replica = min(live, key=lambda index: self.outstanding[index] + self.reported[index])
        chunk_id = next(self._ids)
        chunk.replica, chunk.attempts, chunk.id = replica, chunk.attempts + 1, chunk_id
        self._pending[chunk_id] = chunk
        self.outstanding[replica] += chunk.num_tokens
        self.chunks_sent[replica] += 1
        message = Run(chunk_id, chunk.token_ids, chunk.token_type_ids)
        self._sockets[replica].send(self._encode.encode(message))

    def _forget(self, chunk_id: int, cancel: bool = False) -> _Chunk | None:
        chunk = self._pending.pop(chunk_id, None)
        if chunk is not None:
            self.outstanding[chunk.replica] -= chunk.num_tokens
            if cancel and self.alive[chunk.replica]:
                self._sockets[chunk.replica].send(self._encode.encode(Cancel(chunk_id)))
        return chunk

    async def _receive(self, index: int, socket) -> None:
        while True:
            payload = await socket.recv()
            message = self._decode.decode(payload)
            self.reported[index] = message.queued_tokens
            chunk = self._forget(message.id)
            if chunk is None or chunk.future.done():  # cancelled, or already sent elsewhere
                continue
            if isinstance(message, Failure):
                # a stopped replica's chunk goes elsewhere; so does a refused one where another replica
                # has room (its queue filled with other gateways' work since this one last heard of it)
                retry = message.kind == "stopped" or (
                    message.kind == "overloaded" and self._room_elsewhere(index)
                )
                if retry and chunk.attempts < MAX_ATTEMPTS:
                    self._resend(chunk)
                else:
                    chunk.future.set_exception(_exception(message))
            else:
                chunk.future.set_result(message.array())

    def _room_elsewhere(self, index: int) -> bool:
        load = [self.outstanding[other] + self.reported[other] for other in range(len(self.endpoints))]
        return any(
            self.alive[other] and load[other] < load[index] for other in range(len(load)) if other != index
        )

    def _resend(self, chunk: _Chunk) -> None:
        if chunk.attempts >= MAX_ATTEMPTS:
            chunk.future.set_exception(EngineStopped("the engine replica running this request stopped"))
        else:
            self._send(chunk)

    def _fail_over(self, index: int) -> None:
        self.alive[index] = False
        self.reported[index] = 0
        lost = [chunk_id for chunk_id, chunk in self._pending.items() if chunk.replica == index]
        if lost:
            logger.warning("engine replica %d died with %d chunks in flight: retrying them", index, len(lost))
        for chunk_id in lost:
            chunk = self._forget(chunk_id)
            if chunk is not None and not chunk.future.done():
                self._resend(chunk)

    def _revive(self, index: int) -> None:
        self.alive[index] = True
        self.reported[index] = 0

    def _close(self) -> None:
        """Fail what is pending, stop the receivers, close the sockets (LINGER 0: nothing waits)."""
        for chunk in self._pending.values():
            if not chunk.future.done() and not chunk.future.get_loop().is_closed():
                chunk.future.set_exception(EngineStopped("the server is shutting down"))
        self._pending.clear()
        for task in self._receivers:
            if not task.get_loop().is_closed():
                task.cancel()
        for socket in self._sockets:
            socket.close(linger=0)
        if self._sockets:
            self._context.term()


def _exception(failure: Failure) -> Exception:
    if failure.kind == "overloaded":
        return ReplicaOverloaded(failure.message, failure.retry_after_s)
    if failure.kind == "invalid":
        return SequenceTooLong(failure.message)
    if failure.kind == "stopped":
        return EngineStopped(failure.message)
    return EngineError(failure.message)
