"""ReplicaPool: the gateway's side of the engine replicas, with Engine's `enqueue` / `run` interface. A
request's sequences are cut into chunks of at most `chunk_tokens` tokens (each with the request's shared
prefix, if it has one, counted in), each chunk goes to the live
replica with the fewest outstanding tokens (those this gateway has sent it, plus the queue it last
reported), and the rows come back in input order. A request is admitted whole or refused whole: one chunk
refused (and not taken by another replica with room) cancels the others. A chunk whose replica dies is
sent once more to another; losing it twice fails the request with EngineStopped (503)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.admission import stretched
from engine.batch import check_images, check_spans
from engine.errors import EngineError, EngineStopped, Overloaded, SequenceTooLong
from engine.interface import EngineInterface
from engine.outputs import ALL_ROWS, HeadOutput, RowRequest
from engine.prefixes import prefix_pays, split_by_tokens, tokens_to_run
from engine.replicas.link import ReplicaLink
from engine.replicas.protocol import Cancel, Capabilities, Failure, Load, Result
from engine.request import EngineOutput
from engine.service_rate import recovered

logger = logging.getLogger(__name__)
MAX_ATTEMPTS = 2  # a chunk is sent at most twice: its first replica, and one other if that one dies


class ReplicaOverloaded(Overloaded):
    def __init__(self, message: str, retry_after_s: float):
        EngineError.__init__(self, message)
        self.retry_after_s = max(1, round(retry_after_s))


@dataclass(slots=True, eq=False)
class _Request:
    """One caller's request over its chunks: done when every chunk is, failed when one fails."""

    future: asyncio.Future
    chunks: list[_Chunk] = field(default_factory=list)
    parts: list[np.ndarray | None] = field(default_factory=list)
    num_pending: int = 0
    queue_s: float = 0.0
    inference_s: float = 0.0
    num_tokens: int = 0  # run by its chunks so far


@dataclass(slots=True, eq=False)
class _Chunk:
    token_ids: Sequence[Sequence[int]]
    token_type_ids: Sequence[Sequence[int] | None] | None
    rows: RowRequest  # its sequences' part of the request's (the prefix, which every chunk carries)
    num_tokens: int  # its sequences' and its prefix's
    request: _Request
    position: int  # in its request
    deadline: float | None
    replica: int = -1
    attempts: int = 0
    id: int = -1  # of its latest Run: a chunk sent again gets a new one
    sent_at: float = 0.0  # time.perf_counter() of its latest Run


