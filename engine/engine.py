"""Engine: queues token sequences, runs batches on a worker thread and hands each request its rows (an
asyncio future in process; any EngineRequest, such as a replica's reply)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.admission import stretched
from engine.batch import PackedBatch, check_images, check_spans, pack, rows_per_sequence, sequence_rows
from engine.config import EngineConfig
from engine.errors import BehindDeadline, EngineError, EngineStopped, SequenceTooLong
from engine.inline_images import vision_patches
from engine.interface import EngineInterface
from engine.lazy import LazyTensor
from engine.outputs import ALL_ROWS, SEQUENCE, HeadOutput, RowRequest
from engine.prefixes import (
    MIN_SAVED_TOKENS_EAGER,
    SCORED_BY_MAX_SIM,
    describe_rule,
    prefix_pays,
    tokens_to_run,
)
from engine.replicas.protocol import Capabilities
from engine.request import EngineOutput, EngineRequest, FutureRequest
from engine.runner import ModelRunner
from engine.scheduler import QueuedRequest, ScheduledSequence, Scheduler
from engine.service_rate import ServiceRate

logger = logging.getLogger(__name__)

BatchObserver = Callable[[int, int], None]
IDLE_WAIT_S = 0.5  # how long the worker waits for work before it looks at the scheduler's state again
# with a large batch on the device and nothing queued, the worker listens for new work until the batch's
# rows are ready (looking every OVERLAP_POLL_S) or its expected time is past, and only then blocks on them:
# work that comes meanwhile is launched behind it, so that the device does not idle between the batches of
# requests that come one at a time (4 clients of 100 texts). A small batch's time is mostly the fixed
# cost of a step: work that comes while it runs is better gathered into the next batch than launched alone.
OVERLAP_POLL_S = 0.0002
# in a replica process on a GPU, the worker keeps reading the gateways' sockets without sleeping for this
# long after each batch: a request that comes meanwhile wakes no thread, and the gateway's send to it
# costs less (one 128-token round trip through a replica, answered at once: 129 against 89 us on the
# 2-core development machine). It spins on one core, which the layout leaves to the engine; an engine on
# the CPU never spins (the cores are the model's), nor one in the gateway's process (the GIL)
IDLE_SPIN_S = 0.002


class Intake(Protocol):
    """Work that arrives on the engine's own thread (a replica process's sockets), so that no second
    thread has to be woken for it: `poll` reads what comes within `timeout` seconds and submits it;
    `wake` makes a waiting poll return."""

    def poll(self, timeout: float) -> None: ...

    def wake(self) -> None: ...


@dataclass(slots=True)
class _InFlight:
    batch: list[ScheduledSequence]
    output: LazyTensor
    num_tokens: int
    launched_at: float
    pooled_spans: bool = False  # some sequence of it gives a row a span


class Engine(EngineInterface):
    """Owns a runner, a scheduler and the worker thread between them. While batch N runs on the
    device, the worker packs and launches batch N+1, then hands out batch N's rows (on the CPU, whose
    step computes before it returns, it hands them out first)."""

    def __init__(self, runner: ModelRunner, config: EngineConfig, on_batch: BatchObserver | None = None):
        self.runner = runner
        self.config = config
        self.rate = ServiceRate(config.max_batch_tokens)
        self.scheduler = Scheduler(
            config.max_batch_tokens, config.max_batch_seqs, config.max_queue_tokens, self.rate
        )
        self._on_batch = on_batch
        self.attention_backend = "unknown"  # its name, set by build_engine; for logs and metrics
        # runs sequences that continue a shared prefix (a causal model on a backend with key layouts),
        # and whether callers should send them so (shares_prefix) where that saves min_saved_tokens; all
        # set by build_engine
        self.runs_prefixes = False
        self.shares_prefixes = False
        self.min_saved_tokens = MIN_SAVED_TOKENS_EAGER
        self._thread: threading.Thread | None = None
        self._last_finished = 0.0
        self._intake: Intake | None = None
        # the batch an idle engine times to measure itself again (set by build_engine's seed_rate; None:
        # it never probes), and who hears when a probe changed its rate (a replica tells its gateways)
        self.probe_batch: PackedBatch | None = None
        self.on_rate_change: Callable[[], None] | None = None

    @property
    def output(self) -> HeadOutput:
        """What the model gives (engine/outputs.py)."""
        return self.runner.output

    @property
    def accepting(self) -> bool:
        """Its worker runs and takes work (readiness)."""
        return self._thread is not None and self._thread.is_alive() and not self.scheduler.stopped

    @property
    def queued_tokens(self) -> int:
        return self.scheduler.queued_tokens

    def describe(self) -> dict[str, str]:
        """How the model runs, for logs and metrics."""
        graphs = self.config.cuda_graphs if self.runner.graphs is not None else "off"
        described = {
            "attention_backend": self.attention_backend,
            "cuda_graphs": graphs,
            "replicas": "1",
            "shared_prefixes": describe_rule(self.min_saved_tokens if self.shares_prefixes else None),
        }
        if self.output.scores_prefix:
            described["prefixes"] = SCORED_BY_MAX_SIM
        return described

    def capabilities(self) -> Capabilities:
        """What it gives and does, for a replica's gateways (engine/replicas/protocol.py)."""
        shared_from = self.min_saved_tokens if self.shares_prefixes else None
        return Capabilities(self.output, shared_from, self.describe())

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="posy-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self.scheduler.stop()
        if self._intake is not None:
            self._intake.wake()
        if self._thread is not None:
            self._thread.join(timeout)

    def attach(self, intake: Intake) -> None:
        """From now on the worker also reads `intake` between batches, and waits on it when idle."""
        self._intake = intake
        self.scheduler.wake()

    def shares_prefix(self, prefix_length: int, lengths: Sequence[int]) -> bool:
        """Whether sequences of `lengths` that all start with the same `prefix_length` tokens should come
        as continuations of that prefix (enqueue's `prefix`) rather than whole (engine/prefixes.py)."""
        return self.shares_prefixes and prefix_pays(prefix_length, lengths, self.min_saved_tokens)

    def tokens_to_run(self, lengths: Sequence[int], prefix_length: int = 0) -> int:
        """The tokens a request of `lengths` (continuing a prefix of `prefix_length`) runs in batches of
        max_batch_tokens: the prefix once a batch."""
        return tokens_to_run(lengths, self.config.max_batch_tokens, prefix_length)

    def estimate_seconds(self, num_tokens: int) -> float | None:
        """How long `num_tokens` tokens take on this engine when idle, at its probes' rate and stretched by
        its margin as admission judges it (engine/admission.py); None before it has measured."""
        per_token = self.rate.idle_seconds_per_token
        return None if per_token is None else num_tokens * per_token * self.rate.margin

    def rates(self) -> list[tuple[float | None, float]]:
        return [(self.rate.seconds_per_token, self.rate.margin)]

    def backlog_seconds(self, num_tokens: int) -> float | None:
        """How long `num_tokens` more, queued now, would take to come back behind the queue, as admission
        judges it (engine/admission.py); None before it has measured."""
        per_token = self.rate.seconds_per_token
        if per_token is None:
            return None
        ahead = self.scheduler.queued_tokens * per_token + self.rate.in_flight_left()
        return stretched(num_tokens * per_token, ahead, self.rate.margin)

    def enqueue(
        self,
        token_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int] | None] | None = None,
        deadline: float | None = None,
        rows: RowRequest = ALL_ROWS,
    ) -> asyncio.Future[EngineOutput]:
        """Queue the sequences now (refusals raise here) and return the future of their output, no task
        in between; cancelling the future drops what is still queued. `deadline` (time.perf_counter)
        refuses work the queue could not finish before it (BehindDeadline, a 429). `rows` says what comes
        back: with a prefix, each sequence continues those tokens (where `runs_prefixes`), its row that of
        prefix + sequence, or is scored against them (where the head scores_prefix); with spans (where it
        pools_spans), sequence i gives a row for each of its spans: it starts one, and so does each offset
        in spans[i]; with first_rows, a token head gives each sequence's first row only (the rest never
        leave the device); with columns, each row those columns only."""
        request = FutureRequest(len(token_ids), asyncio.get_running_loop())
        self.submit(request, token_ids, token_type_ids, deadline, rows)
        return request.future

    def submit(
        self,
        request: EngineRequest,
        token_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int] | None] | None = None,
        deadline: float | None = None,
        rows: RowRequest = ALL_ROWS,
    ) -> None:
        """Queue a request from any thread, or raise (Overloaded, SequenceTooLong, EngineStopped,
        ValueError) before anything is queued."""
        if self._thread is None or not self._thread.is_alive():
            raise EngineStopped("the engine is not running")
        # checked here, before queueing, so that one bad sequence never fails a whole batch
        lengths = list(map(len, token_ids))
        if not lengths or min(lengths) == 0:
            raise ValueError("the engine needs at least one sequence and no empty sequence")
        check_rows(self.output, rows, lengths, self.runs_prefixes, token_type_ids is not None)
        if rows.images is not None:
            check_images(self.output, rows, token_ids)
        longest = max(lengths) + (0 if rows.prefix is None else len(rows.prefix))
        costs = lengths
        if rows.images is not None and self.output.image_run is not None:
            # a vision-language model's vision tower runs each patch of a sequence's image too: the queue,
            # its batches and the service rate count them beside the tokens (a batch of images then holds
            # its patches within max_batch_tokens, not four times as many)
            costs = [length + vision_patches(image) for length, image in zip(lengths, rows.images)]
        if longest > self.config.max_batch_tokens:
            raise SequenceTooLong(
                f"a sequence of {longest} tokens exceeds max_batch_tokens ({self.config.max_batch_tokens})"
            )
        counts = rows_per_sequence(self.output, token_ids, rows)
        if counts is not None:
            if min(counts) == 0:  # a request of no rows would never be answered
                raise ValueError("every sequence of this model needs a token that gives a row")
            request.expect_rows(counts)
        request.columns = rows.columns
        # one queue entry per request: a burst of requests holds the GIL, which the worker needs to
        # launch batches, as briefly as it can
        judged = self.scheduler.submit(
            QueuedRequest(token_ids, token_type_ids, request, request.is_cancelled, costs, rows), deadline
        )
        # (a request back before this line is not checked: it was far inside its estimate anyway)
        if judged is not None and self.rate.checks(*judged):
            request.checked_estimate_s = judged[0]

    def _loop(self) -> None:
        device = self.runner.device
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # this thread's current device starts at cuda:0
        in_flight: _InFlight | None = None
        spins = device.type == "cuda"
        # a CPU step computes its batch before it returns: there is nothing to overlap, and launching the
        # next batch before handing out this one's rows would hold them back by a whole batch's time
        hands_out_first = self.runner.computes_on_launch
        while True:
            intake = self._intake
            if in_flight is not None:
                # with a batch on the device, wait for new work only as long as _overlap_wait says, then
                # finish that batch
                wait = self._overlap_wait(in_flight)
            elif intake is not None and spins and time.perf_counter() - self._last_finished < IDLE_SPIN_S:
                wait = 0.0  # see IDLE_SPIN_S
            else:
                wait = IDLE_WAIT_S
            if intake is None:
                batch = self.scheduler.next_batch(timeout=wait)
            else:
                intake.poll(0 if self.scheduler.queued_tokens else wait)
                batch = self.scheduler.next_batch(timeout=0)
            for expired, estimate, left in self.scheduler.take_expired():
                expired.owner.fail(BehindDeadline(estimate, left))
            if hands_out_first and in_flight is not None:
                self._finish(in_flight)
                in_flight = None
            launched = self._launch(batch) if batch else None
            if launched is None and in_flight is not None and self._overlap_wait(in_flight) > 0:
                continue  # nothing came and the batch still runs: listen again
            if launched is not None:
                self.rate.launched(launched.launched_at)
            elif in_flight is None:
                self.rate.launched(None)
            if in_flight is not None:
                self._finish(in_flight)
            in_flight = launched
            if in_flight is None and self.scheduler.stopped and not batch:
                self._fail_queued()
                return
            if in_flight is None and not batch and self.probe_batch is not None:
                if not self.scheduler.queued_tokens and self.rate.probe_due(time.perf_counter()):
                    self.probe()

    def probe(self) -> None:
        """Time probe_batch and give the rate its measure (the engine's thread while idle, or before the
        engine starts): a request that comes meanwhile waits for it as for a batch on the device."""
        batch = self.probe_batch
        started = time.perf_counter()
        per_token = self.rate.idle_seconds_per_token
        self.rate.launched(started, None if per_token is None else batch.num_tokens * per_token)
        try:
            self.runner.step(batch).result()
        except Exception:  # a probe that fails measures nothing; the next real batch says what is wrong
            logger.exception("engine probe failed")
            return
        finally:
            self.rate.launched(None)
        changed = self.rate.observe_probe(batch.num_tokens, time.perf_counter() - started)
        if changed and self.on_rate_change is not None:
            self.on_rate_change()

    def _overlap_wait(self, in_flight: _InFlight) -> float:
        """Seconds to listen for new work before looking at `in_flight` again; 0: block on its rows now
        (see OVERLAP_POLL_S)."""
        per_token = self.rate.seconds_per_token
        if per_token is None or not self.rate.measures(in_flight.num_tokens) or in_flight.output.ready():
            return 0.0
        started = max(in_flight.launched_at, self._last_finished)  # on the device after the one before
        left = started + per_token * in_flight.num_tokens - time.perf_counter()
        return min(OVERLAP_POLL_S, left) if left > 0 else 0.0

    def _launch(self, batch: list[ScheduledSequence]) -> _InFlight | None:
        launched_at = time.perf_counter()
        # busy from now: on the CPU the step computes the whole batch before it returns, and admission
        # meanwhile counts what is left of it (ServiceRate.seconds_for)
        self.rate.launched(launched_at)
        owner = None
        for sequence in batch:
            if sequence.owner is not owner:
                owner = sequence.owner
                owner.started(launched_at)
            owner.num_tokens += len(sequence.token_ids)
        try:
            prefix_of = [sequence.prefix_at for sequence in batch]
            output = self.output
            packed = pack(
                [sequence.token_ids for sequence in batch],
                [sequence.token_type_ids for sequence in batch],
                prefix_of if max(prefix_of) >= 0 else None,
                [sequence.spans for sequence in batch] if output.pools_spans else None,
                [sequence.first_row for sequence in batch] if output.takes_first_rows else None,
                output,
                [sequence.image for sequence in batch] if output.takes_images else None,
            )
            output = self.runner.step(packed)
        except Exception as error:  # forwarded to every waiting caller, never swallowed
            logger.exception("engine step failed")
            self._fail(batch, EngineError(f"model step failed: {type(error).__name__}"))
            return None
        if self._on_batch is not None:
            self._on_batch(packed.num_tokens, packed.num_seqs)
        work = packed.num_tokens  # in the queue's units: with a vision-language model's patches
        if self.output.image_run is not None:
            work += sum(vision_patches(sequence.image) for sequence in batch)
        return _InFlight(batch, output, work, launched_at, packed.pool_cu_seqlens is not None)

    def _finish(self, in_flight: _InFlight) -> None:
        try:
            rows = in_flight.output.result()
        except Exception as error:
            logger.exception("engine result failed")
            self._fail(in_flight.batch, EngineError(f"model step failed: {type(error).__name__}"))
            return
        finished = time.perf_counter()
        # busy time: batches overlap, so a batch's time starts where the previous one's ended
        self.rate.observe(in_flight.num_tokens, finished - max(in_flight.launched_at, self._last_finished))
        self._last_finished = finished
        if not in_flight.output.all_finite():  # large rows: checked on the device
            logger.error("model produced non-finite outputs")
        # a request's sequences sit side by side in a batch (after its prefix, which has no row of the
        # request's): one hand-over per request
        batch, start = in_flight.batch, 0
        # where each sequence's rows start: a row a sequence, or a row a token, a marker or a span
        row_starts: Sequence[int] = range(len(batch) + 1)
        if self.output.rows != SEQUENCE or in_flight.pooled_spans:
            counts = (sequence_rows(self.output, sequence) for sequence in batch)
            row_starts = list(itertools.accumulate(counts, initial=0))
        while start < len(batch):
            if batch[start].is_prefix:
                start += 1
                continue
            owner, end = batch[start].owner, start + 1
            while end < len(batch) and batch[end].owner is owner:
                end += 1
            owner.set_rows(batch[start].index, rows[row_starts[start] : row_starts[end]])
            if owner.num_pending == 0 and owner.checked_estimate_s is not None:
                self.rate.observe_request(owner.checked_estimate_s, finished - owner.submitted_at)
            start = end

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


def check_rows(
    output: HeadOutput, rows: RowRequest, lengths: Sequence[int], runs_prefixes: bool, has_types: bool
) -> None:
    """ValueError where a head of `output` cannot give what `rows` asks of sequences of `lengths`."""
    if rows.prefix is not None:
        if not (output.scores_prefix or runs_prefixes):
            raise ValueError("this engine does not run shared prefixes")
        if len(rows.prefix) == 0 or has_types:
            raise ValueError("a shared prefix has tokens, and its sequences no token types")
    plain = rows.prefix is None and rows.spans is None
    if rows.first_rows and not (output.takes_first_rows and plain):
        raise ValueError("first rows are a token head's, of sequences without a prefix or spans")
    if rows.spans is not None:
        if not output.pools_spans or rows.prefix is not None:
            raise ValueError("pooled spans need an embedder that mean-pools, and no shared prefix")
        check_spans(rows.spans, lengths)
    if rows.columns is not None and not 0 <= rows.columns[0] < rows.columns[1] <= output.width:
        raise ValueError(f"columns {rows.columns} are not inside a row of {output.width}")
