"""An engine replica process: builds its model's engine on its device, then serves gateways on a Unix
stream socket (engine/replicas/protocol.py). The engine's thread reads every gateway's frames between
batches and queues their Runs, then writes each request's rows into that gateway's reply ring and
answers at once. It exits on SIGTERM (the engine fails what is still queued with EngineStopped) or when
its parent is gone."""

from __future__ import annotations

import itertools
import logging
import os
import selectors
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.checkpoint.source import ModelSource
from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import EngineError, EngineStopped, Overloaded, SequenceTooLong
from engine.outputs import RowRequest
from engine.passing_thread import run_in_passing_thread
from engine.replicas.protocol import (
    Cancel,
    Failure,
    FrameReader,
    Freed,
    Hello,
    Load,
    Refused,
    Result,
    Run,
    encoder,
    frame,
    replica_decoder,
    write_start,
)
from engine.replicas.shm_ring import Mapping, RingWriter, read_spill, write_spill
from engine.request import EngineOutput, EngineRequest

logger = logging.getLogger(__name__)
PARENT_CHECK_S = 1.0
RECEIVE_BYTES = 1 << 16


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    source: ModelSource
    engine: EngineConfig
    endpoint: str  # the path of the Unix socket it listens on, in a folder that also holds the rings
    log_level: str = "info"
    num_threads: int | None = None  # torch's CPU threads; None: torch's default
    metrics_model: str | None = None  # the model's name in the server's metrics
    # metrics_model -> the engine's on_batch callback (or None); a module-level function
    batch_observer: Callable[[str], Callable[[int, int], None] | None] | None = None


# a replica that refuses its model writes a Refused and exits with this code
REFUSED_EXIT_CODE = 2


def replica_main(config: ReplicaConfig, ready) -> None:
    """The spawned process's entry: `ready` (a multiprocessing Event) is set once the engine is warm,
    after its Capabilities are written (replica_protocol.write_start)."""
    import torch

    from engine.build import build_engine

    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    logging.basicConfig(
        level=config.log_level.upper(), format=f"%(asctime)s %(levelname)s replica {os.getpid()}: %(message)s"
    )
    on_batch = None
    if config.batch_observer is not None and config.metrics_model is not None:
        on_batch = config.batch_observer(config.metrics_model)
    try:
        spec = config.source.resolve()
        # in a thread that exits: this main thread would otherwise slow the engine's CPU steps
        engine = run_in_passing_thread(lambda: build_engine(spec, config.engine, on_batch))
    except EngineError as error:  # a refusal (the model, its backend): the gateway says it, once
        write_start(config.endpoint, Refused(str(error)))
        sys.exit(REFUSED_EXIT_CODE)
    write_start(config.endpoint, engine.capabilities())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    serve(engine, config.endpoint, ready, stop, parent=os.getppid())


def serve(
    engine: Engine,
    endpoint: str,
    ready,
    stop: threading.Event,
    parent: int | None = None,
) -> None:
    """Serve gateways on `endpoint` until `stop` is set or the process `parent` is gone: the engine's
    own thread reads the gateways' frames between batches and waits on them when idle (_Intake), so a
    request wakes one thread here, not a reader and then the engine. The engine is stopped on return."""
    intake = _Intake(engine, endpoint)
    engine.attach(intake)
    ready.set()
    logger.info("replica serving %s on %s", engine.attention_backend, endpoint)
    try:
        while not stop.wait(PARENT_CHECK_S):
            if parent is not None and os.getppid() != parent:
                logger.warning("the gateway process is gone: stopping")
                return
    finally:
        engine.stop()
        intake.close()


class _Intake:
    """The listening socket and every gateway's connection, read on the engine's thread."""

    def __init__(self, engine: Engine, endpoint: str):
        self.engine, self.endpoint = engine, endpoint
        self.folder = Path(endpoint).parent
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        Path(endpoint).unlink(missing_ok=True)  # a replica killed before it could clean up
        self.listener.bind(endpoint)
        self.listener.listen(256)
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_write.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        self.connections: list[_Connection] = []
        engine.on_rate_change = self.report_load

    def report_load(self) -> None:
        """The engine's thread: its probe changed its rate; every gateway hears it."""
        for connection in self.connections:
            connection.report_load()

    def poll(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout=timeout):
            if key.data is None:
                accepted, _ = self.listener.accept()
                connection = _Connection(accepted, self.folder, self.engine)
                self.connections.append(connection)
                self.selector.register(accepted, selectors.EVENT_READ, connection)
            elif key.data == "wake":
                self._wake_read.recv(64)
            elif not key.data.receive():
                self.selector.unregister(key.fileobj)
                key.data.close()
                self.connections.remove(key.data)

    def wake(self) -> None:
        try:
            self._wake_write.send(b"x")
        except OSError:  # full (a wake-up is pending anyway) or closed
            pass

    def close(self) -> None:
        for connection in self.connections:
            connection.close()
        self.selector.close()
        self.listener.close()
        self._wake_read.close()
        self._wake_write.close()
        Path(self.endpoint).unlink(missing_ok=True)


