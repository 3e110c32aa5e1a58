"""TokenizerPool: the threads a gateway tokenizes large inputs on, the characters queued on them and the
rate they work through them, so that admission can count a request's tokenization (its wait behind the
others' and its own) before it waits; and the latest start a queued part may still make (StartBy)."""

from __future__ import annotations

import asyncio
import functools
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeVar

from api.decode_turns import GatewayTurns
from engine.errors import BehindDeadline, EngineError, NeverInTime
from engine.service_rate import RECOVERY_HALF_LIFE_S, MovingRate

T = TypeVar("T")
NUM_PARTS = 64  # the moving window of measured parts; a rate slower than the start-up's sample (taken
# while the threads were idle; an image pool's: its fastest part) recovers toward it (MovingRate): parts
# measured on a busy host do not refuse, for ever, the work that the quiet host does in time


class TokenizingNeverInTime(NeverInTime):
    """Tokenizing a request's input alone, on idle threads, would take more than admission allows of the
    whole request timeout: a 400, which no retry passes."""

    refusal = "tokenizing_never_in_time"

    def __init__(self, needed_s: float, allowed_s: float, timeout_s: float):
        NeverInTime.__init__(self, needed_s, allowed_s, timeout_s, "tokenizing this request")


class TokenizerBehind(BehindDeadline):
    """The tokenizer's threads could not finish a request's input within the time its deadline leaves
    them: a 429, whose Retry-After is how far past that time it would be."""

    refusal = "tokenizer_behind"

    def __init__(self, needed_s: float, allowed_s: float):
        EngineError.__init__(
            self,
            f"the server is too busy to tokenize this request in time: it needs about {needed_s:.1f} s of "
            f"the tokenizer's threads, behind the inputs queued on them, and its --request-timeout leaves "
            f"{max(0.0, allowed_s):.1f} s for that; retry later",
        )
        self.retry_after_s = max(1, math.ceil(needed_s - max(0.0, allowed_s)))


@dataclass(frozen=True, slots=True)
class StartBy:
    """The latest a request's part may start on a thread and still finish in time (TokenizerBehind
    past it), with what the refusal then says, counted from its admission."""

    at: float  # time.perf_counter()
    admitted_at: float
    own_s: float  # its own time on the threads, as estimated at admission
    allowed_s: float  # the time its deadline left the threads at admission

    def check(self, now: float) -> None:
        if now > self.at:
            raise TokenizerBehind(now - self.admitted_at + self.own_s, self.allowed_s)


class TokenizeAdmission(Protocol):
    """Who admits an input's tokenization (a request's RequestGuard): given how long it takes behind what is
    queued (`tokenize_s`) and alone (`own_s`), None before the threads have measured, and the tokens it
    should give, it refuses (raises) or says by when its parts must start (None: any time)."""

    def admit_tokenization(
        self, tokenize_s: float | None, own_s: float | None, num_tokens: int
    ) -> StartBy | None: ...

    def refuse_if_behind(self, num_tokens: int) -> None:
        """Refuse (raise) now where the engine would refuse `num_tokens` of work, before any tokenization."""


class TokenizerPool:
    """`num_threads` threads, FIFO. Each part's time on its thread (wall time: it includes what the host's
    other work takes from it) measures the rate in seconds a character, over the last NUM_PARTS parts.
    With `turns` (an image model's pool, beside other gateways'), each part also waits for its turn at the
    host's cores (api/decode_turns.py)."""

    def __init__(self, num_threads: int, turns: GatewayTurns | None = None):
        self.num_threads = max(1, num_threads)
        self.turns = turns
        self._threads = ThreadPoolExecutor(max_workers=self.num_threads, thread_name_prefix="posy-tokenize")
        self._parts = MovingRate(NUM_PARTS, RECOVERY_HALF_LIFE_S)
        self._queued_chars = 0  # of parts submitted and not yet finished (or refused, or cancelled)
        self._lock = threading.Lock()

    def observe(self, num_chars: int, seconds: float) -> None:
        """A part of `num_chars` characters took `seconds` on one thread (any thread)."""
        if num_chars <= 0 or seconds <= 0:
            return
        with self._lock:
            self._parts.add(num_chars, seconds)

    def observe_idle(self, num_chars: int, seconds: float) -> None:
        """A sample of `num_chars` took `seconds` on idle threads (at start-up): the rate an aged one
        returns to, and its first observation."""
        self.observe(num_chars, seconds)
        self._parts.measured_reference = seconds / num_chars

    @property
    def seconds_per_char(self) -> float | None:
        return self._parts.seconds_per_unit

    @property
    def queued_chars(self) -> int:
        return self._queued_chars

    def seconds_for(self, num_chars: int, behind_queued: bool = True) -> float | None:
        """How long `num_chars` characters split over the threads take to come back: behind what is queued
        on them, or (`behind_queued` False) on idle threads, at the faster of the rate and the idle
        sample's; None before any part was measured."""
        per_char = self.seconds_per_char
        if per_char is None:
            return None
        reference = self._parts.reference
        if not behind_queued and reference is not None:
            per_char = min(per_char, reference)
        queued = self._queued_chars if behind_queued else 0
        return (queued + num_chars) * per_char / self.num_threads

    async def map(
        self,
        work: Callable[[Sequence[str], int], T],
        texts: Sequence[str],
        start_by: StartBy | None = None,
        part_size: int | None = None,
    ) -> list[T | BaseException]:
        """`work(part, index of its first text)` on consecutive parts of `texts` at once: num_threads parts,
        or parts of `part_size` texts (then the longest first, so that the threads, taking the next part as
        each is free, end together), each part's result (or its error) in order; a part that would start
        after `start_by` is refused (TokenizerBehind) without being worked on."""
        loop = asyncio.get_running_loop()
        size = part_size or -(-len(texts) // self.num_threads)
        parts = [(texts[start : start + size], start) for start in range(0, len(texts), size)]
        sizes = [sum(map(len, part)) for part, _ in parts]
        with self._lock:
            self._queued_chars += sum(sizes)
        order = range(len(parts))
        if part_size is not None:
            order = sorted(order, key=sizes.__getitem__, reverse=True)
        first = self.turns.take(len(parts)) if self.turns is not None else None  # tickets, in `order`
        running = {}
        for turn, index in enumerate(order):
            submitted = self._threads.submit(
                self._run,
                work,
                *parts[index],
                sizes[index],
                start_by,
                None if first is None else first + turn,
            )
            # a part cancelled before it started (its request gone) never runs _run, whose end releases
            # its characters and its turn: they are released here
            submitted.add_done_callback(functools.partial(self._unstarted, sizes[index], first is not None))
            running[index] = asyncio.wrap_future(submitted, loop=loop)
        return await asyncio.gather(*(running[index] for index in range(len(parts))), return_exceptions=True)

    def _unstarted(self, num_chars: int, has_turn: bool, part: Future) -> None:
        if part.cancelled():
            with self._lock:
                self._queued_chars -= num_chars
            if has_turn:
                self.turns.finish()

    def _run(
        self,
        work: Callable[[Sequence[str], int], T],
        part: Sequence[str],
        first: int,
        num_chars: int,
        start_by: StartBy | None,
        ticket: int | None = None,
    ) -> T:
        try:
            if ticket is not None:
                self.turns.wait(ticket)
            started = time.perf_counter()
            if start_by is not None:
                start_by.check(started)
            result = work(part, first)
            self.observe(num_chars, time.perf_counter() - started)
            return result
        finally:
            with self._lock:
                self._queued_chars -= num_chars
            if ticket is not None:
                self.turns.finish()

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
