"""RequestGuard: what one HTTP request may ask of the model: a token budget, a deadline, and no work
left in the queue once its client has gone; it notes where the request's time went."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar

import numpy as np
from litestar import Request
from litestar.types import Receive

from api.config import ServerConfig
from api.errors import ClientDisconnected, RequestTimeout, RequestTooLarge
from api.timing import times_of
from api.tokenizer_pool import StartBy, TokenizerBehind, TokenizingNeverInTime
from engine.admission import ADMIT_SHARE, TOKENIZE_SHARE, fits_alone
from engine.errors import BehindDeadline, NeverInTime
from engine.inline_images import vision_patches
from engine.interface import EngineInterface
from engine.outputs import ALL_ROWS, HeadOutput, RowRequest
from engine.request import EngineOutput

T = TypeVar("T")
# work that comes back sooner needs no watch for the client's disconnect: it is done before a watch
# could drop it, and a task per request costs the busy event loop more than the model's answer
WATCH_AFTER_S = 0.005


class RequestGuard:
    """The engine as one request sees it (an EngineInterface, which scoring runs on). `run` refuses more than
    max_request_tokens over the request's runs (counted as the engine will run them: a shared prefix once
    a batch), and work that would outlast --request-timeout even on an idle engine, before anything is
    queued; the engine refuses (429) what its queue could not finish in the time left, and what come to
    the front of its queue could no longer finish in it. Then it waits until the rows come, the client
    disconnects (499) or the deadline passes (504: never a late answer), whichever is first; the last two
    cancel the engine's future, and the scheduler drops what is not yet batched.
    Before that, a large input's tokenization is admitted by the same deadline (admit_tokenization). The
    engine's deadline is the request's less what the gateway takes to answer once the rows are back
    (RequestTimes.answer_reserve_s). A request whose engine's queue alone would not finish by then is
    refused as the guard is made, before its inputs are tokenized: under a flood of clients that never
    back off, a refusal then costs the loop its body's decoding, not its tokenization. Every refusal for
    time follows engine/admission.py."""

    def __init__(self, engine: EngineInterface, request: Request, config: ServerConfig):
        self.engine = engine
        self.receive = request.receive
        self.max_request_tokens = config.max_request_tokens
        self.timeout_s = config.request_timeout
        self.times = times_of(request.scope)
        self.deadline = self.engine_deadline = None
        if self.timeout_s > 0:
            self.deadline = self.times.origin + self.timeout_s
            self.engine_deadline = self.deadline - self.times.answer_reserve_s
            self.refuse_if_behind(1)
        self.num_tokens_asked = 0  # by the request's runs so far, as the engine plans to run them
        self.num_tokens = 0  # the tokens the model ran for the request (its usage)
        self._working: set[asyncio.Future] = set()  # its engine calls in flight
        self._tokenizing = 0  # its tokenizations in flight (several at once: `together`)
        self._tokenizing_since = 0.0

    def refuse_if_behind(self, num_tokens: int) -> None:
        """BehindDeadline where the engine would refuse `num_tokens` of work now: with its queue it takes
        more than ADMIT_SHARE of the time left to the engine. Asked for a single token as the guard is made,
        and for a guess of the input's tokens before it is tokenized (TextEncoder.guessed_tokens), so that
        under a flood a refusal costs the loop no tokenization (inline, up to 20,000 characters a request:
        on two cores, floods of never-backing-off clients had their refusals answered seconds late)."""
        if self.engine_deadline is None:
            return
        if num_tokens > 1:  # work past --max-request-tokens, or that an idle engine would not finish in
            # time either, is run()'s to refuse for good (a 400) on its counted tokens
            if self.num_tokens_asked + num_tokens > self.max_request_tokens:
                return
            idle_s = self.engine.estimate_seconds(num_tokens)
            if idle_s is None or not fits_alone(idle_s, self.whole_s):
                return
        backlog = self.engine.backlog_seconds(num_tokens)
        left = self.engine_deadline - time.perf_counter()
        if backlog is not None and backlog > ADMIT_SHARE * left:
            raise BehindDeadline(backlog, left, max(1, math.ceil(backlog - ADMIT_SHARE * self.timeout_s)))

    @property
    def whole_s(self) -> float:
        """What a retry of this request would leave its engine work (admission's `whole_s`): the timeout,
        less the request's own tokenization so far."""
        return self.timeout_s - (self.times.tokenization_s or 0.0)

    def admit_tokenization(
        self, tokenize_s: float | None, own_s: float | None, num_tokens: int
    ) -> StartBy | None:
        """A large input's tokenization, admitted by the request's deadline as the engine admits its work
        (engine/admission.py): of ADMIT_SHARE of the time left, less the engine's queue and its `num_tokens`
        (backlog_seconds), tokenizing it behind what is queued on the encoder's threads (`tokenize_s`) may
        take TOKENIZE_SHARE, else it is refused now (TokenizerBehind, a 429) rather than left to wait;
        admitted, its parts must start on a thread by the returned StartBy, which leaves them all of it.
        Tokenizing it on idle threads (`own_s`) past TOKENIZE_SHARE of what admission allows of the whole
        timeout is refused for good (TokenizingNeverInTime, a 400). Nothing is refused without a deadline
        or before the threads have measured; nor, for now, work that an idle server would not admit at
        this guess of its tokens: run() judges that (a 400, or a 429) on its counted tokens."""
        if self.engine_deadline is None or tokenize_s is None or own_s is None:
            return None
        allowed = TOKENIZE_SHARE * ADMIT_SHARE * self.timeout_s
        if own_s > allowed:
            raise TokenizingNeverInTime(own_s, allowed, self.timeout_s)
        idle_s = self.engine.estimate_seconds(num_tokens) or 0.0
        if not fits_alone(idle_s + own_s / TOKENIZE_SHARE, self.timeout_s):
            return None
        now = time.perf_counter()
        left = self.engine_deadline - now
        engine_s = self.engine.backlog_seconds(num_tokens) or 0.0
        budget = ADMIT_SHARE * left - engine_s  # what the engine's queue leaves for tokenization
        if tokenize_s > TOKENIZE_SHARE * budget:
            raise TokenizerBehind(tokenize_s, TOKENIZE_SHARE * budget)
        return StartBy(now + budget - own_s, now, own_s, budget)

    async def tokenized(self, tokenizing: Awaitable[T]) -> T:
        """`await tokenizing`, its time counted as the request's tokenization: the time while any of its
        tokenizations is in flight, once."""
        if not self._tokenizing:
            self._tokenizing_since = time.perf_counter()
        self._tokenizing += 1
        try:
            return await tokenizing
        finally:
            self._tokenizing -= 1
            if not self._tokenizing:
                self.times.add_tokenization(time.perf_counter() - self._tokenizing_since)

    # the engine's own, as it is
    @property
    def output(self) -> HeadOutput:
        return self.engine.output

    def estimate_seconds(self, num_tokens: int) -> float | None:
        return self.engine.estimate_seconds(num_tokens)

    def backlog_seconds(self, num_tokens: int) -> float | None:
        return self.engine.backlog_seconds(num_tokens)

    def shares_prefix(self, prefix_length: int, lengths: Sequence[int]) -> bool:
        return self.engine.shares_prefix(prefix_length, lengths)

    def tokens_to_run(self, lengths: Sequence[int], prefix_length: int = 0) -> int:
        return self.engine.tokens_to_run(lengths, prefix_length)

    @property
    def queued_tokens(self) -> int:
        return self.engine.queued_tokens

    @property
    def accepting(self) -> bool:
        return self.engine.accepting

    def describe(self) -> dict[str, str]:
        return self.engine.describe()

    # the request's own
    def stop(self) -> None:
        """Drop what the request still has queued (its calls then raise CancelledError)."""
        for work in self._working:
            work.cancel()

    def enqueue(
        self,
        token_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int] | None] | None = None,
        deadline: float | None = None,
        rows: RowRequest = ALL_ROWS,
    ) -> asyncio.Future[EngineOutput]:
        """run(), as a task (its deadline is the request's, not `deadline`)."""
        return asyncio.ensure_future(self._output(token_ids, token_type_ids, rows))

    async def run(
        self,
        token_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int] | None] | None = None,
        rows: RowRequest = ALL_ROWS,
    ) -> np.ndarray:
        return (await self._output(token_ids, token_type_ids, rows)).rows

    async def _output(
        self,
        token_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int] | None] | None,
        rows: RowRequest,
    ) -> EngineOutput:
        lengths = list(map(len, token_ids))
        prefix = rows.prefix
        num_tokens = sum(lengths) if prefix is None else self.engine.tokens_to_run(lengths, len(prefix))
        self.num_tokens_asked += num_tokens
        if self.num_tokens_asked > self.max_request_tokens:
            raise RequestTooLarge(self.num_tokens_asked, self.max_request_tokens)
        if self.deadline is not None:
            work = num_tokens
            if rows.images is not None and self.engine.output.image_run is not None:
                # a vision-language model's vision tower runs each patch too, as the engine's queue counts
                work += sum(map(vision_patches, rows.images))
            estimate = self.engine.estimate_seconds(work)
            if estimate is not None and not fits_alone(estimate, self.whole_s):
                raise NeverInTime(estimate, ADMIT_SHARE * self.whole_s, self.timeout_s)
        submitted = time.perf_counter()
        work = self.engine.enqueue(token_ids, token_type_ids, self.engine_deadline, rows)
        watch = _Watch(work, self.receive, self.deadline)
        self._working.add(work)
        try:
            output = await work
        except asyncio.CancelledError:
            if watch.outcome is None:  # the request's own task was cancelled
                raise
            watch.raise_outcome(time.perf_counter() - self.times.origin, self.timeout_s)
        finally:
            watch.stop()
            self._working.discard(work)
        waited = time.perf_counter() - self.times.origin
        if self.deadline is not None and waited > self.timeout_s:
            # rows that beat the deadline's timer on a busy loop are still late: never a late 200
            raise RequestTimeout(waited, self.timeout_s)
        self.times.add_engine(output.queue_s, output.inference_s)
        self.times.add_rows_back(submitted, output.queue_s, output.inference_s)
        self.num_tokens += output.num_tokens
        return output


