"""`posy embed` on this machine: the input's shards through the in-process engine (no HTTP), each written
as soon as it is done. While one shard runs on the model the next is read and tokenized; within a shard,
chunks of texts go to the engine together, as many as its queue takes, so that batches stay full."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from api.bulk.chunk_tokenizer import ChunkTokenizer, Tokenization, default_num_processes, open_chunk_tokenizer
from api.bulk.config import JobConfig
from api.bulk.errors import JobError
from api.bulk.output import Output
from api.bulk.progress import JobProgress
from api.bulk.source import Shard, Source, input_format
from api.encoding import check_dimensions, truncate_dimensions
from api.errors import InvalidInput
from api.prompts import select_prompt
from api.tokenize import TextEncoder
from engine.build import build_engine
from engine.config import EngineConfig, sized_for
from engine.device import resolve_device, resolve_dtype
from engine.engine import Engine
from engine.loader import ModelSpec, resolve_model
from engine.passing_thread import await_in_passing_thread

logger = logging.getLogger(__name__)

CHUNK_TEXTS = 1024  # texts tokenized and sent to the engine together
SHARDS_IN_FLIGHT = 2  # one on the model while the next is read and tokenized
# shards written at once: encoding a 100k x 768 shard as Parquet takes a core 1.4 s (its list column's
# levels), longer than the H200 embeds it in; writes release the GIL and spread over cores
SHARD_WRITERS = 3


@dataclass(frozen=True, slots=True)
class JobResult:
    rows: int  # embedded by this run
    skipped_rows: int  # in shards an earlier run finished
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class JobModel:
    """What every worker of a job builds the same way: the model, its tokenizer, prompt and engine config."""

    spec: ModelSpec
    encoder: TextEncoder
    prompt: str
    engine_config: EngineConfig
    dimensions: int | None

    @classmethod
    def load(cls, config: JobConfig) -> JobModel:
        if config.shard_rows < 1:
            raise JobError(f"--shard-rows must be at least 1, not {config.shard_rows}")
        try:
            spec = resolve_model(config.model, config.bidirectional, config.max_model_len)
            if spec.task != "embed":
                raise JobError(f"{spec.name} is a {spec.task} model: posy embed needs an embedding model")
            check_dimensions(config.dimensions, spec.output_dim, "--dimensions")
            prompt = select_prompt(
                spec.prompts, config.input_type, config.prompt_name, spec.default_prompt_name
            )
            device = resolve_device(config.device)
            engine_config = sized_for(
                spec.max_seq_length, device, resolve_dtype(config.dtype, device), config.attention_backend,
                config.cuda_graphs, config.max_batch_tokens, config.max_batch_seqs, config.max_queue_tokens,
            )  # fmt: skip
        except (InvalidInput, ValueError) as error:
            raise JobError(str(error)) from error
        encoder = TextEncoder(spec.tokenizer_path, spec.max_seq_length, spec.vocab_size)
        return cls(spec, encoder, prompt, engine_config, config.dimensions)

    def job_identity(self, config: JobConfig) -> dict:
        """What the output's rows depend on: a rerun into the same output must ask for the same."""
        fields = ("input", "text_column", "id_column", "dimensions", "shard_rows")
        return {
            **{name: asdict(config)[name] for name in fields},
            "model": self.spec.name,
            "prompt": self.prompt,
            "window": self.spec.max_seq_length,
            "dtype": self.engine_config.dtype,
        }

    def open_tokenizer(self, num_processes: int | None) -> ChunkTokenizer:
        """None: worker processes beside a GPU engine, a thread beside a CPU one."""
        tokenization = Tokenization(
            self.spec.tokenizer_path, self.spec.max_seq_length, self.spec.vocab_size, self.prompt
        )
        if num_processes is None:
            num_processes = default_num_processes(self.engine_config.device)
        try:
            return open_chunk_tokenizer(tokenization, num_processes)
        except ValueError as error:
            raise JobError(str(error)) from error

    async def embed(
        self, engine: Engine, tokenizer: ChunkTokenizer, texts: Sequence[str], budget: TokenBudget
    ) -> tuple[list[np.ndarray], int]:
        """(vectors in input order, as one array per chunk, and tokens) of `texts`. Chunks go to the
        tokenizer up to its lookahead ahead, and each to the engine, in order, as soon as it is tokenized
        and the engine's queue has room. The arrays stay apart: joining a shard's (300 MB at 100k x 768)
        here would hold up the event loop, and with it every submission."""
        tokenizing: deque[asyncio.Future] = deque()
        runs: list[asyncio.Task] = []
        total = 0

        async def hand_over(chunk: asyncio.Future) -> None:
            nonlocal total
            sequences = await chunk
            tokens = sum(map(len, sequences))
            await budget.acquire(tokens)
            runs.append(asyncio.create_task(_run(engine, sequences, tokens, budget)))
            total += tokens

        try:
            for start in range(0, len(texts), CHUNK_TEXTS):
                tokenizing.append(tokenizer.submit(texts[start : start + CHUNK_TEXTS]))
                if len(tokenizing) > tokenizer.lookahead:
                    await hand_over(tokenizing.popleft())
            while tokenizing:
                await hand_over(tokenizing.popleft())
            parts = await asyncio.gather(*runs)
        finally:
            for future in (*tokenizing, *runs):
                future.cancel()
        return [truncate_dimensions(part, self.dimensions) for part in parts], total


