"""GET /v1/models: every served name, OpenAI's model list shape."""

from __future__ import annotations

from litestar import get
from litestar.di import NamedDependency

from api.schemas.openai import Model, ModelList
from api.server import Server


@get(["/v1/models", "/models"])
async def list_models(server: NamedDependency[Server]) -> ModelList:
    """Every served model name, with its window (`max_model_len`), `tasks`, `dimensions` and whether it is
    Matryoshka-trained."""
    registry = server.registry()
    return ModelList(
        data=[
            Model(
                id=name,
                created=server.started_at,
                root=str(model.spec.name),
                max_model_len=model.spec.max_seq_length,
                tasks=list(model.tasks),
                dimensions=model.spec.output_dim if model.spec.task == "embed" else None,
                matryoshka=model.spec.matryoshka if model.spec.task == "embed" else None,
            )
            for model in registry.models
            for name in model.names
        ]
    )
