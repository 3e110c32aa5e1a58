"""`posy embed --ray`: the same job on a Ray cluster through Ray Data. Ray reads the input in parallel,
`map_batches` sends record batches to engine actors (one per GPU, or CPU workers), each holding the same
engine and tokenizer the local job uses, and Ray writes the Parquet files. Ray retries a failed task by
itself; a job killed as a whole starts over (the local job is the resumable one)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import pyarrow as pa

from api.bulk.chunk_tokenizer import MAX_DEFAULT_PROCESSES
from api.bulk.config import JobConfig
from api.bulk.errors import JobError
from api.bulk.output import EMBEDDING_COLUMN
from api.bulk.source import input_format

logger = logging.getLogger(__name__)

BATCH_ROWS = 4096  # rows per map_batches call


class EmbedWorker:
    """A Ray Data actor: builds the engine once, then embeds every record batch it is given."""

    def __init__(self, config: JobConfig):
        from api.bulk.job_model import JobModel, TokenBudget

        self.config = config
        self.model = JobModel.load(config)
        self.engine = self.model.build_engine()
        self.loop = asyncio.new_event_loop()  # every batch runs on it, the budget's condition too
        self.budget = TokenBudget(self.model.engine_config.max_queue_tokens)
        self.tokenizer = self.model.open_tokenizer(config.tokenizer_processes)

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = batch.column(self.config.text_column).to_pylist()
        if any(text is None for text in texts):
            raise JobError(f"a row has no '{self.config.text_column}'")

        parts, _ = self.loop.run_until_complete(
            self.model.embed(self.engine, self.tokenizer, texts, self.budget)
        )
        vectors = pa.concat_arrays(parts)
        id_column = self.config.id_column or "id"
        return pa.table({id_column: batch.column(id_column), EMBEDDING_COLUMN: vectors})


def run_ray_job(config: JobConfig, address: str, num_workers: int | None) -> float:
    """Runs the job on the cluster at `address` ("auto": the one this machine belongs to, else a new
    local one); the seconds it took."""
    import ray

    if config.id_column is None:
        raise JobError("--ray needs --id-column: Ray Data reads files in parallel and keeps no row numbers")
    source_format = input_format(config.input, config.input_format)
    ray.init(address=None if address == "auto" else address, logging_level=logging.WARNING)
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        use_gpus = gpus > 0 and config.engine.device != "cpu"
        workers = num_workers or (gpus if use_gpus else 1)
        tokenizer_processes = config.tokenizer_processes
        if tokenizer_processes is None:  # the cluster's cores shared by the workers, not each a node's
            cpus = int(ray.cluster_resources().get("CPU", 1))
            tokenizer_processes = min(MAX_DEFAULT_PROCESSES, max(2, cpus // workers // 2)) if use_gpus else 0
        # a worker sees only its own GPU: "cuda:N" would name one it does not have
        engine = dataclasses.replace(config.engine, device="cuda" if use_gpus else "cpu")
        worker_config = dataclasses.replace(config, engine=engine, tokenizer_processes=tokenizer_processes)
        started = time.perf_counter()
        dataset = _read(ray, source_format, config)
        dataset = dataset.map_batches(
            EmbedWorker,
            fn_constructor_args=(worker_config,),
            batch_size=BATCH_ROWS,
            batch_format="pyarrow",
            concurrency=workers,
            num_gpus=1 if use_gpus else 0,
        )
        dataset.write_parquet(config.output)
        seconds = time.perf_counter() - started
        done = (config.input, workers, seconds, config.output)
        logger.info("embedded %s with %d Ray workers in %.1f s into %s", *done)
        return seconds
    finally:
        ray.shutdown()


def _read(ray, source_format: str, config: JobConfig):
    columns = [config.text_column, config.id_column]
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # the output's files follow the input
    if source_format == "parquet":
        return ray.data.read_parquet(config.input, columns=columns)
    if source_format == "csv":
        import pyarrow.csv as csv

        options = csv.ConvertOptions(column_types={config.text_column: pa.string()})
        return ray.data.read_csv(config.input, convert_options=options).select_columns(columns)
    return ray.data.read_json(config.input, lines=True).select_columns(columns)