class ReplicaPool(EngineInterface):
    def __init__(self, endpoints: Sequence[str], chunk_tokens: int, max_sequence_tokens: int):
        self.endpoints = list(endpoints)
        self.chunk_tokens = chunk_tokens
        self.max_sequence_tokens = max_sequence_tokens
        # what the replicas' engines give and do, as they told it at their start (ReplicaSet sets it)
        self.capabilities: Capabilities | None = None
        num_replicas = len(self.endpoints)
        self.outstanding = [0] * num_replicas  # tokens this gateway has in flight on each replica
        self.reported = [0] * num_replicas  # queued tokens each replica last reported
        self.seconds_per_token: list[float | None] = [None] * num_replicas  # each replica's measured rate
        self.margins = [1.0] * num_replicas  # and its admission's margin (ServiceRate.margin)
        self.idle_seconds_per_token: list[float | None] = [None] * num_replicas  # and its idle probes' rate
        # and the quiet host's, toward which the other two recover as the report ages (since heard_at)
        self.quiet_seconds_per_token: list[float | None] = [None] * num_replicas
        self.heard_at = [0.0] * num_replicas
        self.alive = [True] * num_replicas
        self.chunks_sent = [0] * num_replicas
        self._pending: dict[int, _Chunk] = {}
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._links: list[ReplicaLink | None] = [None] * num_replicas
        self._stopped = False

    @property
    def queued_tokens(self) -> int:
        return sum(self.reported)

    @property
    def output(self) -> HeadOutput:
        """What the replicas' head gives (engine/outputs.py)."""
        return self._capabilities().output

    def describe(self) -> dict[str, str]:
        return {**self._capabilities().description, "replicas": str(len(self.endpoints))}

    def shares_prefix(self, prefix_length: int, lengths: Sequence[int]) -> bool:
        """As Engine.shares_prefix, for the replicas' engines (their capabilities say from how many saved
        tokens they run shared prefixes)."""
        min_saved_tokens = self._capabilities().shared_prefixes_from
        return min_saved_tokens is not None and prefix_pays(prefix_length, lengths, min_saved_tokens)

    def _capabilities(self) -> Capabilities:
        if self.capabilities is None:
            raise EngineStopped("the engine replicas have not started")
        return self.capabilities

    def tokens_to_run(self, lengths: Sequence[int], prefix_length: int = 0) -> int:
        """The tokens a request runs in chunks of chunk_tokens: its shared prefix once a chunk."""
        return tokens_to_run(lengths, self.chunk_tokens, prefix_length)

    def estimate_seconds(self, num_tokens: int) -> float | None:
        """As Engine.estimate_seconds, on idle live replicas: the request's chunks of chunk_tokens each go
        to the replica with the fewest tokens so far (as _send spreads them), and the slowest replica's
        share at its idle rate, stretched by its margin, is the estimate; None while one of them has not
        measured."""
        live = [index for index, alive in enumerate(self.alive) if alive]
        rates = {
            index: self._now(self.idle_seconds_per_token, index) or self._now(self.seconds_per_token, index)
            for index in live
        }
        if not live or None in rates.values():
            return None
        assigned = dict.fromkeys(live, 0)
        for start in range(0, num_tokens, self.chunk_tokens):
            replica = min(live, key=assigned.__getitem__)
            assigned[replica] += min(self.chunk_tokens, num_tokens - start)
        return max(
            tokens * rates[index] * self.margins[index]  # type: ignore[operator]
            for index, tokens in assigned.items()
        )

    def rates(self) -> list[tuple[float | None, float]]:
        """Each replica's, as it last reported them (its rate recovered since)."""
        rates = [self._now(self.seconds_per_token, index) for index in range(len(self.endpoints))]
        return list(zip(rates, self.margins))

    def _now(self, reported: list[float | None], index: int) -> float | None:
        """A rate that replica `index` reported, recovered toward its quiet rate since (as its own)."""
        value = reported[index]
        if value is None:
            return None
        age = time.perf_counter() - self.heard_at[index]
        return recovered(value, self.quiet_seconds_per_token[index], age)

    def backlog_seconds(self, num_tokens: int) -> float | None:
        """As Engine.backlog_seconds, on the live replica that would take the work (the least loaded), at
        its measured rate and margin; None while none has measured. Its load is this gateway's work on
        it, and the queue it reported with that work's results while there is some: with none, its last
        report may be long stale (a queue drained since), and a gateway that refused on it would never
        hear otherwise; the replica judges the work itself as it comes."""
        rates = (self._now(self.seconds_per_token, index) for index in range(len(self.endpoints)))
        estimates = [
            stretched(num_tokens * rate, (outstanding + (reported if outstanding else 0)) * rate, margin)
            for alive, rate, margin, outstanding, reported in zip(
                self.alive, rates, self.margins, self.outstanding, self.reported
            )
            if alive and rate is not None
        ]
        return min(estimates) if estimates else None

    def enqueue(
        self,
        token_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int] | None] | None = None,
        deadline: float | None = None,
        rows: RowRequest = ALL_ROWS,
    ) -> asyncio.Future[EngineOutput]:
        """Send the request's chunks now and return the future of its output (the slowest chunk's queue
        and inference times, the tokens all ran); cancelling it cancels every chunk on its replica. `rows`,
        as Engine.enqueue's, goes with every chunk: its prefix whole, its spans with their sequences."""
        lengths = [len(ids) for ids in token_ids]
        if not lengths or min(lengths) == 0:
            raise ValueError("the engine needs at least one sequence and no empty sequence")
        if rows.spans is not None:
            check_spans(rows.spans, lengths)
        prefix = rows.prefix
        prefix_length = 0 if prefix is None else len(prefix)
        capabilities = self._capabilities()
        if rows.images is not None:
            check_images(capabilities.output, rows, token_ids)
        runs_prefixes = capabilities.shared_prefixes_from is not None
        if prefix is not None and not runs_prefixes and not capabilities.output.scores_prefix:
            raise ValueError("the engine replicas do not run shared prefixes")
        if max(lengths) + prefix_length > self.max_sequence_tokens:
            raise SequenceTooLong(
                f"a sequence of {max(lengths) + prefix_length} tokens exceeds max_batch_tokens "
                f"({self.max_sequence_tokens})"
            )
        if self._stopped:
            raise EngineStopped("the engine is not running")
        self._use_running_loop()
        request = _Request(self._loop.create_future())
        for start, end in split_by_tokens(lengths, self.chunk_tokens, prefix_length):
            types = None if token_type_ids is None else token_type_ids[start:end]
            num_tokens = sum(lengths[start:end]) + prefix_length
            position = len(request.chunks)
            chunk = _Chunk(
                token_ids[start:end], types, rows.sliced(start, end), num_tokens, request, position, deadline
            )
            request.chunks.append(chunk)
        request.parts = [None] * len(request.chunks)
        request.num_pending = len(request.chunks)
        request.future.add_done_callback(lambda _, request=request: self._request_done(request))
        for chunk in request.chunks:
            if request.future.done():
                break
            self._send(chunk)
        return request.future

    @property
    def accepting(self) -> bool:
        """Some replica is alive and the pool is not stopped (readiness)."""
        return not self._stopped and any(self.alive)

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
            self._close()  # no loop runs any more: nothing else touches the links

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

    def _use_running_loop(self) -> None:
        """Links live on one loop; a new loop (a test's, a restarted server's) gets new ones."""
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        self._close()
        self._loop = loop
        self.outstanding = [0] * len(self.endpoints)

    def _link(self, index: int) -> ReplicaLink | None:
        link = self._links[index]
        if link is None:
            try:
                link = ReplicaLink(
                    index, self.endpoints[index], self._loop, self._on_message, self._on_closed
                )
            except OSError as error:  # not listening (yet, or any more): another replica takes the chunk
                logger.warning("engine replica %d cannot be reached: %s", index, error)
                return None
            self._links[index] = link
        return link

    def _send(self, chunk: _Chunk) -> None:
        while True:
            live = [index for index, alive in enumerate(self.alive) if alive]
            if not live:
                self._fail_request(chunk.request, EngineStopped("no engine replica is running"))
                return
            replica = min(live, key=lambda index: self.outstanding[index] + self.reported[index])
            link = self._link(replica)
            if link is not None:
                break
            self.alive[replica] = False
        chunk_id = next(self._ids)
        chunk.replica, chunk.attempts, chunk.id = replica, chunk.attempts + 1, chunk_id
        self._pending[chunk_id] = chunk
        self.outstanding[replica] += chunk.num_tokens
        self.chunks_sent[replica] += 1
        chunk.sent_at = time.perf_counter()
        prefix = chunk.rows.prefix
        num_sequence_tokens = chunk.num_tokens - (0 if prefix is None else len(prefix))
        link.send_run(
            chunk_id, chunk.token_ids, chunk.token_type_ids, num_sequence_tokens, chunk.deadline, chunk.rows
        )

    def _forget(self, chunk_id: int, cancel: bool = False) -> _Chunk | None:
        chunk = self._pending.pop(chunk_id, None)
        if chunk is not None:
            self.outstanding[chunk.replica] -= chunk.num_tokens
            link = self._links[chunk.replica]
            if cancel and link is not None:
                link.send(Cancel(chunk_id))
        return chunk

    def _on_message(self, index: int, message: Result | Failure | Load, rows: np.ndarray | None) -> None:
        self.reported[index] = message.queued_tokens
        self.seconds_per_token[index] = message.seconds_per_token
        self.margins[index] = message.margin
        self.idle_seconds_per_token[index] = message.idle_seconds_per_token
        self.quiet_seconds_per_token[index] = message.quiet_seconds_per_token
        self.heard_at[index] = time.perf_counter()
        if isinstance(message, Load):
            return
        chunk = self._forget(message.id)
        if chunk is None or chunk.request.future.done():  # cancelled, or already sent elsewhere
            return
        if isinstance(message, Failure):
            # a stopped replica's chunk goes elsewhere; so does a refused one where another replica has
            # room (its queue filled with other gateways' work since this one last heard of it)
            retry = message.kind == "stopped" or (
                message.kind == "overloaded" and self._room_elsewhere(index)
            )
            if retry and chunk.attempts < MAX_ATTEMPTS:
                self._resend(chunk)
            else:
                self._fail_request(chunk.request, _exception(message))
            return
        request = chunk.request
        request.parts[chunk.position] = rows
        # its wait in the replica's socket is queue time too
        queue_s = max(message.queue_s, message.finished_at - message.inference_s - chunk.sent_at)
        request.queue_s = max(request.queue_s, queue_s)
        request.inference_s = max(request.inference_s, message.inference_s)
        request.num_tokens += message.num_tokens
        request.num_pending -= 1
        if request.num_pending == 0:
            parts = request.parts
            output = parts[0] if len(parts) == 1 else np.concatenate(parts)
            request.future.set_result(
                EngineOutput(output, request.queue_s, request.inference_s, request.num_tokens)
            )

    def _fail_request(self, request: _Request, error: BaseException) -> None:
        if not request.future.done():
            request.future.set_exception(error)  # _request_done cancels the other chunks

    def _request_done(self, request: _Request) -> None:
        """A request that failed or was cancelled takes its other chunks off the replicas."""
        future = request.future
        if not future.cancelled() and future.exception() is None:
            return
        for chunk in request.chunks:
            if self._pending.get(chunk.id) is chunk:
                self._forget(chunk.id, cancel=True)

    def _on_closed(self, index: int, link: ReplicaLink) -> None:
        """The replica closed its end (it died or stopped): its chunks go elsewhere."""
        if self._links[index] is link:
            self._links[index] = None
            self._fail_over(index)

    def _room_elsewhere(self, index: int) -> bool:
        load = [self.outstanding[other] + self.reported[other] for other in range(len(self.endpoints))]
        return any(
            self.alive[other] and load[other] < load[index] for other in range(len(load)) if other != index
        )

    def _resend(self, chunk: _Chunk) -> None:
        if chunk.attempts >= MAX_ATTEMPTS:
            self._fail_request(
                chunk.request, EngineStopped("the engine replica running this request stopped")
            )
        else:
            self._send(chunk)

    def _fail_over(self, index: int) -> None:
        self.alive[index] = False
        self.reported[index] = 0
        link, self._links[index] = self._links[index], None
        if link is not None:
            link.close()
        lost = [chunk_id for chunk_id, chunk in self._pending.items() if chunk.replica == index]
        if lost:
            logger.warning("engine replica %d died with %d chunks in flight: retrying them", index, len(lost))
        for chunk_id in lost:
            chunk = self._forget(chunk_id)
            if chunk is not None and not chunk.request.future.done():
                self._resend(chunk)

    def _revive(self, index: int) -> None:
        self.alive[index] = True
        self.reported[index] = 0

    def _close(self) -> None:
        """Fail what is pending and close the links."""
        for chunk in self._pending.values():
            future = chunk.request.future
            if not future.done() and not future.get_loop().is_closed():
                future.set_exception(EngineStopped("the server is shutting down"))
        self._pending.clear()
        for index, link in enumerate(self._links):
            if link is not None:
                link.close()
            self._links[index] = None


def _exception(failure: Failure) -> Exception:
    if failure.kind == "overloaded":
        return ReplicaOverloaded(failure.message, failure.retry_after_s)
    if failure.kind == "invalid":
        return SequenceTooLong(failure.message)
    if failure.kind == "stopped":
        return EngineStopped(failure.message)
    return EngineError(failure.message)
