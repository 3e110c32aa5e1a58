"""EngineRequest: one caller's sequences inside the engine: their rows as batches finish, when the first
was batched and the last came back, and how the caller hears of it (an asyncio future in process, a reply
message in a replica process)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.host_copy import copy_into
from engine.passing_thread import settle


@dataclass(frozen=True, slots=True)
class EngineOutput:
    """A request's rows, in the order of its sequences, and where its engine time went."""

    rows: np.ndarray  # [num_seqs, out_dim] float32 (a token head's: [num_tokens, out_dim])
    queue_s: float  # from submission until its first sequence was batched
    inference_s: float  # from then until its last row was back on the host
    num_tokens: int  # the tokens the model ran for it: its sequences, and its shared prefix once a batch


class EngineRequest:
    """Rows arrive a batch's worth at a time on the engine's thread; the last ones call `done`."""

    __slots__ = (
        "num_pending", "rows", "row_starts", "columns", "submitted_at", "started_at", "num_tokens",
        "checked_estimate_s",
    )  # fmt: skip

    def __init__(self, num_seqs: int):
        self.num_pending = num_seqs  # rows still to come
        self.rows: np.ndarray | None = None
        self.row_starts: list[int] | None = None  # with expect_rows: each sequence's first row
        self.columns: tuple[int, int] | None = None  # of each row, the columns it keeps (RowRequest's)
        self.submitted_at = time.perf_counter()
        self.started_at: float | None = None
        self.num_tokens = 0  # run so far, counted as batches launch
        # the estimate it was admitted on, where its time is to be checked against it (ServiceRate.checks)
        self.checked_estimate_s: float | None = None

    def is_cancelled(self) -> bool:
        return False

    def started(self, now: float) -> None:
        if self.started_at is None:
            self.started_at = now

    def expect_rows(self, counts: Sequence[int]) -> None:
        """Its sequences give these many rows each, not one (a token head's: a row a token; late
        chunking: a row a span)."""
        self.row_starts = list(itertools.accumulate(counts, initial=0))
        self.num_pending = self.row_starts[-1]

    def set_rows(self, start: int, rows: np.ndarray) -> None:
        """Rows of sequences start, start + 1, ... (a batch holds a request's sequences in order)."""
        if self.row_starts is not None:
            start = self.row_starts[start]
        if self.columns is not None:
            rows = rows[:, self.columns[0] : self.columns[1]]
        if self.rows is None:
            if len(rows) == self.num_pending:  # the whole request in one batch: no copy of its rows
                self.num_pending = 0
                self.rows = rows if self.columns is None else np.ascontiguousarray(rows)
                self.done(self._output())
                return
            self.rows = np.empty((self.num_pending, rows.shape[1]), dtype=np.float32)
        copy_into(self.rows[start : start + len(rows)], rows)
        self.num_pending -= len(rows)
        if self.num_pending == 0:
            self.done(self._output())

    def _output(self) -> EngineOutput:
        now = time.perf_counter()
        started = self.started_at if self.started_at is not None else now
        return EngineOutput(self.rows, started - self.submitted_at, now - started, self.num_tokens)

    def done(self, output: EngineOutput) -> None:
        raise NotImplementedError

    def fail(self, error: BaseException) -> None:
        raise NotImplementedError


class FutureRequest(EngineRequest):
    """An in-process caller awaiting an asyncio future; cancelling the future cancels the request."""

    __slots__ = ("loop", "future")

    def __init__(self, num_seqs: int, loop: asyncio.AbstractEventLoop):
        super().__init__(num_seqs)
        self.loop = loop
        self.future: asyncio.Future[EngineOutput] = loop.create_future()

    def is_cancelled(self) -> bool:
        return self.future.done()

    def done(self, output: EngineOutput) -> None:
        self.loop.call_soon_threadsafe(settle, self.future, output, None)

    def fail(self, error: BaseException) -> None:
        self.loop.call_soon_threadsafe(settle, self.future, None, error)
