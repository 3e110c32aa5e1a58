"""`posy embed` on this machine: the input's shards through the in-process engine (no HTTP). While one
shard runs on the model the next is read and tokenized, and the one before is written; within a shard,
chunks of texts go to the engine together, as many as its queue takes, so that batches stay full, and
its rows are written a row group at a time as they come back."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

import pyarrow as pa

from api.bulk.chunk_tokenizer import ChunkTokenizer
from api.bulk.config import JobConfig
from api.bulk.errors import JobError
from api.bulk.job_model import JobModel, Submitted, TokenBudget
from api.bulk.output import Output, ShardWriter
from api.bulk.progress import JobProgress
from api.bulk.source import Shard, Source, input_format
from engine.engine import Engine
from engine.passing_thread import await_in_passing_thread

logger = logging.getLogger(__name__)

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
    why_not = source.why_not_counted()
    no_total = "counting the input" if why_not is None else f"{why_not}: no total, no ETA"
    progress = JobProgress(no_total, logger)
    tokenizer = model.open_tokenizer(config.tokenizer_processes)  # its workers start while the model loads
    stop_counting = threading.Event()
    counting = asyncio.create_task(_count_rows(source, progress, stop_counting))  # so does the count
    try:
        engine = await await_in_passing_thread(model.build_engine)
        progress.start()
        try:
            await _run_shards(source, config, model, engine, tokenizer, output, progress)
        finally:
            progress.close()
            engine.stop()
    finally:
        stop_counting.set()
        await counting
        tokenizer.close()
    output.finish()
    logger.info("%s; written to %s", progress.line(), config.output)
    return JobResult(progress.rows, progress.skipped_rows, progress.tokens, progress.seconds)


async def _count_rows(source: Source, progress: JobProgress, stop: threading.Event) -> None:
    """The input's rows, counted in a thread beside the job, where why_not_counted() allows."""
    try:
        progress.counted(await asyncio.to_thread(source.num_rows, stop))
    except JobError:
        pass  # what the count cannot read, the job's own reading meets and reports


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
    num_read = 0

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
            num_read += len(shard.ids)
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
        progress.counted(num_read)  # read to its end, the input's total is known, counted or not
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
    buffered: list[pa.Array] = []
    written = 0
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
        async with Submitted(model, engine, tokenizer, entry.shard.texts, budget) as submitted:
            async for vectors, chunk_tokens in submitted:
                buffered.append(vectors)
                progress.embedded(len(vectors), chunk_tokens)  # a chunk at a time, not a shard
                if sum(map(len, buffered)) >= ROW_GROUP_ROWS:
                    await flush()
        entry.embedded = True
        if buffered:
            await flush()
        await write(writer.close)
    finally:
        if in_thread is not None and not in_thread.done():
            await asyncio.wait([in_thread])
        writer.discard()