class _Connection:
    """One gateway's connection: its socket, the rings it made, and its Runs queued here. Frames are
    read on the serving thread; replies go out from the engine's thread, under `lock`."""

    def __init__(self, sock: socket.socket, folder: Path, engine: Engine):
        self.sock, self.folder, self.engine = sock, folder, engine
        self.reader = FrameReader(replica_decoder())
        self.encode = encoder()
        self.lock = threading.Lock()
        self.requests: Mapping | None = None
        self.replies: RingWriter | None = None
        self.requests_read = 0
        self.running: dict[int, _Reply] = {}
        self.open = True

    def receive(self) -> bool:
        """Handle what has arrived; False once the gateway has closed the connection."""
        try:
            data = self.sock.recv(RECEIVE_BYTES)
        except OSError:
            return False
        if not data:
            return False
        for message in self.reader.feed(data):
            if isinstance(message, Run):
                self._run(message)
            elif isinstance(message, Cancel):
                request = self.running.pop(message.id, None)
                if request is not None:
                    request.cancelled = True  # the scheduler drops what is not yet batched
            elif isinstance(message, Freed):
                self._replies_read(message.replies_read)
            elif isinstance(message, Hello):
                self.requests = Mapping(self.folder / message.requests, message.requests_size, create=False)
                replies = Mapping(self.folder / message.replies, message.replies_size, create=False)
                replies.touch()
                self.replies = RingWriter(replies)
                self.report_load()  # the gateway judges its first request on the rate the start measured
        return True

    def _run(self, run: Run) -> None:
        self._replies_read(run.replies_read)
        try:
            lengths, ids, types, prefix, spans, images = self._payload(run)
        except Exception as error:  # a fault of the link's: the gateway's request fails, not the replica
            logger.exception("engine replica: a run's payload could not be read")
            failure = EngineError(f"the engine replica could not read the run: {type(error).__name__}")
            self.fail(run.id, failure)
            return
        request = _Reply(run.num_seqs, self, run.id)
        self.running[run.id] = request
        try:
            ends = list(itertools.accumulate(lengths))
            token_ids = [ids[start:end] for start, end in zip([0, *ends], ends)]
            token_types = (
                None if types is None else [types[start:end] for start, end in zip([0, *ends], ends)]
            )
            rows = RowRequest(prefix, spans, run.first_rows, run.columns, images)
            self.engine.submit(request, token_ids, token_types, run.deadline, rows)
        except (EngineError, ValueError) as error:
            self.running.pop(run.id, None)
            self.fail(run.id, error)
        except Exception as error:  # a fault of the replica's own: the gateway's request fails, not hangs
            logger.exception("engine replica: a run could not be queued")
            self.running.pop(run.id, None)
            failure = EngineError(f"the engine replica could not queue the run: {type(error).__name__}")
            self.fail(run.id, failure)

    def _payload(
        self, run: Run
    ) -> tuple[list[int], np.ndarray, np.ndarray | None, np.ndarray | None, list | None, list | None]:
        """The Run's lengths, token ids, token types, prefix, spans and images, copied out of the ring (whose
        space the next reply then frees)."""
        count = run.num_tokens
        types_end = run.num_seqs + count * (2 if run.has_types else 1)
        if run.spill is not None:
            data = read_spill(self.folder, run.spill).view(np.int32)
        else:
            try:
                words = types_end + run.prefix_tokens + run.span_words + run.image_words
                data = self.requests.array(run.offset, "<i4", words).copy()
            finally:  # its space is free again, even where it could not be read
                self.requests_read = max(self.requests_read, run.end)
        lengths = data[: run.num_seqs].tolist()
        ids = data[run.num_seqs : run.num_seqs + count]
        types = data[run.num_seqs + count : types_end] if run.has_types else None
        prefix = data[types_end : types_end + run.prefix_tokens] if run.prefix_tokens else None
        spans = None
        if run.span_words:
            counts = data[types_end + run.prefix_tokens :][: run.num_seqs].tolist()
            boundaries = data[types_end + run.prefix_tokens + run.num_seqs :][: run.span_words - run.num_seqs]
            ends = list(itertools.accumulate(max(count, 0) for count in counts))
            spans = [
                None if count < 0 else boundaries[end - count : end].tolist()
                for count, end in zip(counts, ends)
            ]
        images = None
        if run.image_words:
            start = types_end + run.prefix_tokens + run.span_words
            stop = start + run.image_words
            counts = data[start : start + run.num_seqs].tolist()  # each sequence's images
            start += run.num_seqs
            held = data[start : start + sum(counts)].tolist()  # each an index of the distinct images
            start += len(held)
            grids = data[start : start + 2 * (max(held, default=-1) + 1)].reshape(-1, 2).tolist()
            ends = list(itertools.accumulate((rows * columns for rows, columns in grids), initial=0))
            pixels = data[start + 2 * len(grids) : stop].view(np.uint8)
            pixels = pixels[: ends[-1] * run.patch_dim].reshape(-1, run.patch_dim) if run.patch_dim else None
            grid_images = [
                pixels[begin:end].reshape(*grid, -1) for begin, end, grid in zip(ends, ends[1:], grids)
            ]
            taken = list(itertools.accumulate(counts, initial=0))
            images = [
                None
                if count == 0
                else grid_images[held[first]]
                if count == 1
                else tuple(grid_images[index] for index in held[first : first + count])
                for count, first in zip(counts, taken)
            ]
        return lengths, ids, types, prefix, spans, images

    def _replies_read(self, position: int) -> None:
        if self.replies is not None and position:
            with self.lock:
                self.replies.release(position)

    # the engine's thread

    def reply(self, run_id: int, output: EngineOutput) -> None:
        rows = np.ascontiguousarray(output.rows, dtype="<f4")
        with self.lock:
            if not self.open:
                return
            self.running.pop(run_id, None)
            spot = self.replies.reserve(rows.nbytes) if self.replies is not None else None
            if spot is None:
                offset, end, spill = 0, 0, write_spill(self.folder, [rows])
            else:
                (offset, end), spill = spot, None
                self.replies.mapping.array(offset, "<f4", rows.size)[:] = rows.reshape(-1)
            result = Result(
                run_id, rows.shape[0], rows.shape[1], offset, end, spill, output.queue_s, output.inference_s,
                self.engine.queued_tokens, self.requests_read, self.engine.rate.seconds_per_token,
                output.num_tokens, self.engine.rate.margin, self.engine.rate.idle_seconds_per_token,
                time.perf_counter(), self.engine.rate.quiet_seconds_per_token,
            )  # fmt: skip
            self._send(result)

    def fail(self, run_id: int, error: BaseException) -> None:
        self.running.pop(run_id, None)
        retry_after = 1.0
        if isinstance(error, Overloaded):
            kind, retry_after = "overloaded", float(error.retry_after_s)
        elif isinstance(error, (SequenceTooLong, ValueError)):
            kind = "invalid"
        elif isinstance(error, EngineStopped):
            kind = "stopped"
        else:
            kind = "failed"
        failure = Failure(
            run_id, kind, str(error), self.engine.queued_tokens, self.requests_read, retry_after,
            self.engine.rate.seconds_per_token, self.engine.rate.margin,
            self.engine.rate.idle_seconds_per_token, self.engine.rate.quiet_seconds_per_token,
        )  # fmt: skip
        with self.lock:
            if self.open:
                self._send(failure)

    def report_load(self) -> None:
        """Tell the gateway the engine's rate now (Load)."""
        rate = self.engine.rate
        load = Load(
            self.engine.queued_tokens, self.requests_read, rate.seconds_per_token, rate.margin,
            rate.idle_seconds_per_token, rate.quiet_seconds_per_token,
        )  # fmt: skip
        with self.lock:
            if self.open and self.replies is not None:
                self._send(load)

    def _send(self, message) -> None:
        try:
            self.sock.sendall(frame(self.encode, message))
        except OSError:  # the gateway is gone; its connection closes on the serving thread
            self.open = False

    def close(self) -> None:
        with self.lock:
            self.open = False
            for request in self.running.values():
                request.cancelled = True
            self.running.clear()
            self.sock.close()
            # a gateway that died leaves its rings behind: they are gone with its connection
            for mapping in (self.requests, self.replies.mapping if self.replies is not None else None):
                if mapping is not None:
                    mapping.close(unlink=True)


class _Reply(EngineRequest):
    """A Run's request in the engine: its rows go back over the connection it came on."""

    __slots__ = ("connection", "run_id", "cancelled")

    def __init__(self, num_seqs: int, connection: _Connection, run_id: int):
        super().__init__(num_seqs)
        self.connection, self.run_id, self.cancelled = connection, run_id, False

    def is_cancelled(self) -> bool:
        return self.cancelled or not self.connection.open

    def done(self, output: EngineOutput) -> None:
        self.connection.reply(self.run_id, output)

    def fail(self, error: BaseException) -> None:
        self.connection.fail(self.run_id, error)
