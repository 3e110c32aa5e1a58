"""FIFO scheduler under a token and sequence budget, admitting work by tokens and by time; plain Python,
no torch."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.admission import BATCH_SHARE, admit, stretched
from engine.errors import EngineStopped, Overloaded
from engine.outputs import ALL_ROWS, RowRequest
from engine.service_rate import ServiceRate


@dataclass(slots=True, eq=False)
class ScheduledSequence:
    """One sequence of a batch."""

    token_ids: Sequence[int]
    token_type_ids: Sequence[int] | None = None
    # the request this sequence belongs to and its row in that request's result
    owner: object = None
    index: int = 0
    # the batch position of the shared prefix this sequence continues (-1: none); a prefix itself has
    # no row in its request's result
    prefix_at: int = -1
    is_prefix: bool = False
    spans: Sequence[int] | None = None  # where its pooled spans start (late chunking); None: one span
    first_row: bool = False  # a token head gives its first row only, not a row a token (bge-m3's dense)
    image: object = None  # the pixels of the image it is or holds (RowRequest.images' entry); None: a text


@dataclass(slots=True, eq=False)
class QueuedRequest:
    """One caller's sequences, queued as one entry: submitting costs the same for 1 or 1,000
    sequences, and batches cut ScheduledSequences out of it on the worker thread."""

    token_ids: Sequence[Sequence[int]]
    token_type_ids: Sequence[Sequence[int] | None] | None = None  # per sequence; None: no segments
    owner: object = None
    is_cancelled: Callable[[], bool] = field(default=lambda: False)
    lengths: list[int] = field(default_factory=list)  # filled from token_ids when left empty
    # what it asks back (engine/outputs.py); a prefix runs once in each batch that takes sequences of the
    # request, before the first of them
    rows: RowRequest = ALL_ROWS
    deadline: float | None = None  # (time.perf_counter) set by Scheduler.submit
    taken: int = 0  # sequences already in batches
    remaining_tokens: int = 0  # the prefix counted once, until a batch first takes it

    def __post_init__(self) -> None:
        if not self.lengths:
            self.lengths = [len(ids) for ids in self.token_ids]
        self.remaining_tokens = sum(self.lengths) + self.prefix_length

    @property
    def prefix(self) -> Sequence[int] | None:
        return self.rows.prefix

    @property
    def prefix_length(self) -> int:
        return 0 if self.rows.prefix is None else len(self.rows.prefix)

    def take_prefix(self) -> ScheduledSequence:
        if self.taken == 0:
            self.remaining_tokens -= self.prefix_length
        return ScheduledSequence(self.rows.prefix, None, self.owner, -1, is_prefix=True)

    def take(self) -> ScheduledSequence:
        index = self.taken
        self.taken += 1
        self.remaining_tokens -= self.lengths[index]
        types = self.token_type_ids[index] if self.token_type_ids is not None else None
        spans = self.rows.spans[index] if self.rows.spans is not None else None
        image = self.rows.images[index] if self.rows.images is not None else None
        return ScheduledSequence(
            self.token_ids[index], types, self.owner, index, spans=spans, first_row=self.rows.first_rows,
            image=image,
        )  # fmt: skip

    @property
    def done(self) -> bool:
        return self.taken == len(self.lengths)


class Scheduler:
    """Strict FIFO over sequences: a batch takes sequences from the front while they fit; the first
    one that does not fit stays at the front and closes the batch. A cancelled request's sequences
    not yet taken are dropped. With a ServiceRate, a request with a deadline is admitted only while the
    work queued ahead of it plus its own is estimated to finish before it (engine/admission.py); and one
    that, come to the front, would no longer finish before it (the host slowed the engine after its
    admission) is not run but set aside, for its owner to refuse (take_expired): never answered late, and
    no batch spent on it. So is one whose first batches ran, where the rest of it, at the rate now measured,
    would come back after its deadline."""

    def __init__(
        self,
        max_batch_tokens: int,
        max_batch_seqs: int,
        max_queue_tokens: int,
        rate: ServiceRate | None = None,
    ):
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_seqs = max_batch_seqs
        self.max_queue_tokens = max_queue_tokens
        self.rate = rate
        self._queue: deque[QueuedRequest] = deque()
        self._expired: list[tuple[QueuedRequest, float, float]] = []
        self._queued_tokens = 0
        self._stopped = False
        self._woken = False
        self._condition = threading.Condition()

    @property
    def queued_tokens(self) -> int:
        return self._queued_tokens

    def submit(self, request: QueuedRequest, deadline: float | None = None) -> tuple[float, float] | None:
        """Queue one request's sequences together, or refuse them all with Overloaded. An empty queue
        admits any number of tokens, so a request larger than the queue still runs; `deadline`
        (time.perf_counter) refuses work that would finish after it (BehindDeadline, engine/admission.py:
        the rate's estimate, stretched by its margin where work is ahead, must fit ADMIT_SHARE of the time
        left). Returns (estimate, time left) where the deadline was judged on an estimate (the estimate
        unstretched)."""
        if not request.lengths:
            raise ValueError("a request needs at least one sequence")
        num_tokens = request.remaining_tokens
        with self._condition:
            if self._stopped:
                raise EngineStopped("the engine is shutting down")
            if self._queue and self._queued_tokens + num_tokens > self.max_queue_tokens:
                raise Overloaded(self._queued_tokens, self.max_queue_tokens)
            judged = None
            per_token = None if deadline is None or self.rate is None else self.rate.seconds_per_token
            if per_token is not None:
                own = num_tokens * per_token
                ahead = self._queued_tokens * per_token + self.rate.in_flight_left()
                left = deadline - time.perf_counter()
                admit(own, ahead, self.rate.margin, left, left)
                judged = own + ahead, left
            request.deadline = deadline
            self._queue.append(request)
            self._queued_tokens += num_tokens
            self._condition.notify()
        return judged

    def next_batch(self, timeout: float | None = None) -> list[ScheduledSequence]:
        """Wait up to `timeout` seconds (None: until work or stop) and pop the next batch;
        an empty list means no work arrived in time or the scheduler stopped."""
        with self._condition:
            self._condition.wait_for(lambda: self._queue or self._stopped or self._woken, timeout=timeout)
            self._woken = False
            return self._take_batch()

    def take_expired(self) -> list[tuple[QueuedRequest, float, float]]:
        """The requests set aside since the last call, with the estimate (its margin included) and the
        time left that judged each."""
        if not self._expired:  # the usual case, read without the lock: the batching thread sets them
            return []
        with self._condition:
            expired, self._expired = self._expired, []
        return expired

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify_all()

    def wake(self) -> None:
        """A worker waiting in next_batch returns (empty-handed unless work came)."""
        with self._condition:
            self._woken = True
            self._condition.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _take_batch(self) -> list[ScheduledSequence]:
        batch: list[ScheduledSequence] = []
        num_tokens = 0
        prefixed: QueuedRequest | None = None  # the request whose prefix is in the batch, at prefix_at
        prefix_at = -1
        due: float | None = None  # the earliest deadline of a request in the batch
        while self._queue and len(batch) < self.max_batch_seqs:
            head = self._queue[0]
            if head.is_cancelled() or self._expires(head, num_tokens):
                self._queue.popleft()
                self._queued_tokens -= head.remaining_tokens
                continue
            # a batch's rows all come back at its end: a request that would make it take more than
            # BATCH_SHARE of what the earliest deadline in it (its own included) leaves waits for the next
            # batch (a request already begun in it goes on: it needs all its sequences back)
            if batch and head.taken == 0:
                earliest = head.deadline if due is None else min(due, head.deadline or due)
                joined = min(self.max_batch_tokens, num_tokens + head.remaining_tokens)
                if earliest is not None and self._ends_after(joined, earliest):
                    break
            length = head.lengths[head.taken]
            # a request's prefix goes first, once a batch, before the first of its sequences there
            needs_prefix = head.prefix is not None and prefixed is not head
            if needs_prefix:
                length += head.prefix_length
                if batch and len(batch) + 2 > self.max_batch_seqs:
                    break
            # a sequence above the budget (rejected upstream) still runs alone rather than block
            if batch and num_tokens + length > self.max_batch_tokens:
                break
            if needs_prefix:
                before = head.remaining_tokens
                batch.append(head.take_prefix())
                self._queued_tokens -= before - head.remaining_tokens
                prefixed, prefix_at = head, len(batch) - 1
            sequence = head.take()
            if head.prefix is not None:
                sequence.prefix_at = prefix_at
            batch.append(sequence)
            if head.deadline is not None:
                due = head.deadline if due is None else min(due, head.deadline)
            self._queued_tokens -= head.lengths[sequence.index]
            num_tokens += length
            if head.done:
                self._queue.popleft()
            if num_tokens >= self.max_batch_tokens:
                break
        return batch

    def _expires(self, request: QueuedRequest, ahead_tokens: int) -> bool:
        """Whether `request`, at the front, would come back after its deadline (its own work behind the
        `ahead_tokens` of the batch it would join, as admission stretches them; once begun, the rest of it
        at the bare rate: what ran of it is spent, and only a certain overrun is worth dropping it for); if
        so it is set aside."""
        if request.deadline is None:
            return False
        if request.taken == 0:
            late = self._late(request.remaining_tokens, ahead_tokens, request.deadline)
        elif ahead_tokens == 0:  # a new batch would carry on with it
            late = self._late(request.remaining_tokens, 0, request.deadline, margin=False)
        else:
            return False
        if late is not None:
            self._expired.append((request, *late))
        return late is not None

    def _ends_after(self, num_tokens: int, deadline: float) -> bool:
        """Whether a batch of `num_tokens` would take more than BATCH_SHARE of the time to `deadline` (behind
        what is left of the batch on the device), at the guarded rate, unstretched."""
        per_token = self.rate.guarded_seconds_per_token if self.rate is not None else None
        if per_token is None:
            return False
        estimate = num_tokens * per_token + self.rate.in_flight_left()
        return estimate > BATCH_SHARE * (deadline - time.perf_counter())

    def _late(
        self, own_tokens: int, ahead_tokens: int, deadline: float, margin: bool = True
    ) -> tuple[float, float] | None:
        """(estimate, time left) where `own_tokens` behind `ahead_tokens` and what is left of the batch on
        the device would come back after `deadline`: at the guarded rate (ServiceRate's), stretched as
        admission stretches it (unless `margin` is False); None where in time or not yet measured."""
        per_token = self.rate.guarded_seconds_per_token if self.rate is not None else None
        if per_token is None:
            return None
        own, ahead = own_tokens * per_token, ahead_tokens * per_token + self.rate.in_flight_left()
        estimate = stretched(own, ahead, self.rate.margin) if margin else own + ahead
        left = deadline - time.perf_counter()
        return (estimate, left) if estimate > left else None
