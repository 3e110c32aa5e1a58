"""`posy embed` on this machine: the input's shards through the in-process engine (no HTTP). While one
shard runs on the model the next is read and tokenized, and the one before is written; within a shard,
chunks of texts go to the engine together, as many as its queue takes, so that batches stay full, and
its rows are written a row group at a time as they come back."""

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
from api.bulk.output import Output, ShardWriter
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
# shards between their reading and their recording: one written out, one on the model, one tokenized
MAX_OPEN_SHARDS = 3
# rows per Parquet row group: the job's end waits for one, not a whole shard (a core encodes 100k x 768
# float32 rows in about 1.4 s, longer than the H200 embeds them in)
ROW_GROUP_ROWS = 16_384


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

    async def submit(
        self,
        engine: Engine,
        tokenizer: ChunkTokenizer,
        texts: Sequence[str],
        budget: TokenBudget,
        runs: asyncio.Queue[asyncio.Task | None],
    ) -> None:
        """Hands `texts` to the engine chunk by chunk: each chunk goes to the tokenizer (up to its
        lookahead ahead), then, in order, to the engine as soon as its queue has room. Puts each chunk's
        run (a task giving its vectors and tokens) on `runs`, then None, also when it fails."""
        tokenizing: deque[asyncio.Future] = deque()

        async def hand_over(chunk: asyncio.Future) -> None:
            sequences = await chunk
            tokens = sum(map(len, sequences))
            await budget.acquire(tokens)
            runs.put_nowait(asyncio.create_task(self._run(engine, sequences, tokens, budget)))

        try:
            for start in range(0, len(texts), CHUNK_TEXTS):
                tokenizing.append(tokenizer.submit(texts[start : start + CHUNK_TEXTS]))
                if len(tokenizing) > tokenizer.lookahead:
                    await hand_over(tokenizing.popleft())
            while tokenizing:
                await hand_over(tokenizing.popleft())
        finally:
            for future in tokenizing:
                future.cancel()
            runs.put_nowait(None)

    async def embed(
        self, engine: Engine, tokenizer: ChunkTokenizer, texts: Sequence[str], budget: TokenBudget
    ) -> tuple[list[np.ndarray], int]:
        """(vectors in input order, as one array per chunk, and tokens) of `texts`."""
        parts: list[np.ndarray] = []
        total = 0
        async with _Submitted(self, engine, tokenizer, texts, budget) as submitted:
            async for vectors, tokens in submitted:
                parts.append(vectors)
                total += tokens
        return parts, total

    async def _run(
        self, engine: Engine, sequences: Sequence[Sequence[int]], tokens: int, budget: TokenBudget
    ) -> tuple[np.ndarray, int]:
        try:
            return truncate_dimensions(await engine.run(sequences), self.dimensions), tokens
        finally:
            await budget.release(tokens)


class _Submitted:
    """`texts` submitted in the background; iterating gives each chunk's (vectors, tokens) in order. On
    leaving, what is still submitting or running is cancelled."""

    def __init__(
        self,
        model: JobModel,
        engine: Engine,
        tokenizer: ChunkTokenizer,
        texts: Sequence[str],
        budget: TokenBudget,
    ):
        self.runs: asyncio.Queue[asyncio.Task | None] = asyncio.Queue()
        self.submitting = asyncio.create_task(model.submit(engine, tokenizer, texts, budget, self.runs))

    async def __aenter__(self) -> _Submitted:
        return self

    def __aiter__(self) -> _Submitted:
        return self

    async def __anext__(self) -> tuple[np.ndarray, int]:
        run = await self.runs.get()
        if run is None:
            await self.submitting  # raises what stopped it
            raise StopAsyncIteration
        return await run

    async def __aexit__(self, *exc_info) -> None:
        self.submitting.cancel()
        while not self.runs.empty():
            if (run := self.runs.get_nowait()) is not None:
                run.cancel()


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


@dataclass(slots=True, eq=False)
class _OpenShard:
    """A shard from its reading until it is recorded."""

    shard: Shard
    task: asyncio.Task | None = None
    embedded: bool = False  # all its rows are back from the engine: what is left is writing them


async def _run_shards(
    source: Source,
    config: JobConfig,
    model: JobModel,
    engine: Engine,
    tokenizer: ChunkTokenizer,
    output: Output,
    progress: JobProgress,
) -> None:
    """Reads shards and runs each, up to MAX_OPEN_SHARDS at once. A failure stops the job with every
    shard before the failed one written out; Ctrl-C, with the shards whose rows were all embedded."""
    budget = TokenBudget(model.engine_config.max_queue_tokens)
    id_column = config.id_column or "id"
    shards = source.shards(config.shard_rows)
    open_shards: list[_OpenShard] = []
    failed_at: int | None = None  # the shard whose failure stops the job

    async def wait_for_one() -> None:
        nonlocal failed_at
        await asyncio.wait([entry.task for entry in open_shards], return_when=asyncio.FIRST_COMPLETED)
        for entry in [entry for entry in open_shards if entry.task.done()]:
            open_shards.remove(entry)
            try:
                entry.task.result()
            except BaseException:
                failed_at = entry.shard.index
                raise

    try:
        while (shard := await asyncio.to_thread(next, shards, None)) is not None:
            if shard.index in output.shards:
                output.check_finished(shard.index, shard.ids)
                progress.skipped(len(shard.ids))
                continue
            entry = _OpenShard(shard)
            entry.task = asyncio.create_task(
                _embed_and_write(
                    entry,
                    model,
                    engine,
                    tokenizer,
                    budget,
                    output.open_shard(shard.index, id_column),
                    progress,
                )
            )
            open_shards.append(entry)
            while len(open_shards) >= MAX_OPEN_SHARDS:
                await wait_for_one()
        while open_shards:
            await wait_for_one()
    except BaseException:
        # finished work is kept: shards all embedded, and after a failure every shard before it
        for entry in open_shards:
            if not entry.embedded and (failed_at is None or entry.shard.index > failed_at):
                entry.task.cancel()
        await asyncio.gather(*(entry.task for entry in open_shards), return_exceptions=True)
        raise


async def _embed_and_write(
    entry: _OpenShard,
    model: JobModel,
    engine: Engine,
    tokenizer: ChunkTokenizer,
    budget: TokenBudget,
    writer: ShardWriter,
    progress: JobProgress,
) -> None:
    """One shard: its chunks' rows written as they come back, a row group at a time, then recorded."""
    ids = entry.shard.ids
    buffered: list[np.ndarray] = []
    written = tokens = 0
    in_thread: asyncio.Future | None = None  # a write under way, which the file must outlast

    async def write(operation, *args) -> None:
        nonlocal in_thread
        in_thread = asyncio.ensure_future(asyncio.to_thread(operation, *args))
        await asyncio.shield(in_thread)  # cancelled, the thread would write on: in_thread says when done

    async def flush() -> None:
        nonlocal written
        rows = sum(map(len, buffered))
        await write(writer.write, ids[written : written + rows], list(buffered))
        written += rows
        buffered.clear()

    try:
        async with _Submitted(model, engine, tokenizer, entry.shard.texts, budget) as submitted:
            async for vectors, chunk_tokens in submitted:
                buffered.append(vectors)
                tokens += chunk_tokens
                if sum(map(len, buffered)) >= ROW_GROUP_ROWS:
                    await flush()
        entry.embedded = True
        if buffered:
            await flush()
        await write(writer.close)
        progress.embedded(len(ids), tokens)
    finally:
        if in_thread is not None and not in_thread.done():
            await asyncio.wait([in_thread])
        writer.discard()
