"""Wire types of vLLM's score API (/score, /v1/score)."""

from __future__ import annotations

import msgspec


class ScoreRequest(msgspec.Struct, kw_only=True):
    text_1: str | list[str]
    text_2: str | list[str]
    model: str | None = None


class ScoreData(msgspec.Struct):
    index: int
    score: float
    object: str = "score"


class ScoreUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    data: list[ScoreData]
    usage: ScoreUsage
    object: str = "list"
