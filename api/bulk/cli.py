"""`posy embed INPUT --output OUTPUT ...`: flags -> JobConfig -> the job, here or on a Ray cluster."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
from collections.abc import Coroutine

from api.bulk.config import DEFAULT_SHARD_ROWS, JobConfig
from engine.checkpoint.source import ModelSource


def add_embed_command(commands, add_engine_flags) -> argparse.ArgumentParser:
    embed = commands.add_parser(
        "embed",
        help="embed a file of texts (JSONL, CSV, Parquet) into Parquet shards of ids and vectors (a "
        "SPLADE model's: sparse ones; a ColBERT model's: a vector a token)",
    )
    embed.add_argument(
        "input",
        help="JSONL, CSV or Parquet: a path, or a URI pyarrow reads (s3://...); JSONL or CSV also compressed "
        "(.gz, .bz2, .zst, .lz4) or from a pipe ('-': stdin, with --input-format)",
    )
    embed.add_argument(
        "--output", required=True, help="a folder for the Parquet shards and _manifest.json (path or URI)"
    )
    embed.add_argument("--model", help="model folder or hub id (default: the bundled all-MiniLM-L6-v2)")
    embed.add_argument("--text-column", default="text")
    embed.add_argument("--id-column", help="written beside each vector (default: the row number, as 'id')")
    embed.add_argument("--input-format", choices=["jsonl", "csv", "parquet"], help="default: from the suffix")
    embed.add_argument("--dimensions", type=int, help="keep the first N values, re-normalized (Matryoshka)")
    embed.add_argument("--prompt-name", help="the model's prompt of this name before every text")
    embed.add_argument(
        "--input-type",
        help="document, query, ...: the model's prompt for that kind (a ColBERT model: query lays the texts "
        "out as its queries)",
    )
    embed.add_argument(
        "--shard-rows",
        type=int,
        default=DEFAULT_SHARD_ROWS,
        help="rows per output shard; a rerun after a crash skips the finished shards",
    )
    embed.add_argument(
        "--tokenizer-processes",
        type=int,
        help="processes that tokenize beside the engine (default: up to 8 with a GPU, none on CPUs; "
        "0: a thread of the job's process)",
    )
    embed.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        metavar="ADDRESS",
        help="run on a Ray cluster through Ray Data (no ADDRESS: the cluster this machine belongs to, "
        "or a local one)",
    )
    embed.add_argument(
        "--ray-workers", type=int, help="engine actors on Ray (default: one per GPU, or 1 on CPUs)"
    )
    add_engine_flags(embed)
    return embed


def job_config(args: argparse.Namespace) -> JobConfig:
    """The model and its flags, the engine flags, and every other JobConfig field the flag of its name."""
    from api.cli import engine_flags, model_flags

    nested = {"source": ModelSource(args.model, model_flags(args)), "engine": engine_flags(args)}
    flat = {field.name: getattr(args, field.name) for field in dataclasses.fields(JobConfig)
            if field.name not in nested}  # fmt: skip
    return JobConfig(**nested, **flat)


def run_embed(args: argparse.Namespace) -> int:
    """0 when the output is complete; 2 for a job that cannot run as asked; 1 when the model failed and
    130 on Ctrl-C, both with the finished shards kept for a rerun (not with --ray)."""
    from api.bulk.errors import JobError, TokenizerFailed
    from api.bulk.job import run_job
    from engine.errors import EngineError

    config = job_config(args)
    kept = ": the finished shards are kept, the same command resumes the job"
    resume = "" if args.ray is not None else kept
    try:
        if args.ray is not None:
            from api.bulk.ray_job import run_ray_job

            run_ray_job(config, args.ray, args.ray_workers)
        else:
            if asyncio.run(_until_interrupted(run_job(config))):
                raise KeyboardInterrupt
    except JobError as error:
        print(f"posy embed: {error}", file=sys.stderr)
        return 2
    except (EngineError, TokenizerFailed) as error:
        print(f"posy embed: {error}{resume}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"posy embed: interrupted{resume}", file=sys.stderr)
        return 130
    return 0


async def _until_interrupted(job: Coroutine) -> bool:
    """Runs the job; True when Ctrl-C stopped it (its task cancelled, what it finished kept). SIGINT is
    the loop's, its callback run between callbacks: asyncio.run's own handler cancels the task from
    inside whatever runs when the signal lands, and once cancelled a thread's future between asyncio's
    check of it and its set_result, which logged an InvalidStateError traceback."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    interrupted = False

    def interrupt() -> None:
        nonlocal interrupted
        interrupted = True
        task.cancel()

    loop.add_signal_handler(signal.SIGINT, interrupt)
    try:
        await job
    except asyncio.CancelledError:
        if not interrupted:
            raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    return interrupted