async def _run(
    engine: Engine, sequences: Sequence[Sequence[int]], tokens: int, budget: TokenBudget
) -> np.ndarray:
    try:
        return await engine.run(sequences)
    finally:
        await budget.release(tokens)


class TokenBudget:
    """Tokens handed to the engine and not yet back, at most its queue's: more would be refused."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self._changed = asyncio.Condition()

    async def acquire(self, tokens: int) -> None:
        async with self._changed:
            # a chunk alone always goes (the engine refuses it only if it is over its whole queue)
            await self._changed.wait_for(lambda: self.held == 0 or self.held + tokens <= self.limit)
            self.held += tokens

    async def release(self, tokens: int) -> None:
        async with self._changed:
            self.held -= tokens
            self._changed.notify_all()


async def run_job(config: JobConfig) -> JobResult:
    source_format = input_format(config.input, config.input_format)
    source = Source(config.input, source_format, config.text_column, config.id_column)
    model = JobModel.load(config)
    output = Output(config.output, model.job_identity(config))
    output.open()
    if output.complete:
        logger.info("%s already holds this job's %d rows: nothing to do", config.output, output.finished_rows)
        return JobResult(0, output.finished_rows, 0, 0.0)
    if output.shards:
        finished = (len(output.shards), output.finished_rows, config.output)
        logger.info("taking up %d finished shards (%d rows) in %s", *finished)
    total_rows = await asyncio.to_thread(source.num_rows)
    tokenizer = model.open_tokenizer(config.tokenizer_processes)  # its workers start while the model loads
    try:
        engine = await await_in_passing_thread(lambda: build_engine(model.spec, model.engine_config))
        progress = JobProgress(total_rows, logger)
        try:
            await _run_shards(source, config, model, engine, tokenizer, output, progress)
        finally:
            progress.close()
            engine.stop()
    finally:
        tokenizer.close()
    output.finish()
    logger.info("%s; written to %s", progress.line(), config.output)
    return JobResult(progress.rows, progress.skipped_rows, progress.tokens, progress.seconds)


async def _run_shards(
    source: Source,
    config: JobConfig,
    model: JobModel,
    engine: Engine,
    tokenizer: ChunkTokenizer,
    output: Output,
    progress: JobProgress,
) -> None:
    """Reads shards and hands them to the engine while a writer task writes the finished ones (up to
    SHARD_WRITERS at once): neither waits on the other, up to SHARDS_IN_FLIGHT shards embedding at once."""
    budget = TokenBudget(model.engine_config.max_queue_tokens)
    id_column = config.id_column or "id"
    shards = source.shards(config.shard_rows)
    embedding: asyncio.Queue[tuple[Shard, asyncio.Task] | None] = asyncio.Queue(maxsize=SHARDS_IN_FLIGHT)
    tasks: list[asyncio.Task] = []

    async def write(shard: Shard, parts: list[np.ndarray], tokens: int) -> None:
        await asyncio.to_thread(output.write_shard, shard.index, id_column, shard.ids, parts)
        progress.embedded(len(shard.ids), tokens)

    async def write_finished() -> None:
        writes: set[asyncio.Task] = set()
        try:
            while (item := await embedding.get()) is not None:
                shard, task = item
                parts, tokens = await task
                while len(writes) >= SHARD_WRITERS:
                    done, writes = await asyncio.wait(writes, return_when=asyncio.FIRST_COMPLETED)
                    for finished in done:
                        finished.result()  # a failed write stops the job
                writes.add(asyncio.create_task(write(shard, parts, tokens)))
            for finished in asyncio.as_completed(writes):
                await finished
        except BaseException:
            # a failure (or Ctrl-C) elsewhere: the shards being written are finished work, keep them
            await asyncio.gather(*writes, return_exceptions=True)
            raise

    writer = asyncio.create_task(write_finished())

    async def hand_over(item: tuple[Shard, asyncio.Task] | None) -> bool:
        """Queues `item` for the writer, waiting while SHARDS_IN_FLIGHT shards wait for it; False if the
        writer has stopped (failed) instead, which would never take it."""
        put = asyncio.create_task(embedding.put(item))
        await asyncio.wait({put, writer}, return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()
            return False
        return True

    try:
        while (shard := await asyncio.to_thread(next, shards, None)) is not None:
            if shard.index in output.shards:
                output.check_finished(shard.index, shard.ids)
                progress.skipped(len(shard.ids))
                continue
            tasks.append(asyncio.create_task(model.embed(engine, tokenizer, shard.texts, budget)))
            if not await hand_over((shard, tasks[-1])):
                break
        else:
            await hand_over(None)
        await writer  # raises what the writer or an embedding raised
    finally:
        for task in (*tasks, writer):
            task.cancel()