class _Watch:
    """One timer while the work is young; past WATCH_AFTER_S a task that waits for the client's
    disconnect, and a timer for the deadline. Either cancels the work and says why."""

    def __init__(self, work: asyncio.Future, receive: Receive, deadline: float | None):
        self.work, self.receive, self.deadline = work, receive, deadline
        self.outcome: str | BaseException | None = None
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(WATCH_AFTER_S, self._arm)

    def _arm(self) -> None:
        if self.work.done():
            return
        self._task = self._loop.create_task(self._disconnected())
        if self.deadline is not None:
            self._timer = self._loop.call_later(max(0.0, self.deadline - time.perf_counter()), self._expire)

    def _expire(self) -> None:
        self._end("timeout")

    async def _disconnected(self) -> None:
        """The route has read the body, so the next ASGI message is the disconnect (uvicorn and the test
        clients send it; the latter only once the response is complete)."""
        try:
            while (await self.receive())["type"] != "http.disconnect":
                pass
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a failing receive() is a fault, not a disconnect
            self._end(error)
            return
        self._end("disconnect")

    def _end(self, outcome: str | BaseException) -> None:
        if self.outcome is None and not self.work.done():
            self.outcome = outcome
            self.work.cancel()

    def raise_outcome(self, waited_s: float, timeout_s: float) -> None:
        if self.outcome == "timeout":
            raise RequestTimeout(waited_s, timeout_s)
        if self.outcome == "disconnect":
            raise ClientDisconnected()
        raise self.outcome  # type: ignore[misc]

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
        if not self.work.done():
            self.work.cancel()


async def together(calls: list[Awaitable[T]]) -> list[T]:
    """The calls' results in order, run at once so that their sequences share batches; the first to fail
    cancels the others (their queued work is dropped) and its error is raised."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
