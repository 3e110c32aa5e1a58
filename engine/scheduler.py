"""FIFO scheduler under a token and sequence budget; plain Python, no torch."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.errors import EngineStopped, Overloaded


@dataclass(slots=True, eq=False)
class ScheduledSequence:
    token_ids: Sequence[int]
    token_type_ids: Sequence[int] | None = None
    # the request this sequence belongs to and its row in that request's result
    owner: object = None
    index: int = 0
    is_cancelled: Callable[[], bool] = field(default=lambda: False)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class Scheduler:
    """Strict FIFO: a batch takes sequences from the front while they fit; the first one that
    does not fit stays at the front and closes the batch. Cancelled sequences are dropped."""

    def __init__(self, max_batch_tokens: int, max_batch_seqs: int, max_queue_tokens: int):
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_seqs = max_batch_seqs
        self.max_queue_tokens = max_queue_tokens
        self._queue: deque[ScheduledSequence] = deque()
        self._queued_tokens = 0
        self._stopped = False
        self._condition = threading.Condition()

    @property
    def queued_tokens(self) -> int:
        return self._queued_tokens

    def submit(self, sequences: Sequence[ScheduledSequence], num_tokens: int | None = None) -> None:
        """Queue one request's sequences together, or refuse them all with Overloaded. `num_tokens`:
        their total when the caller has it. An empty queue admits any request, so a request larger
        than the queue still runs."""
        if num_tokens is None:
            num_tokens = sum(sequence.num_tokens for sequence in sequences)
        with self._condition:
            if self._stopped:
                raise EngineStopped("the engine is shutting down")
            if self._queue and self._queued_tokens + num_tokens > self.max_queue_tokens:
                raise Overloaded(self._queued_tokens, self.max_queue_tokens)
            self._queue.extend(sequences)
            self._queued_tokens += num_tokens
            self._condition.notify()

    def next_batch(self, timeout: float | None = None) -> list[ScheduledSequence]:
        """Wait up to `timeout` seconds (None: until work or stop) and pop the next batch;
        an empty list means no work arrived in time or the scheduler stopped."""
        with self._condition:
            self._condition.wait_for(lambda: self._queue or self._stopped, timeout=timeout)
            return self._take_batch()

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _take_batch(self) -> list[ScheduledSequence]:
        batch: list[ScheduledSequence] = []
        num_tokens = 0
        while self._queue and len(batch) < self.max_batch_seqs:
            head = self._queue[0]
            if head.is_cancelled():
                self._queue.popleft()
                self._queued_tokens -= head.num_tokens
                continue
            # a sequence above the budget (rejected upstream) still runs alone rather than block
            if batch and num_tokens + head.num_tokens > self.max_batch_tokens:
                break
            self._queue.popleft()
            self._queued_tokens -= head.num_tokens
            batch.append(head)
            num_tokens += head.num_tokens
            if num_tokens >= self.max_batch_tokens:
                break
        return batch
