"""JobModel: what every worker of a bulk job (the local job, a Ray actor) builds the same way, and how it
hands texts to the engine: chunk by chunk, tokenized ahead, within the engine's queue (TokenBudget)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from api.bulk.chunk_tokenizer import ChunkTokenizer, Tokenization, default_num_processes, open_chunk_tokenizer
from api.bulk.config import JobConfig
from api.bulk.errors import JobError
from api.bulk.output import fixed_size_vectors, sparse_vectors, token_vectors
from api.encoding import check_dimensions, truncate_dimensions
from api.errors import InvalidInput
from api.prompts import select_prompt
from engine.build import build_engine
from engine.checkpoint.spec import ModelSpec
from engine.config import EngineConfig
from engine.engine import Engine
from engine.outputs import HeadOutput, RowRequest
from scoring.late_interaction import QUERY_INPUT_TYPES, kept_tokens

CHUNK_TEXTS = 1024  # texts tokenized and sent to the engine together
# a ranker's rows score pairs, not texts: posy embed runs any other head (a vector a text, bge-m3's dense one,
# a SPLADE model's sparse vector, a ColBERT model's token vectors, a head's own rows: a token classifier's)
RANKING_TASKS = ("score",)


@dataclass(frozen=True, slots=True)
class JobModel:
    """What every worker of a job builds the same way: the model, its prompt and engine config."""

    spec: ModelSpec
    prompt: str
    engine_config: EngineConfig
    dimensions: int | None
    is_query: bool = False  # a ColBERT job of queries, not documents

    @classmethod
    def load(cls, config: JobConfig) -> JobModel:
        if config.shard_rows < 1:
            raise JobError(f"--shard-rows must be at least 1, not {config.shard_rows}")
        try:
            spec = config.source.resolve()
            if spec.task in RANKING_TASKS:
                raise JobError(
                    f"{spec.name} is a {spec.task} model: posy embed runs embedding models (a vector a "
                    "text), SPLADE models (a sparse vector a text), ColBERT models (a vector a token) and "
                    "other heads' rows of a text (a token classifier's logits)"
                )
            if spec.task != "embed" and config.dimensions is not None:
                raise JobError(f"--dimensions shortens a vector a text, not a {spec.task} model's outputs")
            check_dimensions(config.dimensions, spec.output_dim, "--dimensions")
            prompt = select_prompt(
                spec.prompts, config.input_type, config.prompt_name, spec.default_prompt_name
            )
            engine_config = config.engine.engine_config(spec.max_seq_length)
        except (InvalidInput, ValueError) as error:
            raise JobError(str(error)) from error
        is_query = spec.colbert is not None and config.input_type in QUERY_INPUT_TYPES
        return cls(spec, prompt, engine_config, config.dimensions, is_query)

    def job_identity(self, config: JobConfig) -> dict:
        """What the output's rows depend on: a rerun into the same output must ask for the same."""
        fields = ("input", "text_column", "id_column", "dimensions", "shard_rows")
        return {
            **{name: getattr(config, name) for name in fields},
            "model": self.spec.name,
            "prompt": self.prompt,
            "window": self.spec.max_seq_length,
            "dtype": self.engine_config.dtype,
            **({"queries": self.is_query} if self.spec.colbert is not None else {}),
        }

    def build_engine(self) -> Engine:
        return build_engine(self.spec, self.engine_config)

    @property
    def tokenization(self) -> Tokenization:
        spec = self.spec
        window, colbert = spec.max_seq_length, spec.colbert
        return Tokenization(
            spec.tokenizer_path, window, spec.vocab_size, self.prompt, colbert, self.is_query,
            spec.text_padding, spec.input_layout,
        )  # fmt: skip

    def open_tokenizer(self, num_processes: int | None) -> ChunkTokenizer:
        """None: worker processes beside a GPU engine, a thread beside a CPU one."""
        if num_processes is None:
            num_processes = default_num_processes(self.engine_config.device)
        try:
            return open_chunk_tokenizer(self.tokenization, num_processes)
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
    ) -> tuple[list[pa.Array], int]:
        """(vectors in input order, as one column array per chunk, and tokens) of `texts`."""
        parts: list[pa.Array] = []
        total = 0
        async with Submitted(self, engine, tokenizer, texts, budget) as submitted:
            async for vectors, tokens in submitted:
                parts.append(vectors)
                total += tokens
        return parts, total

    def column(self, rows: np.ndarray, sequences: Sequence[Sequence[int]], output: HeadOutput) -> pa.Array:
        """The engine's rows of a chunk's sequences as the output's column: vectors (of `dimensions`), a
        SPLADE model's sparse vectors, a ColBERT model's token vectors (a query's all, a document's but
        those of its skiplist tokens, as the server's /pooling gives them), or a head's own rows as its
        output declares them (a token classifier's: a text's logits, a row a token)."""
        task, lengths = self.spec.task, [len(ids) for ids in sequences]
        if task == "sparse_embed":
            return sparse_vectors(rows)
        if task == "token_embed":
            flat_ids = np.concatenate([np.asarray(ids) for ids in sequences])
            return token_vectors(rows, lengths, kept_tokens(self.spec.colbert, flat_ids, self.is_query))
        if task != "embed" and output.token_rows:
            return token_vectors(rows, lengths, np.ones(len(rows), dtype=bool))
        return fixed_size_vectors(truncate_dimensions(rows, self.dimensions))

    async def _run(
        self, engine: Engine, sequences: Sequence[Sequence[int]], tokens: int, budget: TokenBudget
    ) -> tuple[pa.Array, int]:
        try:
            # the rows of the job's task (bge-m3's embedding: each text's dense vector, as the routes give it)
            rows = RowRequest.for_task(engine.output, self.spec.task)
            return self.column(await engine.run(sequences, rows=rows), sequences, engine.output), tokens
        finally:
            await budget.release(tokens)


class Submitted:
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

    async def __aenter__(self) -> Submitted:
        return self

    def __aiter__(self) -> Submitted:
        return self

    async def __anext__(self) -> tuple[pa.Array, int]:
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
