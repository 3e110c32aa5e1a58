"""Served models: each model's names, tokenizer and engine, and lookup by the request's `model`."""

from __future__ import annotations

from dataclasses import dataclass, field

from api.errors import ModelNotServed, TaskNotSupported
from api.prompts import select_prompt
from api.tokenize import TextEncoder
from api.tokenizer_pool import TokenizerPool
from engine.checkpoint.spec import ModelSpec
from engine.interface import EngineInterface
from engine.outputs import CLASSIFY, EMBED, RERANK, SPARSE_EMBED, TOKEN_EMBED, RowRequest
from scoring.late_interaction import LateInteraction
from scoring.listwise import ListwiseModel, ListwisePrompt, passage_tokens
from scoring.rerank import RerankModel, document_lead
from scoring.templates import TextPrompts

SCORE = "score"  # vLLM's /score: a pair's relevance, from whatever ranks
POOLING = "pooling"  # vLLM's /pooling: a pooled vector, token vectors, or any head's own rows
# Perplexity's (and Voyage's) contextualized embeddings: a vector a chunk of documents read whole, from any
# embedder that mean-pools spans (api/late_chunking.py)
CONTEXTUALIZED_EMBED = "contextualized_embed"
# where each task is served, for the error that names what a model can do; in the order /v1/models lists them
# (a head's own task, outside this table, is served by /pooling: task_route)
TASK_ROUTES = {
    EMBED: "/v1/embeddings",
    CONTEXTUALIZED_EMBED: "/v1/contextualizedembeddings",
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
    engine: EngineInterface
    late_interaction: LateInteraction | None = None  # a ColBERT model's query and document layout
    listwise: ListwiseModel | None = None  # a listwise ranker's prompt (see listwise_model)
    # the threads an image model's requests' images are decoded on (ServerConfig.image_threads), apart
    # from the tokenizer's so that neither's queue or measured rate is the other's
    image_pool: TokenizerPool | None = None
    # how its rerank lays out and scores pairs (its prompts, their tokenized document lead), made once
    rerank: RerankModel = field(init=False)

    def __post_init__(self) -> None:
        self.rerank = self._rerank_model()

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def tasks(self) -> tuple[str, ...]:
        """Every task it serves: what it gives, then the routes that serve any model giving that (/score
        whatever ranks, /pooling whatever embeds or gives token vectors)."""
        own = self.engine.output.tasks
        served = set(own)
        if RERANK in served:
            served.add(SCORE)
        if served & {EMBED, TOKEN_EMBED}:
            served.add(POOLING)
        if EMBED in served and self.engine.output.pools_spans:
            served.add(CONTEXTUALIZED_EMBED)
        listed = tuple(task for task in TASK_ROUTES if task in served)
        return listed + tuple(task for task in own if task not in TASK_ROUTES)

    def rows(self, task: str) -> RowRequest:
        """What a request for `task` asks of the model's rows (bge-m3's embeddings: each text's first row,
        its dense part)."""
        return RowRequest.for_task(self.engine.output, task)

    def served(self) -> list[str]:
        """Its tasks and where each is asked for, for errors."""
        return [f"{task} ({task_route(task)})" for task in self.tasks]

    def _rerank_model(self) -> RerankModel:
        spec = self.spec
        if self.encoder.pair_prompt is not None:
            prompts = self.encoder.pair_prompt
        elif self.late_interaction is not None:  # its text layout, if it has one (ColQwen2's)
            prompts = self.late_interaction
        elif spec.task == "embed":
            # an embedding model ranks with its own query and document prompts, as its retrieval does
            prompts = TextPrompts(
                select_prompt(spec.prompts, "query", None), select_prompt(spec.prompts, "document", None)
            )
        else:
            prompts = TextPrompts()
        lead = document_lead(prompts)
        return RerankModel(
            engine=self.engine,
            rows=self.rows(RERANK),
            window=spec.max_seq_length,
            single=self.encoder.single,
            pair=self.encoder.pair,
            cross_encoder=spec.task == "score",
            prompts=prompts,
            late_interaction=self.late_interaction,
            document_lead=tuple(self.encoder.content_ids([lead])[0]) if lead else (),
        )


def task_route(task: str) -> str:
    """Where a task is asked for: its route, or /pooling for a head's own task (a token classifier's)."""
    return TASK_ROUTES.get(task, f"/pooling with task {task}")


def listwise_model(spec: ModelSpec, encoder: TextEncoder, engine: EngineInterface) -> ListwiseModel | None:
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
