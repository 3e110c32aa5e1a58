"""Served models: each model's names, tokenizer and engine, and lookup by the request's `model`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from api.errors import ModelNotServed, TaskNotSupported
from api.prompts import select_prompt
from api.tokenize import TextEncoder
from engine.engine import Engine
from engine.replica_pool import ReplicaPool
from engine.request import EngineOutput
from engine.spec import ModelSpec
from scoring.late_interaction import LateInteraction
from scoring.listwise import ListwiseModel, ListwisePrompt, passage_tokens
from scoring.m3_rows import dense_vectors
from scoring.rerank import RerankModel
from scoring.templates import TextPrompts

EMBED = "embed"
RERANK = "rerank"
TOKEN_EMBED = "token_embed"  # a vector a token (ColBERT; bge-m3's ColBERT vectors)
SPARSE_EMBED = "sparse_embed"  # vocabulary weights (SPLADE; bge-m3's lexical weights)
CLASSIFY = "classify"  # a sequence classifier's labels
SCORE = "score"  # vLLM's /score: a pair's relevance, from whatever ranks
POOLING = "pooling"  # vLLM's /pooling: a pooled vector, or token vectors
# where each task is served, for the error that names what a model can do; in the order /v1/models lists them
TASK_ROUTES = {
    EMBED: "/v1/embeddings",
    TOKEN_EMBED: "/pooling with task token_embed",
    SPARSE_EMBED: "/embed_sparse",
    RERANK: "/v1/rerank",
    SCORE: "/score",
    CLASSIFY: "/classify",
    POOLING: "/pooling",
}


@dataclass(slots=True)
class ServedModel:
    names: tuple[str, ...]
    spec: ModelSpec
    encoder: TextEncoder
    # the same run() either way; bge-m3's shows its dense vectors (DenseView), its token rows are in
    # `token_engine`
    engine: Engine | ReplicaPool | DenseView
    token_engine: Engine | ReplicaPool | None = None
    late_interaction: LateInteraction | None = None  # a ColBERT model's query and document layout
    listwise: ListwiseModel | None = None  # a listwise ranker's prompt (see listwise_model)

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def tasks(self) -> tuple[str, ...]:
        """Every task it serves: what it gives, then the routes that serve any model giving that (/score
        whatever ranks, /pooling whatever embeds or gives token vectors)."""
        served = set(self._own_tasks())
        if RERANK in served:
            served.add(SCORE)
        if served & {EMBED, TOKEN_EMBED}:
            served.add(POOLING)
        return tuple(task for task in TASK_ROUTES if task in served)

    def _own_tasks(self) -> tuple[str, ...]:
        """What the model itself gives."""
        spec = self.spec
        if spec.m3:
            return (EMBED, RERANK, TOKEN_EMBED, SPARSE_EMBED)
        if spec.listwise is not None:
            return (RERANK,)
        if spec.task in (EMBED, TOKEN_EMBED):
            return (spec.task, RERANK)
        if spec.task == SPARSE_EMBED:
            return (SPARSE_EMBED,)
        rerank = (RERANK,) if spec.num_labels in (1, 2) else ()
        classify = (CLASSIFY,) if spec.architecture.endswith("ForSequenceClassification") else ()
        return rerank + classify

    def served(self) -> list[str]:
        """Its tasks and where each is asked for, for errors."""
        return [f"{task} ({TASK_ROUTES[task]})" for task in self.tasks]

    def rerank_model(self) -> RerankModel:
        spec = self.spec
        if self.encoder.pair_prompt is not None:
            prompts = self.encoder.pair_prompt
        elif spec.task == "embed":
            # an embedding model ranks with its own query and document prompts, as its retrieval does
            prompts = TextPrompts(
                select_prompt(spec.prompts, "query", None), select_prompt(spec.prompts, "document", None)
            )
        else:
            prompts = TextPrompts()
        return RerankModel(
            engine=self.engine,
            window=spec.max_seq_length,
            single=self.encoder.single,
            pair=self.encoder.pair,
            cross_encoder=spec.task == "score",
            prompts=prompts,
            late_interaction=self.late_interaction,
        )


def listwise_model(
    spec: ModelSpec, encoder: TextEncoder, engine: Engine | ReplicaPool
) -> ListwiseModel | None:
    """A listwise ranker's prompts, tokenized by its encoder, as long as its window."""
    if spec.listwise is None:
        return None
    prompt = ListwisePrompt(spec.listwise.document_marker, spec.listwise.query_marker)
    return ListwiseModel(
        engine=engine,
        prompt=prompt,
        max_prompt_tokens=spec.max_seq_length,
        passage_tokens=passage_tokens(prompt, lambda text: len(encoder.content_ids([text])[0])),
        tokenize=encoder.content_ids_off_loop,
        decode=lambda ids: encoder.tokenizer.decode(list(ids), skip_special_tokens=False),
    )


class DenseView:
    """bge-m3's engine as a dense embedder: each sequence's first row only, which holds its dense vector
    (its other rows never leave the device), so that every embedding and rerank route serves it as it
    serves any embedder."""

    def __init__(self, engine: Engine | ReplicaPool):
        self.inner = engine

    def __getattr__(self, name: str) -> Any:  # the rest of the engine's interface, as it is
        return getattr(self.inner, name)

    def enqueue(
        self,
        token_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int] | None] | None = None,
        deadline: float | None = None,
        prefix: Sequence[int] | None = None,
    ) -> asyncio.Future[EngineOutput]:
        work = self.inner.enqueue(token_ids, token_type_ids, deadline, prefix, first_rows=True)
        # a task: cancelling it (a timeout, a client gone) cancels the engine's work too
        return asyncio.ensure_future(self._dense(work))

    async def run(
        self,
        token_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int] | None] | None = None,
        prefix: Sequence[int] | None = None,
    ):
        return (await self.enqueue(token_ids, token_type_ids, prefix=prefix)).rows

    @staticmethod
    async def _dense(work: asyncio.Future[EngineOutput]) -> EngineOutput:
        output = await work
        return replace(output, rows=dense_vectors(output.rows))


class ModelRegistry:
    def __init__(self, models: list[ServedModel]):
        self.models = models
        self._by_name = {name: model for model in models for name in model.names}

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def get(self, name: str | None, task: str) -> ServedModel:
        """The model a request names, or without a name the first one that can do the task."""
        if name is None:
            for model in self.models:
                if task in model.tasks:
                    return model
            first = self.models[0]
            raise TaskNotSupported(first.name, task, first.served())
        model = self._by_name.get(name)
        if model is None:
            raise ModelNotServed(name, self.names)
        if task not in model.tasks:
            raise TaskNotSupported(name, task, model.served())
        return model
