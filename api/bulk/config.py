"""JobConfig: what `posy embed` was asked for."""

from __future__ import annotations

from dataclasses import dataclass

from engine.checkpoint.source import ModelSource

DEFAULT_SHARD_ROWS = 50_000  # rows per output shard: what a crash can cost


@dataclass(frozen=True, slots=True)
class JobConfig:
    input: str
    output: str
    model: str | None = None  # None: the bundled all-MiniLM-L6-v2
    text_column: str = "text"
    id_column: str | None = None  # None: row numbers, from 0
    input_format: str | None = None  # None: from the input's suffix
    dimensions: int | None = None  # Matryoshka: the first N values, re-normalized
    prompt_name: str | None = None
    input_type: str | None = None  # "document", "query", ...: the model's prompt for it
    shard_rows: int = DEFAULT_SHARD_ROWS
    tokenizer_processes: int | None = None  # None: beside a GPU engine, a pool; beside a CPU one, none
    device: str = "auto"
    dtype: str = "auto"
    attention_backend: str = "auto"
    cuda_graphs: str = "lazy"
    quantization: str = "none"
    bidirectional: bool = False
    max_model_len: int | None = None
    model_impl: str = "auto"
    trust_remote_code: bool = False
    pooling: str | None = None  # TEI's --pooling (engine/checkpoint/source.py POOLING_FLAGS)
    max_batch_tokens: int | None = None
    max_batch_seqs: int = 512
    max_queue_tokens: int | None = None

    def source(self) -> ModelSource:
        """The model as its flags read it."""
        return ModelSource.of(self.model, self)
