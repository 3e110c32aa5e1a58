"""Engine: queues token sequences, runs batches on a worker thread and resolves asyncio futures."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.batch import pack
from engine.config import EngineConfig
from engine.errors import EngineError, EngineStopped, SequenceTooLong
from engine.lazy import LazyTensor
from engine.runner import ModelRunner
from engine.scheduler import QueuedRequest, ScheduledSequence, Scheduler

logger = logging.getLogger(__name__)

BatchObserver = Callable[[int, int], None]


class _Request:
    """One caller's sequences; its future resolves with all rows once the last one is done."""

    def __init__(self, num_seqs: int, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.future: asyncio.Future[np.ndarray] = loop.create_future()
        self.rows: np.ndarray | None = None
        self.num_pending = num_seqs

    def is_cancelled(self) -> bool:
        return self.future.done()

    def set_row(self, index: int, row: np.ndarray) -> None:
        if self.rows is None:
            self.rows = np.empty((self.num_pending, row.shape[0]), dtype=np.float32)
        self.rows[index] = row
        self.num_pending -= 1
        if self.num_pending == 0:
            self.loop.call_soon_threadsafe(_resolve, self.future, self.rows)

    def fail(self, error: BaseException) -> None:
        self.loop.call_soon_threadsafe(_reject, self.future, error)


def _resolve(future: asyncio.Future, rows: np.ndarray) -> None:
    if not future.done():
        future.set_result(rows)


def _reject(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


@dataclass(slots=True)
class _InFlight:
    batch: list[ScheduledSequence]
    output: LazyTensor


class Engine:
    """Owns a runner, a scheduler and the worker thread between them. While batch N runs on the
    device, the worker packs and launches batch N+1, then hands out batch N's rows."""

    def __init__(self, runner: ModelRunner, config: EngineConfig, on_batch: BatchObserver | None = None):
        self.runner = runner
        self.config = config
        self.scheduler = Scheduler(config.max_batch_tokens, config.max_batch_seqs, config.max_queue_tokens)
        self._on_batch = on_batch
        self.attention_backend = "unknown"  # its name, set by build_engine; for logs and metrics
        self._thread: threading.Thread | None = None

    @property
    def queued_tokens(self) -> int:
        return self.scheduler.queued_tokens

    def describe(self) -> dict[str, str]:
        """How the model runs, for logs and metrics."""
        graphs = self.config.cuda_graphs if self.runner.graphs is not None else "off"
        return {"attention_backend": self.attention_backend, "cuda_graphs": graphs, "replicas": "1"}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="posy-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self.scheduler.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    async def run(
        self,
        token_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int] | None] | None = None,
    ) -> np.ndarray:
        """One row per sequence ([num_seqs, out_dim] float32), in the order given."""
        if self._thread is None or not self._thread.is_alive():
            raise EngineStopped("the engine is not running")
        # checked here, before queueing, so that one bad sequence never fails a whole batch
        lengths = list(map(len, token_ids))
        if not lengths or min(lengths) == 0:
            raise ValueError("the engine needs at least one sequence and no empty sequence")
        longest = max(lengths)
        if longest > self.config.max_batch_tokens:
            raise SequenceTooLong(
                f"a sequence of {longest} tokens exceeds max_batch_tokens ({self.config.max_batch_tokens})"
            )
        request = _Request(len(token_ids), asyncio.get_running_loop())
        # one queue entry per request: a burst of requests holds the GIL, which the worker needs to
        # launch batches, as briefly as it can
        self.scheduler.submit(
            QueuedRequest(token_ids, token_type_ids, request, request.is_cancelled, lengths)
        )
        return await request.future

    def _loop(self) -> None:
        device = self.runner.device
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # this thread's current device starts at cuda:0
        in_flight: _InFlight | None = None
        while True:
            # with a batch on the device, do not wait for new work: finish that batch instead
            batch = self.scheduler.next_batch(timeout=0 if in_flight else 0.5)
            launched = self._launch(batch) if batch else None
            if in_flight is not None:
                self._finish(in_flight)
            in_flight = launched
            if in_flight is None and self.scheduler.stopped and not batch:
                self._fail_queued()
                return

    def _launch(self, batch: list[ScheduledSequence]) -> _InFlight | None:
        try:
            packed = pack(
                [sequence.token_ids for sequence in batch], [sequence.token_type_ids for sequence in batch]
            )
            output = self.runner.step(packed)
        except Exception as error:  # forwarded to every waiting caller, never swallowed
            logger.exception("engine step failed")
            self._fail(batch, EngineError(f"model step failed: {type(error).__name__}"))
            return None
        if self._on_batch is not None:
            self._on_batch(packed.num_tokens, packed.num_seqs)
        return _InFlight(batch, output)

    def _finish(self, in_flight: _InFlight) -> None:
        try:
            rows = in_flight.output.result()
        except Exception as error:
            logger.exception("engine result failed")
            self._fail(in_flight.batch, EngineError(f"model step failed: {type(error).__name__}"))
            return
        if not np.isfinite(rows).all():
            logger.error("model produced non-finite outputs")
        for sequence, row in zip(in_flight.batch, rows):
            sequence.owner.set_row(sequence.index, row)

    @staticmethod
    def _fail(batch: list[ScheduledSequence], error: BaseException) -> None:
        failed: set[int] = set()
        for sequence in batch:
            if id(sequence.owner) not in failed:
                failed.add(id(sequence.owner))
                sequence.owner.fail(error)

    def _fail_queued(self) -> None:
        while batch := self.scheduler.next_batch(timeout=0):
            self._fail(batch, EngineStopped("the engine stopped before this request ran"))
