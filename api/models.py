"""Served models: each model's names, tokenizer and engine, and lookup by the request's `model`."""

from __future__ import annotations

from dataclasses import dataclass

from api.errors import ModelNotServed, TaskNotSupported
from api.prompts import select_prompt
from api.tokenize import TextEncoder
from engine.engine import Engine
from engine.loader import ModelSpec
from engine.replica_pool import ReplicaPool
from scoring.rerank import RerankModel
from scoring.templates import TextPrompts

EMBED = "embed"
RERANK = "rerank"


@dataclass(slots=True)
class ServedModel:
    names: tuple[str, ...]
    spec: ModelSpec
    encoder: TextEncoder
    engine: Engine | ReplicaPool  # the same run() either way

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def tasks(self) -> tuple[str, ...]:
        if self.spec.task == "embed":
            return (EMBED, RERANK)
        return (RERANK,) if self.spec.num_labels in (1, 2) else ()

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
            raise TaskNotSupported(self.models[0].name, task)
        model = self._by_name.get(name)
        if model is None:
            raise ModelNotServed(name, self.names)
        if task not in model.tasks:
            raise TaskNotSupported(name, task)
        return model
