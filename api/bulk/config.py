"""JobConfig: what `posy embed` was asked for."""

from __future__ import annotations

from dataclasses import dataclass

from api.config import EngineFlags
from engine.checkpoint.source import ModelSource

DEFAULT_SHARD_ROWS = 50_000  # rows per output shard: what a crash can cost


@dataclass(frozen=True, slots=True)
class JobConfig:
    input: str
    output: str
    source: ModelSource = ModelSource()  # the model and how it is read; None: the bundled all-MiniLM-L6-v2
    text_column: str = "text"
    id_column: str | None = None  # None: row numbers, from 0
    input_format: str | None = None  # None: from the input's suffix
    dimensions: int | None = None  # Matryoshka: the first N values, re-normalized
    prompt_name: str | None = None
    input_type: str | None = None  # "document", "query", ...: the model's prompt for it
    shard_rows: int = DEFAULT_SHARD_ROWS
    tokenizer_processes: int | None = None  # None: beside a GPU engine, a pool; beside a CPU one, none
    engine: EngineFlags = EngineFlags()
